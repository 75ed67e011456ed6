//! Per slot: which of this sidecache's writes are queued and not landed,
//! and when its last write of the slot landed on the master (see "Read
//! your writes" in the `replica` module). Allocated only with replica reads
//! on. A standalone upstream has one slot (index 0).
//!
//! Each queued write takes a sequence number; its slot is *clean* once a
//! write with a sequence number at least the slot's last queued one
//! landed. A write that never lands (failed for good, re-routed after a
//! failover) leaves its slot unclean until a later write of the slot
//! lands: reads of that slot go to the master meanwhile, which is safe.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::slot::{Slot, SLOT_COUNT};

/// The slot stamps.
#[derive(Debug)]
pub struct Stamps {
    base: Instant,
    next: AtomicU64,
    /// Per slot: the sequence number of the last write queued.
    queued: Box<[AtomicU64]>,
    /// Per slot: the highest sequence number landed.
    landed_seq: Box<[AtomicU64]>,
    /// Per slot: when the last write (queued or forwarded) landed.
    landed_at: Box<[AtomicU64]>,
    /// When the last write of every slot landed (FLUSHALL and other
    /// writes without known keys).
    all_at: AtomicU64,
}

/// Nanoseconds since `base`, at least 1 (0 means "never").
pub(crate) fn clock(base: Instant) -> u64 {
    (base.elapsed().as_nanos() as u64).max(1)
}

fn index(slot: Option<Slot>) -> usize {
    slot.map_or(0, |s| usize::from(s.get()))
}

fn slots() -> Box<[AtomicU64]> {
    (0..SLOT_COUNT).map(|_| AtomicU64::new(0)).collect()
}

impl Stamps {
    /// Empty stamps on the clock starting at `base`.
    pub fn new(base: Instant) -> Stamps {
        Stamps {
            base,
            next: AtomicU64::new(1),
            queued: slots(),
            landed_seq: slots(),
            landed_at: slots(),
            all_at: AtomicU64::new(0),
        }
    }

    /// A write of `slot` is queued (before it is acknowledged): its
    /// sequence number, for [`Stamps::landed`].
    pub fn queued(&self, slot: Option<Slot>) -> u64 {
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        self.queued[index(slot)].fetch_max(seq, Ordering::SeqCst);
        seq
    }

    /// The queued write `seq` of `slot` landed (its reply was read) at
    /// `at` (the stamps' clock, read after the reply arrived).
    pub fn landed(&self, slot: Option<Slot>, seq: u64, at: u64) {
        let i = index(slot);
        // The instant first: a reader that sees the sequence number sees it.
        self.landed_at[i].fetch_max(at, Ordering::SeqCst);
        self.landed_seq[i].fetch_max(seq, Ordering::SeqCst);
    }

    /// Now, on the stamps' clock.
    pub fn now(&self) -> u64 {
        clock(self.base)
    }

    /// A forwarded write of `slot` was answered: stamped now.
    pub fn touched(&self, slot: Option<Slot>) {
        let now = clock(self.base);
        self.landed_at[index(slot)].fetch_max(now, Ordering::SeqCst);
    }

    /// A forwarded write that may have changed any slot was answered.
    pub fn touched_all(&self) {
        let now = clock(self.base);
        self.all_at.fetch_max(now, Ordering::SeqCst);
    }

    /// The latest landing a read of `slot` must see (the stamps' clock),
    /// or `None` while a write of it is queued or in flight.
    pub fn fresh_after(&self, slot: Option<Slot>) -> Option<u64> {
        let i = index(slot);
        let queued = self.queued[i].load(Ordering::SeqCst);
        if self.landed_seq[i].load(Ordering::SeqCst) < queued {
            return None;
        }
        let at = self.landed_at[i].load(Ordering::SeqCst);
        Some(at.max(self.all_at.load(Ordering::SeqCst)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_clean_once_its_last_queued_write_landed() {
        let s = Stamps::new(Instant::now());
        let slot = Slot::new(7);
        assert_eq!(s.fresh_after(slot), Some(0));
        let a = s.queued(slot);
        let b = s.queued(slot);
        assert_eq!(s.fresh_after(slot), None);
        s.landed(slot, a, 10);
        assert_eq!(s.fresh_after(slot), None, "b is still queued");
        s.landed(slot, b, 20);
        assert_eq!(s.fresh_after(slot), Some(20));
        // Another slot is untouched.
        assert_eq!(s.fresh_after(Slot::new(8)), Some(0));
        s.touched_all();
        assert!(s.fresh_after(Slot::new(8)).is_some_and(|t| t > 0));
    }
}
