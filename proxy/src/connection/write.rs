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
use sidecache_pool::{Slot, Write};

use super::Client;
use crate::cmd::write::{self, Expiry, WritePlan};

/// Pairs bound for one node and slot: (node index, slot, (key, value) indexes).
type Group = (usize, Option<Slot>, write::Pairs);

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
        // Group the pairs by slot (cluster) — one upstream command each.
        // Inline for one slot (every SET): no allocation per write.
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
        // A slot that moved since its last queued write: wait until the old
        // owner's queue has applied it (bounded), so a key's writes stay in order.
        for (node, slot, _) in &groups {
            let (Some(slot), Some(n)) = (slot, self.topo.nodes().get(*node)) else {
                continue;
            };
            let moved = self.shared.upstream.wait_reroute(*slot, n, self.st.db);
            if let Err(e) = moved.await {
                let msg = format!("ERR {e}");
                self.local_reply(|r| r.error(&msg));
                return true;
            }
        }
        // Nothing already bound for these nodes may be overtaken.
        if groups.iter().any(|g| {
            self.builders.get(g.0).is_some_and(|b| b.count > 0)
                || self
                    .fills
                    .iter()
                    .skip(g.0 * self.fill_lanes)
                    .take(self.fill_lanes)
                    .any(|b| b.count > 0)
        }) {
            self.flush().await;
        }
        let shared = std::sync::Arc::clone(&self.shared);
        let wb = shared.upstream.write_behind();
        let mut permits: smallvec::SmallVec<[_; 1]> = smallvec::SmallVec::new();
        // After one write waited the full timeout and was refused, this
        // client's writes do not wait again for as long (see `refusing`).
        let wait = match self.refusing {
            Some(until) if std::time::Instant::now() < until => std::time::Duration::ZERO,
            _ => wb.config().queue_timeout,
        };
        for (_, _, pairs) in &groups {
            // Sized once: the room taken, and the encoding's buffer.
            let need = write::encoded_bound(args, pairs);
            match wb.reserve_within(wait, need).await {
                Ok(p) => permits.push((p, need)),
                // Larger than the whole queue: sent through instead, after
                // the writes queued before it (as any forwarded command).
                Err(sidecache_pool::Error::TooLargeToQueue { .. }) => return false,
                Err(e) => {
                    if !wait.is_zero() {
                        self.refusing = Some(std::time::Instant::now() + wait);
                    }
                    let msg = format!("ERR {e}");
                    self.local_reply(|r| r.error(&msg));
                    return true;
                }
            }
        }
        let now = self.cache_written(&plan, args, now_ms);
        // A node whose invalidation channel is down: its keys are not
        // cached. Checked after the insert, as a fill checks after reading
        // its epoch (see `sidecache_pool::coherence::tracking`).
        if !groups
            .iter()
            .all(|g| self.topo.nodes().get(g.0).is_some_and(|n| n.coherent()))
        {
            for &(k, _) in &plan.pairs {
                self.shared.invalidate(self.st.db, &args[k]);
            }
        }
        let db = self.st.db;
        let mut journalled = 0;
        for ((node, slot, pairs), (permit, need)) in groups.into_iter().zip(permits) {
            let cmd = write::encode(&plan, args, raw, &pairs, need, &mut self.write_buf);
            let Some(n) = self.topo.nodes().get(node).cloned() else {
                return false;
            };
            match shared
                .upstream
                .queue_write(&n, Write { db, slot, cmd }, permit, now)
            {
                Ok(seq) => journalled = journalled.max(seq),
                Err(e) => {
                    for &(k, _) in &pairs {
                        shared.invalidate(db, &args[k]);
                    }
                    // As Redis answers a write its AOF cannot take.
                    let kind = match e {
                        sidecache_pool::Error::Journal(_) => "MISCONF",
                        _ => "ERR",
                    };
                    let msg = format!("{kind} {e}");
                    self.local_reply(|r| r.error(&msg));
                    return true;
                }
            }
        }
        // `--write-journal-fsync always`: `+OK` once the record is synced
        // (`Client::reply`). `everysec` and `no` acknowledge at once: the
        // writer thread writes the record within moments, and a crash
        // loses at most what it had not written yet (about a second at
        // worst), the promise of those settings.
        let synced = journalled > 0
            && wb
                .journal()
                .is_some_and(|j| j.config().fsync == Fsync::Always);
        if synced {
            self.pending.push(super::Pending::Journalled(journalled));
        } else {
            self.local_reply(|r| r.ok());
        }
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

    /// The written values become what the L1 serves (or, for KEEPTTL, whose
    /// remaining TTL the proxy does not know, the keys are dropped).
    /// Returns the clock it read (when the write was acknowledged).
    fn cache_written(&mut self, plan: &WritePlan, args: &[Bytes], now_ms: i64) -> Instant {
        let now = Instant::now();
        let deadline = match plan.expiry {
            Expiry::Persist | Expiry::KeepTtl => now + Duration::from_secs(365 * 24 * 3600),
            Expiry::At(ms) => now + Duration::from_millis(u64::try_from(ms - now_ms).unwrap_or(0)),
        };
        let db = self.st.db;
        for &(k, v) in &plan.pairs {
            if plan.expiry == Expiry::KeepTtl {
                self.shared.invalidate(db, &args[k]);
            } else {
                self.shared
                    .l1
                    .insert_written(db, &args[k], &args[v], deadline, now);
                self.shared.flights.forget(db, &args[k]);
            }
        }
        // Fetches later in this batch must not join other clients' flights.
        self.batch_writes = true;
        now
    }
}
