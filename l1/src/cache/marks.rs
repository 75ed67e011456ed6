//! Read marks: for each key hash, the second the key was last read, so a
//! write can tell whether its key is being read (optin tracking re-reads
//! such a key in the write's pipeline to keep it cached:
//! `sidecache_pool::coherence::refill`). It owns no entries and knows no
//! keys, only their hashes: keys sharing a mark cost a re-read too many,
//! never a stale value.
//!
//! # Unread writes
//! A key whose first access is a write has no mark, so its write is not
//! re-read and its first read misses. Whether re-reading such writes pays
//! is a property of the workload, so it is measured, not guessed: keys
//! whose hash is in a fixed sample (1 in 16: [`sampled`]) always follow the
//! read-mark rule, and a *ghost* notes, per sampled key, the second its
//! unread write was released. A fill that finds a recent ghost is a read
//! the re-read would have served. Every [`PERIOD`] sampled releases, the
//! share of them read since decides for every key outside the sample:
//! from 1 in [`ON_AT`] on, unread writes are re-read too; below 1 in
//! [`OFF_BELOW`], they are not (the default at start).
//!
//! Why those bounds: a miss costs Redis a round trip of its own (`GET`,
//! `PTTL`), a re-read only its part of a batch. Re-reading every write on
//! the worst row of `bench/workload.sh` (Zipf 0.99 over 10^6 keys, 50%
//! writes, where 12% of unread writes are read later) cost Redis 7.62 µs
//! per operation against bcast's 8.00 in one run; the read-mark rule
//! alone, 8.88 against bcast's 9.00 in the run before it. A load that
//! never reads what it writes reads no ghost and keeps
//! the rule: its writes cost Redis what untracked writes cost.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Marks wrap after this many seconds (18 hours): a key last read a
/// multiple of that ago may look read lately, one re-read too many.
const WRAP: u16 = u16::MAX;
/// Marks (a power of two): 2^19 of 2 bytes, 1 MiB.
const SLOTS: usize = 1 << 19;

/// Ghosts (a power of two): 2^15 of 2 bytes, 64 KiB.
const GHOSTS: usize = 1 << 15;
/// Sampled unread writes per decision.
pub(super) const PERIOD: u32 = 64;
/// Unread writes are re-read once at least 1 in this many is read later...
pub(super) const ON_AT: u32 = 16;
/// ...and no longer once fewer than 1 in this many is.
const OFF_BELOW: u32 = 32;

/// The marks, or none (off: bcast, or no L1).
pub(super) struct Marks {
    /// Per hash, the second (since `born`, plus one; 0: never) of the last
    /// read.
    slots: Box<[AtomicU16]>,
    /// Per sampled hash, the second its unread write was released (0:
    /// none, or read since).
    ghosts: Box<[AtomicU16]>,
    /// Sampled unread writes released in this period.
    released: AtomicU32,
    /// Of them, those read within the window (ghosts found by a fill).
    read_after: AtomicU32,
    /// Whether unread writes outside the sample are re-read.
    reread_unread: AtomicBool,
    /// How recent a read counts: the TTL cap in seconds (no filled entry
    /// outlives it), at most half a wrap.
    window: u16,
    born: Instant,
}

impl Marks {
    /// Marks counting from `born`, within `ttl_cap`; empty unless `on`.
    pub(super) fn new(on: bool, ttl_cap: Duration, born: Instant) -> Marks {
        Marks {
            slots: (0..if on { SLOTS } else { 0 })
                .map(|_| AtomicU16::new(0))
                .collect(),
            ghosts: (0..if on { GHOSTS } else { 0 })
                .map(|_| AtomicU16::new(0))
                .collect(),
            released: AtomicU32::new(0),
            read_after: AtomicU32::new(0),
            reread_unread: AtomicBool::new(false),
            window: ttl_cap.as_secs().clamp(1, u64::from(WRAP / 2)) as u16,
            born,
        }
    }

    /// Whether marks are kept.
    pub(super) fn on(&self) -> bool {
        !self.slots.is_empty()
    }

    /// A hash's mark (bits above the epoch bucket's).
    fn slot(&self, hash: u64) -> Option<&AtomicU16> {
        self.slots.get((hash >> 12) as usize & (SLOTS - 1))
    }

    /// `now` as a mark: seconds since `born`, wrapped, never 0.
    fn second(&self, now: Instant) -> u16 {
        (now.saturating_duration_since(self.born).as_secs() % u64::from(WRAP)) as u16 + 1
    }

    /// Notes that the key was read at `now` (a load, and a store at most
    /// once a second: readers of a hot key share no written cache line).
    pub(super) fn note(&self, hash: u64, now: Instant) {
        if let Some(m) = self.slot(hash) {
            let s = self.second(now);
            if m.load(Ordering::Relaxed) != s {
                m.store(s, Ordering::Relaxed);
            }
        }
    }

    /// Whether the key was read within the window before `now`.
    pub(super) fn read_lately(&self, hash: u64, now: Instant) -> bool {
        self.slot(hash)
            .is_some_and(|m| self.lately(m.load(Ordering::Relaxed), now))
    }

    /// Whether a mark (0: none) is within the window before `now`.
    fn lately(&self, mark: u16, now: Instant) -> bool {
        if mark == 0 {
            return false;
        }
        let wrap = u32::from(WRAP);
        let age = (u32::from(self.second(now)) + wrap - u32::from(mark)) % wrap;
        age <= u32::from(self.window)
    }

    /// Whether a write of the key should be re-read: the key was read
    /// lately, or (outside the sample) the proxy's unread writes are
    /// being read ([module docs](self)).
    pub(super) fn reread(&self, hash: u64, now: Instant) -> bool {
        self.read_lately(hash, now)
            || (!sampled(hash) && self.reread_unread.load(Ordering::Relaxed))
    }

    /// Whether unread writes outside the sample are re-read now.
    pub(super) fn rereads_unread(&self) -> bool {
        self.reread_unread.load(Ordering::Relaxed)
    }

    /// A sampled key's ghost.
    fn ghost(&self, hash: u64) -> Option<&AtomicU16> {
        if !sampled(hash) {
            return None;
        }
        self.ghosts.get((hash >> 12) as usize & (GHOSTS - 1))
    }

    /// A fill (a read that missed) of the key at `now`: its read mark,
    /// and, for a sampled key released unread lately, a read the re-read
    /// would have served.
    pub(super) fn filled(&self, hash: u64, now: Instant) {
        self.note(hash, now);
        if let Some(g) = self.ghost(hash) {
            let mark = g.load(Ordering::Relaxed);
            if self.lately(mark, now) && g.swap(0, Ordering::Relaxed) == mark {
                self.read_after.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A write of the key left the L1 once landed (it was not re-read):
    /// for a sampled key, its ghost; every [`PERIOD`] of them, the
    /// decision for the keys outside the sample.
    pub(super) fn released(&self, hash: u64, now: Instant) {
        let Some(g) = self.ghost(hash) else {
            return;
        };
        g.store(self.second(now), Ordering::Relaxed);
        if self.released.fetch_add(1, Ordering::Relaxed) + 1 < PERIOD {
            return;
        }
        // One decider per period (a racing release only counts late).
        let released = self.released.swap(0, Ordering::Relaxed);
        if released < PERIOD {
            return;
        }
        let read = self.read_after.swap(0, Ordering::Relaxed);
        let on = self.reread_unread.load(Ordering::Relaxed);
        let next = if on {
            read.saturating_mul(OFF_BELOW) >= released
        } else {
            read.saturating_mul(ON_AT) >= released
        };
        if next != on {
            self.reread_unread.store(next, Ordering::Relaxed);
        }
    }
}

/// Whether a hash is in the sample that keeps the read-mark rule: 1 in
/// 16, by bits no mark, ghost or epoch bucket is chosen by.
pub(super) fn sampled(hash: u64) -> bool {
    hash >> 60 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_counts_within_the_window_and_off_counts_none() {
        let born = Instant::now();
        let m = Marks::new(true, Duration::from_secs(2), born);
        assert!(!m.read_lately(7, born));
        m.note(7 << 12, born);
        assert!(m.read_lately(7 << 12, born));
        assert!(m.read_lately(7 << 12, born + Duration::from_secs(2)));
        assert!(!m.read_lately(7 << 12, born + Duration::from_secs(3)));
        // Another slot is another key.
        assert!(!m.read_lately(8 << 12, born));
        let off = Marks::new(false, Duration::from_secs(2), born);
        off.note(7 << 12, born);
        assert!(!off.on() && !off.read_lately(7 << 12, born));
    }

    /// A sampled hash (top bits 0) and one outside the sample.
    fn sample(i: u64) -> u64 {
        i << 12
    }
    fn other(i: u64) -> u64 {
        (1 << 63) | (i << 12)
    }

    /// Releases `n` sampled unread writes (distinct keys from `from`),
    /// the first `read` of them read back by a fill.
    fn period(m: &Marks, from: u64, n: u32, read: u32, now: Instant) {
        for i in 0..u64::from(n) {
            m.released(sample(from + i), now);
        }
        for i in 0..u64::from(read) {
            m.filled(sample(from + i), now);
        }
    }

    #[test]
    fn unread_writes_are_reread_while_reads_of_them_pay_and_not_after() {
        let born = Instant::now();
        let m = Marks::new(true, Duration::from_secs(60), born);
        assert!(!m.reread(other(1), born), "off at start");
        // A period of unread writes nobody reads: stays off.
        period(&m, 0, PERIOD, 0, born);
        assert!(!m.rereads_unread());
        // 1 in 16 read back (counted in the next period's decision).
        period(&m, 1000, PERIOD, PERIOD / ON_AT, born);
        period(&m, 2000, PERIOD, 0, born);
        assert!(m.rereads_unread() && m.reread(other(1), born));
        // The sample keeps the read-mark rule.
        assert!(!m.reread(sample(5000), born));
        m.note(sample(5000), born);
        assert!(m.reread(sample(5000), born));
        // A ghost counts once: a second fill of the key is no new read.
        period(&m, 3000, PERIOD, PERIOD / 16, born);
        for i in 0..u64::from(PERIOD / 16) {
            m.filled(sample(3000 + i), born);
        }
        // 1 in 32 keeps it on (hysteresis), fewer turns it off.
        period(&m, 4000, PERIOD, PERIOD / 32, born);
        assert!(m.rereads_unread());
        period(&m, 5000, PERIOD, PERIOD / 64, born);
        period(&m, 6000, PERIOD, 0, born);
        assert!(!m.rereads_unread() && !m.reread(other(1), born));
    }

    #[test]
    fn a_ghost_read_after_the_window_is_not_counted() {
        let born = Instant::now();
        let m = Marks::new(true, Duration::from_secs(2), born);
        period(&m, 0, PERIOD, 0, born);
        let late = born + Duration::from_secs(5);
        // Every write of the last period read, but too late to count.
        for i in 0..u64::from(PERIOD) {
            m.filled(sample(i), late);
        }
        period(&m, 1000, PERIOD, 0, late);
        assert!(!m.rereads_unread());
    }
}
