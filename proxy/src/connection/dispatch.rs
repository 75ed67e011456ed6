//! The steps of [`Client::dispatch`] past its fast paths (an L1 GET, a
//! write-behind SET): a command the proxy answers itself, and a forwarded
//! command by its handling.

use bytes::{Bytes, BytesMut};
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::request::Request;

use super::{blocking, subscribed, tracked, Client, Flow, Inval, Pending, Receivers};
use crate::answer::{self, Local, Outcome};
use crate::cmd::handling::{Handling, Merge};
use crate::cmd::table::CommandInfo;

impl Client {
    /// Dispatches a command the proxy answers itself (`cmd`), or, for PING
    /// while a node is not known healthy, hands to upstream.
    pub(super) async fn dispatch_local(&mut self, cmd: Local, args: &[Bytes]) -> Flow {
        let id = self.shared.metrics.local_id(cmd);
        self.metrics.command(id);
        // CLIENT LIST's `cmd`: a command without subcommands is counted
        // under its table id, which names it (no lookup for a PING); an id
        // past the table's commands is one upstream does not know.
        if matches!(cmd, Local::Client | Local::ClusterDisabled) {
            self.note_command(args);
        } else if usize::from(id) < self.shared.table.names().len() {
            self.last_cmd = u32::from(id);
        } else {
            self.last_cmd = crate::state::clients::NO_COMMAND;
        }
        if !self.st.authenticated && !cmd.allowed_unauthenticated() {
            self.local_reply(|r| r.error("NOAUTH Authentication required."));
            return Flow::Continue;
        }
        if self.st.user.is_some() {
            match cmd {
                // An ACL user's PING and ECHO are Redis's (it may lack them).
                Local::Ping | Local::Echo => {
                    self.forward(0, None, &encoded(args));
                    return Flow::Continue;
                }
                // Answered here, once Redis said the user may run them.
                Local::Select | Local::Client if self.refused_to_user(args).await => {
                    return Flow::Continue;
                }
                _ => {}
            }
        }
        // PING is answered here only while every node is known
        // healthy (one atomic load); otherwise Redis's answer (BUSY,
        // LOADING, …) is the client's. See pool's `conn/health.rs`.
        if cmd == Local::Ping && args.len() <= 2 && !self.shared.upstream.all_healthy() {
            let mut ping = BytesMut::new();
            let argv: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
            encode::encode_command(&mut ping, &argv);
            self.pending.push(Pending::Control(ping.freeze()));
            return Flow::Continue;
        }
        if cmd.changes_session() {
            self.flush().await;
        }
        if cmd == Local::Reset {
            self.leave_pubsub();
        }
        if cmd == Local::Client
            && args
                .get(1)
                .is_some_and(|a| a.eq_ignore_ascii_case(b"unblock"))
        {
            self.client_unblock(args).await;
            return Flow::Continue;
        }
        if cmd == Local::Client && answer::is_kill(args) {
            let node = self.topo.nodes().first().cloned();
            let users = upstream_users(node, answer::named_users(args, &self.shared)).await;
            let start = self.scratch.len();
            let outcome =
                answer::client_kill(args, &self.st, &self.shared, &mut self.scratch, &users);
            self.pending.push(Pending::Local(start..self.scratch.len()));
            return match outcome {
                Outcome::Continue => Flow::Continue,
                Outcome::Close => Flow::Close,
            };
        }
        if cmd == Local::Auth && self.auth_as_own_user(args) {
            self.forward(0, None, &encoded(args));
            return Flow::Continue;
        }
        let verified = verify_credentials(&self.shared, cmd, args).await;
        let start = self.scratch.len();
        let outcome = answer::run(
            cmd,
            args,
            &mut self.st,
            &self.shared,
            &mut self.scratch,
            verified,
        );
        self.pending.push(Pending::Local(start..self.scratch.len()));
        if matches!(cmd, Local::Client | Local::Reset | Local::Hello) {
            self.tracking_changed();
        }
        if matches!(cmd, Local::Auth | Local::Reset | Local::Hello) {
            self.user_changed();
        }
        match outcome {
            Outcome::Continue => Flow::Continue,
            Outcome::Close => Flow::Close,
        }
    }

    /// Dispatches a command known to upstream's table by its handling
    /// (`cluster`: whether the upstream was a cluster at dispatch); then
    /// queues its invalidation, `inval`, behind it.
    pub(super) async fn dispatch_handled(
        &mut self,
        info: &CommandInfo,
        lname: &[u8],
        req: &Request,
        inval: Option<Inval>,
        cluster: bool,
    ) -> Flow {
        let args = &req.args;
        if let Some(body) = info.script_body.and_then(|i| args.get(i)) {
            self.shared.pause.saw_script(body);
        }
        match info.handling {
            Handling::Unsupported(why) => {
                self.local_reply(|r| r.error(&format!("ERR {why}")));
            }
            Handling::Blocking => return self.dispatch_blocking(info, lname, req, inval),
            // An ACL user's subscriptions join the shared ones (made as
            // the --upstream user) once Redis said that user may make them.
            Handling::PubSub { sub: true, .. } | Handling::Monitor
                if self.st.user.is_some() && self.refused_to_user(args).await =>
            {
                return Flow::Continue
            }
            Handling::PubSub { kind, sub } => self.pubsub(kind, sub, lname, args).await,
            Handling::Monitor => self.monitor().await,
            Handling::Publish { shard } if args.len() == 3 => {
                let channel = (shard && cluster).then(|| &args[1]);
                let Some((node, slot)) = self.channel_node(channel) else {
                    return Flow::Continue;
                };
                let adjust = subscribed::Adjust::Publish {
                    channel: args[1].clone(),
                    shard,
                };
                self.forward_receivers(node, slot, req, adjust);
            }
            Handling::NumSub { shard } if !cluster || !shard || args.len() <= 3 => {
                let channel = if shard && cluster { args.get(2) } else { None };
                let Some((node, slot)) = self.channel_node(channel) else {
                    return Flow::Continue;
                };
                self.forward_receivers(node, slot, req, subscribed::Adjust::NumSub { shard });
            }
            Handling::MaybeBlocking if blocking::has_block_arg(args) => {
                return self.dispatch_blocking(info, lname, req, inval);
            }
            Handling::Info => self.info(req),
            // An ACL user's SCRIPT KILL and FUNCTION STATS go on its own
            // connections (the control ones are the --upstream user).
            Handling::Kill if self.st.user.is_none() => {
                self.pending.push(Pending::Kill(req.raw.clone()))
            }
            Handling::Control if self.st.user.is_none() => {
                self.pending.push(Pending::Control(req.raw.clone()))
            }
            Handling::Transaction => {
                if !self.start_session(lname, req).await {
                    self.forward(0, None, &req.raw);
                }
            }
            Handling::Scan if cluster => self.scan(req),
            Handling::FanOut(kind) if cluster => self.fan_out(kind, req),
            Handling::Split(kind)
                if cluster
                    && info.arity_ok(args.len())
                    && (kind != Merge::AllOk || args.len() % 2 == 1) =>
            {
                self.split(kind, req);
            }
            // MSET with a key and no value: a cluster node would check the
            // slots first (CROSSSLOT); one Redis, which the proxy presents,
            // refuses the arity.
            Handling::Split(Merge::AllOk) if cluster && args.len().is_multiple_of(2) => {
                self.local_reply(|r| answer::arity_error(r, "mset"));
            }
            _ if matches!(self.fill_route, tracked::FillRoute::Read(_))
                && self.read_on_fill_lane(req) => {}
            _ if std::mem::take(&mut self.fill_route) == tracked::FillRoute::Script => {
                let alone = self.script_on_fill_lane(req, inval).await;
                // Nothing after it overtakes it on another connection.
                if alone {
                    self.flush().await;
                }
                return Flow::Continue;
            }
            _ if !cluster => {
                let node = if self.replica_reads && replica_readable(info) {
                    self.read_node(0, None)
                } else {
                    0
                };
                self.forward(node, None, &req.raw);
            }
            _ => self.forward_keyed(info, req, inval.is_some()),
        }
        if let Some(inval) = inval {
            self.pending.push(Pending::Invalidate(inval));
        }
        if info.name == "config|set" && self.shared.tracked.active() && sets_tracking_limit(args) {
            self.pending.push(Pending::Settle);
        }
        Flow::Continue
    }

    /// Whether Redis refuses this command to the client's ACL user (see
    /// [`Client::user_refusal`]); the refusal is then the client's reply.
    async fn refused_to_user(&mut self, args: &[Bytes]) -> bool {
        match self.user_refusal(args).await {
            Some(frame) => {
                let start = self.scratch.len();
                self.scratch.extend_from_slice(&frame);
                self.pending.push(Pending::Local(start..self.scratch.len()));
                true
            }
            None => false,
        }
    }

    /// Redis's refusal of this command to the client's ACL user, if any:
    /// it is queued between `MULTI` and `DISCARD` on one of the user's
    /// connections, where Redis checks its ACL (`-NOPERM …`) and runs
    /// nothing. A failure to ask is a refusal too. `None` for a client of
    /// the `--upstream` user, and when Redis queued it or refused it for
    /// another reason than the ACL.
    pub(super) async fn user_refusal(&mut self, args: &[Bytes]) -> Option<Bytes> {
        let pool = std::sync::Arc::clone(self.st.user.as_ref()?.pool());
        let node = self.topo.nodes().first().cloned()?;
        let mut payload = BytesMut::new();
        encode::encode_command(&mut payload, &[b"MULTI".as_slice()]);
        let argv: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        encode::encode_command(&mut payload, &argv);
        encode::encode_command(&mut payload, &[b"DISCARD".as_slice()]);
        let up = &self.shared.upstream;
        let wait = up.write_behind().config().queue_timeout;
        let session = sidecache_pool::Session {
            db: self.st.db,
            proto: sidecache_pool::Proto::Resp2,
        };
        match pool
            .hold(
                node.addr(),
                session,
                wait,
                &payload,
                3,
                up.command_timeout(),
            )
            .await
        {
            Ok((conn, replies)) => {
                pool.release(conn, true);
                // Only an ACL refusal: other queue-time errors (an older
                // server's unknown CLIENT subcommand) are not the user's.
                replies
                    .get(1)
                    .filter(|f| {
                        sidecache_resp::frame::error_text(f)
                            .is_some_and(|t| t.starts_with(b"NOPERM"))
                    })
                    .cloned()
            }
            Err(e) => Some(e.reply()),
        }
    }

    /// The node a PUBLISH or PUBSUB NUMSUB goes to: the master of
    /// `channel`'s slot when given (a shard channel on a cluster), else the
    /// first node; `None` once a slot no node serves was answered.
    fn channel_node(&mut self, channel: Option<&Bytes>) -> Option<(usize, Option<Slot>)> {
        let Some(ch) = channel else {
            return Some((0, None));
        };
        let slot = Slot::for_key(ch);
        match self.topo.node_index(slot) {
            Ok(n) => Some((n, Some(slot))),
            Err(e) => {
                self.slot_error(&e);
                None
            }
        }
    }

    /// Forwards a PUBLISH or PUBSUB NUMSUB to `node`, its reply's counts to
    /// be adjusted for the hub's shared subscriptions (`adjust`).
    fn forward_receivers(
        &mut self,
        node: usize,
        slot: Option<Slot>,
        req: &Request,
        adjust: subscribed::Adjust,
    ) {
        let (node, idx) = self.enqueue(node, &req.raw);
        self.pending.push(Pending::Receivers(Box::new(Receivers {
            node,
            idx,
            slot,
            cmd: req.raw.clone(),
            adjust,
        })));
    }

    /// Forwards a command to the master of its first key's slot (a cluster;
    /// no key: the first node); a write (`writes`) records the slot for
    /// WAIT.
    fn forward_keyed(&mut self, info: &CommandInfo, req: &Request, writes: bool) {
        let args = &req.args;
        self.keys.clear();
        let slot = match info.keys(args, &mut self.keys) {
            Ok(_) => self.keys.first().map(|&i| Slot::for_key(&args[i])),
            Err(_) => None,
        };
        if writes && slot.is_some() {
            self.last_write_slot = slot;
        }
        match slot {
            Some(s) => match self.topo.node_index(s) {
                Ok(n) if self.replica_reads && !writes && replica_readable(info) => {
                    let n = self.read_node(n, Some(s));
                    self.forward(n, Some(s), &req.raw);
                }
                Ok(n) => self.forward(n, Some(s), &req.raw),
                Err(e) => self.slot_error(&e),
            },
            None => self.forward(0, None, &req.raw),
        }
    }
}

impl Client {
    /// Whether an AUTH or HELLO leaves the client the user it is, as far
    /// as connections go: no credentials, the upstream's own user checked
    /// upstream, or sidecache's `--requirepass` checked here for a client
    /// of the upstream's user.
    pub(super) fn login_keeps_user(&self, cmd: Local, args: &[Bytes]) -> bool {
        let Some((user, pass)) = answer::credentials(cmd, args) else {
            return true;
        };
        if cmd == Local::Auth && self.auth_as_own_user(args) {
            return true;
        }
        let requirepass = self.shared.config.requirepass.as_deref();
        let enabled = self.shared.users.enabled();
        self.st.user.is_none()
            && matches!(
                crate::state::users::check(user.map(|u| &u[..]), pass, requirepass, enabled),
                crate::state::users::Check::Local(_)
            )
    }

    /// An AUTH that Redis answers on a shared connection: sidecache has no
    /// `--requirepass` of its own, the client is on the shared connections,
    /// and the user named (`AUTH password`: `default`) is the one those
    /// connections are. Redis's reply is the client's (a password set at
    /// run time with `CONFIG SET requirepass`, `-ERR AUTH <password> called
    /// without …`, `-WRONGPASS`), and the connection stays the user it was:
    /// a successful AUTH as its own user changes nothing, a failed one
    /// leaves it as it was.
    pub(super) fn auth_as_own_user(&self, args: &[Bytes]) -> bool {
        let own = self.shared.upstream.auth().username().unwrap_or("default");
        let named = match args.len() {
            2 => &b"default"[..],
            3 => &args[1][..],
            _ => return false,
        };
        self.shared.config.requirepass.is_none()
            && self.st.user.is_none()
            && named == own.as_bytes()
    }
}

/// AUTH or HELLO … AUTH with credentials only the upstream can check
/// (an ACL user; see `state/users.rs`): the upstream's verdict, from
/// a handshake as that user. `None` for anything else.
pub(super) async fn verify_credentials(
    shared: &crate::state::Shared,
    cmd: Local,
    args: &[Bytes],
) -> Option<answer::Verified> {
    let (user, pass) = answer::credentials(cmd, args)?;
    let user = user.map(|u| &u[..]);
    let users = &shared.users;
    let requirepass = shared.config.requirepass.as_deref();
    if crate::state::users::check(user, pass, requirepass, users.enabled())
        != crate::state::users::Check::Upstream
    {
        return None;
    }
    Some(match users.login(&shared.upstream, user, pass).await {
        Ok(login) => answer::Verified::Accepted(login),
        Err(e) => answer::Verified::Refused(e),
    })
}

/// Of `names` (users a CLIENT KILL names), those the upstream has: asked
/// with `ACL GETUSER` on `node`'s control connection (the `--upstream`
/// user's). None when it cannot say (no node, an error such as
/// `-NOPERM`): such a user then gets `No such user`, as before.
pub(super) async fn upstream_users(
    node: Option<std::sync::Arc<sidecache_pool::Node>>,
    names: Vec<Bytes>,
) -> Vec<Bytes> {
    let Some(node) = node else {
        return Vec::new();
    };
    let mut known = Vec::new();
    for name in names {
        let mut cmd = BytesMut::new();
        encode::encode_command(&mut cmd, &[b"ACL".as_slice(), b"GETUSER", &name]);
        // A user is a map (RESP3) or an array (RESP2); no user is a nil.
        if let Ok(f) = node.control_call(cmd.freeze()).await {
            if (f.starts_with(b"*") && !f.starts_with(b"*-1")) || f.starts_with(b"%") {
                known.push(name);
            }
        }
    }
    known
}

/// A command's arguments as RESP.
pub(super) fn encoded(args: &[Bytes]) -> Bytes {
    let mut out = BytesMut::new();
    let argv: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
    encode::encode_command(&mut out, &argv);
    out.freeze()
}

/// Whether a forwarded command may be read from a replica: read-only,
/// with keys (`ROLE`, `DBSIZE`… speak of the node), not blocking, no script (`EVAL_RO`, `FCALL_RO` stay on the master
/// with every script), forwarded as it is.
fn replica_readable(info: &CommandInfo) -> bool {
    info.flags.readonly
        && info.first > 0
        && !info.flags.write
        && !info.flags.blocking
        && !info.flags.pubsub
        && info.handling == Handling::Forward
        && info.invalidation == crate::cmd::handling::Invalidation::None
        && !info.name.starts_with("eval")
        && !info.name.starts_with("fcall")
        && !NODE_LOCAL.iter().any(|n| info.name.starts_with(n))
}

/// Reads whose replies describe the node's own representation, which a
/// replica builds differently (measured with the differential test: a
/// replica's `OBJECT ENCODING` of an appended string, its `XINFO GROUPS`
/// `entries-read`): these stay on the master.
const NODE_LOCAL: &[&str] = &["object", "memory", "xinfo", "debug"];

/// Whether a `CONFIG SET` names `tracking-table-max-keys`.
fn sets_tracking_limit(args: &[Bytes]) -> bool {
    args.iter()
        .skip(2)
        .step_by(2)
        .any(|p| p.eq_ignore_ascii_case(b"tracking-table-max-keys"))
}
