//! Read marks: for each key hash, the second the key was last read, or
//! that it was written since, so a write can tell whether its key is
//! being read between its writes (optin tracking re-reads such a key in
//! the write's pipeline to keep it cached:
//! `sidecache_pool::coherence::refill`). It owns no entries and knows no
//! keys, only their hashes: keys sharing a mark cost a re-read too many,
//! or one too few (a miss later), never a stale value.
//!
//! # Per key: reads between writes
//! A write re-reads its key when the key was read (a fill, or a hit on a
//! written or re-read value) within the TTL cap and fewer than
//! [`UNREAD_WRITES`] writes of it ago: each write counts itself in the
//! key's mark ([`written_mark`]), and only a read resets the count. A key
//! written again and again with no read between (a counter, a rate limit,
//! a session touched but not read) is re-read [`UNREAD_WRITES`] times at
//! most; from the next write on its value is not even cached
//! ([`Fate::Unread`]): no insert, no release once landed, no re-read, and
//! (the last re-read's registration taken by the next write) no report of
//! its writes, so they cost Redis what untracked `SET`s cost. A key read
//! between writes keeps its re-reads: at 50% writes half of a key's writes
//! follow another write, and re-reading only keys read since their last
//! write lost a quarter of bcast's hit ratio (`bench/workload.sh matrix`,
//! Zipf 0.99 and 1.2 over 10^4 and 10^6 keys: 0.68–0.76× of bcast at 50%
//! writes, 2026-12-07); four unread writes, 0.93–0.94×; eight, 0.97–1.00×.
//! A hot key read once in ten operations is written eight times in a row
//! often enough that eight halved the hit ratio of `bench/workload.sh
//! write-heavy` (0.50 against 0.97) and cost Redis more CPU per operation
//! than re-reading (misses are dearer than re-reads); 64 stops re-reading
//! only keys nobody reads any more (a counter read once at start).
//!
//! # Unread writes
//! A key whose first access is a write has no mark, so its write is not
//! re-read and its first read misses. Whether re-reading such writes pays
//! is a property of the workload, so it is measured, not guessed: keys
//! whose hash is in a fixed sample (1 in 16: [`sampled`]) always follow the
//! read-mark rule, and a *ghost* notes, per sampled key, the second its
//! unread write was released. A fill that finds a recent ghost is a read
//! the re-read would have served. Every [`PERIOD`] sampled releases, the
//! share of them read since decides for first writes of keys outside the
//! sample (keys with no mark, or an old one: a key written before and not
//! read since keeps the per-key rule; a sampled key keeps no count, so each
//! of its unread writes is cached, released and measured): from 1 in
//! [`ON_AT`] on, they are
//! re-read too; below 1 in [`OFF_BELOW`], they are not (the default at
//! start).
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

/// Writes of a key with no read between that are still re-read (and
/// cached); the next one is neither.
pub(super) const UNREAD_WRITES: u16 = 64;
/// Marks wrap after this many seconds (18 hours): a key last read a
/// multiple of that ago may look read lately, one re-read too many. The
/// values above it count writes since the last read ([`written_mark`]), or
/// say that the key was written with no read known ([`UNREAD_SINCE`]).
const WRAP: u16 = u16::MAX - UNREAD_WRITES - 1;
/// The mark of a key written with no read known before (none, or too long
/// ago): its writes follow the sample's decision, each time.
const UNREAD_SINCE: u16 = u16::MAX;

/// The mark of a key written `n` times (1 to [`UNREAD_WRITES`]) since its
/// last read: above every second.
pub(super) const fn written_mark(n: u16) -> u16 {
    WRAP + n
}
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

/// What a write's value is worth keeping for ([`Marks::written`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Cached, and re-read once landed: the key is being read.
    Reread,
    /// Cached until it lands (no marks kept, or nothing known of the key).
    Cached,
    /// Written [`UNREAD_WRITES`] times since its last read, or, with no
    /// read known while unread writes are not read later, written before:
    /// not cached at all (as if evicted at once). A read before it lands
    /// waits for it upstream.
    Unread,
}

/// The marks, or none (off: bcast, or no L1).
pub(super) struct Marks {
    /// Per hash, the second (since `born`, plus one; 0: never) of the last
    /// read, or [`written_mark`] once written and not read since.
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
    #[cfg(test)]
    pub(super) fn read_lately(&self, hash: u64, now: Instant) -> bool {
        self.slot(hash)
            .is_some_and(|m| self.lately(m.load(Ordering::Relaxed), now))
    }

    /// Whether a mark (0: none) is a read within the window before `now`.
    fn lately(&self, mark: u16, now: Instant) -> bool {
        if mark == 0 || mark > WRAP {
            return false;
        }
        let wrap = u32::from(WRAP);
        let age = (u32::from(self.second(now)) + wrap - u32::from(mark)) % wrap;
        age <= u32::from(self.window)
    }

    /// A write of the key at `now`: what becomes of its value
    /// ([`Fate`]). Re-read when the key was read lately and fewer than
    /// [`UNREAD_WRITES`] writes of it ago; not cached when that many
    /// writes went unread; for a key with no recent read, cached until it
    /// lands and re-read as the sample decides for unread writes ([module
    /// docs](self)), its next unread write then not cached. Counts the
    /// write in the mark (one store, only when it changes).
    pub(super) fn written(&self, hash: u64, now: Instant) -> Fate {
        let Some(m) = self.slot(hash) else {
            return Fate::Cached;
        };
        let mark = m.load(Ordering::Relaxed);
        let last = written_mark(UNREAD_WRITES);
        if mark == last {
            return Fate::Unread;
        }
        if mark > WRAP && mark < last {
            m.store(mark + 1, Ordering::Relaxed);
            return Fate::Reread;
        }
        if self.lately(mark, now) {
            m.store(written_mark(1), Ordering::Relaxed);
            return Fate::Reread;
        }
        // No read known. A sampled key keeps its mark: each of its unread
        // writes is cached and released, which is what the sample measures.
        // Others as the sample decides, at every write: re-read (then
        // counted from a first unread write: such keys are being read
        // later), or, while unread writes are not read later, cached until
        // they land the first time and not cached after.
        if sampled(hash) {
            return Fate::Cached;
        }
        if self.reread_unread.load(Ordering::Relaxed) {
            m.store(written_mark(1), Ordering::Relaxed);
            return Fate::Reread;
        }
        if mark == UNREAD_SINCE {
            return Fate::Unread;
        }
        m.store(UNREAD_SINCE, Ordering::Relaxed);
        Fate::Cached
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
        assert_eq!(m.written(other(1), born), Fate::Cached, "off at start");
        // A period of unread writes nobody reads: stays off.
        period(&m, 0, PERIOD, 0, born);
        assert!(!m.rereads_unread());
        // 1 in 16 read back (counted in the next period's decision).
        period(&m, 1000, PERIOD, PERIOD / ON_AT, born);
        period(&m, 2000, PERIOD, 0, born);
        assert!(m.rereads_unread() && m.written(other(2), born) == Fate::Reread);
        // The sample keeps the read-mark rule.
        assert_eq!(m.written(sample(5000), born), Fate::Cached);
        m.note(sample(5000), born);
        assert_eq!(m.written(sample(5000), born), Fate::Reread);
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
        assert!(!m.rereads_unread() && m.written(other(3), born) == Fate::Cached);
    }

    #[test]
    fn a_write_is_reread_while_the_key_is_read_between_its_writes() {
        let born = Instant::now();
        let m = Marks::new(true, Duration::from_secs(60), born);
        let k = other(7);
        m.filled(k, born);
        for n in 0..UNREAD_WRITES {
            assert_eq!(m.written(k, born), Fate::Reread, "unread write {n}");
        }
        assert_eq!(m.written(k, born), Fate::Unread, "too many unread writes");
        assert_eq!(m.written(k, born + Duration::from_secs(1)), Fate::Unread);
        // A read between: re-read again, the count starting afresh.
        m.note(k, born + Duration::from_secs(1));
        assert_eq!(m.written(k, born + Duration::from_secs(1)), Fate::Reread);
        m.note(k, born + Duration::from_secs(1));
        for _ in 0..UNREAD_WRITES {
            assert_eq!(m.written(k, born + Duration::from_secs(1)), Fate::Reread);
        }
        assert_eq!(m.written(k, born + Duration::from_secs(1)), Fate::Unread);
        // The key keeps the per-key rule even while unread writes are
        // re-read.
        period(&m, 0, PERIOD, PERIOD / ON_AT, born);
        period(&m, 1000, PERIOD, 0, born);
        assert!(m.rereads_unread());
        assert_eq!(m.written(k, born + Duration::from_secs(2)), Fate::Unread);
        // A read too long ago is a key with no recent read: as the sample
        // decides (on here), counted as a first unread write.
        let old = other(8);
        m.note(old, born);
        let later = born + Duration::from_secs(120);
        for _ in 0..UNREAD_WRITES {
            assert_eq!(m.written(old, later), Fate::Reread);
        }
        assert_eq!(m.written(old, later), Fate::Unread);
        // No history: a sampled key's unread writes are all cached (and
        // released: measured); another's, sample off, cached until it
        // lands, then not cached.
        let fresh = sample(9);
        assert_eq!(m.written(fresh, born), Fate::Cached);
        assert_eq!(m.written(fresh, born), Fate::Cached);
        let m = Marks::new(true, Duration::from_secs(60), born);
        let fresh = other(9);
        assert_eq!(m.written(fresh, born), Fate::Cached);
        assert_eq!(m.written(fresh, born), Fate::Unread);
        // Once unread writes are read later, its next write is re-read
        // (a key never read follows the sample at every write).
        period(&m, 0, PERIOD, PERIOD / ON_AT, born);
        period(&m, 1000, PERIOD, 0, born);
        assert!(m.rereads_unread());
        assert_eq!(m.written(fresh, born), Fate::Reread);
        // Off (bcast): every written value is cached, none re-read.
        let off = Marks::new(false, Duration::from_secs(60), born);
        assert_eq!(off.written(k, born), Fate::Cached);
        assert_eq!(off.written(k, born), Fate::Cached);
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
