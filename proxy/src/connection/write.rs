//! Write-behind dispatch: an unconditional SET/SETEX/PSETEX/MSET is put in
//! the L1, queued on its node's write-behind queue, and acknowledged.
//!
//! Order: commands of this batch already bound for the same node are sent
//! (and answered) first, so a write queued now cannot overtake them; and a
//! command sent to a node later waits for that node's queued writes
//! ([`sidecache_pool::write_behind::WriteQueue::barrier`], in `flush`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sidecache_pool::write_behind::journal::{Fsync, JournalError};
use sidecache_pool::write_behind::{Reservation, WriteBehind};
use sidecache_pool::{Slot, Write};

use super::Client;
use crate::cmd::write::{self, Expiry, WritePlan};
use crate::state::Shared;

/// Pairs bound for one node and slot: (node index, slot, (key, value) indexes).
type Group = (usize, Option<Slot>, write::Pairs);

/// What became of a group's command ([`Client::queue`]).
enum Outcome {
    /// Queued, with its journal sequence number (0: not journalled).
    Queued(u64),
    /// Not queued: the error is answered and its keys left the L1.
    Answered,
    /// Its node is gone from the topology: the command is forwarded
    /// instead.
    NoNode,
}

/// One group's command to queue: its node, slot, pairs and the room they
/// reserved (`need`, their [`write::encoded_bound`]).
struct Queue<'a, 'w> {
    node: usize,
    slot: Option<Slot>,
    pairs: &'a [(usize, usize)],
    need: usize,
    permit: Reservation<'w>,
    /// Some key was read lately (within the TTL cap): the write re-reads it
    /// (`sidecache_pool::coherence::refill`).
    refill: bool,
    /// Some key's written value is cached (released once it lands).
    cached: bool,
}

impl Client {
    /// Takes the write-behind path for `args` (the request `raw`) if the
    /// plan allows; `false` means forward the command instead.
    pub(super) async fn write_behind(&mut self, name: &str, args: &[Bytes], raw: &[u8]) -> bool {
        // The wall clock only turns relative expiries into absolute ones: a
        // plain `SET k v` or an MSET has none (one clock read less on the
        // acknowledgement path).
        let relative = !(name == "mset" || name == "set" && args.len() == 3);
        let now_ms = if relative {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64)
        } else {
            0
        };
        let Some(plan) = write::plan(name, args, now_ms) else {
            return false;
        };
        if let [pair] = plan.pairs[..] {
            return self.write_one(&plan, args, raw, now_ms, pair).await;
        }
        // Group the pairs by slot (cluster) — one upstream command each.
        let mut groups: smallvec::SmallVec<[Group; 1]> = smallvec::SmallVec::new();
        for &(k, v) in &plan.pairs {
            let (node, slot) = match self.route_key(&args[k]) {
                Ok(r) => r,
                Err(_) => return false,
            };
            match groups.iter_mut().find(|g| g.1 == slot) {
                Some(g) => g.2.push((k, v)),
                None => groups.push((node, slot, smallvec::smallvec![(k, v)])),
            }
        }
        for &(node, slot, _) in &groups {
            if let Err(msg) = self.keep_slot_order(node, slot).await {
                self.local_reply(|r| r.error(&msg));
                return true;
            }
        }
        if groups.iter().any(|g| self.bound_for(g.0)) {
            self.flush().await;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let wb = shared.upstream.write_behind();
        let mut permits: smallvec::SmallVec<[_; 1]> = smallvec::SmallVec::new();
        let wait = self.room_wait(wb);
        for (_, _, pairs) in &groups {
            // Sized once: the room taken, and the encoding's buffer.
            let need = write::encoded_bound(args, pairs);
            match wb.reserve_within(wait, need).await {
                Ok(p) => permits.push((p, need)),
                Err(e) => return self.no_room(wait, &e),
            }
        }
        let (now, refill, cached) = self.cache_written(&plan, args, now_ms);
        if !groups.iter().all(|g| self.coherent(g.0)) {
            for &(k, _) in &plan.pairs {
                self.shared.drop_cached(self.st.db, &args[k]);
            }
        }
        let mut journalled = 0;
        for ((node, slot, pairs), (permit, need)) in groups.into_iter().zip(permits) {
            let group = Queue {
                node,
                slot,
                pairs: &pairs,
                need,
                permit,
                refill,
                cached,
            };
            match self.queue(&shared, &plan, args, raw, group, now) {
                Outcome::Queued(seq) => journalled = journalled.max(seq),
                Outcome::Answered => return true,
                Outcome::NoNode => return false,
            }
        }
        self.acknowledge(wb, journalled);
        true
    }

    /// Waits until the write journal holds every record up to `seq` with
    /// the promise of `--write-journal-fsync`.
    pub(super) async fn journalled(&mut self, seq: u64) -> Result<(), JournalError> {
        let Some(j) = self.shared.upstream.write_behind().journal() else {
            return Ok(());
        };
        let durable = self.durable.get_or_insert_with(|| j.durable());
        durable.wait(seq).await
    }

    /// Answers a queued write: `+OK` now, or with `--write-journal-fsync
    /// always` once its journal record (sequence number `journalled`, 0
    /// for none) is synced (`Client::reply`). `everysec` and `no`
    /// acknowledge at once: the writer thread writes the record within
    /// moments, and a crash loses at most what it had not written yet
    /// (about a second at worst), the promise of those settings.
    fn acknowledge(&mut self, wb: &WriteBehind, journalled: u64) {
        let synced = journalled > 0
            && wb
                .journal()
                .is_some_and(|j| j.config().fsync == Fsync::Always);
        if synced {
            self.pending.push(super::Pending::Journalled(journalled));
        } else {
            self.local_reply(|r| r.ok());
        }
    }

    /// [`Client::write_behind`] for a plan of one pair (SET, SETEX,
    /// PSETEX): the same steps for its one group, with nothing collected
    /// (the groups and permits the general path gathers were about a
    /// tenth of a SET's instructions).
    async fn write_one(
        &mut self,
        plan: &WritePlan,
        args: &[Bytes],
        raw: &[u8],
        now_ms: i64,
        pair: (usize, usize),
    ) -> bool {
        let Ok((node, slot)) = self.route_key(&args[pair.0]) else {
            return false;
        };
        if let Err(msg) = self.keep_slot_order(node, slot).await {
            self.local_reply(|r| r.error(&msg));
            return true;
        }
        if self.bound_for(node) {
            self.flush().await;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let wb = shared.upstream.write_behind();
        let wait = self.room_wait(wb);
        let pairs = [pair];
        let need = write::encoded_bound(args, &pairs);
        let permit = match wb.reserve_within(wait, need).await {
            Ok(p) => p,
            Err(e) => return self.no_room(wait, &e),
        };
        let (now, refill, cached) = self.cache_written(plan, args, now_ms);
        if !self.coherent(node) {
            self.shared.drop_cached(self.st.db, &args[pair.0]);
        }
        let group = Queue {
            node,
            slot,
            pairs: &pairs,
            need,
            permit,
            refill,
            cached,
        };
        match self.queue(&shared, plan, args, raw, group, now) {
            Outcome::Queued(seq) => self.acknowledge(wb, seq),
            Outcome::Answered => {}
            Outcome::NoNode => return false,
        }
        true
    }

    /// A slot that moved since its last queued write: waits until the old
    /// owner's queue has applied it (bounded), so a key's writes stay in
    /// order. `Err`: the error to answer.
    async fn keep_slot_order(&mut self, node: usize, slot: Option<Slot>) -> Result<(), String> {
        let (Some(slot), Some(n)) = (slot, self.topo.nodes().get(node)) else {
            return Ok(());
        };
        let moved = self.shared.upstream.wait_reroute(slot, n, self.st.db);
        moved.await.map_err(|e| format!("ERR {e}"))
    }

    /// Whether commands of this batch are already bound for `node` (on the
    /// client's builder or a fill lane): a write queued now must not
    /// overtake them, so they are sent first.
    fn bound_for(&self, node: usize) -> bool {
        self.builders.get(node).is_some_and(|b| b.count > 0)
            || self
                .fills
                .iter()
                .skip(node * self.fill_lanes)
                .take(self.fill_lanes)
                .any(|b| b.count > 0)
            || self.replicas_bound(node)
    }

    /// How long a write waits for room. After one write waited the full
    /// timeout and was refused, this client's writes do not wait again for
    /// as long (see `refusing`).
    fn room_wait(&self, wb: &WriteBehind) -> Duration {
        match self.refusing {
            Some(until) if Instant::now() < until => Duration::ZERO,
            _ => wb.config().queue_timeout,
        }
    }

    /// No room for a write: one larger than the whole queue is sent
    /// through instead (`false`), after the writes queued before it (as any
    /// forwarded command); otherwise the write is refused (`true`, replied).
    fn no_room(&mut self, wait: Duration, e: &sidecache_pool::Error) -> bool {
        if let sidecache_pool::Error::TooLargeToQueue { .. } = e {
            return false;
        }
        if !wait.is_zero() {
            self.refusing = Some(Instant::now() + wait);
        }
        let msg = format!("ERR {e}");
        self.local_reply(|r| r.error(&msg));
        true
    }

    /// Whether `node`'s invalidation channel is up. A node whose channel is
    /// down: its keys are not cached. Checked after the insert, as a fill
    /// checks after reading its epoch (see
    /// `sidecache_pool::coherence::tracking`).
    fn coherent(&self, node: usize) -> bool {
        self.topo.nodes().get(node).is_some_and(|n| n.coherent())
    }

    /// Encodes one group's command and queues it with its permit.
    fn queue(
        &mut self,
        shared: &Shared,
        plan: &WritePlan,
        args: &[Bytes],
        raw: &[u8],
        group: Queue<'_, '_>,
        now: Instant,
    ) -> Outcome {
        let Queue {
            node,
            slot,
            pairs,
            need,
            permit,
            refill,
            cached,
        } = group;
        let cmd = write::encode(plan, args, raw, pairs, need, &mut self.write_buf);
        // The topology a flush before took in may have fewer nodes.
        let Some(n) = self.topo.nodes().get(node) else {
            return Outcome::NoNode;
        };
        let db = self.st.db;
        match shared.upstream.queue_write(
            n,
            Write {
                db,
                slot,
                cmd,
                refill,
                cached,
            },
            permit,
            now,
        ) {
            Ok(seq) => Outcome::Queued(seq),
            Err(e) => {
                for &(k, _) in pairs {
                    shared.invalidate(db, &args[k]);
                }
                // As Redis answers a write its AOF cannot take.
                let kind = match e {
                    sidecache_pool::Error::Journal(_) => "MISCONF",
                    _ => "ERR",
                };
                let msg = format!("{kind} {e}");
                self.local_reply(|r| r.error(&msg));
                Outcome::Answered
            }
        }
    }

    /// The written values become what the L1 serves (or, for KEEPTTL, whose
    /// remaining TTL the proxy does not know, the keys are dropped).
    /// Returns the clock it read (when the write was acknowledged),
    /// whether a key is being read (`sidecache_l1`'s read marks: the
    /// write then re-reads its keys once landed, to keep them cached), and
    /// whether any written value is cached (to be released once it lands).
    fn cache_written(
        &mut self,
        plan: &WritePlan,
        args: &[Bytes],
        now_ms: i64,
    ) -> (Instant, bool, bool) {
        let now = Instant::now();
        let deadline = match plan.expiry {
            Expiry::Persist | Expiry::KeepTtl => now + Duration::from_secs(365 * 24 * 3600),
            Expiry::At(ms) => now + Duration::from_millis(u64::try_from(ms - now_ms).unwrap_or(0)),
        };
        let db = self.st.db;
        let mut refill = false;
        let mut cached = false;
        for &(k, v) in &plan.pairs {
            self.observe_write(&args[k]);
            if plan.expiry == Expiry::KeepTtl {
                if self.shared.tracked.active() {
                    self.shared
                        .upstream
                        .expect_echoes(std::slice::from_ref(&args[k]));
                }
                self.shared.invalidate_from(db, &args[k], Some(self.st.id));
            } else {
                let written = self
                    .shared
                    .l1
                    .insert_written(db, &args[k], &args[v], deadline, now);
                // Only a key registered on the connection that writes it
                // (fill lane 0) is kept by a re-read: see
                // `sidecache_pool::config::DEFAULT_FILL_CONNECTIONS`.
                cached |= written.cached;
                refill |= written.cached
                    && written.reread
                    && super::cache::fill_lane(&args[k], self.fill_lanes) == 0;
                self.shared.flights.forget(db, &args[k]);
                if self.shared.tracked.active() {
                    let keys = std::slice::from_ref(&args[k]);
                    self.shared.upstream.expect_echoes(keys);
                    self.shared.tracked.invalidate(keys, Some(self.st.id));
                    if let Expiry::At(_) = plan.expiry {
                        self.shared.tracked.expire_at(&args[k], deadline);
                    }
                }
            }
        }
        // Fetches later in this batch must not join other clients' flights.
        self.batch_writes = true;
        (now, refill, cached)
    }
}
