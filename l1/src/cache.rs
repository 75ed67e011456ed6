//! The cache: Moka, weighted by bytes, each entry with its own deadline, and
//! a per-bucket epoch that keeps a raced fill out.
//!
//! # Race window
//! A fill reads the bucket's epoch before the fetch is sent
//! ([`L1::begin_fill`]); every invalidation bumps it before removing the
//! entry. [`L1::complete_fill`] inserts only if the epoch is unchanged, and
//! checks again after inserting: an invalidation that slipped in between
//! the check and the insert is seen by the second check, which removes what
//! was just inserted. So once an invalidation of a key has returned, no fill
//! begun before it can leave a value in the cache. Buckets are shared by
//! keys with the same hash; a collision only discards a fill, never keeps a
//! stale one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use moka::notification::RemovalCause;
use moka::sync::Cache;
use moka::Expiry;

use crate::config::L1Config;
use crate::stats::{Stats, StatsSnapshot};

/// Epoch buckets (a power of two).
const BUCKETS: usize = 4096;
/// Estimated bytes an entry costs beyond its key and value (Moka node,
/// key struct, deadline, hash table slot).
pub const ENTRY_OVERHEAD: u64 = 128;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    db: u16,
    key: Bytes,
}

#[derive(Debug, Clone)]
struct Entry {
    /// `None`: a cached nil.
    value: Option<Bytes>,
    deadline: Instant,
}

struct ByDeadline;

impl Expiry<CacheKey, Entry> for ByDeadline {
    fn expire_after_create(&self, _: &CacheKey, v: &Entry, now: Instant) -> Option<Duration> {
        Some(v.deadline.saturating_duration_since(now))
    }

    fn expire_after_update(
        &self,
        _: &CacheKey,
        v: &Entry,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(v.deadline.saturating_duration_since(now))
    }
}

/// The result of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Cached: the value, or `None` for a cached nil.
    Hit(Option<Bytes>),
    /// Not cached; fetch and fill.
    Miss,
    /// The L1 is off or the key is filtered out: go upstream, do not fill.
    Bypass,
}

/// Proof that a fill began at a given epoch.
#[derive(Debug, Clone, Copy)]
pub struct FillTicket {
    bucket: usize,
    epoch: u64,
    started: Instant,
}

/// The L1 cache.
pub struct L1 {
    cfg: L1Config,
    cache: Option<Cache<CacheKey, Entry>>,
    epochs: Box<[AtomicU64]>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for L1 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L1").field("cfg", &self.cfg).finish()
    }
}

impl L1 {
    /// A cache with this configuration (`max_bytes == 0`: off).
    pub fn new(cfg: L1Config) -> L1 {
        let stats = Arc::new(Stats::default());
        let cache = (cfg.max_bytes > 0).then(|| {
            let s = Arc::clone(&stats);
            Cache::builder()
                .max_capacity(cfg.max_bytes)
                .weigher(|k: &CacheKey, v: &Entry| {
                    let w = k.key.len() as u64
                        + v.value.as_ref().map_or(0, |b| b.len() as u64)
                        + ENTRY_OVERHEAD;
                    u32::try_from(w).unwrap_or(u32::MAX)
                })
                .expire_after(ByDeadline)
                .eviction_listener(move |_, _, cause| {
                    if cause == RemovalCause::Size {
                        Stats::add(&s.evictions, 1);
                    }
                })
                .build()
        });
        let epochs = (0..BUCKETS).map(|_| AtomicU64::new(0)).collect();
        L1 {
            cfg,
            cache,
            epochs,
            stats,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &L1Config {
        &self.cfg
    }

    /// Whether the cache is on.
    pub fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    fn bucket(db: u16, key: &[u8]) -> usize {
        // FNV-1a: cheap and good enough to spread keys over buckets.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(db);
        for &b in key {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h as usize) & (BUCKETS - 1)
    }

    /// Looks a key up. Counts a hit or a miss.
    pub fn get(&self, db: u16, key: &Bytes) -> Lookup {
        let Some(cache) = &self.cache else {
            return Lookup::Bypass;
        };
        if !self.cfg.key_allowed(key) {
            return Lookup::Bypass;
        }
        match cache.get(&CacheKey {
            db,
            key: key.clone(),
        }) {
            Some(e) if e.deadline > Instant::now() => {
                Stats::add(&self.stats.hits, 1);
                Lookup::Hit(e.value)
            }
            _ => {
                Stats::add(&self.stats.misses, 1);
                Lookup::Miss
            }
        }
    }

    /// Starts a fill: call before the fetch is sent upstream.
    pub fn begin_fill(&self, db: u16, key: &[u8]) -> FillTicket {
        let bucket = Self::bucket(db, key);
        FillTicket {
            bucket,
            epoch: self.epochs[bucket].load(Ordering::Acquire),
            started: Instant::now(),
        }
    }

    /// Whether an invalidation of the ticket's bucket happened since it began.
    pub fn raced(&self, t: &FillTicket) -> bool {
        self.epochs[t.bucket].load(Ordering::Acquire) != t.epoch
    }

    /// Finishes a fill with the fetched `value` and its upstream `pttl`
    /// (milliseconds; -1 = no expiry, -2 = no key). Returns whether the
    /// value was cached. Values too large, nils (unless configured), keys
    /// already expired and fills raced by an invalidation are not.
    pub fn complete_fill(
        &self,
        t: FillTicket,
        db: u16,
        key: Bytes,
        value: Option<Bytes>,
        pttl: i64,
    ) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        let ttl = match (&value, pttl) {
            (Some(v), _) if v.len() as u64 > self.cfg.max_value_bytes => return false,
            (Some(_), -1) => self.cfg.ttl_cap,
            (Some(_), ms) if ms > 0 => Duration::from_millis(ms as u64).min(self.cfg.ttl_cap),
            (Some(_), _) => return false,
            (None, _) => match self.cfg.cache_nil {
                Some(d) => d.min(self.cfg.ttl_cap),
                None => return false,
            },
        };
        if self.raced(&t) {
            Stats::add(&self.stats.fills_discarded, 1);
            return false;
        }
        // The deadline counts from when the fetch was sent: the upstream
        // measured its TTL later, so the entry never outlives the key.
        let ck = CacheKey { db, key };
        cache.insert(
            ck.clone(),
            Entry {
                value,
                deadline: t.started + ttl,
            },
        );
        if self.raced(&t) {
            cache.invalidate(&ck);
            Stats::add(&self.stats.fills_discarded, 1);
            return false;
        }
        Stats::add(&self.stats.fills, 1);
        true
    }

    /// Drops a key (a write through the proxy touched it).
    pub fn invalidate(&self, db: u16, key: &Bytes) {
        let Some(cache) = &self.cache else { return };
        self.epochs[Self::bucket(db, key)].fetch_add(1, Ordering::AcqRel);
        cache.invalidate(&CacheKey {
            db,
            key: key.clone(),
        });
        Stats::add(&self.stats.invalidations, 1);
    }

    /// Drops everything (FLUSHALL, FLUSHDB, lost coherence).
    pub fn clear(&self) {
        let Some(cache) = &self.cache else { return };
        for e in self.epochs.iter() {
            e.fetch_add(1, Ordering::AcqRel);
        }
        cache.invalidate_all();
    }

    /// Counters and sizes (runs Moka's pending maintenance first so sizes
    /// are current; not for the hot path).
    pub fn stats(&self) -> StatsSnapshot {
        match &self.cache {
            Some(c) => {
                c.run_pending_tasks();
                self.stats.snapshot(c.weighted_size(), c.entry_count())
            }
            None => self.stats.snapshot(0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l1(max: u64) -> L1 {
        L1::new(L1Config {
            max_bytes: max,
            ..L1Config::default()
        })
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn fill_then_hit() {
        let c = l1(1 << 20);
        assert_eq!(c.get(0, &b("k")), Lookup::Miss);
        let t = c.begin_fill(0, b"k");
        assert!(c.complete_fill(t, 0, b("k"), Some(b("v")), -1));
        assert_eq!(c.get(0, &b("k")), Lookup::Hit(Some(b("v"))));
        // Databases are separate.
        assert_eq!(c.get(1, &b("k")), Lookup::Miss);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.fills, s.entries), (1, 2, 1, 1));
    }

    #[test]
    fn invalidation_during_fill_discards_it() {
        let c = l1(1 << 20);
        let t = c.begin_fill(0, b"k");
        c.invalidate(0, &b("k"));
        assert!(!c.complete_fill(t, 0, b("k"), Some(b("old")), -1));
        assert_eq!(c.get(0, &b("k")), Lookup::Miss);
        assert_eq!(c.stats().fills_discarded, 1);
        // A clear also discards fills in flight.
        let t = c.begin_fill(0, b"k");
        c.clear();
        assert!(!c.complete_fill(t, 0, b("k"), Some(b("old")), -1));
    }

    #[test]
    fn invalidate_removes() {
        let c = l1(1 << 20);
        let t = c.begin_fill(0, b"k");
        assert!(c.complete_fill(t, 0, b("k"), Some(b("v")), -1));
        c.invalidate(0, &b("k"));
        assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    }

    #[test]
    fn ttl_and_limits() {
        let c = L1::new(L1Config {
            max_bytes: 1 << 20,
            max_value_bytes: 4,
            ..L1Config::default()
        });
        let t = c.begin_fill(0, b"big");
        assert!(
            !c.complete_fill(t, 0, b("big"), Some(b("12345")), -1),
            "too large"
        );
        let t = c.begin_fill(0, b"nil");
        assert!(
            !c.complete_fill(t, 0, b("nil"), None, -2),
            "nil not cached by default"
        );
        let t = c.begin_fill(0, b"gone");
        assert!(
            !c.complete_fill(t, 0, b("gone"), Some(b("v")), -2),
            "expired between GET and PTTL"
        );
        let t = c.begin_fill(0, b"short");
        assert!(c.complete_fill(t, 0, b("short"), Some(b("v")), 30));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.get(0, &b("short")), Lookup::Miss, "expired with upstream");
        let c = L1::new(L1Config {
            max_bytes: 1 << 20,
            cache_nil: Some(Duration::from_secs(5)),
            ..L1Config::default()
        });
        let t = c.begin_fill(0, b"nil");
        assert!(c.complete_fill(t, 0, b("nil"), None, -2));
        assert_eq!(c.get(0, &b("nil")), Lookup::Hit(None));
    }

    #[test]
    fn cap_bounds_life() {
        let c = L1::new(L1Config {
            max_bytes: 1 << 20,
            ttl_cap: Duration::from_millis(30),
            ..L1Config::default()
        });
        let t = c.begin_fill(0, b"k");
        assert!(c.complete_fill(t, 0, b("k"), Some(b("v")), -1));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    }

    #[test]
    fn bytes_stay_bounded() {
        let c = l1(64 * 1024);
        let v = Bytes::from(vec![b'x'; 1000]);
        for i in 0..1000 {
            let k = Bytes::from(format!("key:{i}"));
            let t = c.begin_fill(0, &k);
            c.complete_fill(t, 0, k, Some(v.clone()), -1);
        }
        let s = c.stats();
        assert!(s.bytes <= 64 * 1024, "{s:?}");
        assert!(s.evictions > 0);
    }

    #[test]
    fn off_and_filtered() {
        let c = l1(0);
        assert_eq!(c.get(0, &b("k")), Lookup::Bypass);
        let c = L1::new(L1Config {
            exclude_prefixes: vec![b"tmp:".to_vec()],
            ..L1Config::default()
        });
        assert_eq!(c.get(0, &b("tmp:1")), Lookup::Bypass);
        assert_eq!(c.get(0, &b("k")), Lookup::Miss);
    }
}
