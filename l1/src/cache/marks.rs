//! Read marks: for each key hash, the second the key was last read, so a
//! write can tell whether its key is being read (optin tracking re-reads
//! such a key in the write's pipeline to keep it cached:
//! `sidecache_pool::coherence::refill`). It owns no entries and knows no
//! keys, only their hashes: keys sharing a mark cost a re-read too many,
//! never a stale value.

use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// Marks wrap after this many seconds (18 hours): a key last read a
/// multiple of that ago may look read lately, one re-read too many.
const WRAP: u16 = u16::MAX;
/// Marks (a power of two): 2^19 of 2 bytes, 1 MiB.
const SLOTS: usize = 1 << 19;

/// The marks, or none (off: bcast, or no L1).
pub(super) struct Marks {
    /// Per hash, the second (since `born`, plus one; 0: never) of the last
    /// read.
    slots: Box<[AtomicU16]>,
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
        let Some(m) = self.slot(hash) else {
            return false;
        };
        match m.load(Ordering::Relaxed) {
            0 => false,
            last => {
                let wrap = u32::from(WRAP);
                let age = (u32::from(self.second(now)) + wrap - u32::from(last)) % wrap;
                age <= u32::from(self.window)
            }
        }
    }
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
}
