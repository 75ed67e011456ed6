//! L1 hit ratio by key prefix (`--prefix-stats`): per prefix, hits, misses
//! and bytes served from the L1, exported as `sidecache_prefix_*_total`.
//!
//! It owns the prefixes, their shared counters ([`PrefixStats`]) and a
//! connection's tally ([`PrefixTally`]); the exporter reads the counters
//! at scrape time (`export/collect.rs`).
//!
//! A prefix is a number: a key is matched against the explicit prefixes
//! (at most [`crate::config::MAX_PREFIX_STATS`], first match wins; none
//! matches: `other`, the last number), and the connection adds to plain
//! integers indexed by that number, added to the shared atomics once per
//! batch ([`super::ConnMetrics::written`]). No label is hashed or
//! formatted per request. Off (the default), a lookup costs one branch.

use std::sync::atomic::{AtomicU64, Ordering};

/// The label of keys no prefix matches.
pub const OTHER: &str = "other";

/// Hits, misses, hit bytes.
const FIELDS: usize = 3;

/// The prefixes and their counters, shared by all connections.
#[derive(Debug, Default)]
pub struct PrefixStats {
    prefixes: Vec<Vec<u8>>,
    /// Per prefix, then `other`: the label value.
    labels: Vec<String>,
    /// Per prefix, then `other`: hits, misses, hit bytes.
    counts: Box<[[AtomicU64; FIELDS]]>,
}

/// One prefix's figures at a scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixFigures<'a> {
    /// The label value (the prefix, lossy UTF-8, or `other`).
    pub label: &'a str,
    /// L1 hits.
    pub hits: u64,
    /// L1 misses (lookups not answered from the L1).
    pub misses: u64,
    /// Value bytes served from the L1.
    pub hit_bytes: u64,
}

impl PrefixStats {
    /// Counters for `prefixes` (empty: off).
    pub fn new(prefixes: &[Vec<u8>]) -> PrefixStats {
        if prefixes.is_empty() {
            return PrefixStats::default();
        }
        let mut labels: Vec<String> = prefixes
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        labels.push(OTHER.to_owned());
        PrefixStats {
            prefixes: prefixes.to_vec(),
            counts: labels
                .iter()
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            labels,
        }
    }

    /// Whether any prefix is counted.
    pub fn enabled(&self) -> bool {
        !self.prefixes.is_empty()
    }

    /// The number of `key`'s prefix (the first that matches; `other`'s
    /// when none does).
    pub fn index(&self, key: &[u8]) -> usize {
        self.prefixes
            .iter()
            .position(|p| key.starts_with(p))
            .unwrap_or(self.prefixes.len())
    }

    /// Every prefix's figures, `other` last.
    pub fn figures(&self) -> Vec<PrefixFigures<'_>> {
        self.labels
            .iter()
            .zip(self.counts.iter())
            .map(|(label, c)| PrefixFigures {
                label,
                hits: c[0].load(Ordering::Relaxed),
                misses: c[1].load(Ordering::Relaxed),
                hit_bytes: c[2].load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// A connection's per-prefix tally of the batch in hand.
#[derive(Debug, Default)]
pub struct PrefixTally {
    on: bool,
    dirty: bool,
    counts: Vec<[u64; FIELDS]>,
}

impl PrefixTally {
    /// A tally for `stats`' prefixes (a no-op one when off).
    pub fn new(stats: &PrefixStats) -> PrefixTally {
        PrefixTally {
            on: stats.enabled(),
            dirty: false,
            counts: vec![[0; FIELDS]; stats.counts.len()],
        }
    }

    /// Whether prefixes are counted (the one branch when off).
    #[inline]
    pub fn on(&self) -> bool {
        self.on
    }

    /// An L1 lookup of `key`: a hit of `bytes` value bytes, or a miss.
    pub fn lookup(&mut self, stats: &PrefixStats, key: &[u8], hit: Option<usize>) {
        let Some(c) = self.counts.get_mut(stats.index(key)) else {
            return;
        };
        match hit {
            Some(bytes) => {
                c[0] += 1;
                c[2] += bytes as u64;
            }
            None => c[1] += 1,
        }
        self.dirty = true;
    }

    /// Adds the tally to `stats` and clears it.
    pub fn flush(&mut self, stats: &PrefixStats) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        for (mine, shared) in self.counts.iter_mut().zip(stats.counts.iter()) {
            for (m, s) in mine.iter_mut().zip(shared.iter()) {
                if *m > 0 {
                    s.fetch_add(std::mem::take(m), Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_match_then_other() {
        let s = PrefixStats::new(&[b"user:".to_vec(), b"u".to_vec(), b"cart:".to_vec()]);
        assert_eq!(s.index(b"user:1"), 0);
        assert_eq!(s.index(b"ux"), 1);
        assert_eq!(s.index(b"cart:9"), 2);
        assert_eq!(s.index(b"zzz"), 3);
        let mut t = PrefixTally::new(&s);
        assert!(t.on());
        t.lookup(&s, b"user:1", Some(10));
        t.lookup(&s, b"user:2", None);
        t.lookup(&s, b"other", Some(3));
        assert!(s.figures().iter().all(|f| f.hits == 0), "not flushed yet");
        t.flush(&s);
        t.flush(&s);
        let f = s.figures();
        assert_eq!(
            f[0],
            PrefixFigures {
                label: "user:",
                hits: 1,
                misses: 1,
                hit_bytes: 10
            }
        );
        assert_eq!(
            f[3],
            PrefixFigures {
                label: "other",
                hits: 1,
                misses: 0,
                hit_bytes: 3
            }
        );
    }

    #[test]
    fn off_by_default() {
        let s = PrefixStats::new(&[]);
        assert!(!s.enabled());
        assert!(s.figures().is_empty());
        let mut t = PrefixTally::new(&s);
        assert!(!t.on());
        t.lookup(&s, b"k", Some(1));
        t.flush(&s);
    }
}
