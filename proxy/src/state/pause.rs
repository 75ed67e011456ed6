//! `CLIENT PAUSE timeout [WRITE|ALL]` and `CLIENT UNPAUSE`, over
//! sidecache's own clients, as Redis 7 pauses its clients.
//!
//! While a pause is on, a client's next command waits (its earlier
//! replies written first) when the pause covers it: under `ALL` every
//! command, under `WRITE` the commands that may change data (`write` or
//! `may_replicate` in the upstream's COMMAND table: `SET`, `EVAL`,
//! `PUBLISH`, …, and `EXEC`). Reads and L1 hits go on under `WRITE`. A
//! write-behind `SET` is not acknowledged until the pause ends; writes
//! acknowledged before it keep flowing upstream. The pause is not sent
//! upstream: Redis would pause every client of every sidecache sharing it,
//! and this sidecache's own write-behind batches, where the caller asked
//! to pause the clients of the server it talks to.
//!
//! When no pause is on a command pays one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The pause state shared by every client.
#[derive(Debug)]
pub struct Pause {
    /// When the pause ends, in microseconds from `epoch`; 0: none.
    until_us: AtomicU64,
    /// Whether it pauses every command (`ALL`), not just writes.
    all: AtomicBool,
    epoch: Instant,
    /// Wakes the waiting clients when the pause ends early (UNPAUSE).
    changed: Notify,
}

impl Default for Pause {
    fn default() -> Pause {
        Pause {
            until_us: AtomicU64::new(0),
            all: AtomicBool::new(false),
            epoch: Instant::now(),
            changed: Notify::new(),
        }
    }
}

impl Pause {
    /// Whether a pause may be on (one relaxed load).
    #[inline]
    pub fn on(&self) -> bool {
        self.until_us.load(Ordering::Relaxed) != 0
    }

    /// `CLIENT PAUSE`: as Redis, the stricter mode and the later end win
    /// over a pause already on.
    pub fn pause(&self, timeout: Duration, all: bool) {
        let end = u64::try_from((Instant::now() + timeout - self.epoch).as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        if all {
            self.all.store(true, Ordering::Release);
        }
        self.until_us.fetch_max(end, Ordering::AcqRel);
    }

    /// `CLIENT UNPAUSE`.
    pub fn unpause(&self) {
        self.until_us.store(0, Ordering::Release);
        self.all.store(false, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Whether a command (`writes`: one that may change data) waits now,
    /// and until when.
    pub fn holds(&self, writes: bool) -> Option<Instant> {
        let until = self.until_us.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        let end = self.epoch + Duration::from_micros(until);
        if Instant::now() >= end {
            // Over: the first to see it clears it.
            if self
                .until_us
                .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.all.store(false, Ordering::Release);
            }
            return None;
        }
        (writes || self.all.load(Ordering::Acquire)).then_some(end)
    }

    /// Waits while the pause holds a command (`writes` as above).
    pub async fn wait(&self, writes: bool) {
        while let Some(end) = self.holds(writes) {
            let changed = self.changed.notified();
            tokio::select! {
                () = tokio::time::sleep_until(end.into()) => {}
                () = changed => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_pauses_hold_writes_only_until_unpaused_or_over() {
        let p = Pause::default();
        assert!(!p.on());
        assert!(p.holds(true).is_none());
        p.pause(Duration::from_secs(60), false);
        assert!(p.on());
        assert!(p.holds(true).is_some());
        assert!(p.holds(false).is_none());
        // ALL is stricter and wins; a shorter timeout does not shorten it.
        p.pause(Duration::from_millis(1), true);
        assert!(p.holds(false).is_some());
        p.unpause();
        assert!(!p.on() && p.holds(true).is_none() && p.holds(false).is_none());
        p.pause(Duration::from_millis(30), true);
        let t0 = Instant::now();
        p.wait(false).await;
        assert!(t0.elapsed() >= Duration::from_millis(25));
        assert!(!p.on());
    }
}
