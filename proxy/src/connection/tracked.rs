//! CLIENT TRACKING on the connection's side: a tracking client's reads are
//! registered before they are dispatched, and after the batch's replies
//! each read of a key sidecache does not follow upstream is invalidated at
//! once (the contract and its argument: `crate::tracking`).

use bytes::{BufMut, Bytes};
use sidecache_pool::{Proto, Slot};
use sidecache_resp::request::Request;
use sidecache_resp::shape::{self, Shape};
use smallvec::SmallVec;

use super::{Client, Inval, Pending};
use crate::cmd::table::CommandInfo;
use crate::state::Shared;
use crate::tracking::Sink;

mod early;
pub(super) use early::Early;

/// Where a tracking client's command goes instead of its usual way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum FillRoute {
    /// Its usual way.
    #[default]
    No,
    /// A script, to a fill lane: Redis follows the keys it declares if it
    /// reads ([`Client::script_on_fill_lane`]).
    Script,
    /// A read the L1 does not serve, to a fill lane: Redis follows its
    /// keys for sidecache, so the client keeps what it read until it
    /// changes, and Redis's messages (an eviction's) come in order with
    /// its reply ([`Client::read_on_fill_lane`]); the shape of its reply,
    /// which the lane gives in RESP3.
    Read(Shape),
}

/// Commands that run a script or a function with declared keys.
const SCRIPTS: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// Whether a script command may run a read (its body is known for EVAL
/// and EVAL_RO only; see `crate::cmd::script`).
fn script_may_read(name: &str, args: &[Bytes], table: &crate::cmd::table::CommandTable) -> bool {
    match (name, args.get(1)) {
        ("eval" | "eval_ro", Some(body)) => crate::cmd::script::may_read(body, table),
        _ => true,
    }
}

/// The declared keys (indexes into `keys`, EVAL's key arguments) an EVAL's
/// script reads, where the upstream follows only those: Redis 7.2 and
/// Valkey track the keys the script's reads read, Redis 7.0 every key the
/// script declares once it reads (`None`: all of them, also when the
/// script's text does not show which).
fn script_reads(name: &str, args: &[Bytes], keys: &[usize], shared: &Shared) -> Option<Vec<usize>> {
    let body = match name {
        "eval" | "eval_ro" => args.get(1)?,
        _ => return None,
    };
    let info = shared.upstream.server_info();
    if !info.is_at_least("valkey", 7, 2) && !info.is_at_least("redis", 7, 2) {
        return None;
    }
    let declared: SmallVec<[&[u8]; 4]> = keys.iter().map(|&i| &args[i][..]).collect();
    crate::cmd::script::read_keys(body, &shared.table, &declared)
}

/// A held transaction's reads sent again on a fill lane
/// ([`Client::tx_follow`]): their replies from index `idx` of lane `lane`,
/// and what each must be (the client's reply) for its keys to be followed.
#[derive(Debug)]
pub(super) struct TxFollow {
    lane: u32,
    idx: u32,
    expect: Vec<(Bytes, SmallVec<[Bytes; 2]>)>,
}

/// A tracking client's script or read on a fill lane: its reply at `idx`
/// of fill lane `lane`.
#[derive(Debug)]
pub(super) struct LaneRead {
    lane: u32,
    idx: u32,
    slot: Option<Slot>,
    cmd: Bytes,
    db: u16,
    keys: SmallVec<[Bytes; 2]>,
    /// What its writes may have changed, applied at its reply.
    inval: Option<Inval>,
    /// Its reply's shape, to show the lane's RESP3 reply in the client's
    /// protocol.
    shape: Shape,
}

impl Client {
    /// The shared table learns this client's tracking state (after CLIENT
    /// TRACKING, RESET or HELLO); a RESP3 client gets an outbox, so it can
    /// be another client's REDIRECT target.
    pub(super) fn tracking_changed(&mut self) {
        let t = &self.st.tracking;
        if t.on {
            let sink = Sink {
                bcast: t.bcast,
                noloop: t.noloop,
                redirect: t.redirect,
                prefixes: t.prefixes.clone(),
                quiet: false,
            };
            self.subs_mut();
            self.shared.tracked.enable(self.st.id, sink);
            self.early.started();
            self.shared.upstream.filter_echoes();
        } else {
            self.shared.tracked.disable(self.st.id);
            self.tracked_reads.clear();
            self.fill_reads.clear();
            if self.st.proto == Proto::Resp3 {
                self.subs_mut();
            }
        }
    }

    /// Before a tracking client's command: if it is a read the client
    /// tracks (CLIENT CACHING for OPTIN/OPTOUT), its keys are registered
    /// (default mode; BCAST clients hear of every key) and kept for
    /// [`Client::end_tracked_reads`]. As on Redis, a CLIENT CACHING applies
    /// to the one command after it, or to the whole transaction when that
    /// command is MULTI (rueidis sends `CLIENT CACHING YES`, `MULTI`,
    /// `PTTL k`, the read, `EXEC`); one queued inside a MULTI applies to
    /// the commands queued after it. Reads inside a transaction are
    /// registered when they are queued, and again when EXEC is sent
    /// ([`Client::renew_tracked_reads`]), before Redis runs them. Every
    /// command also notes what the batch touches ([`Client::note_early`]).
    pub(super) fn track_read(&mut self, req: &Request) {
        self.fill_route = FillRoute::No;
        // One lookup for both: what the batch touches, and what it reads.
        let shared = std::sync::Arc::clone(&self.shared);
        let info = shared.table.lookup(&req.args);
        self.note_early(req, info.map(|i| &**i));
        let caching = req.args.len() >= 2
            && req.args[0].eq_ignore_ascii_case(b"client")
            && req.args[1].eq_ignore_ascii_case(b"caching");
        let in_tx = self.tx.is_some();
        if !in_tx {
            self.tx_caching = None;
            if std::mem::take(&mut self.caching_used) {
                self.st.tracking.caching = None;
            }
        }
        if caching {
            if in_tx && req.args.len() == 3 {
                // Only what CLIENT CACHING would accept at EXEC (its
                // errors are the EXEC's then, as Redis's).
                let t = &self.st.tracking;
                if req.args[2].eq_ignore_ascii_case(b"yes") && t.optin {
                    self.tx_caching = Some(true);
                } else if req.args[2].eq_ignore_ascii_case(b"no") && t.optout {
                    self.tx_caching = Some(false);
                }
            }
            return;
        }
        self.caching_used = true;
        let caching = if in_tx {
            self.tx_caching.or(self.st.tracking.caching)
        } else {
            self.st.tracking.caching
        };
        if !self.st.tracking.tracks_reads_with(caching) {
            return;
        }
        let Some(info) = info else {
            return;
        };
        // A script: Redis tracks the keys it declares if it runs a read
        // (which sidecache cannot see), so under optin it runs on a fill
        // lane, where Redis decides (`Client::script_on_fill_lane`).
        let script = SCRIPTS.contains(&info.name.as_str());
        if !script && (!info.flags.readonly || info.writes_keys()) {
            return;
        }
        self.keys.clear();
        if info.keys(&req.args, &mut self.keys).is_err() {
            return;
        }
        if script {
            if self.keys.is_empty() || !script_may_read(&info.name, &req.args, &shared.table) {
                return;
            }
            if let Some(read) = script_reads(&info.name, &req.args, &self.keys, &shared) {
                let mut at = 0;
                self.keys.retain(|_| {
                    at += 1;
                    read.contains(&(at - 1))
                });
                if self.keys.is_empty() {
                    return;
                }
            }
            if self.optin && !in_tx && self.st.user.is_none() {
                self.fill_route = FillRoute::Script;
            }
        } else if let Some(shape) = self.reads_on_fill_lane(in_tx, info, &req.args) {
            self.fill_route = FillRoute::Read(shape);
        }
        let bcast = self.st.tracking.bcast;
        if bcast && !self.keys.is_empty() {
            shared.tracked.touch(self.st.id);
        }
        if !bcast && !script {
            if let Some(tx) = self.tx.as_mut() {
                let keys = self.keys.iter().map(|&i| req.args[i].clone()).collect();
                tx.read(&req.raw, keys, |k| shared.tracked.registered(self.st.id, k));
            }
        }
        for &i in &self.keys {
            let key = req.args[i].clone();
            if !bcast {
                shared.tracked.register(self.st.id, &key);
            }
            // Followed now, after the registration: every later change
            // reaches sidecache, so this client, whatever its read returns.
            let followed = self.follows(self.st.db, &key);
            self.tracked_reads.push((self.st.db, key, followed));
        }
    }

    /// A tracking client's script (its keys registered by
    /// [`Client::track_read`]), under optin: run in a batch of its own on
    /// the fill lane of its first key (whose reads Redis follows), so Redis
    /// follows the keys it declares exactly when it would for the client
    /// (the script ran a read), and reports their changes to sidecache.
    /// The batch before it is answered first, and (`true`) the caller
    /// answers it before anything after it is sent: its writes keep their
    /// place among the client's commands. Its reads' messages are decided
    /// after its reply. When the fill lane cannot take it (a write of this
    /// batch is bound for the node on the client's connection) it is
    /// forwarded as any script, and its keys are dropped right after.
    pub(super) async fn script_on_fill_lane(
        &mut self,
        req: &Request,
        inval: Option<Inval>,
    ) -> bool {
        let args = &req.args;
        let Some(&first) = self.keys.first() else {
            self.forward(0, None, &req.raw);
            self.push_inval(inval);
            return false;
        };
        let keys: SmallVec<[Bytes; 2]> = self.keys.iter().map(|&i| args[i].clone()).collect();
        let (node, slot) = match self.route_key(&args[first]) {
            Ok(r) => r,
            Err(e) => {
                self.slot_error(&e);
                self.push_inval(inval);
                return false;
            }
        };
        if !self.pending.is_empty() {
            // The reads registered for this script (the last ones) wait
            // for its reply.
            let at = self.tracked_reads.len().saturating_sub(keys.len());
            let reads = self.tracked_reads.split_off(at);
            self.flush().await;
            self.tracked_reads.extend(reads);
        }
        if !self.fills_on_fill_conn(node) {
            self.forward(node, slot, &req.raw);
            self.push_inval(inval);
            return false;
        }
        self.lane_read(node, slot, req, keys, inval, Shape::Plain);
        true
    }

    /// Whether a tracking client's read, not a script, goes to a fill lane
    /// ([`FillRoute::Read`]), and the shape of its reply: under optin, for
    /// a default-mode client of the upstream's own user, outside a
    /// transaction, when its keys share one lane. The lane answers in
    /// RESP3: a RESP3 client's reply goes verbatim, a RESP2 client's read
    /// only when its RESP2 reply is known exactly
    /// ([`crate::cmd::reads::resp2_shape`]).
    fn reads_on_fill_lane(&self, in_tx: bool, info: &CommandInfo, args: &[Bytes]) -> Option<Shape> {
        let &first = self.keys.first()?;
        let lane = |i: usize| super::cache::fill_lane(&args[i], self.fill_lanes);
        let taken = self.optin
            && !in_tx
            && self.st.user.is_none()
            && !self.st.tracking.bcast
            && self.keys.iter().all(|&i| lane(i) == lane(first));
        match self.st.proto {
            _ if !taken => None,
            Proto::Resp3 => Some(Shape::Plain),
            Proto::Resp2 => crate::cmd::reads::resp2_shape(&info.name, args),
        }
    }

    /// A read of [`FillRoute::Read`], on the fill lane of its first key
    /// (`false`, and it takes its usual way, when the lane cannot take
    /// it: a write of this batch is bound for its node on the client's
    /// connection). Its keys are then followed, and its reply is read as a
    /// script's ([`Client::reply_lane_read`]: a redirected one is not).
    pub(super) fn read_on_fill_lane(&mut self, req: &Request) -> bool {
        let FillRoute::Read(shape) = std::mem::take(&mut self.fill_route) else {
            return false;
        };
        let args = &req.args;
        let Some(&first) = self.keys.first() else {
            return false;
        };
        let Ok((node, slot)) = self.route_key(&args[first]) else {
            return false;
        };
        if !self.fills_on_fill_conn(node) {
            return false;
        }
        let keys: SmallVec<[Bytes; 2]> = self.keys.iter().map(|&i| args[i].clone()).collect();
        self.lane_read(node, slot, req, keys, None, shape);
        true
    }

    /// `req` on the fill lane of its first key, `keys[0]`, on `node`:
    /// Redis follows `keys` for sidecache from its reply on
    /// ([`Client::reply_lane_read`], which shows it as `shape`); `inval`,
    /// what it may have written.
    fn lane_read(
        &mut self,
        node: usize,
        slot: Option<Slot>,
        req: &Request,
        keys: SmallVec<[Bytes; 2]>,
        inval: Option<Inval>,
        shape: Shape,
    ) {
        let Some(first) = keys.first() else {
            // (Callers pass a key; without one, the usual way.)
            self.forward(node, slot, &req.raw);
            self.push_inval(inval);
            return;
        };
        let (lane, idx) = self.enqueue_on_fill_lane(node, first, &req.raw, 1);
        let db = self.st.db;
        for k in &keys {
            self.fill_reads.push((db, k.clone()));
        }
        self.pending.push(Pending::LaneRead(Box::new(LaneRead {
            lane,
            idx,
            slot,
            cmd: req.raw.clone(),
            db,
            keys,
            inval,
            shape,
        })));
    }

    fn push_inval(&mut self, inval: Option<Inval>) {
        if let Some(inval) = inval {
            self.pending.push(Pending::Invalidate(inval));
        }
    }

    /// The reply of a script or read run on a fill lane, in the client's
    /// protocol (the lane speaks RESP3). If it was redirected (a cluster
    /// moved its slot) and ran elsewhere, or its connection failed, its keys
    /// are not followed: they get their message after the reply. Returns whether it
    /// is an upstream failure.
    pub(super) async fn reply_lane_read(&mut self, sf: LaneRead) -> bool {
        let mut followed = true;
        let got = match self.take_lane_frame(true, sf.lane, sf.idx) {
            Ok(f)
                if self.topo.is_cluster()
                    && (f.starts_with(b"-MOVED ") || f.starts_with(b"-ASK ")) =>
            {
                followed = false;
                self.shared.metrics.note_redirect(&f);
                self.shared
                    .upstream
                    .follow_via(
                        self.via(),
                        self.session(),
                        sf.slot,
                        &sf.cmd,
                        f,
                        self.deadline,
                    )
                    .await
                    .map(|f| (f, self.st.proto))
            }
            Ok(f) => Ok((f, Proto::Resp3)),
            Err(e) => {
                followed = false;
                Err(e)
            }
        };
        if !followed {
            self.fill_reads
                .retain(|(d, k)| !(*d == sf.db && sf.keys.contains(k)));
        }
        let failed = match got {
            Ok((f, from)) => {
                if shape::convert(&f, sf.shape, from, self.st.proto, &mut self.wbuf).is_err() {
                    self.wbuf.put_slice(&f);
                }
                false
            }
            Err(e) => {
                e.write_reply(&mut self.wbuf);
                true
            }
        };
        // What the script may have written leaves the L1 and reaches peers
        // and tracking clients, as any write's; its caller keeps what the
        // script registered for it when Redis follows it (Redis reports the
        // keys the script read when they change, its own writes included).
        if let Some(inval) = sf.inval {
            self.invalidated_sparing(inval, followed).await;
        }
        failed
    }

    /// Whether a transaction's EXEC, about to be sent on a shared
    /// connection, goes to a fill lane instead ([`Client::tx_on_fill_lane`]):
    /// under optin, for a RESP3 client of the upstream's own user whose
    /// transaction reads keys it tracks.
    pub(super) fn tx_reads_tracked(&self) -> bool {
        self.optin
            && self.st.tracking.on
            && self.st.proto == Proto::Resp3
            && self.st.user.is_none()
            && !self.tracked_reads.is_empty()
    }

    /// A transaction of a tracking client, on the fill lane of a key it
    /// reads (whose reads Redis follows, `MULTI` … `EXEC` included): Redis follows
    /// for sidecache every key it reads, as it would for the client, so
    /// the client keeps what it read until it changes (rueidis reads each
    /// key it caches as `CLIENT CACHING YES`, `MULTI`, `PTTL k`, the read,
    /// `EXEC`). Redis answers a RESP3 client as it answers the lane, so
    /// its replies go verbatim. Returns the lane and the index of the
    /// block's first reply.
    pub(super) fn tx_on_fill_lane(
        &mut self,
        node: usize,
        block: &[u8],
        count: usize,
    ) -> (u32, u32) {
        let key = self
            .tracked_reads
            .last()
            .map(|(_, k, _)| k.clone())
            .unwrap_or_default();
        let at = self.enqueue_on_fill_lane(node, &key, block, count);
        for (db, k, _) in &self.tracked_reads {
            self.fill_reads.push((*db, k.clone()));
        }
        at
    }

    /// `block` (`count` commands) on the fill lane of `key` on `node`:
    /// the lane, and the index of the block's first reply.
    fn enqueue_on_fill_lane(
        &mut self,
        node: usize,
        key: &[u8],
        block: &[u8],
        count: usize,
    ) -> (u32, u32) {
        let lane = self.fill_lane_of(node, key);
        let b = &mut self.fills[lane];
        b.reads += 1;
        b.buf.extend_from_slice(block);
        b.count += count;
        (lane as u32, (b.count - count) as u32)
    }

    /// EXEC is sent: the transaction's reads run now, not when they were
    /// queued, so they are registered again (a change told of meanwhile
    /// took a default-mode registration, and reached the client before
    /// EXEC's reply), BCAST records start again, and whether sidecache
    /// follows each key is decided anew (what it followed at queue time
    /// it may have stopped following since).
    pub(super) fn renew_tracked_reads(&mut self) {
        if self.tracked_reads.is_empty() {
            return;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let id = self.st.id;
        if self.st.tracking.bcast {
            shared.tracked.touch(id);
        }
        let mut reads = std::mem::take(&mut self.tracked_reads);
        for (db, key, followed) in &mut reads {
            if !self.st.tracking.bcast {
                shared.tracked.register(id, key);
            }
            *followed = self.follows(*db, key);
        }
        self.tracked_reads = reads;
    }

    /// A tracking client's transaction ran on a held connection, which
    /// Redis does not follow for sidecache: its reads (`reads`, with their
    /// places in `exec`, EXEC's reply) are sent again on the node's fill
    /// lane, which Redis follows from then on. A read whose reply there is
    /// the one the client got leaves it holding the key's value as it
    /// stands once followed, so its keys need no message
    /// ([`Client::tx_followed`]); any other gets one after the reply, as
    /// before. `None` when there is nothing to read again or the lane
    /// cannot take it.
    pub(super) fn tx_follow(
        &mut self,
        node: usize,
        reads: Vec<(usize, Bytes, SmallVec<[Bytes; 2]>)>,
        exec: &Bytes,
    ) -> Option<Pending> {
        if reads.is_empty() || !self.fills_on_fill_conn(node) {
            return None;
        }
        let replies = sidecache_resp::frame::array_elements(exec).ok().flatten()?;
        let mut block = bytes::BytesMut::new();
        let mut expect = Vec::with_capacity(reads.len());
        for (at, cmd, keys) in reads {
            let Some(reply) = replies.get(at) else {
                continue;
            };
            block.extend_from_slice(&cmd);
            expect.push((reply.clone(), keys));
        }
        let first = expect.first().and_then(|(_, k)| k.first().cloned())?;
        let (lane, idx) = self.enqueue_on_fill_lane(node, &first, &block, expect.len());
        Some(Pending::TxFollow(Box::new(TxFollow { lane, idx, expect })))
    }

    /// The fill lane's replies of [`Client::tx_follow`]: the reads that
    /// got what the client got are followed from then on.
    pub(super) fn tx_followed(&mut self, f: TxFollow) {
        let db = self.st.db;
        for (k, (reply, keys)) in f.expect.into_iter().enumerate() {
            let Ok(got) = self.take_lane_frame(true, f.lane, f.idx + k as u32) else {
                continue;
            };
            let same = if self.st.proto == Proto::Resp3 {
                got == reply
            } else {
                let mut b = bytes::BytesMut::new();
                shape::convert(&got, Shape::Plain, Proto::Resp3, self.st.proto, &mut b).is_ok()
                    && b[..] == reply[..]
            };
            if same {
                for key in keys {
                    self.fill_reads.push((db, key));
                }
            }
        }
    }

    /// After the reply of a tracking client's transaction run on a fill
    /// lane: what its writes changed, in Redis's order for the keys it
    /// read after writing them (`reread`). Redis tells the client of its
    /// own write only if it followed the key before (`false` in `reread`:
    /// then the message goes), and the read after the write follows the
    /// key again in either case (as the lane's read does for sidecache).
    pub(super) async fn tx_invalidated(&mut self, inval: Inval, reread: Vec<(Bytes, bool)>) {
        match inval {
            Inval::Keys(keys) => {
                let fresh = |k: &Bytes| reread.iter().any(|(r, f)| *f && r == k);
                let (spared, told): (SmallVec<[Bytes; 1]>, SmallVec<[Bytes; 1]>) =
                    keys.into_iter().partition(|k| fresh(k));
                if !told.is_empty() {
                    self.invalidated(Inval::Keys(told)).await;
                }
                if !spared.is_empty() {
                    self.invalidated_sparing(Inval::Keys(spared), true).await;
                }
            }
            Inval::All => self.invalidated(Inval::All).await,
        }
        for (key, _) in &reread {
            self.shared.tracked.register(self.st.id, key);
        }
    }

    /// After a batch's replies: the tracked reads of keys sidecache did
    /// not follow upstream when they were registered get their
    /// invalidation now, behind the replies. (Followed only later, a change
    /// made between the read and then would have gone unheard.) A key read
    /// on a fill lane in this batch is followed, value or not: Redis tracks
    /// what that connection read until its next
    /// change (or until the lane's channel is lost, which tells every
    /// tracking client to drop everything). Inside an open MULTI nothing is
    /// decided yet: the reads' replies come with EXEC's, and a message must
    /// not come before the reply it applies to.
    pub(super) fn end_tracked_reads(&mut self) {
        if self.tx.is_some() {
            return;
        }
        let mut reads = std::mem::take(&mut self.tracked_reads);
        let answered = !reads.is_empty();
        let fill_reads = std::mem::take(&mut self.fill_reads);
        let mut lost: Vec<Bytes> = reads
            .drain(..)
            .filter(|(db, key, followed)| {
                !followed && !fill_reads.iter().any(|(d, k)| d == db && k == key)
            })
            .map(|(_, key, _)| key)
            .collect();
        // One message per key (`PTTL k` and `GET k` read it twice).
        lost.sort_unstable();
        lost.dedup();
        if !lost.is_empty() {
            // For a BCAST client, also the touch below.
            self.shared.tracked.forget(self.st.id, &lost);
        } else if self.st.tracking.bcast && answered {
            // Answered: what it was told of while they were in flight may
            // be cached from them now (`Tracked::invalidate_learned`).
            self.shared.tracked.touch(self.st.id);
        }
        self.tracked_reads = reads;
    }

    /// Whether a change of `key` reaches sidecache: its node's
    /// invalidation channel (or the peer channel) is up and the L1 holds
    /// something filled for it (so the channel follows it).
    fn follows(&self, db: u16, key: &[u8]) -> bool {
        let up = match self.route_key(key) {
            Ok((node, _)) => self
                .topo
                .nodes()
                .get(node)
                .and_then(|n| n.tracking_up())
                .unwrap_or_else(|| self.shared.upstream.peer().is_some_and(|p| p.is_up())),
            Err(_) => false,
        };
        // BCAST upstream: Redis reports every change of the keys the L1
        // admits (its include prefixes are the BCAST prefixes), read or not.
        up && if self.optin {
            self.shared.l1.followed(db, key, false)
        } else {
            self.shared.l1.enabled() && self.shared.l1.config().key_allowed(key)
        }
    }
}
