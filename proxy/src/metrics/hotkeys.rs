//! Hot keys: the most read, most missed and most written keys, per
//! database and key, kept by a bounded space-saving sketch per dimension
//! (`--hotkeys-capacity`, `--hotkeys-sample`).
//!
//! It owns the sketch ([`SpaceSaving`]), the shared [`HotKeys`] and the
//! per-connection sampler ([`Sampler`]); it does not own where it is fed
//! (`connection/cache.rs`, `connection/write.rs`) nor how it is shown
//! (`SIDECACHE HOTKEYS` in `answer/sidecache.rs`, `/debug/hotkeys` in
//! `report/http.rs`, the `sidecache hotkeys` subcommand in `main.rs`).
//!
//! **Cost.** A connection counts down to its next sample in a plain
//! integer: an unsampled lookup costs a decrement and a test for zero,
//! nothing shared ([`Sampler`]). A sampled one locks the dimension's mutex and updates its sketch
//! (one hash lookup and a short walk down a heap of the counts; a key not
//! tracked takes over the smallest count, the heap's root). The gap to the next sample
//! is drawn uniformly from `1..=2N-1` (mean `N`) by a per-connection
//! xorshift, so a client that cycles through keys with a period that
//! divides `N` is not sampled on the same key every time. Estimates are
//! the sketch's counts times `N`.
//!
//! **Accuracy.** Space-saving over `k` counters never underestimates a
//! tracked key's sampled count and overestimates it by at most the
//! sampled stream's length over `k`; every key whose count is above that
//! is tracked. With `N = 1` and at most `k` distinct keys, counts are
//! exact.

pub mod cli;

use std::collections::HashMap;
use std::sync::Mutex;

pub use crate::config::hotkeys_bounds::{
    DEFAULT_CAPACITY, DEFAULT_SAMPLE, MAX_CAPACITY, MAX_SAMPLE,
};

/// What the keys are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dimension {
    /// L1 lookups (GET, MGET keys): hits and misses.
    Reads = 0,
    /// L1 lookups not answered from the L1.
    Misses = 1,
    /// Writes through sidecache (SET, MSET, DEL, INCR, … : their keys).
    Writes = 2,
}

impl Dimension {
    /// Parses `reads`, `misses` or `writes` (any case).
    pub fn parse(s: &[u8]) -> Option<Dimension> {
        if s.eq_ignore_ascii_case(b"reads") {
            Some(Dimension::Reads)
        } else if s.eq_ignore_ascii_case(b"misses") {
            Some(Dimension::Misses)
        } else if s.eq_ignore_ascii_case(b"writes") {
            Some(Dimension::Writes)
        } else {
            None
        }
    }

    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Dimension::Reads => "reads",
            Dimension::Misses => "misses",
            Dimension::Writes => "writes",
        }
    }
}

/// A bounded space-saving sketch (Metwally et al.) over byte-string ids.
///
/// The counters form a binary min-heap (counts only grow, so a count
/// moves down the heap), whose root is the counter a new id takes over:
/// an update is O(log k), not a scan. Ids are found by their 64-bit hash
/// (foldhash), checked against the stored bytes; two ids with the same
/// hash (about one chance in 2^64 per pair) share the hash's index entry,
/// the later one taking it, and the earlier one's counter is evicted in
/// time. A replaced counter reuses its id's buffer: no allocation once
/// every counter was used.
#[derive(Debug)]
pub struct SpaceSaving {
    capacity: usize,
    hasher: foldhash::fast::FixedState,
    /// Hash of an id → its slot.
    index: HashMap<u64, u32, foldhash::fast::FixedState>,
    /// Per slot: its id, its hash, its count, its heap position.
    ids: Vec<Vec<u8>>,
    hashes: Vec<u64>,
    counts: Vec<u64>,
    pos: Vec<u32>,
    /// Slots as a min-heap by count.
    heap: Vec<u32>,
}

impl SpaceSaving {
    /// A sketch of `capacity` counters (at least 1).
    pub fn new(capacity: usize) -> SpaceSaving {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            hasher: foldhash::fast::FixedState::with_seed(0x5ca1_ab1e),
            index: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            ids: Vec::with_capacity(capacity),
            hashes: Vec::with_capacity(capacity),
            counts: Vec::with_capacity(capacity),
            pos: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
        }
    }

    /// Counts one occurrence of `id`.
    pub fn add(&mut self, id: &[u8]) {
        use std::hash::BuildHasher as _;
        let h = self.hasher.hash_one(id);
        if let Some(&slot) = self.index.get(&h) {
            let slot = slot as usize;
            if self.ids[slot] == id {
                self.counts[slot] += 1;
                self.sift_down(self.pos[slot] as usize);
                return;
            }
        }
        if self.ids.len() < self.capacity {
            // A new counter: count 1 is the smallest there is, so it is
            // the heap's root or on a level with other 1s; it goes last
            // and moves up while its parent is larger.
            let slot = self.ids.len();
            self.ids.push(id.to_vec());
            self.hashes.push(h);
            self.counts.push(1);
            self.pos.push(slot as u32);
            self.heap.push(slot as u32);
            self.index.insert(h, slot as u32);
            self.sift_up(slot);
            return;
        }
        // The smallest count's counter goes to the new id, which inherits
        // that count (its possible overestimate) plus one.
        let slot = self.heap[0] as usize;
        if self.index.get(&self.hashes[slot]) == Some(&(slot as u32)) {
            self.index.remove(&self.hashes[slot]);
        }
        self.index.insert(h, slot as u32);
        self.hashes[slot] = h;
        self.ids[slot].clear();
        self.ids[slot].extend_from_slice(id);
        self.counts[slot] += 1;
        self.sift_down(0);
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a] as usize] = a as u32;
        self.pos[self.heap[b] as usize] = b as u32;
    }

    fn count_at(&self, i: usize) -> u64 {
        self.counts[self.heap[i] as usize]
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let l = 2 * i + 1;
            if l >= n {
                return;
            }
            let r = l + 1;
            let c = if r < n && self.count_at(r) < self.count_at(l) {
                r
            } else {
                l
            };
            if self.count_at(c) >= self.count_at(i) {
                return;
            }
            self.swap(i, c);
            i = c;
        }
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if self.count_at(p) <= self.count_at(i) {
                return;
            }
            self.swap(i, p);
            i = p;
        }
    }

    /// The `n` largest counts, largest first (ties by id).
    pub fn top(&self, n: usize) -> Vec<(Vec<u8>, u64)> {
        let mut all: Vec<(&[u8], u64)> = self
            .ids
            .iter()
            .map(|i| &i[..])
            .zip(self.counts.iter().copied())
            .collect();
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        all.truncate(n);
        all.into_iter().map(|(i, c)| (i.to_vec(), c)).collect()
    }

    /// Ids tracked now.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether the heap order holds (tests).
    #[cfg(test)]
    fn heap_ok(&self) -> bool {
        (1..self.heap.len()).all(|i| self.count_at((i - 1) / 2) <= self.count_at(i))
            && self
                .heap
                .iter()
                .enumerate()
                .all(|(i, &s)| self.pos[s as usize] as usize == i)
    }
}

/// One hot key as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotKey {
    /// Its database.
    pub db: u16,
    /// The key.
    pub key: Vec<u8>,
    /// Estimated count (the sketch's count times the sampling).
    pub count: u64,
}

/// The three sketches all connections feed.
#[derive(Debug)]
pub struct HotKeys {
    sample: u32,
    /// One per [`Dimension`]; `None` when off (`--hotkeys-capacity 0`).
    dims: Option<[Mutex<Dimensioned>; 3]>,
}

#[derive(Debug)]
struct Dimensioned {
    sketch: SpaceSaving,
    /// Reused for the (db, key) id, so a sample allocates nothing unless
    /// the key is new to the sketch.
    scratch: Vec<u8>,
}

impl HotKeys {
    /// Sketches of `capacity` counters (0: off), fed one event in `sample`.
    pub fn new(capacity: usize, sample: u32) -> HotKeys {
        let dim = || {
            Mutex::new(Dimensioned {
                sketch: SpaceSaving::new(capacity),
                scratch: Vec::new(),
            })
        };
        HotKeys {
            sample: sample.max(1),
            dims: (capacity > 0).then(|| [dim(), dim(), dim()]),
        }
    }

    /// Whether keys are counted.
    pub fn enabled(&self) -> bool {
        self.dims.is_some()
    }

    /// One event in this many is counted.
    pub fn sample(&self) -> u32 {
        self.sample
    }

    /// A sampled event: `key` of database `db` in dimension `d`.
    pub fn note(&self, d: Dimension, db: u16, key: &[u8]) {
        let Some(dims) = &self.dims else {
            return;
        };
        let mut g = dims[d as usize].lock().unwrap_or_else(|p| p.into_inner());
        let Dimensioned { sketch, scratch } = &mut *g;
        scratch.clear();
        scratch.extend_from_slice(&db.to_be_bytes());
        scratch.extend_from_slice(key);
        sketch.add(scratch);
    }

    /// The `n` hottest keys of dimension `d` (of database `db` only, when
    /// given), hottest first.
    pub fn top(&self, d: Dimension, db: Option<u16>, n: usize) -> Vec<HotKey> {
        let Some(dims) = &self.dims else {
            return Vec::new();
        };
        let all = {
            let g = dims[d as usize].lock().unwrap_or_else(|p| p.into_inner());
            g.sketch.top(usize::MAX)
        };
        all.into_iter()
            .filter_map(|(id, c)| {
                let (k_db, key) = id.split_first_chunk::<2>()?;
                let k_db = u16::from_be_bytes(*k_db);
                db.is_none_or(|db| db == k_db).then(|| HotKey {
                    db: k_db,
                    key: key.to_vec(),
                    count: c.saturating_mul(u64::from(self.sample)),
                })
            })
            .take(n)
            .collect()
    }
}

/// A connection's countdown to its next sample (reads and writes apart).
///
/// A GET hit pays one decrement and one test for zero ([`Sampler::read_due`]):
/// the countdown to the next read that needs a closer look. That is the
/// next sample, or every read when every read is watched
/// ([`Sampler::watch_every_read`]: `--prefix-stats` counts each one), in
/// which case a second countdown finds the samples
/// ([`Sampler::read_sampled`]). So the prefix figures' off switch costs a
/// GET hit nothing of its own.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// 0: off.
    sample: u32,
    /// Reads to the next one that needs a closer look (never 0 between
    /// calls).
    reads_due: u32,
    /// Reads to the next sample (never 0 between calls).
    reads_left: u32,
    /// Writes to the next sample (never 0 between calls).
    writes_left: u32,
    every_read: bool,
    rng: u64,
}

impl Sampler {
    /// A countdown for `hot`'s sampling, seeded by `seed` (the client id).
    pub fn new(hot: &HotKeys, seed: u64) -> Sampler {
        let mut s = Sampler {
            sample: if hot.enabled() { hot.sample } else { 0 },
            reads_due: u32::MAX,
            reads_left: u32::MAX,
            writes_left: u32::MAX,
            every_read: false,
            // Never zero (xorshift's fixed point).
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        };
        if s.sample > 0 {
            s.reads_left = s.gap();
            s.reads_due = s.reads_left;
            s.writes_left = s.gap();
        }
        s
    }

    /// Every read is due for a closer look (for the prefix figures); the
    /// samples stay the same.
    pub fn watch_every_read(mut self) -> Sampler {
        self.every_read = true;
        self.reads_due = 1;
        self
    }

    /// Uniform in `1..=2N-1` (mean `N`); 1 when `N` is 1.
    fn gap(&mut self) -> u32 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        let span = u64::from(self.sample) * 2 - 1;
        1 + (x % span) as u32
    }

    /// Counts a read: whether it needs a closer look, then
    /// [`Sampler::read_sampled`] (a sample is due, or every read is
    /// watched).
    #[inline]
    pub fn read_due(&mut self) -> bool {
        self.reads_due = self.reads_due.wrapping_sub(1);
        self.reads_due == 0
    }

    /// After [`Sampler::read_due`] said so: whether this read is a sample.
    pub fn read_sampled(&mut self) -> bool {
        if self.every_read {
            self.reads_due = 1;
            self.reads_left = self.reads_left.wrapping_sub(1);
            if self.reads_left != 0 {
                return false;
            }
        }
        let sampled = self.sample > 0;
        self.reads_left = if sampled { self.gap() } else { u32::MAX };
        if !self.every_read {
            self.reads_due = self.reads_left;
        }
        sampled
    }

    /// Counts a read: whether it is sampled.
    #[inline]
    pub fn read(&mut self) -> bool {
        self.read_due() && self.read_sampled()
    }

    /// Counts a write: whether it is sampled.
    #[inline]
    pub fn write(&mut self) -> bool {
        self.writes_left = self.writes_left.wrapping_sub(1);
        if self.writes_left != 0 {
            return false;
        }
        self.rearm_write()
    }

    #[cold]
    fn rearm_write(&mut self) -> bool {
        if self.sample == 0 {
            self.writes_left = u32::MAX;
            return false;
        }
        self.writes_left = self.gap();
        true
    }
}

/// `key` as text: UTF-8 kept, and every byte of an invalid sequence, every
/// control character and the backslash itself written `\xNN` (so the
/// text maps back to the bytes).
pub fn escape_key(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    for chunk in key.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The `/debug/hotkeys` body: `{"by":…,"sample":N,"keys":[{"db":0,
/// "key":"…","count":N},…]}`, keys escaped by [`escape_key`].
pub fn to_json(d: Dimension, sample: u32, keys: &[HotKey]) -> String {
    let mut out = format!("{{\"by\":\"{}\",\"sample\":{sample},\"keys\":[", d.name());
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("{{\"db\":{},\"key\":\"", k.db));
        for c in escape_key(&k.key).chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c => out.push(c),
            }
        }
        out.push_str(&format!("\",\"count\":{}}}", k.count));
    }
    out.push_str("]}\n");
    out
}

/// What `/debug/hotkeys?by=reads&n=20&db=0` asks for: the ranking
/// (default reads), how many (default 20) and a database (default all).
///
/// # Errors
/// A one-line reason for a 400 answer.
pub fn parse_query(q: Option<&str>) -> Result<(Dimension, usize, Option<u16>), String> {
    let mut out = (Dimension::Reads, 20, None);
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "by" => {
                out.0 = Dimension::parse(v.as_bytes())
                    .ok_or_else(|| format!("by={v}: expected reads, misses or writes"))?;
            }
            "n" => {
                out.1 = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("n={v}: expected a positive integer"))?;
            }
            "db" => {
                out.2 = Some(
                    v.parse::<u16>()
                        .map_err(|_| format!("db={v}: expected a database number"))?,
                );
            }
            _ => return Err(format!("unknown parameter {k:?}: try by, n, db")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
