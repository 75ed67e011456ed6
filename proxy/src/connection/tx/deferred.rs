//! Commands inside MULTI that sidecache answers itself: checked at queue
//! time (Redis's queue-time errors), queued upstream as a stand-in (a
//! `PING`, or the protocol switch of a `HELLO`) so EXEC's array keeps its
//! places, and run at EXEC in their places, as Redis runs them.
//!
//! ```text
//!  MULTI, SET k v, CLIENT SETNAME n, HELLO 2 AUTH u p, EXEC
//!    upstream block:  MULTI, SET k v, PING, PING, EXEC
//!    EXEC's array:   [ +OK (Redis's), +OK (CLIENT, run at EXEC),
//!                      HELLO's reply (credentials checked at EXEC) ]
//! ```
//!
//! An AUTH of the upstream's own user (no `--requirepass`) is Redis's to
//! check: at EXEC, on a control connection. A HELLO that switches protocols
//! makes the block run on a held connection switched in its place (and
//! closed after), so the replies after it come in the new protocol, as
//! Redis sends them.

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame;
use sidecache_resp::request::Request;
use sidecache_resp::shape::{self, Shape};

use super::{Deferred, End};
use crate::answer::{self, Local};
use crate::connection::Client;
use crate::pubsub::Kind;
use sidecache_pool::Proto;

/// What Redis answers MONITOR with at EXEC: a transaction's commands may
/// not block.
const MONITOR_IN_EXEC: &str = "ERR MONITOR isn't allowed for DENY BLOCKING client";
/// What Redis answers SSUBSCRIBE with at EXEC, for the same reason.
const SSUBSCRIBE_IN_EXEC: &str = "ERR SSUBSCRIBE isn't allowed for a DENY BLOCKING client";

impl Client {
    /// Redis's queue-time refusal of `req` (wrong arity, a container
    /// without its subcommand), if any.
    fn queue_refusal(&self, lname: &[u8], req: &Request) -> Option<String> {
        match self.shared.table.lookup(&req.args) {
            Some(info) if !info.arity_ok(req.args.len()) => Some(format!(
                "ERR wrong number of arguments for '{}' command",
                info.name
            )),
            // A container found without its subcommand: Redis refuses it
            // at queue time.
            Some(info) if !info.subcommands.is_empty() && !info.name.contains('|') => {
                Some(format!(
                    "ERR unknown subcommand '{}'. Try {} HELP.",
                    String::from_utf8_lossy(req.args.get(1).map_or(&b""[..], |a| &a[..])),
                    String::from_utf8_lossy(lname).to_ascii_uppercase()
                ))
            }
            _ => None,
        }
    }

    /// A locally answered command inside MULTI: checked for arity now (a
    /// queue-time error, as Redis), run at EXEC.
    pub(super) fn tx_defer(&mut self, cmd: Local, lname: &[u8], req: &Request) {
        let refusal = self.queue_refusal(lname, req);
        let tracking = cmd == Local::Client
            && req
                .args
                .get(1)
                .is_some_and(|a| a.eq_ignore_ascii_case(b"tracking"));
        let deferred = if tracking {
            Deferred::Tracking(req.args.clone(), Vec::new())
        } else {
            Deferred::Local(cmd, req.args.clone())
        };
        self.tx_run_at_exec(refusal, deferred, None);
    }

    /// A read queued inside MULTI after a CLIENT TRACKING (of a client
    /// not tracking yet): its keys, to be told of if tracking is on at
    /// EXEC.
    pub(super) fn tx_read_after_tracking(&mut self, keys: impl Iterator<Item = Bytes>) {
        let Some(tx) = self.tx.as_mut() else { return };
        if let Some((_, Deferred::Tracking(_, reads))) = tx
            .deferred
            .iter_mut()
            .rev()
            .find(|(_, d)| matches!(d, Deferred::Tracking(..)))
        {
            reads.extend(keys);
        }
    }

    /// MONITOR inside MULTI: queued, and refused at EXEC as Redis refuses
    /// it there; an ACL user's refusal (`refusal`) comes first.
    pub(super) fn tx_monitor(&mut self, lname: &[u8], req: &Request, refusal: Option<String>) {
        let refusal = refusal.or_else(|| self.queue_refusal(lname, req));
        self.tx_run_at_exec(refusal, Deferred::Refused(MONITOR_IN_EXEC), None);
    }

    /// AUTH or HELLO inside MULTI: queued, and run at EXEC in its place.
    /// An AUTH of the upstream's own user goes upstream as it is (Redis
    /// checks it, as outside a transaction); a HELLO that switches the
    /// protocol is a switch of the held connection in its place.
    pub(super) fn tx_login(&mut self, cmd: Local, lname: &[u8], req: &Request) {
        let refusal = self.queue_refusal(lname, req);
        let switch = match (cmd, req.args.get(1).map(|a| &a[..])) {
            (Local::Hello, Some(b"2")) => Some(Proto::Resp2),
            (Local::Hello, Some(b"3")) => Some(Proto::Resp3),
            _ => None,
        }
        .filter(|p| *p != self.st.proto && refusal.is_none());
        let stand_in = switch.map(|p| {
            if let Some(tx) = self.tx.as_mut() {
                tx.switch = true;
            }
            let n: &[u8] = if p == Proto::Resp3 { b"3" } else { b"2" };
            let mut hello = BytesMut::new();
            encode::encode_command(&mut hello, &[b"HELLO".as_slice(), n]);
            hello
        });
        let deferred = Deferred::Login {
            cmd,
            args: req.args.clone(),
            switch,
        };
        self.tx_run_at_exec(refusal, deferred, stand_in);
    }

    /// AUTH as the upstream's own user, checked by Redis on a control
    /// connection of `node` (which is that user's: a success changes
    /// nothing).
    async fn upstream_auth(
        node: Option<std::sync::Arc<sidecache_pool::Node>>,
        args: &[Bytes],
    ) -> Bytes {
        let Some(node) = node else {
            return Bytes::from_static(b"-ERR upstream topology changed, retry\r\n");
        };
        node.control_reply(super::super::dispatch::encoded(args))
            .await
    }

    /// A PING inside MULTI, queued upstream as it is: after a SUBSCRIBE
    /// of the block, a RESP2 client's gets a subscriber's reply at EXEC
    /// if it is one by then.
    pub(super) fn tx_ping(&mut self) {
        if self.st.proto != Proto::Resp2 {
            return;
        }
        let Some(tx) = self.tx.as_mut() else { return };
        if tx
            .deferred
            .iter()
            .any(|(_, d)| matches!(d, Deferred::Subscribe(..)))
        {
            tx.deferred.push((tx.queued, Deferred::Ping));
        }
    }

    /// A command sidecache answers itself inside MULTI: refused at queue
    /// time (`refusal`: the transaction is then dirty, EXEC aborts), or
    /// queued, upstream queueing `stand_in` (a PING unless given) in its
    /// place, to run at EXEC.
    fn tx_run_at_exec(
        &mut self,
        refusal: Option<String>,
        deferred: Deferred,
        stand_in: Option<BytesMut>,
    ) {
        if let Some(msg) = refusal {
            if let Some(tx) = self.tx.as_mut() {
                tx.dirty = true;
            }
            self.tx_local_error(&msg);
            return;
        }
        let stand_in = stand_in.unwrap_or_else(|| {
            let mut ping = BytesMut::new();
            encode::encode_command(&mut ping, &[b"PING"]);
            ping
        });
        if let Some(tx) = self.tx.as_mut() {
            tx.deferred.push((tx.queued, deferred));
        }
        self.tx_push_raw(&stand_in, true);
    }

    /// (P|S)UNSUBSCRIBE inside MULTI: queued (upstream queues a PING in
    /// its place) and run at EXEC on the client's own subscriptions, its
    /// replies in its place in EXEC's array, as Redis 7 and Valkey 9 do.
    /// Valkey 8.0.0 and 8.0.1 refuse it at queue time from a client that
    /// subscribed to nothing (`-NOSUB`; reverted in Valkey 8.0.2).
    pub(super) async fn tx_unsubscribe(&mut self, kind: Kind, req: &Request) {
        let info = self.shared.upstream.server_info();
        let nosub = info.engine() == "valkey" && matches!(info.engine_version(), "8.0.0" | "8.0.1");
        let refusal = match self.user_refusal(&req.args).await {
            Some(f) => sidecache_resp::frame::error_text(&f)
                .map(|t| String::from_utf8_lossy(t).into_owned()),
            None if nosub && !self.in_pubsub() => Some(format!(
                "NOSUB '{}' command executed not in subscribed mode",
                String::from_utf8_lossy(&req.args[0]).to_ascii_lowercase()
            )),
            None => None,
        };
        self.tx_run_at_exec(refusal, Deferred::Unsubscribe(kind, req.args.clone()), None);
    }

    /// (P|S)SUBSCRIBE inside MULTI: queued (upstream queues a PING in its
    /// place) and run at EXEC, its replies in its place in EXEC's array,
    /// the client in pub/sub from then on, as on Redis 7 and Valkey.
    pub(super) async fn tx_subscribe(&mut self, kind: Kind, req: &Request) {
        let refusal = if req.args.len() < 2 {
            Some(format!(
                "ERR wrong number of arguments for '{}' command",
                String::from_utf8_lossy(&req.args[0]).to_ascii_lowercase()
            ))
        } else {
            self.user_refusal(&req.args).await.and_then(|f| {
                sidecache_resp::frame::error_text(&f)
                    .map(|t| String::from_utf8_lossy(t).into_owned())
            })
        };
        // Redis runs a transaction's commands as a client that may not
        // block, which SSUBSCRIBE refuses.
        let deferred = match kind {
            Kind::Shard => Deferred::Refused(SSUBSCRIBE_IN_EXEC),
            _ => Deferred::Subscribe(kind, req.args.clone()),
        };
        self.tx_run_at_exec(refusal, deferred, None);
    }

    /// Puts the replies of locally answered commands, run now (at EXEC,
    /// as Redis runs them), in their places in EXEC's array.
    pub(super) async fn run_deferred(
        &mut self,
        mut frames: Vec<Bytes>,
        end: End,
        deferred: &[(usize, Deferred)],
        selects: &[(usize, Vec<Bytes>)],
    ) -> Vec<Bytes> {
        if end != End::Exec || (deferred.is_empty() && selects.is_empty()) {
            return frames;
        }
        let Some(last) = frames.pop() else {
            return frames;
        };
        let Ok(Some(mut items)) = frame::array_elements(&last) else {
            frames.push(last);
            return frames;
        };
        // From the place after each login on: the protocol the block's
        // replies come in (a HELLO switched the held connection), and the
        // client's.
        let mut protos: Vec<(usize, Proto, Proto)> = Vec::new();
        let (mut tracking, mut login) = (false, false);
        let mut late_reads: &[Bytes] = &[];
        let before = self.st.proto;
        for (at, cmd) in deferred {
            let mut out = BytesMut::new();
            match cmd {
                Deferred::Local(Local::Client, args) if answer::is_kill(args) => {
                    let node = self.topo.nodes().first().cloned();
                    let names = answer::named_users(args, &self.shared);
                    let users = super::super::dispatch::upstream_users(node, names).await;
                    answer::client_kill(args, &self.st, &self.shared, &mut out, &users);
                }
                Deferred::Local(cmd, args) => {
                    answer::run(*cmd, args, &mut self.st, &self.shared, &mut out, None);
                }
                Deferred::Tracking(args, reads) => {
                    answer::run(
                        Local::Client,
                        args,
                        &mut self.st,
                        &self.shared,
                        &mut out,
                        None,
                    );
                    tracking = true;
                    late_reads = reads;
                }
                // The upstream's own user: Redis checks it, outside the
                // block (Valkey 8.0 leaves a refused AUTH's reply out of
                // EXEC's array, which would leave the block's replies one
                // short).
                Deferred::Login { cmd, args, .. }
                    if *cmd == Local::Auth && self.auth_as_own_user(args) =>
                {
                    let node = self.topo.nodes().first().cloned();
                    out.extend_from_slice(&Self::upstream_auth(node, args).await);
                }
                Deferred::Login { cmd, args, switch } => {
                    let verified =
                        super::super::dispatch::verify_credentials(&self.shared, *cmd, args).await;
                    answer::run(*cmd, args, &mut self.st, &self.shared, &mut out, verified);
                    let wire = switch.or(protos.last().map(|p| p.1)).unwrap_or(before);
                    protos.push((*at, wire, self.st.proto));
                    (tracking, login) = (true, true);
                }
                // Redis answers a RESP2 subscriber's PING as a message:
                // `pong` and its argument (empty without one).
                Deferred::Ping => {
                    let Some(item) = items.get(*at) else { continue };
                    if self.st.proto == Proto::Resp2 && self.in_pubsub() {
                        match item.first() {
                            Some(b'+') => out.extend_from_slice(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"),
                            Some(b'$') => {
                                out.extend_from_slice(b"*2\r\n$4\r\npong\r\n");
                                out.extend_from_slice(item);
                            }
                            _ => out.extend_from_slice(item),
                        }
                    } else {
                        out.extend_from_slice(item);
                    }
                }
                Deferred::Refused(msg) => {
                    sidecache_resp::encode::Reply {
                        out: &mut out,
                        proto: self.st.proto,
                    }
                    .error(msg);
                }
                // One frame per name, all in its one place: EXEC's array
                // counts commands, not frames, as on Redis.
                Deferred::Unsubscribe(kind, args) => {
                    let before = self.in_pubsub();
                    self.unsubscribe_into(*kind, args, &mut out);
                    self.note_mode(before);
                }
                Deferred::Subscribe(kind, args) => {
                    let before = self.in_pubsub();
                    if let Err(msg) = self.subscribe_into(*kind, args, &mut out).await {
                        out.extend_from_slice(format!("-{msg}\r\n").as_bytes());
                    }
                    self.note_mode(before);
                }
            }
            if let Some(item) = items.get_mut(*at) {
                *item = out.freeze();
            }
        }
        if tracking {
            self.tracking_changed();
            // Reads that ran after tracking went on, on a connection Redis
            // does not follow for sidecache: told of after EXEC's reply,
            // as any read sidecache does not follow.
            if self.st.tracking.tracks_reads_with(None) && !self.st.tracking.bcast {
                let db = self.st.db;
                for key in late_reads {
                    self.shared.tracked.register(self.st.id, key);
                    self.tracked_reads.push((db, key.clone(), false));
                }
            }
        }
        if login {
            self.user_changed();
        }
        // A HELLO whose switch went upstream but failed here (bad
        // credentials): the replies after it back to the client's protocol.
        if protos.iter().any(|&(_, wire, client)| wire != client) {
            for (i, item) in items.iter_mut().enumerate() {
                let Some(&(_, wire, client)) = protos.iter().rev().find(|(at, ..)| *at < i) else {
                    continue;
                };
                if wire != client && !deferred.iter().any(|(at, _)| *at == i) {
                    let mut b = BytesMut::new();
                    if shape::convert(item, Shape::Plain, wire, client, &mut b).is_ok() {
                        *item = b.freeze();
                    }
                }
            }
        }
        // A SELECT that ran moves the client to its database.
        for (at, args) in selects {
            if items.get(*at).is_some_and(|i| i.first() == Some(&b'+')) {
                let mut out = BytesMut::new();
                answer::run(
                    Local::Select,
                    args,
                    &mut self.st,
                    &self.shared,
                    &mut out,
                    None,
                );
            }
        }
        if deferred.is_empty() {
            frames.push(last);
            return frames;
        }
        let mut array = BytesMut::new();
        encode::put_header(&mut array, b'*', items.len() as i64);
        for i in &items {
            array.put_slice(i);
        }
        frames.push(array.freeze());
        frames
    }
}
