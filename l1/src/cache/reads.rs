//! Reads of a key other than GET (HGETALL, STRLEN, ZRANGE …), cached in
//! the key's entry.
//!
//! Each read is the reply to one command with its arguments, named by a
//! *signature* the caller builds (the cache does not read it) and tagged
//! with a byte the caller chooses (the protocol of the reply). They live
//! in the key's [`Entry`], so whatever drops the key (an invalidation, a
//! write, FLUSH*, eviction) drops them all at once, and they share GET's
//! race guard: a read fill takes the same [`FillTicket`] and is kept only
//! if no invalidation of the key's bucket happened since it was taken.
//!
//! A fill copies the entry's other parts and inserts the entry again with
//! the read added: a fill is a miss (rare next to hits) and this keeps the
//! cache's weight accounting and eviction as for any insert.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{CacheKey, Entry, KeyRef, Origin, Stats, Store, L1};
use crate::cache::FillTicket;

/// Reads kept per key: a lookup scans them, so few. The oldest goes first.
pub const MAX_READS_PER_KEY: usize = 16;
/// Estimated bytes a read costs beyond its signature and reply.
const READ_OVERHEAD: u64 = 48;

/// One cached read.
#[derive(Debug, Clone)]
pub(super) struct Read {
    sig: Bytes,
    reply: Bytes,
    tag: u8,
    deadline: Instant,
}

/// An entry's reads (behind one thin pointer: the entry of a key with
/// none grows by 8 bytes only).
#[derive(Debug)]
pub(super) struct Reads(Box<[Read]>);

/// The weight of an entry's reads.
pub(super) fn weight(reads: &Reads) -> u64 {
    reads
        .0
        .iter()
        .map(|r| r.sig.len() as u64 + r.reply.len() as u64 + READ_OVERHEAD)
        .sum()
}

/// The result of a read's lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadLookup {
    /// Cached: the reply and its tag.
    Hit(Bytes, u8),
    /// Not cached; fetch and fill.
    Miss,
    /// The L1 is off or the key is filtered out: go upstream, do not fill.
    Bypass,
}

impl L1 {
    /// Looks up the read of `key` whose signature `matches` accepts, as of
    /// `now`. Counts a hit or a miss.
    pub fn read_at(
        &self,
        db: u16,
        key: &[u8],
        matches: impl Fn(&[u8]) -> bool,
        now: Instant,
    ) -> ReadLookup {
        let Some(cache) = &self.cache else {
            return ReadLookup::Bypass;
        };
        if !self.cfg.key_allowed(key) {
            return ReadLookup::Bypass;
        }
        let hit = cache.get(&KeyRef { db, key }).and_then(|e| {
            e.reads?
                .0
                .iter()
                .find(|r| r.deadline > now && matches(&r.sig))
                .map(|r| (r.reply.clone(), r.tag))
        });
        match hit {
            Some((reply, tag)) => {
                Stats::add(&self.stats.hits, 1);
                Stats::add(&self.stats.read_hits, 1);
                ReadLookup::Hit(reply, tag)
            }
            None => {
                Stats::add(&self.stats.misses, 1);
                Stats::add(&self.stats.read_misses, 1);
                ReadLookup::Miss
            }
        }
    }

    /// Finishes a read's fill: `reply` (tagged `tag`) is the answer to the
    /// read named `sig`, fetched with the key's `pttl` (milliseconds; -1 =
    /// no expiry, -2 = no key). Returns whether it was cached. Replies
    /// larger than `--l1-max-value-bytes`, reads of a missing key (unless
    /// nils are cached), and fills raced by an invalidation are not.
    #[allow(clippy::too_many_arguments)]
    pub fn complete_read(
        &self,
        t: FillTicket,
        db: u16,
        key: &Bytes,
        sig: Bytes,
        reply: &[u8],
        tag: u8,
        pttl: i64,
    ) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        if reply.len() as u64 > self.cfg.max_value_bytes {
            return false;
        }
        let ttl = match pttl {
            -1 => self.cfg.ttl_cap,
            ms if ms > 0 => Duration::from_millis(ms as u64).min(self.cfg.ttl_cap),
            -2 => match self.cfg.cache_nil {
                Some(d) => d.min(self.cfg.ttl_cap),
                None => return false,
            },
            _ => return false,
        };
        if self.raced(&t) {
            Stats::add(&self.stats.fills_discarded, 1);
            return false;
        }
        let read = Read {
            sig,
            // Owned: a slice of an upstream read buffer would keep it alive.
            reply: Bytes::copy_from_slice(reply),
            tag,
            deadline: t.started + ttl,
        };
        let now = Instant::now();
        let entry = match cache.get(&KeyRef { db, key }) {
            Some(mut e) => {
                let mut reads: Vec<Read> = e
                    .reads
                    .as_deref()
                    .map_or(&[][..], |r| &r.0)
                    .iter()
                    .filter(|r| r.deadline > now && r.sig != read.sig)
                    .cloned()
                    .collect();
                if reads.len() >= MAX_READS_PER_KEY {
                    reads.drain(..=reads.len() - MAX_READS_PER_KEY);
                }
                reads.push(read);
                e.reads = Some(Arc::new(Reads(reads.into())));
                e
            }
            None => Entry {
                value: None,
                // No GET value: no lookup is earlier than `born`.
                deadline: self.born,
                origin: Origin::Fill,
                reads: Some(Arc::new(Reads(Box::new([read])))),
            },
        };
        insert(cache, db, key, entry);
        if self.raced(&t) {
            cache.remove(&KeyRef { db, key });
            Stats::add(&self.stats.fills_discarded, 1);
            return false;
        }
        Stats::add(&self.stats.fills, 1);
        Stats::add(&self.stats.read_fills, 1);
        true
    }

    /// The other reads the entry of `key` holds that are still good at
    /// `at`, for a GET fill to keep.
    pub(super) fn live_reads(
        &self,
        cache: &Store,
        db: u16,
        key: &[u8],
        at: Instant,
    ) -> Option<Arc<Reads>> {
        let reads = cache.get(&KeyRef { db, key })?.reads?;
        reads.0.iter().any(|r| r.deadline > at).then_some(reads)
    }
}

fn insert(cache: &Store, db: u16, key: &Bytes, entry: Entry) {
    cache.insert(CacheKey::new(db, key), entry);
}
