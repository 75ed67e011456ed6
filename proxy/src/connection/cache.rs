//! The L1 side of dispatch: GET and MGET answered from the cache or fetched
//! (GET + PTTL in one round trip) and filled; writes invalidating, in
//! command order, at dispatch and again once upstream acknowledged them.
//!
//! With optin tracking the fills go on each node's invalidation channel
//! connection (its *fill lane*, `Client::fills`), which Redis follows
//! every read of (`CLIENT TRACKING ON OPTOUT`: it carries no read sidecache
//! does not cache), so Redis tracks the keys for this sidecache; everything else goes
//! on the client's pooled connections. Two connections do not keep a
//! pipeline's order, so a fill is put on the fill lane only while nothing
//! that may write is bound for its node on the client's connection in the
//! batch (else it is fetched there, uncached), and a command that may
//! write is sent only after the batch's fills were answered.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sidecache_l1::Lookup;
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::request::Request;

use super::{Client, Fetch, Inval, MgetItem, Pending};

pub(super) mod reads;
use crate::cmd::handling::{Handling, Invalidation};
use crate::cmd::table::CommandInfo;
use crate::state::flight::Role;
use crate::state::stale::Serve;

/// Whether a command may change data (or holds commands that may): fills
/// queued before it must be answered first.
pub(super) fn may_write(info: &CommandInfo) -> bool {
    info.invalidation != Invalidation::None
        || matches!(
            info.handling,
            Handling::Transaction
                | Handling::Blocking
                | Handling::MaybeBlocking
                | Handling::PubSub { .. }
                | Handling::Monitor
        )
}

/// Which of a node's `lanes` fill connections fills `key` (FNV-1a).
pub(super) fn fill_lane(key: &[u8], lanes: usize) -> usize {
    if lanes <= 1 {
        return 0;
    }
    let mut h: u32 = 0x811c_9dc5;
    for &b in key {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h as usize % lanes
}

impl Client {
    /// Whether fills wait in this batch for the fill connection.
    pub(super) fn has_fills(&self) -> bool {
        self.fills.iter().any(|b| b.count > 0)
    }

    /// The node and slot a key routes to; `Err` when no node serves it.
    pub(super) fn route_key(
        &self,
        key: &[u8],
    ) -> Result<(usize, Option<Slot>), sidecache_pool::Error> {
        if !self.topo.is_cluster() {
            return Ok((0, None));
        }
        let slot = Slot::for_key(key);
        let node = self.topo.node_index(slot)?;
        Ok((node, Some(slot)))
    }

    /// Replies Redis Cluster's error for a slot no master serves, and asks
    /// for a fresh slot map.
    pub(super) fn slot_error(&mut self, e: &sidecache_pool::Error) {
        self.shared.upstream.request_refresh();
        let msg = format!("CLUSTERDOWN Hash slot not served ({e})");
        self.local_reply(|r| r.error(&msg));
    }

    /// Queues GET + PTTL for `key` on its node: on the client's connection,
    /// or (`fill`) on the node's fill connection, whose reads Redis follows.
    /// Returns where its replies are: the builder (the node, or the fill
    /// lane) and the index of the GET's.
    /// `read`: another read than GET, encoded.
    fn enqueue_fetch(
        &mut self,
        node: usize,
        key: &[u8],
        fill: bool,
        read: Option<&[u8]>,
    ) -> (u32, u32) {
        if !fill {
            let mut cmd = BytesMut::with_capacity(2 * key.len() + 48 + read.map_or(0, <[u8]>::len));
            match read {
                Some(r) => cmd.extend_from_slice(r),
                None => encode::encode_command(&mut cmd, &[b"GET".as_slice(), key]),
            }
            encode::encode_command(&mut cmd, &[b"PTTL".as_slice(), key]);
            let (_, idx) = self.enqueue(node, &cmd);
            // `enqueue` counted one command; the PTTL is the second.
            self.builders[node].count += 1;
            return (node as u32, idx);
        }
        let lane = self.fill_lane_of(node, key);
        let db = self.st.db;
        let b = &mut self.fills[lane];
        b.reads += 1;
        if self.st.tracking.on {
            self.fill_reads.push((db, Bytes::copy_from_slice(key)));
        }
        match read {
            Some(r) => b.buf.extend_from_slice(r),
            None => encode::encode_command(&mut b.buf, &[b"GET".as_slice(), key]),
        }
        encode::encode_command(&mut b.buf, &[b"PTTL".as_slice(), key]);
        b.count += 2;
        (lane as u32, (b.count - 2) as u32)
    }

    /// The fill lane of `key` on `node` (one lane per key, so Redis
    /// registers each key on one connection), in the client's database:
    /// the tracking connection sits in the start database, and a fill of
    /// another selects it first (put back in `submit`).
    pub(super) fn fill_lane_of(&mut self, node: usize, key: &[u8]) -> usize {
        let lane = node * self.fill_lanes + fill_lane(key, self.fill_lanes);
        if self.fills.len() <= lane {
            self.fills.resize_with(lane + 1, super::Builder::default);
        }
        let db = self.st.db;
        let start = self.shared.upstream.default_db();
        let b = &mut self.fills[lane];
        if b.selected.unwrap_or(start) != db {
            let mut n = itoa::Buffer::new();
            encode::encode_command(&mut b.buf, &[b"SELECT".as_slice(), n.format(db).as_bytes()]);
            b.count += 1;
            b.selected = Some(db);
        }
        lane
    }

    /// Whether a fill of a key of `node` goes on the node's fill
    /// connection: with optin tracking, the reads that fill the L1 must be
    /// made on the connection Redis tracks them for, the one that also
    /// writes this sidecache's batches (its `NOLOOP` keeps our own writes
    /// from invalidating them). Only while nothing of this batch is bound
    /// for the node on the client's connection that may write: the fill
    /// must not overtake it. Otherwise the read goes with the client's
    /// commands and is not cached.
    pub(super) fn fills_on_fill_conn(&self, node: usize) -> bool {
        self.optin
            && !(self.forwarded_write && self.builders.get(node).is_some_and(|b| b.count > 0))
    }

    /// The batch's clock.
    fn now(&mut self) -> std::time::Instant {
        *self.now.get_or_insert_with(std::time::Instant::now)
    }

    /// GET with the L1 on.
    pub(super) fn get(&mut self, req: &Request) {
        let key = &req.args[1];
        let db = self.st.db;
        let now = self.now();
        let mut lookup = self.shared.l1.get_at(db, key, now);
        if self.shared.stale.active() {
            lookup = self.stale_hit(key, lookup, now);
        }
        self.observe(db, key, &lookup);
        if let Lookup::Hit(v) = lookup {
            if !(self.st.tracking.on && self.written_hit(db, key)) {
                self.out_known += v.as_ref().map_or(0, |b| b.len());
                self.pending.push(Pending::Value(v));
                return;
            }
            lookup = Lookup::Miss;
        }
        let (node, slot) = match self.route_key(key) {
            Ok(r) => r,
            Err(e) => return self.slot_error(&e),
        };
        let node = self.read_node(node, slot);
        match lookup {
            Lookup::Hit(_) => {}
            Lookup::Bypass => self.forward(node, slot, &req.raw),
            Lookup::Miss => {
                let shared = Arc::clone(&self.shared);
                match shared.flights.lead_or_join(db, key, !self.batch_writes) {
                    Role::Join(rx) => self.pending.push(Pending::Join(rx)),
                    Role::Lead(flight) => {
                        let mut ticket = self.fill_ticket(node, db, key);
                        let fill = ticket.is_some() && self.fills_on_fill_conn(node);
                        if self.optin && !fill {
                            ticket = None;
                        }
                        let (at, idx) = self.enqueue_fetch(node, key, fill, None);
                        self.pending.push(Pending::Fetch(Box::new(Fetch {
                            node: at,
                            idx,
                            fill,
                            slot,
                            key: key.clone(),
                            ticket,
                            flight: Some(flight),
                            result: None,
                        })));
                    }
                }
            }
        }
    }

    /// A tracking client's hit is on a value this sidecache wrote, which
    /// Redis does not follow for it under optin (see
    /// `sidecache_pool::coherence::tracking`): the read goes to a fill
    /// lane instead (after the queued writes, so it reads the same value),
    /// which registers the key with Redis. The client may then keep the
    /// value until the key changes, as on Redis, rather than be told to
    /// drop it right after the reply (`Client::end_tracked_reads`).
    #[cold]
    fn written_hit(&self, db: u16, key: &[u8]) -> bool {
        self.optin && !self.shared.l1.followed(db, key, false)
    }

    /// Hot keys and prefix figures of one L1 lookup: one countdown when
    /// neither takes it (with `--prefix-stats` every lookup is due).
    #[inline]
    fn observe(&mut self, db: u16, key: &[u8], lookup: &Lookup) {
        if self.hot.read_due() {
            self.observe_due(db, key, lookup);
        }
    }

    /// A lookup due for a hot-key sample or the prefix figures. Inlined:
    /// with `--prefix-stats` it runs for every lookup, and out of line it
    /// cost 11 instructions more per GET hit
    /// (`bench/results/hotkeys-countdown.md`).
    #[inline]
    fn observe_due(&mut self, db: u16, key: &[u8], lookup: &Lookup) {
        if self.hot.read_sampled() {
            self.note_hot_read(db, key, !matches!(lookup, Lookup::Hit(_)));
        }
        if self.metrics.prefix.on() {
            let hit = match lookup {
                Lookup::Hit(v) => Some(v.as_ref().map_or(0, |b| b.len())),
                _ => None,
            };
            self.metrics
                .prefix
                .lookup(&self.shared.metrics.prefixes, key, hit);
        }
    }

    #[cold]
    fn note_hot_read(&self, db: u16, key: &[u8], missed: bool) {
        use crate::metrics::hotkeys::Dimension;
        self.shared.hotkeys.note(Dimension::Reads, db, key);
        if missed {
            self.shared.hotkeys.note(Dimension::Misses, db, key);
        }
    }

    /// A write of `key` (sampled into the hot keys' writes).
    #[inline]
    pub(super) fn observe_write(&mut self, key: &[u8]) {
        if self.hot.write() {
            self.shared
                .hotkeys
                .note(crate::metrics::hotkeys::Dimension::Writes, self.st.db, key);
        }
    }

    /// A ticket to fill `key` from `node`, or `None` while that node's
    /// invalidation channel is down (the read goes upstream, uncached).
    /// The epoch is read before the channel is checked: see
    /// `sidecache_pool::coherence::tracking` for why that order keeps stale values out.
    fn fill_ticket(&self, node: usize, db: u16, key: &[u8]) -> Option<sidecache_l1::FillTicket> {
        let ticket = self.shared.l1.begin_fill(db, key);
        self.topo
            .node(node)
            .is_some_and(|n| n.coherent())
            .then_some(ticket)
    }

    /// A hit while a master is out of reach under `--l1-stale-if-error`
    /// (`crate::state::stale`): served and counted inside its window, a
    /// miss once the window's time is up.
    #[cold]
    fn stale_hit(&self, key: &[u8], lookup: Lookup, now: std::time::Instant) -> Lookup {
        match lookup {
            Lookup::Hit(_) if self.shared.stale.check(key, now) == Serve::Expired => Lookup::Miss,
            other => other,
        }
    }

    /// MGET with the L1 on: hits from the cache, misses fetched (one GET +
    /// PTTL each, pipelined per node: one round trip), merged in order.
    pub(super) fn mget(&mut self, req: &Request) {
        let db = self.st.db;
        let mut items = Vec::with_capacity(req.args.len() - 1);
        let now = self.now();
        for key in &req.args[1..] {
            let mut lookup = self.shared.l1.get_at(db, key, now);
            if self.shared.stale.active() {
                lookup = self.stale_hit(key, lookup, now);
            }
            self.observe(db, key, &lookup);
            if let Lookup::Hit(v) = lookup {
                if !(self.st.tracking.on && self.written_hit(db, key)) {
                    self.out_known += v.as_ref().map_or(0, |b| b.len());
                    items.push(MgetItem::Hit(v));
                    continue;
                }
                lookup = Lookup::Miss;
            }
            let (node, slot) = match self.route_key(key) {
                Ok(r) => r,
                Err(e) => return self.slot_error(&e),
            };
            let node = self.read_node(node, slot);
            let mut ticket = if lookup == Lookup::Miss {
                self.fill_ticket(node, db, key)
            } else {
                None
            };
            let fill = ticket.is_some() && self.fills_on_fill_conn(node);
            if self.optin && !fill {
                ticket = None;
            }
            let (at, idx) = self.enqueue_fetch(node, key, fill, None);
            items.push(MgetItem::Fetch(Fetch {
                node: at,
                idx,
                fill,
                slot,
                key: key.clone(),
                ticket,
                flight: None,
                result: None,
            }));
        }
        self.pending.push(Pending::Mget(items));
    }

    /// What a command makes the L1 drop (`None` for reads), applied now, in
    /// command order, before the next command of the pipeline is answered.
    pub(super) fn write_invalidation(
        &mut self,
        info: &CommandInfo,
        args: &[Bytes],
    ) -> Option<Inval> {
        let written_only = match info.invalidation {
            Invalidation::None => return None,
            // Peers still need to hear of it when this L1 is off.
            // Replica reads stamp the written slots (`apply`).
            _ if !self.shared.l1.enabled()
                && self.shared.upstream.peer().is_none()
                && !self.replica_reads =>
            {
                return None
            }
            Invalidation::Keys { written_only } => Some(written_only),
            Invalidation::All => None,
        };
        self.batch_writes = true;
        let inval = match written_only {
            None => Inval::All,
            Some(written_only) => {
                self.keys.clear();
                match info.keys_where(args, &mut self.keys, written_only) {
                    Ok(true) if !self.keys.is_empty() => {
                        // Pushed, not collected: SmallVec's `extend` (its
                        // reserve from the size hint) cost a one-key write
                        // ~90 instructions.
                        let mut keys: smallvec::SmallVec<[Bytes; 1]> = smallvec::SmallVec::new();
                        for &i in &self.keys {
                            keys.push(args[i].clone());
                        }
                        for k in &keys {
                            self.observe_write(k);
                        }
                        if self.shared.tracked.active() {
                            self.report_expiry(info, args);
                        }
                        Inval::Keys(keys)
                    }
                    // Wrong arity: upstream will refuse it; nothing changes.
                    Err(crate::cmd::table::KeysError::Invalid) => return None,
                    // Keys unknown or incomplete, or a keyless write: be safe.
                    _ => Inval::All,
                }
            }
        };
        self.apply_l1(&inval);
        Some(inval)
    }

    /// A forwarded write that gives its key a time to live: its tracking
    /// clients hear of the expiry when it falls due
    /// ([`crate::tracking::Tracked::expire_at`]). Queued inside
    /// MULTI, it runs at EXEC, and so does its clock
    /// ([`Client::start_tx_expiries`]).
    fn report_expiry(&mut self, info: &CommandInfo, args: &[Bytes]) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if let Some(at) = crate::cmd::write::expires_at(&info.name, args, now) {
            let left = std::time::Duration::from_millis(u64::try_from(at - now).unwrap_or(0));
            match self.tx.as_mut() {
                Some(tx) => tx.expiries.push((args[1].clone(), left)),
                None => self
                    .shared
                    .tracked
                    .expire_at(&args[1], std::time::Instant::now() + left),
            }
        }
    }

    /// EXEC is sent: the expiries its writes set start now.
    pub(super) fn start_tx_expiries<'a>(
        &self,
        expiries: impl Iterator<Item = &'a (Bytes, std::time::Duration)>,
    ) {
        let now = std::time::Instant::now();
        for (key, left) in expiries {
            self.shared.tracked.expire_at(key, now + *left);
        }
    }

    /// Drops what `inval` names from the L1, before the write is sent;
    /// tracking clients hear of it at its acknowledgement ([`Client::apply`]).
    /// With replica reads its slots are stamped (as again at the
    /// acknowledgement).
    pub(super) fn apply_l1(&self, inval: &Inval) {
        if self.replica_reads {
            self.stamp_written(inval);
        }
        match inval {
            Inval::Keys(keys) => {
                for k in keys {
                    self.shared.drop_cached(self.st.db, k);
                }
                if self.shared.tracked.active() {
                    self.shared.upstream.expect_echoes(keys);
                    self.shared.tracked.writing(keys, self.st.id);
                }
            }
            Inval::All => {
                self.shared.l1.clear();
                self.shared.flights.forget_all();
            }
        }
    }

    /// Drops what `inval` names from the L1 at the write's acknowledgement;
    /// tracking clients are told (BCAST ones when the batch ends). With
    /// replica reads its slots are stamped: reads of them avoid replicas
    /// until they are proven to hold the write (see
    /// `sidecache_pool::replica`).
    pub(super) fn apply(&self, inval: &Inval) {
        self.apply_sparing(inval, false);
    }

    /// [`Client::apply`]; `spare`: the write was this client's script run
    /// where Redis follows what it read, so this client keeps its
    /// registrations and hears of real changes from Redis
    /// ([`crate::tracking::Tracked::invalidate_sparing`]).
    pub(super) fn apply_sparing(&self, inval: &Inval, spare: bool) {
        if self.replica_reads {
            self.stamp_written(inval);
        }
        match inval {
            Inval::Keys(keys) if spare => {
                for k in keys {
                    self.shared.drop_cached(self.st.db, k);
                }
                if self.shared.tracked.active() {
                    self.shared.tracked.invalidate_sparing(keys, self.st.id);
                }
            }
            Inval::Keys(keys) => {
                for k in keys {
                    self.shared.invalidate_from(self.st.db, k, Some(self.st.id));
                }
            }
            Inval::All => self.shared.invalidate_all(),
        }
    }
}
