//! Transactions (MULTI/EXEC/DISCARD) and WATCH, answered by Redis itself.
//!
//! ```text
//!  MULTI … EXEC in one batch, no WATCH:
//!    MULTI ─┐ collected (raw, in order; nothing from the L1, nothing
//!    cmd …  ├─ written behind)                        one contiguous block
//!    EXEC  ─┘ ─────────────────────────────▶ builder[node] ─▶ shared pipelined connection
//!    replies: +OK, +QUEUED/errors …, EXEC's array ◀── Redis's own, verbatim
//!
//!  WATCH …, or a MULTI still open when the batch ends:
//!    held connection (bounded pool) ──▶ WATCH / MULTI + cmds / … / EXEC
//!    released at EXEC, DISCARD, UNWATCH; closed at RESET, QUIT, disconnect
//! ```
//!
//! Every reply a transaction gets (`+QUEUED`, queue-time errors, the EXEC
//! array, `-EXECABORT`, a nil EXEC after a WATCH) comes from Redis: the
//! proxy only collects the commands so that nothing of another client is
//! interleaved, picks the node (the slot of the first keyed command, or
//! of WATCH; Redis Cluster itself then answers `-CROSSSLOT` for a command
//! of another slot), and never lets its own machinery (L1, write-behind,
//! local answers) act inside a transaction.
//!
//! Order: a block goes to its node after every write queued for that node
//! (this client's write-behind writes included) has landed, as any
//! forwarded command does; writes of this client after EXEC are queued only
//! after the block was answered. Keys the transaction may write leave the
//! L1 at queue time and again when EXEC is answered.
//!
//! What a shared connection must never carry stays out of a block:
//! commands that change the connection itself are run by sidecache at EXEC
//! in their place (CLIENT, AUTH, HELLO, (P|S)(UN)SUBSCRIBE, MONITOR's
//! refusal; see `deferred`), SELECT goes upstream in its place and is
//! followed, and a HELLO that switches protocols moves the block to a held
//! connection. Only REPLCONF (replication is not proxied) and sidecache's
//! own SIDECACHE are refused inside MULTI, and the EXEC then aborts
//! (`-EXECABORT`) without running anything.

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::SessionConn;
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::request::Request;
use smallvec::SmallVec;

use super::{Client, Flow, Inval, Pending};

mod deferred;
mod run;
use crate::answer::{self, Local, Outcome};
use crate::pubsub::Kind;

/// The reply Redis gives EXEC after a queue-time error.
const EXECABORT: &[u8] = b"-EXECABORT Transaction discarded because of previous errors.\r\n";

/// An open MULTI: its commands, collected until EXEC or DISCARD.
#[derive(Debug, Default)]
pub(super) struct TxBlock {
    /// Commands not sent yet, encoded, in order.
    buf: BytesMut,
    /// How many.
    count: usize,
    /// Where each reply of the commands in `buf` comes from, in order:
    /// `None` the next upstream reply, `Some` a local error.
    order: Vec<Option<Bytes>>,
    /// The slot the transaction is bound to (cluster).
    slot: Option<Slot>,
    /// What its writes make the L1 drop.
    inval: Option<Inval>,
    /// A command was refused locally: EXEC aborts.
    dirty: bool,
    /// MULTI is already open on the held connection.
    on_held: bool,
    /// Commands queued so far (their places in EXEC's array).
    queued: usize,
    /// Upstream lost the transaction (no connection would take it, or it
    /// broke): answered locally until its EXEC, which aborts.
    lost: bool,
    /// Locally answered commands, run at EXEC: (place in EXEC's array,
    /// command).
    deferred: Vec<(usize, Deferred)>,
    /// SELECTs sent upstream inside the block: (place in EXEC's array,
    /// arguments).
    selects: Vec<(usize, Vec<Bytes>)>,
    /// Keys its writes give a time to live, and how long (for tracking
    /// clients' expiry messages, started at EXEC).
    pub(super) expiries: Vec<(Bytes, std::time::Duration)>,
    /// A tracking client's reads of keys the block wrote before them (and
    /// not after): Redis follows them for the client from that read on,
    /// past the write. `true`: the client was not following the key
    /// before, so the write tells it nothing either.
    reread: Vec<(Bytes, bool)>,
    /// A tracking client's reads (default mode, no script): place in
    /// EXEC's array, the command, its keys. Run on a held connection,
    /// which Redis does not follow for sidecache, they are read again on a
    /// fill lane after EXEC (`Client::tx_follow`).
    pub(super) reads: Vec<(usize, Bytes, SmallVec<[Bytes; 2]>)>,
    /// A queued command may change data: CLIENT PAUSE WRITE holds EXEC.
    pub(super) writes: bool,
    /// A queued HELLO switches the protocol: the block runs on a held
    /// connection, switched in its place and closed after.
    switch: bool,
    /// Cluster, a held connection, no slot bound yet: what was sent on it
    /// (MULTI, keyless commands), and how many, sent again if a key then
    /// binds the transaction to another master (`Client::held_send`).
    sent: BytesMut,
    sent_count: usize,
}

impl TxBlock {
    /// A tracking client (default mode) queued `raw`, a read of `keys`
    /// (no script); `registered`: whether it followed a key already.
    pub(super) fn read(
        &mut self,
        raw: &Bytes,
        keys: SmallVec<[Bytes; 2]>,
        registered: impl Fn(&Bytes) -> bool,
    ) {
        for key in &keys {
            let written = match &self.inval {
                Some(Inval::All) => true,
                Some(Inval::Keys(w)) => w.contains(key),
                None => false,
            };
            if written && !self.reread.iter().any(|(k, _)| k == key) {
                self.reread.push((key.clone(), !registered(key)));
            }
        }
        self.reads.push((self.queued, raw.clone(), keys));
    }

    /// A write queued after the reads of [`TxBlock::read`] ends what they
    /// registered, as on Redis.
    fn wrote(&mut self, inval: &Inval) {
        match inval {
            Inval::All => self.reread.clear(),
            Inval::Keys(keys) => self.reread.retain(|(k, _)| !keys.contains(k)),
        }
    }
}

/// A command inside MULTI that sidecache answers itself, at EXEC.
#[derive(Debug)]
pub(super) enum Deferred {
    /// One of [`Local`]'s, with its arguments.
    Local(Local, Vec<Bytes>),
    /// CLIENT TRACKING, with its arguments, and the keys of the reads
    /// queued after it (Redis tracks them if it turns tracking on).
    Tracking(Vec<Bytes>, Vec<Bytes>),
    /// AUTH or HELLO: credentials checked and the session changed at EXEC;
    /// `switch`, the protocol the held connection was switched to in its
    /// place (a HELLO that changes it).
    Login {
        cmd: Local,
        args: Vec<Bytes>,
        switch: Option<sidecache_pool::Proto>,
    },
    /// A command Redis refuses at EXEC with this error (MONITOR,
    /// SSUBSCRIBE).
    Refused(&'static str),
    /// A PING queued upstream after a SUBSCRIBE of the block: its reply
    /// becomes a RESP2 subscriber's if the client is one by then.
    Ping,
    /// (P|S)UNSUBSCRIBE, with its arguments: the client's subscriptions are
    /// sidecache's.
    Unsubscribe(Kind, Vec<Bytes>),
    /// SUBSCRIBE or PSUBSCRIBE, with its arguments.
    Subscribe(Kind, Vec<Bytes>),
}

/// The client's held connection: from WATCH (or a MULTI spanning batches)
/// until the transaction ends.
#[derive(Debug)]
pub(super) struct Held {
    conn: SessionConn,
    /// The pool it came from (the client's user at the time: an AUTH at
    /// EXEC may change the user before it goes back).
    pool: std::sync::Arc<sidecache_pool::SessionPool>,
    /// Index of its node in the client's topology snapshot.
    node: usize,
    /// Keys are watched on it.
    watching: bool,
    /// The slot of its WATCHed keys (cluster): the transaction's slot.
    slot: Option<Slot>,
    /// A SELECT changed its database: closed, not reused, at the end.
    session_changed: bool,
}

/// How a finished block ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    Exec,
    Discard,
}

/// A block sent on a shared connection, answered in the reply pass.
pub(super) struct TxPending {
    node: u32,
    idx: u32,
    count: usize,
    order: Vec<Option<Bytes>>,
    slot: Option<Slot>,
    block: Bytes,
    end: End,
    dirty: bool,
    deferred: Vec<(usize, Deferred)>,
    selects: Vec<(usize, Vec<Bytes>)>,
    /// A trailing `SELECT` (not the client's) puts the connection back.
    restore: bool,
    /// On a fill lane (`node` is the lane; see `Client::tx_on_fill_lane`).
    fill: bool,
}

impl Client {
    /// Whether commands must go through [`Client::in_session`] first.
    pub(super) fn session_active(&self) -> bool {
        self.tx.is_some() || self.held.is_some()
    }

    /// MULTI or WATCH outside any transaction (the command table routes them
    /// here). Other transaction commands outside one are forwarded: Redis
    /// answers them (`-ERR EXEC without MULTI`, `+OK` for UNWATCH).
    pub(super) async fn start_session(&mut self, lname: &[u8], req: &Request) -> bool {
        match lname {
            b"multi" => {
                self.tx = Some(TxBlock::default());
                self.tx_push_raw(&req.raw, false);
                true
            }
            b"watch" => {
                self.watch(req).await;
                true
            }
            _ => false,
        }
    }

    /// Dispatch while a transaction is open or keys are watched; `None`
    /// when the command takes the normal path (watching, outside MULTI).
    pub(super) async fn in_session(&mut self, lname: &[u8], req: &Request) -> Option<Flow> {
        if let Some(cmd) = Local::lookup(lname) {
            match cmd {
                Local::Quit | Local::Reset => {
                    // Both end the transaction and the watches at once.
                    self.end_session(false);
                    self.flush().await;
                    let start = self.scratch.len();
                    let outcome = answer::run(
                        cmd,
                        &req.args,
                        &mut self.st,
                        &self.shared,
                        &mut self.scratch,
                        None,
                    );
                    self.pending.push(Pending::Local(start..self.scratch.len()));
                    // RESET: back to the default user.
                    self.user_changed();
                    return Some(match outcome {
                        Outcome::Continue => Flow::Continue,
                        Outcome::Close => Flow::Close,
                    });
                }
                Local::Ping | Local::Echo if self.tx.is_some() => {
                    if cmd == Local::Ping {
                        self.tx_ping();
                    }
                    self.tx_push(lname, req);
                    return Some(Flow::Continue);
                }
                Local::Ping | Local::Echo => return None,
                Local::Auth | Local::Hello if self.tx.is_some() => {
                    self.tx_login(cmd, lname, req);
                    return Some(Flow::Continue);
                }
                // Watching, outside MULTI: a login that keeps the client's
                // user keeps the held connection's; a HELLO switches its
                // protocol with the client's.
                Local::Auth | Local::Hello if self.login_keeps_user(cmd, &req.args) => {
                    return match cmd {
                        Local::Hello => Some(self.hello_while_watching(req).await),
                        _ => None,
                    };
                }
                // Watching, outside MULTI: SELECT applies to the client and
                // to the held connection (the EXEC to come runs there).
                Local::Select if self.tx.is_none() => {
                    self.select_while_watching(req).await;
                    return Some(Flow::Continue);
                }
                c if self.tx.is_none() && !c.changes_session() => return None,
                // Inside MULTI, what sidecache answers itself runs at EXEC,
                // in its place in EXEC's array; upstream queues a PING there.
                Local::Select if self.tx.is_some() => {
                    self.tx_select(req);
                    return Some(Flow::Continue);
                }
                Local::Client | Local::ClusterDisabled if self.tx.is_some() => {
                    self.tx_defer(cmd, lname, req);
                    return Some(Flow::Continue);
                }
                _ => {
                    let name = String::from_utf8_lossy(&req.args[0]).to_ascii_uppercase();
                    if let Some(tx) = self.tx.as_mut() {
                        tx.dirty = true;
                    }
                    let what = if self.tx.is_some() {
                        "inside MULTI"
                    } else {
                        "while keys are WATCHed (UNWATCH first)"
                    };
                    let msg = format!("ERR sidecache: {name} {what} is not supported");
                    self.tx_local_error(&msg);
                    return Some(Flow::Continue);
                }
            }
        }
        if self.tx.is_none() {
            // Watching, outside MULTI.
            return match lname {
                b"multi" => {
                    self.tx = Some(TxBlock {
                        slot: self.held.as_ref().and_then(|h| h.slot),
                        ..TxBlock::default()
                    });
                    self.tx_push_raw(&req.raw, false);
                    Some(Flow::Continue)
                }
                b"watch" | b"unwatch" => {
                    self.held_call(req).await;
                    Some(Flow::Continue)
                }
                b"exec" | b"discard" => {
                    // Not in MULTI: Redis's own error, from the held connection.
                    self.held_call(req).await;
                    Some(Flow::Continue)
                }
                _ => None,
            };
        }
        match lname {
            b"exec" => self.finish_tx(req, End::Exec).await,
            b"discard" => self.finish_tx(req, End::Discard).await,
            b"unsubscribe" => self.tx_unsubscribe(Kind::Channel, req).await,
            b"punsubscribe" => self.tx_unsubscribe(Kind::Pattern, req).await,
            b"sunsubscribe" => self.tx_unsubscribe(Kind::Shard, req).await,
            b"subscribe" => self.tx_subscribe(Kind::Channel, req).await,
            b"psubscribe" => self.tx_subscribe(Kind::Pattern, req).await,
            b"ssubscribe" => self.tx_subscribe(Kind::Shard, req).await,
            b"monitor" => {
                // An ACL user's refusal comes first, as on Redis (its ACL
                // is checked before the command is queued).
                let refusal = self.user_refusal(&req.args).await;
                let text = refusal
                    .as_ref()
                    .and_then(|f| sidecache_resp::frame::error_text(f))
                    .map(|t| String::from_utf8_lossy(t).into_owned());
                self.tx_monitor(lname, req, text);
            }
            // Replication is not proxied: refused as outside MULTI (SYNC
            // and PSYNC go upstream, which refuses them inside MULTI).
            b"replconf" => {
                if let Some(tx) = self.tx.as_mut() {
                    tx.dirty = true;
                }
                self.tx_local_error(&format!("ERR {}", crate::cmd::handling::REPLICATION));
            }
            _ => self.tx_push(lname, req),
        }
        Some(Flow::Continue)
    }

    /// SELECT inside MULTI: sent upstream in its place (the commands after
    /// it run in the database it selects, as in Redis); at EXEC, if it ran,
    /// the client's database follows, and the shared connection is put back
    /// in its own database right after the block.
    fn tx_select(&mut self, req: &Request) {
        let db = req
            .args
            .get(1)
            .and_then(|a| std::str::from_utf8(a).ok())
            .and_then(|a| a.parse::<u16>().ok());
        if let Some(tx) = self.tx.as_mut() {
            tx.selects.push((tx.queued, req.args.clone()));
            // Its keys' databases are no longer the client's: drop everything
            // the transaction may touch, in any database.
            if db.is_some() {
                tx.inval = Some(Inval::All);
            }
        }
        self.tx_push_raw(&req.raw, true);
    }

    /// HELLO without credentials while keys are watched: answered as
    /// always, and a protocol it switches to is also the held
    /// connection's, so the EXEC to come answers in it (the connection is
    /// then not reused).
    async fn hello_while_watching(&mut self, req: &Request) -> Flow {
        let before = self.st.proto;
        let flow = self.dispatch_local(Local::Hello, &req.args).await;
        if self.st.proto == before {
            return flow;
        }
        let n: &[u8] = if self.st.proto == sidecache_pool::Proto::Resp3 {
            b"3"
        } else {
            b"2"
        };
        let mut hello = BytesMut::new();
        encode::encode_command(&mut hello, &[b"HELLO".as_slice(), n]);
        let timeout = self.shared.upstream.command_timeout();
        let Some(h) = self.held.as_mut() else {
            return flow;
        };
        h.session_changed = true;
        if h.conn.call(&hello, 1, timeout).await.is_err() {
            // Its watches are lost with it: the EXEC will say so.
            self.end_session(false);
        }
        flow
    }

    /// SELECT while keys are watched: answered as always, and, when it
    /// succeeds, also sent to the held connection so the EXEC to come runs
    /// in the new database (the connection is then not reused).
    async fn select_while_watching(&mut self, req: &Request) {
        self.flush().await;
        let start = self.scratch.len();
        answer::run(
            Local::Select,
            &req.args,
            &mut self.st,
            &self.shared,
            &mut self.scratch,
            None,
        );
        let ok = self.scratch.get(start) == Some(&b'+');
        self.pending.push(Pending::Local(start..self.scratch.len()));
        if !ok {
            return;
        }
        let timeout = self.shared.upstream.command_timeout();
        let Some(h) = self.held.as_mut() else { return };
        h.session_changed = true;
        if h.conn.call(&req.raw, 1, timeout).await.is_err() {
            // Its watches are lost with it: the EXEC will say so.
            self.end_session(false);
        }
    }

    /// Adds a command to the open transaction (binding its slot, noting
    /// what it may write).
    fn tx_push(&mut self, lname: &[u8], req: &Request) {
        let shared = std::sync::Arc::clone(&self.shared);
        if let Some(info) = shared.table.lookup(&req.args) {
            if let Some(body) = info.script_body.and_then(|i| req.args.get(i)) {
                shared.pause.saw_script(body);
            }
            if let Some(tx) = self.tx.as_mut() {
                tx.writes |= crate::cmd::pause::may_change_data(info, &req.args, |sha| {
                    shared.pause.ro_script(sha)
                });
            }
            if self.topo.is_cluster() {
                // Every key of a transaction must share its slot, fixed by
                // the first keyed command (or WATCH): Redis Cluster's
                // CROSSSLOT at queue time, and the EXEC aborts.
                self.keys.clear();
                if info.keys(&req.args, &mut self.keys).is_ok() && !self.keys.is_empty() {
                    let first = self.tx.as_ref().and_then(|t| t.slot);
                    let Ok(slot) = crate::cmd::route::one_slot(&req.args, &self.keys, first) else {
                        if let Some(tx) = self.tx.as_mut() {
                            tx.dirty = true;
                        }
                        self.tx_local_error(crate::cmd::route::CROSSSLOT);
                        return;
                    };
                    if let Some(tx) = self.tx.as_mut() {
                        tx.slot = slot;
                    }
                }
            }
            let late = !self.st.tracking.on
                && info.flags.readonly
                && !info.writes_keys()
                && self.tx.as_ref().is_some_and(|t| {
                    t.deferred
                        .iter()
                        .any(|(_, d)| matches!(d, Deferred::Tracking(..)))
                });
            if late {
                self.keys.clear();
                if info.keys(&req.args, &mut self.keys).is_ok() {
                    let keys: Vec<Bytes> = self.keys.iter().map(|&i| req.args[i].clone()).collect();
                    self.tx_read_after_tracking(keys.into_iter());
                }
            }
            if let Some(inval) = self.write_invalidation(info, &req.args) {
                if let Some(tx) = self.tx.as_mut() {
                    tx.wrote(&inval);
                    tx.inval = Some(match (tx.inval.take(), inval) {
                        (Some(Inval::All), _) => Inval::All,
                        (Some(Inval::Keys(mut a)), Inval::Keys(b)) => {
                            a.extend(b);
                            Inval::Keys(a)
                        }
                        (None, i) => i,
                        _ => Inval::All,
                    });
                }
            }
        }
        // Redis answers a nested MULTI and a WATCH inside MULTI at once:
        // they take no place in EXEC's array.
        let queued = lname != b"multi" && lname != b"watch";
        self.tx_push_raw(&req.raw, queued);
    }

    fn tx_push_raw(&mut self, raw: &[u8], queued: bool) {
        if let Some(tx) = self.tx.as_mut() {
            tx.buf.extend_from_slice(raw);
            tx.count += 1;
            tx.order.push(None);
            tx.queued += usize::from(queued);
        }
    }

    /// A reply the proxy gives itself, in the transaction's order (or as a
    /// plain local reply when no MULTI is open).
    fn tx_local_error(&mut self, msg: &str) {
        let start = self.scratch.len();
        sidecache_resp::encode::Reply {
            out: &mut self.scratch,
            proto: self.st.proto,
        }
        .error(msg);
        let range = start..self.scratch.len();
        match self.tx.as_mut() {
            Some(tx) => {
                let owned = Bytes::copy_from_slice(&self.scratch[range]);
                self.scratch.truncate(start);
                tx.order.push(Some(owned));
            }
            None => self.pending.push(Pending::Local(range)),
        }
    }

    /// The node a transaction goes to: the held connection's, else its
    /// slot's owner, else any master.
    fn tx_node(&self, slot: Option<Slot>) -> Result<usize, sidecache_pool::Error> {
        if let Some(h) = &self.held {
            return Ok(h.node);
        }
        match slot {
            Some(s) if self.topo.is_cluster() => self.topo.node_index(s),
            _ => Ok(0),
        }
    }

    /// Waits until the writes queued for `node` (and for masters that left
    /// the map) have landed, bounded by `--write-queue-timeout`.
    pub(super) async fn wait_writes(
        &mut self,
        node: &sidecache_pool::Node,
    ) -> Result<(), sidecache_pool::Error> {
        self.shared.upstream.wait_writes(node).await.map(drop)
    }

    fn tx_upstream_error(&mut self, e: &sidecache_pool::Error) {
        let mut b = BytesMut::new();
        e.write_reply(&mut b);
        let start = self.scratch.len();
        self.scratch.put_slice(&b);
        self.pending.push(Pending::Local(start..self.scratch.len()));
    }

    /// Drops the transaction and gives the held connection back (`clean`:
    /// it carries no state) or closes it.
    pub(super) fn end_session(&mut self, clean: bool) {
        self.tx = None;
        if let Some(h) = self.held.take() {
            let clean = clean && !h.watching && !h.session_changed;
            h.pool.release(h.conn, clean);
        }
    }
}
