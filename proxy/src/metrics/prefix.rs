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
//!
//! With a separator (`--prefix-stats-separator ':'`) the prefix is the
//! key's first segment and its separator (`user:` of `user:42`), learned
//! as keys come: the first [`crate::config::MAX_PREFIX_STATS`] distinct
//! ones get a number, later ones and keys without the separator count as
//! `other`. A connection keeps a copy of the learned list and compares
//! with it (at most 64 short comparisons); it locks the shared list only
//! for a segment it does not know while the list is not full, and takes
//! a fresh copy then.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
    /// Separator mode: the byte, and the segments learned so far (their
    /// numbers are their positions; `other` is the last of `counts`).
    separator: Option<u8>,
    learned: Mutex<Vec<Vec<u8>>>,
}

/// One prefix's figures at a scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixFigures<'a> {
    /// The label value (the prefix, lossy UTF-8, or `other`).
    pub label: std::borrow::Cow<'a, str>,
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
            ..PrefixStats::default()
        }
    }

    /// Counters for the first `cap` distinct first segments of keys up to
    /// and with `separator`.
    pub fn by_separator(separator: u8, cap: usize) -> PrefixStats {
        PrefixStats {
            counts: (0..=cap)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            separator: Some(separator),
            ..PrefixStats::default()
        }
    }

    /// Whether any prefix is counted.
    pub fn enabled(&self) -> bool {
        !self.prefixes.is_empty() || self.separator.is_some()
    }

    /// `other`'s number.
    fn other(&self) -> usize {
        self.counts.len().saturating_sub(1)
    }

    /// Separator mode: the number of `segment`, learned now if there is
    /// room; and a copy of the learned list.
    fn learn(&self, segment: &[u8]) -> (Option<usize>, Vec<Vec<u8>>) {
        let mut l = self.learned.lock().unwrap_or_else(|p| p.into_inner());
        let i = match l.iter().position(|s| s == segment) {
            Some(i) => Some(i),
            None if l.len() < self.other() => {
                l.push(segment.to_vec());
                Some(l.len() - 1)
            }
            None => None,
        };
        (i, l.clone())
    }

    /// The number of `key`'s prefix (the first that matches; `other`'s
    /// when none does).
    pub fn index(&self, key: &[u8]) -> usize {
        self.prefixes
            .iter()
            .position(|p| key.starts_with(p))
            .unwrap_or(self.prefixes.len())
    }

    /// Every prefix's figures (label, hits, misses, hit bytes), `other`
    /// last.
    pub fn figures(&self) -> Vec<PrefixFigures<'static>> {
        let labels: Vec<String> = if self.separator.is_some() {
            let l = self.learned.lock().unwrap_or_else(|p| p.into_inner());
            l.iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .chain(std::iter::once(OTHER.to_owned()))
                .collect()
        } else {
            self.labels.clone()
        };
        let n = labels.len();
        labels
            .into_iter()
            .enumerate()
            .map(|(i, label)| {
                // Separator mode: `other` is the last counter, whatever
                // was learned.
                let c = if i + 1 == n {
                    &self.counts[self.other()]
                } else {
                    &self.counts[i]
                };
                PrefixFigures {
                    label: std::borrow::Cow::Owned(label),
                    hits: c[0].load(Ordering::Relaxed),
                    misses: c[1].load(Ordering::Relaxed),
                    hit_bytes: c[2].load(Ordering::Relaxed),
                }
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
    /// Separator mode: the learned segments as last seen, and whether the
    /// shared list was full then (an unknown segment is `other`).
    known: Vec<Vec<u8>>,
    full: bool,
}

impl PrefixTally {
    /// A tally for `stats`' prefixes (a no-op one when off).
    pub fn new(stats: &PrefixStats) -> PrefixTally {
        PrefixTally {
            on: stats.enabled(),
            dirty: false,
            counts: vec![[0; FIELDS]; stats.counts.len()],
            known: Vec::new(),
            full: false,
        }
    }

    /// Separator mode: the number of `key`'s first segment.
    fn segment_index(&mut self, stats: &PrefixStats, sep: u8, key: &[u8]) -> usize {
        let Some(end) = memchr::memchr(sep, key) else {
            return stats.other();
        };
        let seg = &key[..=end];
        if let Some(i) = self.known.iter().position(|s| s == seg) {
            return i;
        }
        if self.full {
            return stats.other();
        }
        let (i, known) = stats.learn(seg);
        self.full = i.is_none();
        self.known = known;
        i.unwrap_or(stats.other())
    }

    /// Whether prefixes are counted (the one branch when off).
    #[inline]
    pub fn on(&self) -> bool {
        self.on
    }

    /// An L1 lookup of `key`: a hit of `bytes` value bytes, or a miss.
    pub fn lookup(&mut self, stats: &PrefixStats, key: &[u8], hit: Option<usize>) {
        let i = match stats.separator {
            None => stats.index(key),
            Some(sep) => self.segment_index(stats, sep, key),
        };
        let Some(c) = self.counts.get_mut(i) else {
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
                label: "user:".into(),
                hits: 1,
                misses: 1,
                hit_bytes: 10
            }
        );
        assert_eq!(
            f[3],
            PrefixFigures {
                label: "other".into(),
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
