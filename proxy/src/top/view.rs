//! The figures `sidecache top` shows, computed from two scrapes: totals
//! and gauges from the latest, rates as the counters' deltas over the time
//! between the two. Pure: no I/O, no clock (the samples carry their
//! instants), so every figure is unit-tested.

use super::scrape::{HotKey, Metrics, Sample};

/// Everything one screen shows.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The metrics endpoint watched.
    pub endpoint: String,
    /// Seconds between scrapes (`--interval`).
    pub interval: f64,
    /// Live, waiting for the first scrape, or disconnected.
    pub status: Status,
    /// Figures of the last good scrape (kept while disconnected).
    pub figures: Option<Figures>,
}

/// Whether the figures are current.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Nothing read yet.
    Connecting,
    /// The last scrape worked.
    Live,
    /// The last `failures` scrapes failed; `error` is the latest reason.
    Disconnected {
        /// Why.
        error: String,
        /// Failed scrapes in a row.
        failures: u64,
    },
}

/// The figures of one scrape, rates against the one before.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Seconds between the two scrapes the rates come from (None: first
    /// scrape, or the process restarted in between).
    pub window: Option<f64>,
    /// `sidecache_build_info{version}`.
    pub version: String,
    /// `standalone redis 7.2.4` from `sidecache_upstream_info`.
    pub upstream: String,
    /// `sidecache_ready`.
    pub ready: bool,
    /// `sidecache_connected_clients`.
    pub clients: u64,
    /// L1 hits since start.
    pub hits: u64,
    /// L1 misses since start.
    pub misses: u64,
    /// Hits over lookups since start.
    pub hit_ratio: Option<f64>,
    /// Hits over lookups in the window.
    pub hit_ratio_now: Option<f64>,
    /// Hits served while their master was out of reach
    /// (`--l1-stale-if-error`), since start.
    pub stale_served: u64,
    /// Per-second rates, in display order.
    pub rates: Vec<Rate>,
    /// The write-behind queue.
    pub queue: Queue,
    /// Upstream masters, by address.
    pub nodes: Vec<Node>,
    /// Hot keys by reads, or why there are none.
    pub hotkeys: Result<HotKeysView, String>,
}

/// One per-second rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    /// Short name (`L1 hit`).
    pub label: &'static str,
    /// What it counts, in words.
    pub from: &'static str,
    /// Per second; None without a window.
    pub per_sec: Option<f64>,
}

/// The write-behind queue's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    /// Writes queued now.
    pub depth: u64,
    /// `--write-queue-max`.
    pub max: u64,
    /// Bytes queued now.
    pub bytes: u64,
    /// `--write-queue-max-bytes`.
    pub max_bytes: u64,
    /// Writes failed for good since start.
    pub failed: u64,
    /// Writes refused (queue full) since start.
    pub refused: u64,
    /// Mean acknowledgement-to-settlement time in the window, seconds.
    pub flush_mean: Option<f64>,
}

/// One upstream master.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// `host:port`.
    pub addr: String,
    /// `sidecache_upstream_healthy` (None: not reported).
    pub healthy: Option<bool>,
    /// `sidecache_tracking_up` (None: no channel for it).
    pub tracking: Option<bool>,
    /// Commands sent to it per second.
    pub commands_per_sec: Option<f64>,
    /// Failed client pipelines since start.
    pub failures: u64,
}

/// The hot-key panel.
#[derive(Debug, Clone, PartialEq)]
pub struct HotKeysView {
    /// One read in `sample` is counted.
    pub sample: u32,
    /// Most read first.
    pub keys: Vec<HotKey>,
}

impl View {
    /// Before the first scrape.
    pub fn connecting(endpoint: &str, interval: f64) -> View {
        View {
            endpoint: endpoint.to_owned(),
            interval,
            status: Status::Connecting,
            figures: None,
        }
    }

    /// After a good scrape `cur`, rates against `prev` (the scrape
    /// before, if it worked).
    pub fn update(&mut self, prev: Option<&Sample>, cur: &Sample) {
        self.status = Status::Live;
        self.figures = Some(figures(prev, cur));
    }

    /// After a failed scrape: the last figures stay, marked stale.
    pub fn failed(&mut self, error: String) {
        let failures = match &self.status {
            Status::Disconnected { failures, .. } => failures + 1,
            _ => 1,
        };
        self.status = Status::Disconnected { error, failures };
    }
}

/// The rates, in display order: (label, series, what it counts). A series
/// without a `{label=value}` selector is summed over its labels.
const RATES: [(&str, &str, &str); 8] = [
    ("commands", "sidecache_commands_total", "every command"),
    (
        "L1 hit",
        "sidecache_command_duration_seconds_count{path=l1_hit}",
        "answered from the L1",
    ),
    (
        "upstream",
        "sidecache_command_duration_seconds_count{path=upstream}",
        "misses and forwarded commands",
    ),
    (
        "local",
        "sidecache_command_duration_seconds_count{path=local}",
        "write-behind acks, PING…",
    ),
    (
        "L1 miss",
        "sidecache_l1_misses_total",
        "keys fetched upstream",
    ),
    (
        "write-behind",
        "sidecache_writes_queued_total",
        "writes queued",
    ),
    (
        "flushed",
        "sidecache_writes_flushed_total",
        "queued writes landed",
    ),
    (
        "to upstream",
        "sidecache_upstream_commands_total",
        "client commands sent upstream",
    ),
];

/// A counter by a [`RATES`]-style name: `name` (summed over its labels)
/// or `name{label=value}`.
fn counter(m: &Metrics, spec: &str) -> f64 {
    match spec.split_once('{') {
        Some((name, sel)) => {
            let (k, v) = sel
                .trim_end_matches('}')
                .split_once('=')
                .unwrap_or(("", ""));
            m.get(name, &[(k, v)]).unwrap_or(0.0)
        }
        None => m.sum(spec),
    }
}

fn figures(prev: Option<&Sample>, cur: &Sample) -> Figures {
    let m = &cur.metrics;
    // A restart in between (start time changed) resets every counter.
    let prev = prev.filter(|p| {
        p.metrics.get("sidecache_start_time_seconds", &[])
            == m.get("sidecache_start_time_seconds", &[])
    });
    let window = prev.map(|p| cur.at.saturating_duration_since(p.at).as_secs_f64());
    let window = window.filter(|w| *w > 0.0);
    let delta = |spec: &str| -> Option<f64> {
        let p = prev?;
        let d = counter(m, spec) - counter(&p.metrics, spec);
        (d >= 0.0).then_some(d)
    };
    let rate = |spec: &str| Some(delta(spec)? / window?);
    let g = |name: &str| m.get(name, &[]).unwrap_or(0.0);
    let (hits, misses) = (g("sidecache_l1_hits_total"), g("sidecache_l1_misses_total"));
    let ratio = |h: f64, miss: f64| (h + miss > 0.0).then(|| h / (h + miss));
    let hit_ratio_now = match (
        delta("sidecache_l1_hits_total"),
        delta("sidecache_l1_misses_total"),
    ) {
        (Some(h), Some(miss)) => ratio(h, miss),
        _ => None,
    };
    let upstream = ["mode", "engine", "version"]
        .iter()
        .filter_map(|l| m.label("sidecache_upstream_info", l))
        .collect::<Vec<_>>()
        .join(" ");
    let flush_mean = match (
        delta("sidecache_write_flush_duration_seconds_sum"),
        delta("sidecache_write_flush_duration_seconds_count"),
    ) {
        (Some(s), Some(n)) if n > 0.0 => Some(s / n),
        _ => None,
    };
    let mut addrs: Vec<String> = m
        .by_label("sidecache_upstream_healthy", "shard")
        .into_iter()
        .chain(m.by_label("sidecache_upstream_commands_total", "shard"))
        .map(|(a, _)| a)
        .collect();
    addrs.sort();
    addrs.dedup();
    let nodes = addrs
        .into_iter()
        .map(|addr| {
            let with = [("shard", addr.as_str())];
            let cmds = format!("sidecache_upstream_commands_total{{shard={addr}}}");
            Node {
                healthy: m.get("sidecache_upstream_healthy", &with).map(|v| v > 0.0),
                tracking: m.get("sidecache_tracking_up", &with).map(|v| v > 0.0),
                commands_per_sec: rate(&cmds),
                failures: m
                    .get("sidecache_upstream_pipeline_failures_total", &with)
                    .unwrap_or(0.0) as u64,
                addr,
            }
        })
        .collect();
    Figures {
        window,
        version: m
            .label("sidecache_build_info", "version")
            .unwrap_or_default(),
        upstream,
        ready: g("sidecache_ready") > 0.0,
        clients: g("sidecache_connected_clients") as u64,
        hits: hits as u64,
        misses: misses as u64,
        hit_ratio: ratio(hits, misses),
        hit_ratio_now,
        stale_served: g("sidecache_l1_stale_served_total") as u64,
        rates: RATES
            .iter()
            .map(|(label, spec, from)| Rate {
                label,
                from,
                per_sec: rate(spec),
            })
            .collect(),
        queue: Queue {
            depth: g("sidecache_write_queue_depth") as u64,
            max: g("sidecache_write_queue_max") as u64,
            bytes: g("sidecache_write_queue_bytes") as u64,
            max_bytes: g("sidecache_write_queue_max_bytes") as u64,
            failed: g("sidecache_writes_failed_total") as u64,
            refused: g("sidecache_writes_refused_total") as u64,
            flush_mean,
        },
        nodes,
        hotkeys: cur.hotkeys.clone().map(|h| HotKeysView {
            sample: h.sample,
            keys: h.keys,
        }),
    }
}
