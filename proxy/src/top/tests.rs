use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::scrape::{HotKey, HotKeys, Metrics, Sample};
use super::view::{Status, View};
use super::*;

const START: &str = "sidecache_start_time_seconds 1700000000\n";

fn page(hits: u64, misses: u64, queued: u64, cmds: u64, healthy: u8) -> String {
    format!(
        "# TYPE x counter\n{START}\
         sidecache_build_info{{version=\"0.1.0\"}} 1\n\
         sidecache_ready 1\n\
         sidecache_connected_clients 3\n\
         sidecache_upstream_info{{mode=\"standalone\",engine=\"redis\",version=\"7.2.4\"}} 1\n\
         sidecache_commands_total{{command=\"get\",outcome=\"ok\"}} {}\n\
         sidecache_commands_total{{command=\"set\",outcome=\"ok\"}} {queued}\n\
         sidecache_command_duration_seconds_count{{path=\"l1_hit\"}} {hits}\n\
         sidecache_command_duration_seconds_count{{path=\"upstream\"}} {misses}\n\
         sidecache_command_duration_seconds_count{{path=\"local\"}} {queued}\n\
         sidecache_l1_hits_total {hits}\n\
         sidecache_l1_misses_total {misses}\n\
         sidecache_writes_queued_total {queued}\n\
         sidecache_writes_flushed_total {queued}\n\
         sidecache_writes_failed_total 2\n\
         sidecache_write_queue_depth 7\n\
         sidecache_write_queue_max 100000\n\
         sidecache_write_queue_bytes 1536\n\
         sidecache_write_queue_max_bytes 268435456\n\
         sidecache_write_flush_duration_seconds_sum {}\n\
         sidecache_write_flush_duration_seconds_count {queued}\n\
         sidecache_upstream_commands_total{{shard=\"127.0.0.1:7000\"}} {cmds}\n\
         sidecache_upstream_commands_total{{shard=\"127.0.0.1:7001\"}} 0\n\
         sidecache_upstream_healthy{{shard=\"127.0.0.1:7000\"}} {healthy}\n\
         sidecache_upstream_healthy{{shard=\"127.0.0.1:7001\"}} 1\n\
         sidecache_tracking_up{{shard=\"127.0.0.1:7000\"}} 1\n\
         sidecache_upstream_pipeline_failures_total{{shard=\"127.0.0.1:7001\"}} 4\n",
        hits + misses,
        queued as f64 * 0.002,
    )
}

fn sample(at: Instant, text: &str, keys: &[(&str, u64)]) -> Sample {
    Sample {
        at,
        metrics: Metrics::parse(text).expect("parses"),
        hotkeys: Ok(HotKeys {
            by: "reads".into(),
            sample: 32,
            keys: keys
                .iter()
                .map(|(k, n)| HotKey {
                    db: 0,
                    key: (*k).to_owned(),
                    count: *n,
                })
                .collect(),
        }),
    }
}

/// The screen as lines of text.
fn draw(view: &View, w: u16, h: u16) -> Vec<String> {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| render::render(f, view)).expect("draw");
    let buf = t.backend().buffer();
    (0..h)
        .map(|y| {
            (0..w)
                .map(|x| buf[(x, y)].symbol().to_owned())
                .collect::<String>()
                .trim_end()
                .to_owned()
        })
        .collect()
}

fn line<'a>(screen: &'a [String], has: &str) -> &'a str {
    screen
        .iter()
        .find(|l| l.contains(has))
        .unwrap_or_else(|| panic!("no line with {has:?}:\n{}", screen.join("\n")))
}

#[test]
fn rates_are_deltas_between_scrapes() {
    let t0 = Instant::now();
    let a = sample(t0, &page(900, 100, 10, 150, 1), &[]);
    let b = sample(
        t0 + Duration::from_secs(2),
        &page(2_800, 300, 30, 350, 0),
        &[("user:1", 4096), ("user:2", 64)],
    );
    let mut v = View::connecting("127.0.0.1:9121", 1.0);
    v.update(None, &a);
    let f = v.figures.as_ref().expect("figures");
    assert_eq!(f.window, None);
    assert!(f.rates.iter().all(|r| r.per_sec.is_none()));
    assert_eq!(f.hit_ratio, Some(0.9));
    v.update(Some(&a), &b);
    assert_eq!(v.status, Status::Live);
    let f = v.figures.as_ref().expect("figures");
    assert_eq!(f.window, Some(2.0));
    let r = |label: &str| {
        f.rates
            .iter()
            .find(|r| r.label == label)
            .and_then(|r| r.per_sec)
    };
    // (2800 + 300 + 30) − (900 + 100 + 10) commands in 2 s.
    assert_eq!(r("commands"), Some(1060.0));
    assert_eq!(r("L1 hit"), Some(950.0));
    assert_eq!(r("L1 miss"), Some(100.0));
    assert_eq!(r("write-behind"), Some(10.0));
    assert_eq!(r("to upstream"), Some(100.0));
    assert_eq!(f.hit_ratio_now, Some(1900.0 / 2100.0));
    assert_eq!(f.hit_ratio, Some(2800.0 / 3100.0));
    assert_eq!((f.hits, f.misses), (2800, 300));
    assert_eq!(f.queue.depth, 7);
    assert_eq!(f.queue.failed, 2);
    assert!((f.queue.flush_mean.expect("mean") - 0.002).abs() < 1e-9);
    assert_eq!(f.nodes.len(), 2);
    assert_eq!(f.nodes[0].addr, "127.0.0.1:7000");
    assert_eq!(f.nodes[0].healthy, Some(false));
    assert_eq!(f.nodes[0].tracking, Some(true));
    assert_eq!(f.nodes[0].commands_per_sec, Some(100.0));
    assert_eq!(f.nodes[1].tracking, None);
    assert_eq!(f.nodes[1].failures, 4);
    assert_eq!(f.upstream, "standalone redis 7.2.4");
}

#[test]
fn a_restart_or_a_reset_gives_no_rate() {
    let t0 = Instant::now();
    let a = sample(t0, &page(900, 100, 10, 150, 1), &[]);
    let restarted = page(5, 1, 0, 1, 1).replace("1700000000", "1700000100");
    let b = sample(t0 + Duration::from_secs(1), &restarted, &[]);
    let mut v = View::connecting("x", 1.0);
    v.update(Some(&a), &b);
    let f = v.figures.as_ref().expect("figures");
    assert_eq!(f.window, None);
    assert_eq!(f.hit_ratio_now, None);
    // Same start time, a counter going back: that rate is unknown.
    let b = sample(
        t0 + Duration::from_secs(1),
        &page(800, 100, 10, 150, 1),
        &[],
    );
    v.update(Some(&a), &b);
    let f = v.figures.as_ref().expect("figures");
    assert_eq!(f.rates[1].per_sec, None);
}

#[test]
fn renders_every_panel() {
    let t0 = Instant::now();
    let a = sample(t0, &page(900, 100, 10, 150, 1), &[]);
    let b = sample(
        t0 + Duration::from_secs(1),
        &page(1_850, 150, 20, 200, 0),
        &[("user:1", 4096), ("user:2", 64)],
    );
    let mut v = View::connecting("127.0.0.1:9121", 1.0);
    v.update(Some(&a), &b);
    let s = draw(&v, 120, 40);
    let text = s.join("\n");
    assert!(
        line(&s, "127.0.0.1:9121")
            .contains("sidecache 0.1.0 · upstream standalone redis 7.2.4 · ready · 3 clients"),
        "{text}"
    );
    assert!(line(&s, "live, every 1s").contains("q, Esc or Ctrl-C quits"));
    assert!(
        line(&s, "hit ratio")
            .contains("95.0% last 1s · 92.50% since start (hits 1850, misses 150)"),
        "{text}"
    );
    assert!(line(&s, "requests/s (last 1s)").contains("write-behind queue"));
    let cells = |l: &str| {
        l.split(['│', ' '])
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let row = cells(line(&s, "│L1 hit"));
    assert_eq!(&row[..3], ["L1", "hit", "950"], "{text}");
    assert!(line(&s, "depth").contains("7 / 100000"), "{text}");
    assert!(line(&s, "bytes").contains("1.5 KiB / 256.0 MiB"), "{text}");
    assert!(line(&s, "flush").contains("2.0 ms mean"), "{text}");
    assert_eq!(
        cells(line(&s, "127.0.0.1:7000")),
        ["127.0.0.1:7000", "UNHEALTHY", "up", "50.0", "0"],
        "{text}"
    );
    assert_eq!(
        cells(line(&s, "127.0.0.1:7001")),
        ["127.0.0.1:7001", "ok", "—", "0.0", "4"]
    );
    assert!(line(&s, "hot keys by reads").contains("1 read in 32 counted"));
    assert_eq!(cells(line(&s, "user:1")), ["1", "4096", "0", "user:1"]);
    assert_eq!(cells(line(&s, "user:2")), ["2", "64", "0", "user:2"]);
    // A small terminal: no panic, the head still there.
    let s = draw(&v, 40, 10);
    assert!(s[0].contains("sidecache top"));
}

#[test]
fn disconnected_keeps_the_last_figures() {
    let mut v = View::connecting("127.0.0.1:9121", 0.5);
    let s = draw(&v, 100, 30);
    assert!(line(&s, "connecting").contains("every 0.5s"));
    v.failed("cannot connect to 127.0.0.1:9121: Connection refused".into());
    v.failed("cannot connect to 127.0.0.1:9121: Connection refused".into());
    let s = draw(&v, 140, 30);
    assert!(line(&s, "DISCONNECTED").contains(
        "DISCONNECTED (2 failed, retrying every 0.5s): cannot connect to 127.0.0.1:9121: Connection refused"
    ));
    let a = sample(Instant::now(), &page(10, 0, 0, 0, 1), &[("k", 5)]);
    v.update(None, &a);
    v.failed("timed out".into());
    let s = draw(&v, 140, 30);
    let text = s.join("\n");
    assert!(
        line(&s, "DISCONNECTED").contains(
            "DISCONNECTED (1 failed, retrying every 0.5s; figures from the last scrape): timed out"
        ),
        "{text}"
    );
    assert!(
        line(&s, "hit ratio").contains("100.00% since start"),
        "{text}"
    );
}

#[test]
fn hot_keys_off_or_empty() {
    let mut a = sample(Instant::now(), &page(10, 0, 0, 0, 1), &[]);
    let mut v = View::connecting("x", 1.0);
    v.update(None, &a);
    assert!(draw(&v, 100, 30)
        .iter()
        .any(|l| l.contains("no key counted yet")));
    a.hotkeys = Err("404: hot keys are off (--hotkeys-capacity 0)".into());
    v.update(None, &a);
    assert!(draw(&v, 100, 30)
        .iter()
        .any(|l| l.contains("hot keys are off (--hotkeys-capacity 0)")));
}

#[test]
fn quit_keys() {
    assert!(quits(KeyCode::Char('q'), KeyModifiers::NONE));
    assert!(quits(KeyCode::Esc, KeyModifiers::NONE));
    assert!(quits(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert!(!quits(KeyCode::Char('c'), KeyModifiers::NONE));
}

#[test]
fn stale_hits_show_when_served() {
    let t0 = Instant::now();
    let a = sample(t0, &page(900, 100, 10, 150, 1), &[]);
    let text = format!(
        "{}sidecache_l1_stale_served_total 42\n",
        page(1_850, 150, 20, 200, 0)
    );
    let b = sample(t0 + Duration::from_secs(1), &text, &[]);
    let mut v = View::connecting("127.0.0.1:9121", 1.0);
    v.update(Some(&a), &b);
    assert_eq!(v.figures.as_ref().map(|f| f.stale_served), Some(42));
    let s = draw(&v, 120, 40);
    assert!(
        line(&s, "hit ratio").contains("(hits 1850, misses 150) · 42 stale hits"),
        "{}",
        s.join("\n")
    );
    // None served: no line.
    let mut v = View::connecting("127.0.0.1:9121", 1.0);
    v.update(Some(&a), &a);
    assert!(!draw(&v, 120, 40).iter().any(|l| l.contains("stale hits")));
}
