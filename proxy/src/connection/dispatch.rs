//! The steps of [`Client::dispatch`] past its fast paths (an L1 GET, a
//! write-behind SET): a command the proxy answers itself, and a forwarded
//! command by its handling.

use bytes::{Bytes, BytesMut};
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::request::Request;

use super::{blocking, subscribed, Client, Flow, Inval, Pending, Receivers};
use crate::cmd::handling::{Handling, Merge};
use crate::cmd::local::{self, Local, Outcome};
use crate::cmd::table::CommandInfo;

impl Client {
    /// Dispatches a command the proxy answers itself (`cmd`), or, for PING
    /// while a node is not known healthy, hands to upstream.
    pub(super) async fn dispatch_local(&mut self, cmd: Local, args: &[Bytes]) -> Flow {
        self.metrics.command(self.shared.metrics.local_id(cmd));
        if !self.st.authenticated && !cmd.allowed_unauthenticated() {
            self.local_reply(|r| r.error("NOAUTH Authentication required."));
            return Flow::Continue;
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
        let start = self.scratch.len();
        let outcome = local::run(cmd, args, &mut self.st, &self.shared, &mut self.scratch);
        self.pending.push(Pending::Local(start..self.scratch.len()));
        if matches!(cmd, Local::Client | Local::Reset | Local::Hello) {
            self.tracking_changed();
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
        match info.handling {
            Handling::Unsupported(why) => {
                self.local_reply(|r| r.error(&format!("ERR {why}")));
            }
            Handling::Blocking => return self.dispatch_blocking(info, lname, req, inval),
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
            Handling::Kill => self.pending.push(Pending::Kill(req.raw.clone())),
            Handling::Control => self.pending.push(Pending::Control(req.raw.clone())),
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
                self.local_reply(|r| local::arity_error(r, "mset"));
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
        Flow::Continue
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
