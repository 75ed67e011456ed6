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
//! commands that change the connection itself are either run by sidecache
//! at EXEC in their place (CLIENT, (P|S)(UN)SUBSCRIBE; SELECT goes upstream
//! in its place and is followed) or (HELLO, AUTH, MONITOR, replication)
//! refused inside MULTI with an error, and the EXEC then aborts
//! (`-EXECABORT`) without running anything.

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::SessionConn;
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::request::Request;
use smallvec::SmallVec;

use super::{Client, Flow, Inval, Pending};

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
    /// (P|S)UNSUBSCRIBE, with its arguments: the client's subscriptions are
    /// sidecache's.
    Unsubscribe(Kind, Vec<Bytes>),
    /// SUBSCRIBE or PSUBSCRIBE (SSUBSCRIBE: refused at EXEC, as Redis
    /// refuses it there), with its arguments.
    Subscribe(Kind, Vec<Bytes>),
}

/// The client's held connection: from WATCH (or a MULTI spanning batches)
/// until the transaction ends.
#[derive(Debug)]
pub(super) struct Held {
    conn: SessionConn,
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
                    self.tx_push(lname, req);
                    return Some(Flow::Continue);
                }
                Local::Ping | Local::Echo => return None,
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
            b"monitor" | b"sync" | b"psync" | b"replconf" => {
                let name = String::from_utf8_lossy(&req.args[0]).to_ascii_uppercase();
                if let Some(tx) = self.tx.as_mut() {
                    tx.dirty = true;
                }
                // An ACL user's refusal comes first, as on Redis (its ACL
                // is checked before the command is queued).
                let refusal = self.user_refusal(&req.args).await;
                let text = refusal
                    .as_ref()
                    .and_then(|f| sidecache_resp::frame::error_text(f))
                    .map(|t| String::from_utf8_lossy(t).into_owned());
                self.tx_local_error(&text.unwrap_or_else(|| {
                    format!("ERR sidecache: {name} inside MULTI is not supported")
                }));
            }
            _ => self.tx_push(lname, req),
        }
        Some(Flow::Continue)
    }

    /// A locally answered command inside MULTI: checked for arity now (a
    /// queue-time error, as Redis), run at EXEC.
    fn tx_defer(&mut self, cmd: Local, lname: &[u8], req: &Request) {
        let info = self.shared.table.lookup(&req.args).cloned();
        let refusal = match info {
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
        };
        self.tx_run_at_exec(refusal, Deferred::Local(cmd, req.args.clone()));
    }

    /// A command sidecache answers itself inside MULTI: refused at queue
    /// time (`refusal`: the transaction is then dirty, EXEC aborts), or
    /// queued, upstream queueing a PING in its place, to run at EXEC.
    fn tx_run_at_exec(&mut self, refusal: Option<String>, deferred: Deferred) {
        if let Some(msg) = refusal {
            if let Some(tx) = self.tx.as_mut() {
                tx.dirty = true;
            }
            self.tx_local_error(&msg);
            return;
        }
        let mut ping = BytesMut::new();
        encode::encode_command(&mut ping, &[b"PING"]);
        if let Some(tx) = self.tx.as_mut() {
            tx.deferred.push((tx.queued, deferred));
        }
        self.tx_push_raw(&ping, true);
    }

    /// (P|S)UNSUBSCRIBE inside MULTI: queued (upstream queues a PING in
    /// its place) and run at EXEC on the client's own subscriptions, its
    /// replies in its place in EXEC's array, as Redis 7 and Valkey 9 do.
    /// Valkey 8.0.0 and 8.0.1 refuse it at queue time from a client that
    /// subscribed to nothing (`-NOSUB`; reverted in Valkey 8.0.2).
    async fn tx_unsubscribe(&mut self, kind: Kind, req: &Request) {
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
        self.tx_run_at_exec(refusal, Deferred::Unsubscribe(kind, req.args.clone()));
    }

    /// (P|S)SUBSCRIBE inside MULTI: queued (upstream queues a PING in its
    /// place) and run at EXEC, its replies in its place in EXEC's array,
    /// the client in pub/sub from then on, as on Redis 7 and Valkey.
    async fn tx_subscribe(&mut self, kind: Kind, req: &Request) {
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
        self.tx_run_at_exec(refusal, Deferred::Subscribe(kind, req.args.clone()));
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
            self.sessions().release(h.conn, clean);
        }
    }
}
