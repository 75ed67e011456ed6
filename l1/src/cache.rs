//! The cache: byte-weighted, each entry with its own deadline, and a
//! per-bucket epoch that keeps a raced fill out.
//!
//! The store is `quick_cache` (sharded, S3-FIFO eviction, weighted). Moka
//! was the first choice; on the GET hit path it measured at about 45% of the
//! proxy's CPU (`perf`: hash-table probe 23%, key compares 15%, LRU deque
//! upkeep 10%) and held sidecache to 0.55x of direct Redis at `-P 16`;
//! quick_cache looks a key up under a shard read lock with no per-read
//! bookkeeping queue, and takes a borrowed key (no `Bytes` clone per lookup).
//! Expiry is checked on read against the entry's deadline; an expired entry
//! is removed when read, or evicted like any other.
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

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Equivalent, Lifecycle, Weighter};

use crate::config::L1Config;
use crate::stats::{Stats, StatsSnapshot};

/// Epoch buckets (a power of two).
const BUCKETS: usize = 4096;
/// Bytes one slot of the store's slab holds: the key and entry structs,
/// quick_cache's per-entry state, reference count and enum tag, and the
/// slab's two links (152 bytes with the 56-byte key and 72-byte entry).
/// A ghost (a recently evicted key's hash, which S3-FIFO keeps to admit it
/// straight back) takes a whole slot too.
const SLOT: u64 = (std::mem::size_of::<CacheKey>() + std::mem::size_of::<Entry>() + 24) as u64;
/// The store's hash table per entry: a 4-byte token and a control byte,
/// at the table's load after growth.
const TABLE: u64 = 16;
/// What churn costs beyond the allocations themselves: malloc's free
/// chunks between live ones, and the slots and table buckets a shard
/// keeps at its high-water mark. Measured with `bench/churn.sh` (10^6
/// keys, 64-byte values, through a 64 MiB L1): resident memory grew
/// 4.7 MB beyond the entries' charge, about 21 bytes an entry.
const CHURN: u64 = 24;
/// What an entry costs beyond its key's and value's heap allocations:
/// its slab slot, its share of the hash table and of churn. With them and the
/// allocations as malloc rounds them ([`heap_bytes`]), `--l1-max-bytes`
/// is what the L1 adds to the process's resident memory, not an estimate
/// of it (issue #60: a 128-byte estimate let RSS grow 1.63× the bound).
pub const ENTRY_OVERHEAD: u64 = SLOT + TABLE + CHURN;

/// Evicted keys remembered per estimated entry (quick_cache's ghost
/// allocation; its default is 0.5). Each costs a slot, and their slots are
/// held out of `--l1-max-bytes` ([`L1::history_bytes`]).
const GHOSTS_PER_ENTRY: f64 = 0.25;
/// The entry size the store is sized for (its item estimate, and with it
/// the number of ghosts).
const ESTIMATED_ENTRY: u64 = 256;

/// The bytes the store's eviction history (its ghosts) may take, held
/// out of the weight capacity: an entry's overhead per ghost (its slot,
/// table share and churn share).
fn history_bytes(max_bytes: u64) -> u64 {
    let ghosts = (max_bytes / ESTIMATED_ENTRY).max(64) as f64 * GHOSTS_PER_ENTRY;
    (ghosts as u64 * ENTRY_OVERHEAD).min(max_bytes / 2)
}

/// What malloc (glibc's, which the binary and its image use) takes for a
/// buffer of `n` bytes: its 8-byte header, rounded up to 16, at least 32;
/// from 128 KiB its own mapping, rounded to pages.
pub fn heap_bytes(n: usize) -> u64 {
    let n = n as u64;
    match n {
        0 => 0,
        n if n >= 128 * 1024 => (n + 16).div_ceil(4096) * 4096,
        n => ((n + 8).div_ceil(16) * 16).max(32),
    }
}

/// Keys up to this many bytes are stored inline in the entry: comparing
/// them on lookup touches no other cache line.
const INLINE_KEY: usize = 46;

#[derive(Debug, Clone)]
enum KeyBuf {
    Inline { len: u8, buf: [u8; INLINE_KEY] },
    Heap(Bytes),
}

impl KeyBuf {
    fn new(key: &Bytes) -> KeyBuf {
        if key.len() <= INLINE_KEY {
            let mut buf = [0u8; INLINE_KEY];
            buf[..key.len()].copy_from_slice(key);
            KeyBuf::Inline {
                len: key.len() as u8,
                buf,
            }
        } else {
            // A copy, never a slice of the caller's buffer (a request's
            // read buffer would stay allocated as long as the entry).
            KeyBuf::Heap(Bytes::copy_from_slice(key))
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            KeyBuf::Inline { len, buf } => &buf[..usize::from(*len)],
            KeyBuf::Heap(b) => b,
        }
    }
}

#[derive(Debug, Clone)]
struct CacheKey {
    db: u16,
    key: KeyBuf,
}

impl CacheKey {
    fn new(db: u16, key: &Bytes) -> CacheKey {
        CacheKey {
            db,
            key: KeyBuf::new(key),
        }
    }
}

// Hashes and compares exactly like `KeyRef` (a slice hashes with its length).
impl std::hash::Hash for CacheKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.db.hash(state);
        self.key.as_slice().hash(state);
    }
}

impl PartialEq for CacheKey {
    fn eq(&self, other: &CacheKey) -> bool {
        self.db == other.db && self.key.as_slice() == other.key.as_slice()
    }
}

impl Eq for CacheKey {}

#[derive(Debug, Clone)]
struct Entry {
    /// `None`: a cached nil (or, in an entry holding other reads only, no
    /// GET cached: its deadline is then [`L1`]'s `born`, before any lookup).
    value: Option<Bytes>,
    /// When `value` stops being served.
    deadline: Instant,
    /// Where the value came from.
    origin: Origin,
    /// Other cached reads of the key (HGETALL, STRLEN, …): they live and
    /// die with the entry, so any invalidation of the key drops them all.
    reads: Option<Arc<reads::Reads>>,
}

/// Where an entry's value came from (16 bytes, as `Option<Instant>`: the
/// two other states sit in `Instant`'s niche).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A fill: a read, which noted itself in the read marks when it
    /// landed, so its hits need not.
    Fill,
    /// A value the proxy wrote, acknowledged at this instant (its stamp,
    /// see [`L1::release_written`]). Its hits are noted in the read marks.
    Written(Instant),
    /// A written value that the write's pipeline registered again and read
    /// back ([`L1::refill_written`]): followed like a fill, and its hits
    /// are noted like a written value's.
    Reread,
}

impl Origin {
    /// Whether a hit on the entry is noted in the read marks.
    fn notes_reads(self) -> bool {
        self != Origin::Fill
    }
}

/// A borrowed key, hashed and compared exactly like [`CacheKey`], so
/// lookups copy nothing.
#[derive(Hash)]
struct KeyRef<'a> {
    db: u16,
    key: &'a [u8],
}

impl Equivalent<CacheKey> for KeyRef<'_> {
    fn equivalent(&self, k: &CacheKey) -> bool {
        self.db == k.db && self.key == k.key.as_slice()
    }
}

#[derive(Clone)]
struct ByBytes;

impl Weighter<CacheKey, Entry> for ByBytes {
    fn weight(&self, k: &CacheKey, v: &Entry) -> u64 {
        let key = match &k.key {
            KeyBuf::Inline { .. } => 0,
            KeyBuf::Heap(b) => heap_bytes(b.len()),
        };
        key + v.value.as_ref().map_or(0, |b| heap_bytes(b.len()))
            + ENTRY_OVERHEAD
            + v.reads.as_deref().map_or(0, reads::weight)
    }
}

/// Counts evictions (capacity, or a value too heavy to admit).
#[derive(Clone)]
struct CountEvictions(Arc<Stats>);

impl Lifecycle<CacheKey, Entry> for CountEvictions {
    /// Entries dropped by one operation. quick_cache also reports the entry
    /// an `insert` replaces; a caller that knows it replaced one takes the
    /// count with `insert_with_lifecycle` and leaves that one out.
    type RequestState = u64;

    fn begin_request(&self) -> u64 {
        0
    }

    fn on_evict(&self, dropped: &mut u64, _: CacheKey, _: Entry) {
        *dropped += 1;
    }

    fn end_request(&self, dropped: u64) {
        Stats::add(&self.0.evictions, dropped);
    }
}

type Store = Cache<CacheKey, Entry, ByBytes, DefaultHashBuilder, CountEvictions>;

/// Makes `slot` hold a copy of `value`, reusing the old buffer when it has
/// the same length and no one else holds it.
fn overwrite_value(slot: &mut Option<Bytes>, value: &[u8]) {
    if let Some(old) = slot.take() {
        if old.len() == value.len() {
            if let Ok(mut buf) = old.try_into_mut() {
                buf.copy_from_slice(value);
                *slot = Some(buf.freeze());
                return;
            }
        }
    }
    *slot = Some(Bytes::copy_from_slice(value));
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
    cache: Option<Store>,
    epochs: Box<[AtomicU64]>,
    /// Whether each key was read lately (see [`Written::reread`]): set by
    /// fills and by hits on entries whose [`Origin::notes_reads`], read by
    /// [`L1::insert_written`].
    marks: marks::Marks,
    /// Spreads keys over the epoch buckets.
    spread: foldhash::fast::RandomState,
    stats: Arc<Stats>,
    /// Bit `d` set: database `d` (bit 63: some database ≥ 63) ever held an
    /// entry. Invalidations that name no database visit only these.
    used_dbs: AtomicU64,
    /// The highest database that ever held an entry.
    max_db: AtomicU32,
    /// When the cache was made: no lookup's clock is earlier, so an entry
    /// with this deadline holds no GET value (only other reads).
    born: Instant,
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
            // Sized for small entries; the weight capacity is what bounds
            // memory, less the slots its eviction history may take.
            let items = usize::try_from(cfg.max_bytes / ESTIMATED_ENTRY)
                .unwrap_or(usize::MAX)
                .max(64);
            let weight = cfg
                .max_bytes
                .saturating_sub(history_bytes(cfg.max_bytes))
                .max(1);
            let lifecycle = CountEvictions(Arc::clone(&stats));
            let hasher = DefaultHashBuilder::default();
            match quick_cache::OptionsBuilder::new()
                .estimated_items_capacity(items)
                .weight_capacity(weight)
                .ghost_allocation(GHOSTS_PER_ENTRY)
                .build()
            {
                Ok(options) => Store::with_options(options, ByBytes, hasher, lifecycle),
                // Only a missing capacity is refused, and both are set:
                // quick_cache's default history otherwise.
                Err(_) => Store::with(items, weight, ByBytes, hasher, lifecycle),
            }
        });
        let epochs = (0..BUCKETS).map(|_| AtomicU64::new(0)).collect();
        let born = Instant::now();
        let marks = marks::Marks::new(cache.is_some() && cfg.read_marks, cfg.ttl_cap, born);
        L1 {
            cfg,
            cache,
            epochs,
            marks,
            spread: foldhash::fast::RandomState::default(),
            stats,
            used_dbs: AtomicU64::new(0),
            max_db: AtomicU32::new(0),
            born,
        }
    }

    /// Bytes of `--l1-max-bytes` held for the eviction history (the keys
    /// evicted last, remembered to admit them straight back when read
    /// again): entries' weight stays within the bound less this.
    pub fn history_bytes(&self) -> u64 {
        if self.cache.is_some() {
            history_bytes(self.cfg.max_bytes)
        } else {
            0
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

    fn bucket(&self, db: u16, key: &[u8]) -> usize {
        (self.hash(db, key) as usize) & (BUCKETS - 1)
    }

    /// The key's hash for its epoch bucket and its read mark. foldhash,
    /// seeded per process: FNV-1a (a multiply per byte) cost a 20-byte key
    /// ~100 instructions, twice per forwarded write (callgrind); this reads
    /// 8 bytes at a time.
    fn hash(&self, db: u16, key: &[u8]) -> u64 {
        self.spread.hash_one(KeyRef { db, key })
    }

    /// Looks a key up. Counts a hit or a miss.
    pub fn get(&self, db: u16, key: &Bytes) -> Lookup {
        self.get_at(db, key, Instant::now())
    }

    /// Looks a key up as of `now` (a clock read once per batch of
    /// requests). Entries whose deadline passed are misses (and removed).
    pub fn get_at(&self, db: u16, key: &Bytes, now: Instant) -> Lookup {
        let Some(cache) = &self.cache else {
            return Lookup::Bypass;
        };
        if !self.cfg.key_allowed(key) {
            return Lookup::Bypass;
        }
        let k = KeyRef { db, key };
        match cache.get(&k) {
            Some(e) if e.deadline > now => {
                Stats::add(&self.stats.hits, 1);
                if e.origin.notes_reads() && self.marks.on() {
                    self.marks.note(self.hash(db, key), now);
                }
                Lookup::Hit(e.value)
            }
            // Other reads of the key may still be good.
            Some(e) if e.reads.is_some() => {
                Stats::add(&self.stats.misses, 1);
                Lookup::Miss
            }
            Some(_) => {
                cache.remove(&k);
                Stats::add(&self.stats.misses, 1);
                Lookup::Miss
            }
            None => {
                Stats::add(&self.stats.misses, 1);
                Lookup::Miss
            }
        }
    }

    /// Starts a fill: call before the fetch is sent upstream.
    pub fn begin_fill(&self, db: u16, key: &[u8]) -> FillTicket {
        // Before the epoch is read: an invalidation naming no database
        // that is applied after this fill began must visit `db`.
        self.mark_used(db);
        let bucket = self.bucket(db, key);
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
        let Some(ttl) = self.fill_ttl(value.as_ref(), pttl) else {
            return false;
        };
        if self.raced(&t) {
            Stats::add(&self.stats.fills_discarded, 1);
            return false;
        }
        // Own the bytes: a value sliced out of an upstream read buffer would
        // keep the whole buffer alive for as long as the entry lives.
        let value = value.map(|v| Bytes::copy_from_slice(&v));
        // Other reads of the key cached since the ticket was taken stay:
        // an invalidation since then is caught by the check below.
        let reads = self.live_reads(cache, db, &key, t.started);
        // The deadline counts from when the fetch was sent: the upstream
        // measured its TTL later, so the entry never outlives the key.
        cache.insert(
            CacheKey::new(db, &key),
            Entry {
                value,
                deadline: t.started + ttl,
                origin: Origin::Fill,
                reads,
            },
        );
        if self.raced(&t) {
            cache.remove(&KeyRef { db, key: &key });
            Stats::add(&self.stats.fills_discarded, 1);
            return false;
        }
        // The fill was a read: the key's next write registers it again.
        self.marks.filled(self.hash(db, &key), t.started);
        Stats::add(&self.stats.fills, 1);
        true
    }

    /// How long a fetched value may be cached: its upstream `pttl` (ms; -1
    /// none, -2 no key) within the cap; `None` for what is not cached
    /// (too large, already expired, a nil unless `cache_nil`).
    fn fill_ttl(&self, value: Option<&Bytes>, pttl: i64) -> Option<Duration> {
        match (value, pttl) {
            (Some(v), _) if v.len() as u64 > self.cfg.max_value_bytes => None,
            (Some(_), -1) => Some(self.cfg.ttl_cap),
            (Some(_), ms) if ms > 0 => Some(Duration::from_millis(ms as u64).min(self.cfg.ttl_cap)),
            (Some(_), _) => None,
            (None, _) => self.cfg.cache_nil.map(|d| d.min(self.cfg.ttl_cap)),
        }
    }

    /// Drops a key (a write through the proxy touched it).
    pub fn invalidate(&self, db: u16, key: &Bytes) {
        let Some(cache) = &self.cache else { return };
        self.epochs[self.bucket(db, key)].fetch_add(1, Ordering::AcqRel);
        cache.remove(&KeyRef { db, key });
        Stats::add(&self.stats.invalidations, 1);
    }

    /// Records that `db` may hold entries: called before a fill or a
    /// write reads or bumps an epoch (a read, then a write only the first
    /// time; the bit never clears).
    fn mark_used(&self, db: u16) {
        let bit = 1u64 << db.min(63);
        if self.used_dbs.load(Ordering::SeqCst) & bit == 0 {
            self.max_db.fetch_max(u32::from(db), Ordering::SeqCst);
            self.used_dbs.fetch_or(bit, Ordering::SeqCst);
        }
    }

    /// Drops a key from every database that holds entries (an upstream
    /// invalidation names keys, not databases).
    pub fn invalidate_any_db(&self, key: &Bytes) {
        self.for_used_dbs(|db| self.invalidate(db, key));
    }

    /// Calls `f` with every database that ever held an entry.
    pub fn for_used_dbs(&self, mut f: impl FnMut(u16)) {
        let used = self.used_dbs.load(Ordering::SeqCst);
        let max = self.max_db.load(Ordering::SeqCst).min(u32::from(u16::MAX)) as u16;
        for db in 0..=max {
            if used & (1u64 << db.min(63)) != 0 {
                f(db);
            }
        }
    }

    /// Drops every entry for which `drop(db, key)` holds, and discards every
    /// fill in flight (a channel lost: what it covered may be stale).
    pub fn invalidate_where(&self, drop: impl Fn(u16, &[u8]) -> bool) {
        let Some(cache) = &self.cache else { return };
        for e in self.epochs.iter() {
            e.fetch_add(1, Ordering::AcqRel);
        }
        cache.retain(|k, _| !drop(k.db, k.key.as_slice()));
    }

    /// Discards every fill in flight and keeps every entry (a channel lost
    /// while its entries are still served: `--l1-stale-if-error`).
    pub fn discard_fills(&self) {
        for e in self.epochs.iter() {
            e.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Drops everything (FLUSHALL, FLUSHDB, lost coherence).
    pub fn clear(&self) {
        let Some(cache) = &self.cache else { return };
        for e in self.epochs.iter() {
            e.fetch_add(1, Ordering::AcqRel);
        }
        cache.clear();
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StatsSnapshot {
        match &self.cache {
            Some(c) => self.stats.snapshot(c.weight(), c.len() as u64),
            None => self.stats.snapshot(0, 0),
        }
    }

    /// Whether writes of keys nobody read are re-read too, because the
    /// proxy's unread writes were being read later ([`Written::reread`]).
    pub fn rereads_unread_writes(&self) -> bool {
        self.marks.rereads_unread()
    }
}

mod marks;
mod reads;
mod written;
pub use reads::ReadLookup;
pub use written::Written;

#[cfg(test)]
mod tests;
