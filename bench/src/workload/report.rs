//! The figures of a load and how they leave the process: the tally of
//! replies and round-trip latencies, the one `key=value` line printed, the
//! report file of `--hist-out` (the tally with every histogram bucket and
//! the run's start on the wall clock) and `--merge`, which adds up the
//! report files of processes run side by side into the same line, with
//! exact percentiles. Owns no I/O to servers.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::hist::Histogram;

/// Figures of one connection (or all).
pub(crate) struct Tally {
    /// Round-trip latencies (one per pipeline of operations).
    pub(crate) hist: Histogram,
    /// Those of round trips of writes only (every write's, at
    /// `--pipeline 1`): a write-behind write's acknowledgement.
    pub(crate) write_hist: Histogram,
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) errors: u64,
    pub(crate) nils: u64,
    pub(crate) backwards: u64,
}

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally {
            hist: Histogram::new(),
            write_hist: Histogram::new(),
            reads: 0,
            writes: 0,
            errors: 0,
            nils: 0,
            backwards: 0,
        }
    }

    pub(crate) fn merge(&mut self, o: &Tally) {
        self.hist.merge(&o.hist);
        self.write_hist.merge(&o.write_hist);
        self.reads += o.reads;
        self.writes += o.writes;
        self.errors += o.errors;
        self.nils += o.nils;
        self.backwards += o.backwards;
    }
}

/// What a load measured: its tally, and when it ran.
pub(crate) struct Report {
    pub(crate) tally: Tally,
    /// When the first operation was sent, ns since the Unix epoch.
    pub(crate) start_unix_ns: u64,
    /// From then to the last reply, s.
    pub(crate) secs: f64,
}

/// The first line of a report file.
const MAGIC: &str = "sidecache-bench workload report 1";
/// The line before the writes' histogram in a report file.
const WRITES: &str = "writes";

impl Report {
    /// The line printed: `ops secs ops_per_s p50_us p99_us p999_us mean_us
    /// max_us reads writes errors nils backwards set_p50_us set_p99_us`
    /// (the last two: round trips of writes only).
    pub(crate) fn line(&self) -> String {
        let t = &self.tally;
        let h = &t.hist;
        let ops = t.reads + t.writes;
        format!(
            "ops={ops} secs={:.3} ops_per_s={:.0} p50_us={:.1} p99_us={:.1} p999_us={:.1} mean_us={:.1} max_us={:.1} reads={} writes={} errors={} nils={} backwards={} set_p50_us={:.1} set_p99_us={:.1}",
            self.secs,
            ops as f64 / self.secs,
            h.quantile_us(0.5),
            h.quantile_us(0.99),
            h.quantile_us(0.999),
            h.mean_us(),
            h.quantile_us(1.0),
            t.reads,
            t.writes,
            t.errors,
            t.nils,
            t.backwards,
            t.write_hist.quantile_us(0.5),
            t.write_hist.quantile_us(0.99)
        )
    }

    /// The report file's text: a magic line, a line of `key=value` figures,
    /// then the histogram ([`Histogram::to_text`]), a line [`WRITES`] and
    /// the writes' histogram.
    pub(crate) fn to_text(&self) -> String {
        let t = &self.tally;
        format!(
            "{MAGIC}\nstart_unix_ns={} secs={} reads={} writes={} errors={} nils={} backwards={}\n{}",
            self.start_unix_ns,
            self.secs,
            t.reads,
            t.writes,
            t.errors,
            t.nils,
            t.backwards,
            t.hist.to_text()
        ) + WRITES
            + "\n"
            + &t.write_hist.to_text()
    }

    /// Reads what [`Report::to_text`] wrote.
    pub(crate) fn parse(text: &str) -> Result<Report> {
        let mut parts = text.splitn(3, '\n');
        if parts.next() != Some(MAGIC) {
            bail!("not a workload report (its first line is not {MAGIC:?})");
        }
        let figures = parts.next().context("no figures line")?;
        let rest = parts.next().unwrap_or_default();
        let (all, writes) = rest
            .split_once(&format!("\n{WRITES}\n"))
            .unwrap_or((rest, ""));
        let hist = Histogram::from_text(all)?;
        let write_hist = if writes.is_empty() {
            Histogram::new()
        } else {
            Histogram::from_text(writes)?
        };
        let mut r = Report {
            tally: Tally {
                hist,
                write_hist,
                ..Tally::new()
            },
            start_unix_ns: 0,
            secs: 0.0,
        };
        let mut seen = 0;
        for kv in figures.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("{kv:?} is not key=value"))?;
            let bad = || format!("bad {k}: {v:?}");
            let t = &mut r.tally;
            match k {
                "start_unix_ns" => r.start_unix_ns = v.parse().with_context(bad)?,
                "secs" => r.secs = v.parse().with_context(bad)?,
                "reads" => t.reads = v.parse().with_context(bad)?,
                "writes" => t.writes = v.parse().with_context(bad)?,
                "errors" => t.errors = v.parse().with_context(bad)?,
                "nils" => t.nils = v.parse().with_context(bad)?,
                "backwards" => t.backwards = v.parse().with_context(bad)?,
                _ => bail!("unknown figure {k:?}"),
            }
            seen += 1;
        }
        if seen != 7 {
            bail!("the figures line has {seen} of 7 figures");
        }
        Ok(r)
    }
}

/// The reports of loads run side by side, as one: the tallies added up
/// (histograms bucket by bucket, so percentiles are exact), the time from
/// the earliest start to the latest end (the wall time of the whole run).
/// `None` for no reports.
pub(crate) fn merge(reports: &[Report]) -> Option<Report> {
    let start = reports.iter().map(|r| r.start_unix_ns).min()?;
    let mut all = Report {
        tally: Tally::new(),
        start_unix_ns: start,
        secs: 0.0,
    };
    for r in reports {
        all.tally.merge(&r.tally);
        let end = (r.start_unix_ns - start) as f64 / 1e9 + r.secs;
        all.secs = all.secs.max(end);
    }
    Some(all)
}

/// `--merge`: reads report files and returns the merged line.
///
/// # Errors
/// A file that cannot be read or is not a report, or no files.
pub fn merge_files(paths: &[PathBuf]) -> Result<String> {
    let mut reports = Vec::new();
    for p in paths {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        reports.push(Report::parse(&text).with_context(|| format!("in {}", p.display()))?);
    }
    let all = merge(&reports).context("--merge needs at least one file")?;
    Ok(all.line())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn report(start_unix_ns: u64, secs: f64, lat_us: &[u64]) -> Report {
        let mut tally = Tally::new();
        for &us in lat_us {
            tally.hist.record(Duration::from_micros(us));
        }
        tally.reads = lat_us.len() as u64;
        tally.writes = 1;
        tally.nils = 2;
        Report {
            tally,
            start_unix_ns,
            secs,
        }
    }

    #[test]
    fn report_text_round_trips() {
        let r = report(
            1_700_000_000_123_456_789,
            0.123_456_789,
            &[10, 20, 20, 200_000],
        );
        let back = Report::parse(&r.to_text()).expect("parses");
        assert_eq!(back.line(), r.line());
        assert_eq!(back.start_unix_ns, r.start_unix_ns);
        assert_eq!(back.secs, r.secs);
        assert!(Report::parse("something else\n").is_err());
        let cut = r.to_text().replace(" backwards=0", "");
        assert!(Report::parse(&cut).is_err());
    }

    #[test]
    fn merged_percentiles_are_exact_and_time_is_wall_time() {
        // One process all fast, one all slow: the merged p50 is neither's
        // and no average of theirs.
        let fast = report(1_000_000_000, 1.0, &[10; 60]);
        let slow = report(1_500_000_000, 1.0, &[1000; 40]);
        let all = merge(&[fast, slow]).expect("two reports");
        assert_eq!(all.tally.hist.count(), 100);
        assert_eq!(all.tally.hist.quantile_us(0.5), 10.5);
        assert_eq!(all.tally.hist.quantile_us(0.99), 1000.5);
        assert_eq!(all.tally.reads, 100);
        assert_eq!(all.tally.writes, 2);
        assert_eq!(all.tally.nils, 4);
        // From the first start to the last end: 0.5 s + 1 s.
        assert!((all.secs - 1.5).abs() < 1e-9);
        assert!(all
            .line()
            .starts_with("ops=102 secs=1.500 ops_per_s=68 p50_us=10.5 "));
        assert!(merge(&[]).is_none());
    }
}
