//! A latency histogram with 1 µs buckets (redis-benchmark's are about 8 µs
//! wide around 25 µs, too coarse to tell a GET hit from a SET
//! acknowledgement), exact to the microsecond up to [`Histogram::SPAN_US`];
//! and its text form, to merge the histograms of several processes.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Counts of latencies by whole microsecond.
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    /// Samples at or above `SPAN_US`, and their largest value (µs).
    over: u64,
    over_max_us: u64,
    count: u64,
    sum_ns: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    /// Latencies below this many µs get a bucket of their own.
    pub const SPAN_US: usize = 100_000;

    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram {
            buckets: vec![0; Self::SPAN_US],
            over: 0,
            over_max_us: 0,
            count: 0,
            sum_ns: 0,
        }
    }

    /// Counts one latency.
    pub fn record(&mut self, d: Duration) {
        let us = d.as_micros() as u64;
        match self.buckets.get_mut(us as usize) {
            Some(b) => *b += 1,
            None => {
                self.over += 1;
                self.over_max_us = self.over_max_us.max(us);
            }
        }
        self.count += 1;
        self.sum_ns += d.as_nanos();
    }

    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.over += other.over;
        self.over_max_us = self.over_max_us.max(other.over_max_us);
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean, µs.
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.count as f64 / 1000.0
    }

    /// The `q` quantile (0..=1), µs: the bucket holding it, plus 0.5 (its
    /// middle). 0 when empty.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((self.count as f64 * q).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (us, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return us as f64 + 0.5;
            }
        }
        self.over_max_us as f64
    }

    /// Non-empty buckets as `(µs, count)`, the overflow last (at its max).
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(us, &n)| (us as u64, n))
            .chain((self.over > 0).then_some((self.over_max_us, self.over)))
    }

    /// The histogram as text, every sample kept: a line of totals
    /// (`count=N sum_ns=N over=N over_max_us=N`), then `µs count` per
    /// non-empty bucket. [`Histogram::from_text`] reads it back.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "count={} sum_ns={} over={} over_max_us={}\n",
            self.count, self.sum_ns, self.over, self.over_max_us
        );
        for (us, &n) in self.buckets.iter().enumerate().filter(|(_, &n)| n > 0) {
            let _ = writeln!(s, "{us} {n}");
        }
        s
    }

    /// Reads what [`Histogram::to_text`] wrote.
    ///
    /// # Errors
    /// A malformed line, a bucket at or past [`Histogram::SPAN_US`], or
    /// counts that do not add up.
    pub fn from_text(text: &str) -> Result<Histogram> {
        let mut lines = text.lines();
        let head = lines.next().context("empty histogram")?;
        let mut h = Histogram::new();
        for kv in head.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("histogram totals: {kv:?} is not key=value"))?;
            let bad = || format!("histogram totals: bad {k}: {v:?}");
            match k {
                "count" => h.count = v.parse().with_context(bad)?,
                "sum_ns" => h.sum_ns = v.parse().with_context(bad)?,
                "over" => h.over = v.parse().with_context(bad)?,
                "over_max_us" => h.over_max_us = v.parse().with_context(bad)?,
                _ => bail!("histogram totals: unknown key {k:?}"),
            }
        }
        let mut counted = h.over;
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let parsed = line.split_once(' ').and_then(|(us, n)| {
                Some((us.parse::<usize>().ok()?, n.trim().parse::<u64>().ok()?))
            });
            let Some((us, n)) = parsed else {
                bail!("histogram bucket: {line:?} is not `µs count`");
            };
            let Some(b) = h.buckets.get_mut(us) else {
                bail!("histogram bucket {us} µs is past the span");
            };
            *b += n;
            counted += n;
        }
        if counted != h.count {
            bail!(
                "histogram: buckets hold {counted} samples, count says {}",
                h.count
            );
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_exact_to_the_microsecond() {
        let mut h = Histogram::new();
        for us in 1..=100u64 {
            h.record(Duration::from_nanos(us * 1000 + 300));
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile_us(0.5), 50.5);
        assert_eq!(h.quantile_us(0.99), 99.5);
        assert_eq!(h.quantile_us(1.0), 100.5);
        let mut g = Histogram::new();
        g.record(Duration::from_secs(1));
        h.merge(&g);
        assert_eq!(h.quantile_us(1.0), 1_000_000.0);
        assert_eq!(h.buckets().count(), 101);
    }

    #[test]
    fn text_round_trips() {
        let mut h = Histogram::new();
        for ns in [300u64, 1_700, 1_900, 42_000, 250_000_000] {
            h.record(Duration::from_nanos(ns));
        }
        let back = Histogram::from_text(&h.to_text()).expect("parses");
        assert_eq!(back.buckets, h.buckets);
        assert_eq!(
            (back.count, back.sum_ns, back.over, back.over_max_us),
            (h.count, h.sum_ns, h.over, h.over_max_us)
        );
        assert_eq!(
            Histogram::from_text(&Histogram::new().to_text())
                .expect("parses")
                .count(),
            0
        );
        assert!(Histogram::from_text("count=2 sum_ns=0 over=0 over_max_us=0\n1 1\n").is_err());
        assert!(Histogram::from_text("count=1 sum_ns=0 over=0 over_max_us=0\n100000 1\n").is_err());
    }
}
