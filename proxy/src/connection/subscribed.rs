//! A client's subscriptions and MONITOR: its side of the shared hub
//! ([`crate::pubsub`]).
//!
//! ```text
//!  SUBSCRIBE a b ─▶ earlier commands resolved ─▶ hub.subscribe(a), (b) ─▶ confirmations (pending, in order)
//!  hub ─▶ outbox ─▶ (connection loop, between batches) ─▶ wbuf ─▶ client
//! ```
//!
//! The connection keeps its normal loop: in RESP3 any command runs while
//! subscribed, its replies and the pushes interleaved at reply boundaries;
//! in RESP2 only (P|S)SUBSCRIBE, (P|S)UNSUBSCRIBE, PING, QUIT and RESET
//! are accepted, with Redis's error for the rest and its `pong` reply.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sidecache_pool::cluster::redirect;
use sidecache_pool::Proto;
use sidecache_resp::encode::{self, put_header};
use sidecache_resp::frame::Value;
use sidecache_resp::request::Request;
use tokio::sync::mpsc;

use super::{Client, Pending};
use crate::answer;
use crate::cmd::route::{self, Route};
use crate::pubsub::{Delivery, Kind, Outbox};

/// A client's subscriptions and its outbox.
pub(super) struct Subs {
    channels: HashSet<Bytes>,
    patterns: HashSet<Bytes>,
    shard: HashSet<Bytes>,
    monitor: bool,
    outbox: Arc<Outbox>,
    rx: mpsc::Receiver<Delivery>,
}

impl Subs {
    fn set(&mut self, kind: Kind) -> &mut HashSet<Bytes> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
            Kind::Shard => &mut self.shard,
        }
    }

    /// The count Redis puts in a (un)subscribe reply of this kind.
    fn count(&self, kind: Kind) -> i64 {
        match kind {
            Kind::Shard => self.shard.len() as i64,
            _ => (self.channels.len() + self.patterns.len()) as i64,
        }
    }

    fn total(&self) -> usize {
        self.channels.len() + self.patterns.len() + self.shard.len()
    }
}

/// What the connection loop waits for besides the client's requests.
pub(super) enum Next {
    Delivery(Delivery),
    /// Past its output limit: disconnect.
    Doomed,
}

/// The next delivery for this client; never ready without subscriptions.
pub(super) async fn next(subs: &mut Option<Box<Subs>>) -> Next {
    let Some(s) = subs else {
        return std::future::pending().await;
    };
    tokio::select! {
        biased;
        () = s.outbox.doom.notified() => Next::Doomed,
        d = s.rx.recv() => d.map_or(Next::Doomed, Next::Delivery),
    }
}

/// Most outbox bytes drained into one write.
const DRAIN_BYTES: usize = 64 * 1024;

/// Why a subscribed client's write ended it.
#[derive(Debug)]
pub(super) struct Doomed;

impl Client {
    /// Whether this client is subscribed to anything (RESP2's subscribed
    /// mode).
    pub(super) fn in_pubsub(&self) -> bool {
        self.subs.as_ref().is_some_and(|s| s.total() > 0)
    }

    /// Whether `--timeout` spares this client (subscribed or in MONITOR,
    /// as Redis spares pubsub clients and monitors).
    pub(super) fn timeout_exempt(&self) -> bool {
        self.subs
            .as_ref()
            .is_some_and(|s| s.monitor || s.total() > 0)
    }

    pub(super) fn subs_mut(&mut self) -> &mut Subs {
        let hub = &self.shared.pubsub;
        let tracked = &self.shared.tracked;
        let id = self.st.id;
        self.subs.get_or_insert_with(|| {
            let (outbox, rx) = Outbox::new(hub);
            // A possible CLIENT TRACKING REDIRECT target from now on.
            tracked.add_outbox(id, &outbox);
            Box::new(Subs {
                channels: HashSet::new(),
                patterns: HashSet::new(),
                shard: HashSet::new(),
                monitor: false,
                outbox,
                rx,
            })
        })
    }

    /// RESP2 subscribed mode: refuses what Redis refuses, answers PING as
    /// Redis does there. `true` when the command was answered.
    pub(super) fn pubsub_guard(&mut self, lname: &[u8], req: &Request) -> bool {
        if self.st.proto != Proto::Resp2 || !self.in_pubsub() {
            return false;
        }
        match lname {
            b"subscribe" | b"psubscribe" | b"ssubscribe" | b"unsubscribe" | b"punsubscribe"
            | b"sunsubscribe" | b"quit" | b"reset" => false,
            b"ping" if req.args.len() <= 2 => {
                self.commands += 1;
                let arg = req.args.get(1).cloned().unwrap_or_default();
                self.local_reply(|r| {
                    put_header(r.out, b'*', 2);
                    encode::put_bulk(r.out, b"pong");
                    encode::put_bulk(r.out, &arg);
                });
                true
            }
            _ => {
                self.commands += 1;
                let name = String::from_utf8_lossy(lname).into_owned();
                self.local_reply(|r| {
                    r.error(&format!(
                        "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"
                    ))
                });
                true
            }
        }
    }

    /// (P|S)SUBSCRIBE and (P|S)UNSUBSCRIBE.
    pub(super) async fn pubsub(&mut self, kind: Kind, sub: bool, lname: &[u8], args: &[Bytes]) {
        if sub && args.len() < 2 {
            let name = String::from_utf8_lossy(lname).into_owned();
            self.local_reply(|r| answer::arity_error(r, &name));
            return;
        }
        // What came before is resolved first: a PUBLISH sent before this
        // SUBSCRIBE does not reach it, as in Redis.
        if !self.pending.is_empty() {
            self.flush().await;
        }
        let before = self.in_pubsub();
        // Consumed by `silence_from` right after this command.
        self.pushed = self.st.reply != answer::ReplyMode::On;
        if sub {
            self.subscribe(kind, args).await;
        } else {
            self.unsubscribe(kind, args);
        }
        self.note_mode(before);
    }

    /// After (P|S)(UN)SUBSCRIBE: the client's counts in CLIENT LIST and
    /// the subscriber gauge follow whether it is now in pub/sub (`before`:
    /// whether it was).
    pub(super) fn note_mode(&mut self, before: bool) {
        let now = self.in_pubsub();
        let counts = self.subs.as_ref().map_or([0; 3], |s| {
            [s.channels.len(), s.patterns.len(), s.shard.len()]
        });
        if counts != self.st.entry.subs {
            self.st.entry.subs = counts;
            let (id, entry) = (self.st.id, self.st.entry.clone());
            self.shared.with_clients(|c| {
                c.insert(id, entry);
            });
        }
        let stats = &self.shared.pubsub.stats;
        match (before, now) {
            (false, true) => {
                stats.subscribers.fetch_add(1, Ordering::Relaxed);
                // An idle subscriber keeps small buffers.
                if self.wbuf.is_empty() {
                    self.wbuf = BytesMut::new();
                }
            }
            (true, false) => {
                stats.subscribers.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    async fn subscribe(&mut self, kind: Kind, args: &[Bytes]) {
        let start = self.scratch.len();
        let mut out = std::mem::take(&mut self.scratch);
        let done = self.subscribe_into(kind, args, &mut out).await;
        self.scratch = out;
        self.pending.push(Pending::Local(start..self.scratch.len()));
        if let Err(msg) = done {
            self.local_reply(|r| r.error(&msg));
        }
    }

    /// (P|S)SUBSCRIBE of `args`' names: each joins the client's
    /// subscriptions (and the hub's upstream ones), and its reply frame
    /// goes to `out`. Stops at the first name that cannot be subscribed,
    /// with the error to answer in its place.
    pub(super) async fn subscribe_into(
        &mut self,
        kind: Kind,
        args: &[Bytes],
        out: &mut BytesMut,
    ) -> Result<(), String> {
        let cluster = self.topo.is_cluster();
        // Where a new upstream subscription goes: a shard channel's
        // master (all of them in one slot, as Redis Cluster demands), any
        // node for the classic kinds.
        let node = if kind == Kind::Shard && cluster {
            let channels: Vec<usize> = (1..args.len()).collect();
            let Ok(slot) = route::one_slot(args, &channels, None) else {
                return Err(route::CROSSSLOT.to_owned());
            };
            match route::to_slot(slot, &*self.topo) {
                Route::Node { node, .. } => node,
                Route::Unserved(e) => {
                    self.shared.upstream.request_refresh();
                    return Err(format!("CLUSTERDOWN Hash slot not served ({e})"));
                }
                Route::CrossSlot => return Ok(()),
            }
        } else {
            0
        };
        let Some(addr) = self.topo.nodes().get(node).map(|n| n.addr().clone()) else {
            return Err("CLUSTERDOWN Hash slot not served".to_owned());
        };
        let hub = Arc::clone(&self.shared.pubsub);
        let sessions = Arc::clone(self.shared.upstream.sessions());
        let id = self.st.id;
        let push = self.push_kind();
        for name in &args[1..] {
            let subs = self.subs_mut();
            if !subs.set(kind).contains(name) {
                let outbox = Arc::clone(&subs.outbox);
                let mut to = addr.clone();
                let mut attempt = 0;
                // A shard channel's slot moved: follow MOVED, as a cluster
                // client would (the slot map is refreshed meanwhile).
                let done = loop {
                    match hub.subscribe(kind, name, id, &outbox, &to, &sessions).await {
                        Err(crate::pubsub::HubError::Refused(t)) if kind == Kind::Shard => {
                            let frame = format!("-{t}\r\n");
                            match redirect::decide(frame.as_bytes(), attempt) {
                                redirect::Action::Moved { addr, .. } => {
                                    self.shared.upstream.request_refresh();
                                    to = addr;
                                    attempt += 1;
                                }
                                _ => break Err(crate::pubsub::HubError::Refused(t)),
                            }
                        }
                        r => break r,
                    }
                };
                if let Err(e) = done {
                    return Err(match e {
                        crate::pubsub::HubError::Refused(t) => t,
                        other => format!("ERR sidecache: {other}"),
                    });
                }
                self.subs_mut().set(kind).insert(name.clone());
            }
            let count = self.subs_mut().count(kind);
            put_header(out, push, 3);
            encode::put_bulk(out, kind.reply_name(true));
            encode::put_bulk(out, name);
            put_header(out, b':', count);
        }
        Ok(())
    }

    fn unsubscribe(&mut self, kind: Kind, args: &[Bytes]) {
        let start = self.scratch.len();
        let mut out = std::mem::take(&mut self.scratch);
        self.unsubscribe_into(kind, args, &mut out);
        self.scratch = out;
        self.pending.push(Pending::Local(start..self.scratch.len()));
    }

    /// (P|S)UNSUBSCRIBE of `args`' names (none: all of `kind`): each leaves
    /// the client's subscriptions, and its reply frame goes to `out`.
    pub(super) fn unsubscribe_into(&mut self, kind: Kind, args: &[Bytes], out: &mut BytesMut) {
        let push = self.push_kind();
        let proto = self.st.proto;
        let id = self.st.id;
        let hub = Arc::clone(&self.shared.pubsub);
        let names: Vec<Bytes> = if args.len() >= 2 {
            args[1..].to_vec()
        } else {
            self.subs
                .as_mut()
                .map(|s| s.set(kind).iter().cloned().collect())
                .unwrap_or_default()
        };
        let one = |out: &mut BytesMut, name: Option<&Bytes>, count: i64| {
            put_header(out, push, 3);
            encode::put_bulk(out, kind.reply_name(false));
            match (name, proto) {
                (Some(n), _) => encode::put_bulk(out, n),
                (None, Proto::Resp3) => out.extend_from_slice(b"_\r\n"),
                (None, Proto::Resp2) => out.extend_from_slice(b"$-1\r\n"),
            }
            put_header(out, b':', count);
        };
        if names.is_empty() {
            let count = self.subs.as_ref().map_or(0, |s| s.count(kind));
            one(out, None, count);
        }
        for name in &names {
            let count = match self.subs.as_mut() {
                Some(s) => {
                    if s.set(kind).remove(name) {
                        hub.unsubscribe(kind, name, id);
                    }
                    s.count(kind)
                }
                None => 0,
            };
            one(out, Some(name), count);
        }
    }

    fn push_kind(&self) -> u8 {
        if self.st.proto == Proto::Resp3 {
            b'>'
        } else {
            b'*'
        }
    }

    /// MONITOR: every command this proxy receives from now on.
    pub(super) async fn monitor(&mut self) {
        let id = self.st.id;
        let hub = Arc::clone(&self.shared.pubsub);
        let sessions = Arc::clone(self.shared.upstream.sessions());
        let nodes = self.topo.nodes().iter().map(|n| n.addr().clone()).collect();
        let subs = self.subs_mut();
        subs.monitor = true;
        let outbox = Arc::clone(&subs.outbox);
        hub.monitor(id, &outbox, nodes, &sessions).await;
        self.local_reply(|r| r.ok());
    }

    /// Feeds a command to the MONITOR clients (called only while there
    /// are any).
    pub(super) fn monitor_feed(&self, req: &Request) {
        if !self.st.authenticated && !req.args[0].eq_ignore_ascii_case(b"auth") {
            return;
        }
        if req.args[0].eq_ignore_ascii_case(b"monitor") {
            return;
        }
        // As Redis: only commands that run (known, right arity), and not
        // the administrative ones.
        match self.shared.table.lookup(&req.args) {
            Some(i) if !i.flags.no_monitor && i.arity_ok(req.args.len()) => {}
            _ => return,
        }
        let line = crate::pubsub::monitor::line(self.st.db, &self.st.entry.addr, &req.args);
        self.shared.pubsub.feed(line);
    }

    /// Ends every subscription and MONITOR (RESET, disconnect).
    pub(super) fn leave_pubsub(&mut self) {
        let Some(mut s) = self.subs.take() else {
            return;
        };
        // RESET publishes the entry next; a closed client's is gone.
        self.st.entry.subs = [0; 3];
        let hub = &self.shared.pubsub;
        let id = self.st.id;
        if s.total() > 0 {
            hub.stats.subscribers.fetch_sub(1, Ordering::Relaxed);
        }
        for kind in [Kind::Channel, Kind::Pattern, Kind::Shard] {
            for name in s.set(kind).drain() {
                hub.unsubscribe(kind, &name, id);
            }
        }
        if s.monitor {
            hub.unmonitor(id);
        }
    }

    /// Writes `first` and whatever else is queued (up to a bound) to
    /// `wbuf`; returns the outbox bytes they stand for, or `None` when the
    /// client must be closed (its subscription's link broke).
    pub(super) fn take_deliveries(&mut self, first: Delivery) -> Option<usize> {
        // Bounded by what it adds: `wbuf` may already hold the batch's replies.
        let start = self.wbuf.len();
        let mut weight = 0;
        let mut next = Some(first);
        while let Some(d) = next {
            weight += d.weight();
            match d {
                Delivery::Lost => return None,
                Delivery::Monitor(line) => self.wbuf.extend_from_slice(&line),
                Delivery::Message(m) => {
                    let push = self.push_kind();
                    let out = &mut self.wbuf;
                    match m.kind {
                        Kind::Pattern => {
                            put_header(out, push, 4);
                            encode::put_bulk(out, b"pmessage");
                            encode::put_bulk(out, &m.pattern);
                        }
                        Kind::Channel => {
                            put_header(out, push, 3);
                            encode::put_bulk(out, b"message");
                        }
                        Kind::Shard => {
                            put_header(out, push, 3);
                            encode::put_bulk(out, b"smessage");
                        }
                    }
                    encode::put_bulk(out, &m.channel);
                    encode::put_bulk(out, &m.payload);
                }
                Delivery::Invalidate(keys) => self.put_invalidation(keys.as_deref()),
                Delivery::RedirectBroken(id) => {
                    // RESP3 only: RESP2 has no push outside pub/sub.
                    if self.st.proto == Proto::Resp3 {
                        put_header(&mut self.wbuf, b'>', 2);
                        encode::put_bulk(&mut self.wbuf, b"tracking-redir-broken");
                        put_header(&mut self.wbuf, b':', id as i64);
                    }
                }
                Delivery::ShardUnsubscribed(name) => {
                    let push = self.push_kind();
                    let before = self.in_pubsub();
                    let count = match self.subs.as_mut() {
                        Some(s) => {
                            s.shard.remove(&name);
                            s.count(Kind::Shard)
                        }
                        None => 0,
                    };
                    self.note_mode(before);
                    put_header(&mut self.wbuf, push, 3);
                    encode::put_bulk(&mut self.wbuf, b"sunsubscribe");
                    encode::put_bulk(&mut self.wbuf, &name);
                    put_header(&mut self.wbuf, b':', count);
                }
            }
            if self.wbuf.len() - start >= DRAIN_BYTES {
                break;
            }
            next = self.subs.as_mut().and_then(|s| s.rx.try_recv().ok());
        }
        Some(weight)
    }

    /// A CLIENT TRACKING invalidation, as Redis writes it to this client:
    /// a push in RESP3; in RESP2 a message on `__redis__:invalidate` if
    /// the client is subscribed to anything (a REDIRECT target), else
    /// nothing (RESP2 has no push outside pub/sub).
    pub(super) fn put_invalidation(&mut self, keys: Option<&[Bytes]>) {
        let out = &mut self.wbuf;
        let body = |out: &mut BytesMut, nil: &[u8]| match keys {
            Some(keys) => {
                put_header(out, b'*', keys.len() as i64);
                for k in keys {
                    encode::put_bulk(out, k);
                }
            }
            None => out.extend_from_slice(nil),
        };
        if self.st.proto == Proto::Resp3 {
            put_header(out, b'>', 2);
            encode::put_bulk(out, b"invalidate");
            body(out, b"_\r\n");
        } else if self.subs.as_ref().is_some_and(|s| s.total() > 0) {
            put_header(out, b'*', 3);
            encode::put_bulk(out, b"message");
            encode::put_bulk(out, b"__redis__:invalidate");
            body(out, b"$-1\r\n");
        }
    }

    /// Writes what the outbox holds now, without waiting: `Some(weight)`
    /// (0: nothing), or `None` when the client must be closed.
    pub(super) fn take_ready(&mut self) -> Option<usize> {
        match self.subs.as_mut().map(|s| s.rx.try_recv()) {
            // A tracking client's batch: some may go before its replies.
            Some(Ok(d)) if self.st.tracking.on => self.take_early(d),
            Some(Ok(d)) => self.take_deliveries(d),
            _ => Some(0),
        }
    }

    /// The outbox's next message, without waiting.
    pub(super) fn next_delivery(&mut self) -> Option<Delivery> {
        self.subs.as_mut().and_then(|s| s.rx.try_recv().ok())
    }

    /// `weight` outbox bytes reached the client.
    pub(super) fn delivered(&self, weight: usize) {
        if let Some(s) = &self.subs {
            s.outbox.written(weight);
        }
    }

    /// Writes `wbuf` to the client; for a client with an outbox, gives up
    /// when it is doomed (a slow subscriber whose socket is full).
    pub(super) async fn write_watched<S: tokio::io::AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
    ) -> Result<(), Doomed> {
        match &self.subs {
            None => super::write_out(stream, &mut self.wbuf, &self.st.entry.activity)
                .await
                .map_err(|_| Doomed),
            Some(s) => {
                let outbox = Arc::clone(&s.outbox);
                if outbox.doomed() {
                    return Err(Doomed);
                }
                tokio::select! {
                    r = super::write_out(stream, &mut self.wbuf, &self.st.entry.activity) => r.map_err(|_| Doomed),
                    () = outbox.doom.notified() => Err(Doomed),
                }
            }
        }
    }

    /// A PUBLISH/SPUBLISH or PUBSUB NUMSUB/SHARDNUMSUB reply from upstream,
    /// with this hub's one upstream subscription per topic replaced by the
    /// local subscribers it stands for.
    pub(super) fn adjust_receivers(&mut self, frame: &Bytes, adjust: &Adjust) {
        let hub = &self.shared.pubsub;
        match adjust {
            Adjust::Publish { channel, shard } => match Value::decode(frame) {
                Ok(Value::Int(n)) => {
                    let (local, ours) = hub.receivers(channel, *shard);
                    put_header(&mut self.wbuf, b':', (n - ours).max(0) + local);
                }
                _ => self.wbuf.extend_from_slice(frame),
            },
            Adjust::NumSub { shard } => match Value::decode(frame) {
                Ok(Value::Array(items)) if items.len() % 2 == 0 => {
                    put_header(&mut self.wbuf, b'*', items.len() as i64);
                    for pair in items.chunks(2) {
                        let (Some(ch), Some(n)) = (pair[0].as_bytes(), pair[1].as_int()) else {
                            encode::put_bulk(&mut self.wbuf, b"");
                            put_header(&mut self.wbuf, b':', 0);
                            continue;
                        };
                        let (local, ours) = hub.numsub(ch, *shard);
                        encode::put_bulk(&mut self.wbuf, ch);
                        put_header(&mut self.wbuf, b':', (n - ours).max(0) + local);
                    }
                }
                _ => self.wbuf.extend_from_slice(frame),
            },
        }
    }
}

/// How a forwarded reply's receiver counts are adjusted.
#[derive(Debug)]
pub(super) enum Adjust {
    /// PUBLISH (or SPUBLISH) to this channel.
    Publish { channel: Bytes, shard: bool },
    /// PUBSUB NUMSUB (or SHARDNUMSUB).
    NumSub { shard: bool },
}
