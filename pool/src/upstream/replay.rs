//! Replaying what a previous run left in the write journal, before any
//! client is served: each record is queued again as a write-behind write
//! (routed by its key's slot in today's map; the batchers follow MOVED,
//! retry and re-route as for any write), in journal order, so every key's
//! writes reach upstream in the order they were acknowledged and before
//! any new write.

use std::time::{Duration, Instant};

use crate::config::Session;
use crate::dispatch::Target;
use crate::error::{Error, Result};
use crate::slot::Slot;
use crate::upstream::Upstream;
use crate::write_behind::journal::Leftover;
use crate::write_behind::Write;

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Records queued again (or sent through, if larger than the queue).
    pub replayed: u64,
    /// Records upstream refused for good (counted in the write-behind's
    /// failures too, and logged).
    pub failed: u64,
}

/// How often a replay that is still waiting says so.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

impl Upstream {
    /// Replays `leftover` (see the module's documentation) and returns
    /// once every replayed write has landed (or failed for good) upstream;
    /// the previous run's segment files are deleted once their records are
    /// in this run's journal. Waits as long as upstream takes (the
    /// batchers retry); progress is logged every 5 s.
    ///
    /// # Errors
    /// [`Error::Journal`] when the records cannot be journalled again or the
    /// old files removed; [`Error::Closed`] when shutting down.
    pub async fn replay(&self, leftover: Leftover) -> Result<ReplayReport> {
        let wb = self.write_behind();
        let failed_before = wb.stats.failed.load(std::sync::atomic::Ordering::Relaxed);
        let mut report = ReplayReport::default();
        let mut last_seq = 0;
        let total = leftover.records.len();
        let mut said = Instant::now();
        for (i, r) in leftover.records.iter().enumerate() {
            let probe = Write {
                db: r.db,
                slot: None,
                cmd: r.cmd.clone(),
                refill: false,
                cached: false,
            };
            let slot = match probe.keys().first() {
                Some(k) if self.is_cluster() => Some(Slot::for_key(k)),
                _ => None,
            };
            let write = Write { slot, ..probe };
            report.replayed += 1;
            loop {
                let topo = self.topology();
                let idx = match slot {
                    Some(s) => topo.node_index(s).unwrap_or(0),
                    None => 0,
                };
                let Some(node) = topo.nodes().get(idx).cloned() else {
                    return Err(Error::SlotUnassigned(0));
                };
                match wb
                    .reserve_within(Duration::from_secs(3600), r.cmd.len())
                    .await
                {
                    Ok(room) => {
                        last_seq = self.queue_write(&node, write.clone(), room, Instant::now())?;
                        break;
                    }
                    // Larger than the queue is now: sent through.
                    Err(Error::TooLargeToQueue { .. }) => {
                        let session = Session {
                            db: r.db,
                            ..Session::default()
                        };
                        let target = slot.map_or(Target::Any, Target::Slot);
                        match self.execute(session, 0, target, r.cmd.clone()).await {
                            Ok(reply) if !reply.starts_with(b"-") => break,
                            Ok(reply) => {
                                report.failed += 1;
                                tracing::error!(db = r.db, error = %String::from_utf8_lossy(&reply).trim_end(), "write journal: a replayed write failed for good");
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "write journal: replaying a large write; retrying");
                                self.request_refresh();
                                tokio::time::sleep(Duration::from_millis(250)).await;
                            }
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            if said.elapsed() >= PROGRESS_EVERY {
                tracing::info!(queued = i + 1, total, "write journal: replaying");
                said = Instant::now();
            }
        }
        // The records are in this run's journal now: the old files go.
        if let Some(j) = wb.journal() {
            j.durable().wait(last_seq).await?;
        }
        leftover.finish().map_err(Error::Journal)?;
        while wb.depth() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if said.elapsed() >= PROGRESS_EVERY {
                tracing::info!(
                    waiting = wb.depth(),
                    total,
                    "write journal: waiting for replayed writes to land upstream"
                );
                said = Instant::now();
            }
        }
        report.failed += wb
            .stats
            .failed
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(failed_before);
        Ok(report)
    }
}
