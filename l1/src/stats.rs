//! Counters kept without locks (relaxed atomics) and read as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) fills: AtomicU64,
    pub(crate) fills_discarded: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) uncached: AtomicU64,
    pub(crate) refills: AtomicU64,
    pub(crate) read_hits: AtomicU64,
    pub(crate) read_misses: AtomicU64,
    pub(crate) read_fills: AtomicU64,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A point-in-time copy of the counters and sizes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Lookups answered from the L1.
    pub hits: u64,
    /// Lookups that had to go upstream.
    pub misses: u64,
    /// Entries inserted by a fill.
    pub fills: u64,
    /// Fills discarded because a write or invalidation raced them.
    pub fills_discarded: u64,
    /// Entries evicted for capacity.
    pub evictions: u64,
    /// Keys invalidated by writes.
    pub invalidations: u64,
    /// Values cached from the proxy's own writes (write-behind).
    pub writes: u64,
    /// Written values dropped once their write reached upstream (optin
    /// tracking: upstream does not track what the proxy wrote).
    pub released: u64,
    /// Own writes not cached at all: their key was written before and not
    /// read since (optin tracking; see `marks`' module docs).
    pub uncached: u64,
    /// Written values kept once their write landed: the write's pipeline
    /// registered the key again and read it back (optin tracking).
    pub refills: u64,
    /// Lookups of reads other than GET answered from the L1 (counted in
    /// `hits` too).
    pub read_hits: u64,
    /// Lookups of reads other than GET that went upstream (in `misses` too).
    pub read_misses: u64,
    /// Reads other than GET cached by a fill (in `fills` too).
    pub read_fills: u64,
    /// Weighted bytes held.
    pub bytes: u64,
    /// Entries held.
    pub entries: u64,
}

impl Stats {
    pub(crate) fn snapshot(&self, bytes: u64, entries: u64) -> StatsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            hits: l(&self.hits),
            misses: l(&self.misses),
            fills: l(&self.fills),
            fills_discarded: l(&self.fills_discarded),
            evictions: l(&self.evictions),
            invalidations: l(&self.invalidations),
            writes: l(&self.writes),
            released: l(&self.released),
            uncached: l(&self.uncached),
            refills: l(&self.refills),
            read_hits: l(&self.read_hits),
            read_misses: l(&self.read_misses),
            read_fills: l(&self.read_fills),
            bytes,
            entries,
        }
    }
}
