//! Values the proxy itself wrote (write-behind): cached at the write's
//! acknowledgement, then, once the write landed, either released (nothing
//! upstream follows them for this proxy) or kept as a fill when the write's
//! pipeline read the key back (`sidecache_pool::coherence::refill`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quick_cache::sync::{EntryAction, EntryResult};

use super::marks::Fate;
use super::{overwrite_value, CacheKey, Entry, KeyRef, Origin, Stats, BUCKETS, L1};

/// What [`L1::insert_written`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// The value is cached (else the key was only invalidated).
    pub cached: bool,
    /// The write should register the key again with the upstream, so that
    /// it stays cached once it lands (see [`L1::refill_written`]): the key
    /// was read within the TTL cap and fewer than `UNREAD_WRITES` writes of
    /// it ago (a fill, or a hit on a written or re-read value), or, for a
    /// key with no read known, the proxy's unread writes are being read
    /// later (measured on a sample): `marks`' module docs.
    pub reread: bool,
}

impl L1 {
    /// A write the proxy acknowledged at `written` (the `now` it gave
    /// [`L1::insert_written`]) was followed upstream, on the invalidation
    /// channel's connection and in the write's pipeline, by a read that
    /// registered the key again (`CLIENT CACHING YES`, `MGET`, `PTTL`, sent
    /// at `sent`) and returned `value` and `pttl`. If the entry still holds
    /// that write's value, it becomes a filled entry with what the read
    /// returned: the key's value once the read ran, followed from then on
    /// by the channel. Returns whether it did; if not, the caller's
    /// [`L1::release_written`] drops the written value as before.
    ///
    /// # Race window
    /// Nothing else needs to have stayed still: an invalidation of the key
    /// since the write was acknowledged removed the entry, and a later
    /// write replaced its stamp, so either makes this a no-op. The caller
    /// applies it once every reply of the pipeline was read, so a report
    /// of a change after the read, which Redis sends after the read's
    /// reply on the same connection, was applied first (the entry is gone)
    /// or comes later (and removes it). Why the channel may skip the report
    /// of the write itself: `sidecache_pool::coherence::refill`.
    pub fn refill_written(
        &self,
        db: u16,
        key: &Bytes,
        written: Instant,
        value: Option<&Bytes>,
        pttl: i64,
        sent: Instant,
    ) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        // A nil read back (the key went since the write) is left to the
        // release.
        let (Some(v), Some(ttl)) = (value, self.fill_ttl(value, pttl)) else {
            return false;
        };
        let deadline = sent + ttl;
        // Checked and changed under the shard's lock. Only a value of the
        // written one's length (the usual case: the read returned what was
        // written), which keeps the entry's buffer and weight; another one
        // (a change by another client between the write and the read) is
        // left to the release, a miss.
        let refill = |_: &CacheKey, e: &mut Entry| {
            if e.origin != Origin::Written(written)
                || e.value.as_ref().is_none_or(|old| old.len() != v.len())
            {
                return EntryAction::Retain(false);
            }
            overwrite_value(&mut e.value, v);
            e.deadline = deadline;
            e.origin = Origin::Reread;
            EntryAction::Retain(true)
        };
        let kept = match cache.entry(&CacheKey::new(db, key), Some(Duration::ZERO), refill) {
            EntryResult::Retained(kept) => kept,
            // Evicted or removed since the write (rare: no probe first,
            // which measured dearer than the placeholder): the placeholder
            // goes with the guard.
            EntryResult::Vacant(guard) | EntryResult::Replaced(guard, _) => {
                drop(guard);
                false
            }
            EntryResult::Removed(..) | EntryResult::Timeout => false,
        };
        if kept {
            Stats::add(&self.stats.refills, 1);
        }
        kept
    }

    /// Caches a value the proxy itself wrote (write-behind): the written
    /// value is the key's value from now on, until `deadline`. Like an
    /// invalidation, it discards fills in flight. Returns whether it was
    /// cached (a filtered key, an oversized value, and under optin a key
    /// no longer read, [`Fate::Unread`], are only invalidated),
    /// and whether the write should re-read the key ([`Written::reread`]). `now` is the caller's clock read (one per write, not one per
    /// step).
    pub fn insert_written(
        &self,
        db: u16,
        key: &Bytes,
        value: &Bytes,
        deadline: Instant,
        now: Instant,
    ) -> Written {
        let Some(cache) = &self.cache else {
            return Written {
                cached: false,
                reread: false,
            };
        };
        self.mark_used(db);
        let hash = self.hash(db, key);
        self.epochs[(hash as usize) & (BUCKETS - 1)].fetch_add(1, Ordering::AcqRel);
        let fate = self.marks.written(hash, now);
        let reread = fate == Fate::Reread;
        // Predicted unread (no read for many writes): not cached, as
        // if evicted at once, which saves the insert and the release at
        // its landing. An earlier value still cached goes (contract 1: a
        // read before this write lands misses and waits for it upstream).
        if fate == Fate::Unread
            || !self.cfg.key_allowed(key)
            || value.len() as u64 > self.cfg.max_value_bytes
            || deadline <= now
        {
            cache.remove(&KeyRef { db, key });
            Stats::add(&self.stats.invalidations, 1);
            if fate == Fate::Unread {
                Stats::add(&self.stats.uncached, 1);
            }
            return Written {
                cached: false,
                reread,
            };
        }
        let deadline = deadline.min(now + self.cfg.ttl_cap);
        // A key already cached is overwritten in place: its key is not
        // copied and dropped again, and an old value of the same length
        // that no reader still holds is reused rather than freed and
        // reallocated. (Freeing the old value, memory last touched when it
        // was written, was the write path's costliest step in `perf`.)
        // Only a value no longer than the old one: an in-place update
        // evicts nothing, so a heavier one goes through `insert`, which
        // keeps the cache within `max_bytes`. The read-locked probe first:
        // a new key pays no placeholder.
        let mut replaces = false;
        if cache.contains_key(&KeyRef { db, key }) {
            let overwrite = |_: &CacheKey, e: &mut Entry| {
                if e.value.as_ref().is_none_or(|old| value.len() > old.len()) {
                    return EntryAction::Retain(false);
                }
                e.deadline = deadline;
                e.origin = Origin::Written(now);
                // The write changed the key: its other reads are stale.
                e.reads = None;
                overwrite_value(&mut e.value, value);
                EntryAction::Retain(true)
            };
            match cache.entry(&CacheKey::new(db, key), Some(Duration::ZERO), overwrite) {
                EntryResult::Retained(true) => {
                    Stats::add(&self.stats.writes, 1);
                    return Written {
                        cached: true,
                        reread,
                    };
                }
                // Heavier: replaced through `insert` below, which evicts
                // what no longer fits.
                EntryResult::Retained(false) => replaces = true,
                // Evicted or removed since the probe (the placeholder goes
                // with the guard): inserted below.
                EntryResult::Vacant(guard) | EntryResult::Replaced(guard, _) => drop(guard),
                EntryResult::Removed(..) | EntryResult::Timeout => {}
            }
        }
        let dropped = cache.insert_with_lifecycle(
            CacheKey::new(db, key),
            Entry {
                value: Some(Bytes::copy_from_slice(value)),
                deadline,
                origin: Origin::Written(now),
                reads: None,
            },
        );
        // The entry this write replaced is not an eviction.
        Stats::add(
            &self.stats.evictions,
            dropped.saturating_sub(u64::from(replaces)),
        );
        Stats::add(&self.stats.writes, 1);
        Written {
            cached: true,
            reread,
        }
    }

    /// A write the proxy acknowledged at `written` (the `now` it gave
    /// [`L1::insert_written`]) has reached upstream: drops the key's entry
    /// if it still holds that write's value, and keeps it if a later write
    /// (or a fill) replaced it. Returns whether it dropped one.
    ///
    /// Used where upstream does not keep tracking a key the proxy wrote
    /// (optin tracking: a write forgets the key's registrations): from the
    /// moment the write landed, another client's change of the key would
    /// go unseen, so the written value may be served only until then. No
    /// epoch moves: a fill in flight read after the write landed (it waited
    /// for it) and is tracked; one that began before the write was already
    /// discarded by `insert_written`'s epoch bump. Two writes of one key
    /// stamped alike only cost a hit: the later one's value is dropped
    /// early, never kept late.
    pub fn release_written(&self, db: u16, key: &[u8], written: Instant) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let dropped = cache
            .remove_if(&KeyRef { db, key }, |e| {
                e.origin == Origin::Written(written)
            })
            .is_some();
        if dropped {
            Stats::add(&self.stats.released, 1);
            if self.marks.on() {
                self.marks.released(self.hash(db, key), Instant::now());
            }
        }
        dropped
    }

    /// Whether the L1 holds an entry for `key` that the invalidation
    /// channel follows (every change of the key drops it first): one
    /// filled by a read, or (`written_too`: BCAST tracking, which hears of
    /// every key) one the proxy wrote. Under OPTIN a written value is not
    /// followed: Redis forgets a key for the connection that writes it.
    pub fn followed(&self, db: u16, key: &[u8], written_too: bool) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        cache
            .get(&KeyRef { db, key })
            .is_some_and(|e| written_too || !matches!(e.origin, Origin::Written(_)))
    }
}
