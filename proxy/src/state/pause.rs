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
//! Which scripts declare `no-writes` Redis knows by their bodies; an
//! EVALSHA names one by SHA only. So the SHAs of the scripts with that
//! flag that pass through sidecache (EVAL, SCRIPT LOAD) are remembered,
//! at most `--script-flags-max` (past it the set starts over; a script
//! forgotten is held as one that may write).
//!
//! The clients a pause holds now are counted (`waiting`): INFO's
//! `blocked_clients` includes them, as Redis counts its paused clients.
//!
//! When no pause is on a command pays one relaxed load.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
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
    /// How many clients the pause holds now.
    waiting: AtomicUsize,
    /// SHA1s (lowercase hex) of the scripts seen declaring `no-writes`.
    ro_scripts: Mutex<HashSet<[u8; 40]>>,
    /// `--script-flags-max`.
    ro_scripts_max: usize,
}

impl Pause {
    /// No pause; at most `ro_scripts_max` read-only scripts remembered.
    pub fn new(ro_scripts_max: usize) -> Pause {
        Pause {
            until_us: AtomicU64::new(0),
            all: AtomicBool::new(false),
            epoch: Instant::now(),
            changed: Notify::new(),
            waiting: AtomicUsize::new(0),
            ro_scripts: Mutex::new(HashSet::new()),
            ro_scripts_max,
        }
    }

    /// A script body that passed through (EVAL, SCRIPT LOAD): remembered
    /// by SHA if it declares `no-writes`.
    pub fn saw_script(&self, body: &[u8]) {
        if crate::cmd::pause::declares_no_writes(body) != Some(true) || self.ro_scripts_max == 0 {
            return;
        }
        use sha1::Digest;
        let digest = sha1::Sha1::digest(body);
        let mut hex = [0u8; 40];
        for (i, b) in digest.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 15)];
        }
        let mut set = self.ro_scripts.lock().unwrap_or_else(|p| p.into_inner());
        if set.len() >= self.ro_scripts_max && !set.contains(&hex) {
            set.clear();
        }
        set.insert(hex);
    }

    /// Whether `sha` (EVALSHA's, any case) names a script seen declaring
    /// `no-writes`.
    pub fn ro_script(&self, sha: &[u8]) -> bool {
        let Ok(mut hex) = <[u8; 40]>::try_from(sha) else {
            return false;
        };
        hex.make_ascii_lowercase();
        self.ro_scripts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&hex)
    }

    /// Whether the pause on now holds every command (`ALL`).
    pub fn all(&self) -> bool {
        self.all.load(Ordering::Acquire)
    }
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

    /// How many clients the pause holds now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Waits while the pause holds a command (`writes` as above), counted
    /// in `waiting` meanwhile (a client dropped while held included).
    pub async fn wait(&self, writes: bool) {
        struct Held<'a>(&'a AtomicUsize);
        impl Drop for Held<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _held = Held(&self.waiting);
        while let Some(end) = self.holds(writes) {
            let changed = self.changed.notified();
            tokio::select! {
                () = tokio::time::sleep_until(end.into()) => {}
                () = changed => {}
            }
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_pauses_hold_writes_only_until_unpaused_or_over() {
        let p = Pause::new(10);
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
        let held = p.wait(false);
        tokio::pin!(held);
        // Counted while it waits, not once it is over or dropped.
        assert!(futures_poll_once(held.as_mut()).await);
        assert_eq!(p.waiting(), 1);
        held.await;
        assert!(t0.elapsed() >= Duration::from_millis(25));
        assert!(!p.on());
        assert_eq!(p.waiting(), 0);
        p.pause(Duration::from_secs(60), false);
        {
            let held = p.wait(true);
            tokio::pin!(held);
            assert!(futures_poll_once(held.as_mut()).await);
            assert_eq!(p.waiting(), 1);
        }
        assert_eq!(p.waiting(), 0);
    }

    #[test]
    fn read_only_scripts_are_remembered_by_sha_within_the_bound() {
        let p = Pause::new(2);
        let ro = b"#!lua flags=no-writes\nreturn 2";
        p.saw_script(ro);
        p.saw_script(b"#!lua\nreturn 1");
        p.saw_script(b"return 1");
        // SHA1 of `ro`, as Redis names it (SCRIPT LOAD's reply).
        let sha = "ae33f9227913b24d053a555637f98260b23bd3a3";
        assert!(p.ro_script(sha.as_bytes()));
        assert!(p.ro_script(sha.to_ascii_uppercase().as_bytes()));
        assert!(!p.ro_script(b"0000000000000000000000000000000000000000"));
        assert!(!p.ro_script(b"short"));
        assert_eq!(p.ro_scripts.lock().unwrap().len(), 1);
        p.saw_script(b"#!lua flags=no-writes\nreturn 3");
        p.saw_script(b"#!lua flags=no-writes\nreturn 4");
        // Past the bound the set starts over.
        assert_eq!(p.ro_scripts.lock().unwrap().len(), 1);
        assert!(!p.ro_script(sha.as_bytes()));
    }

    /// Polls `f` once; true if it is still pending.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> bool {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::pin::Pin::new(&mut f).poll(cx).is_pending())
        })
        .await
    }
}
