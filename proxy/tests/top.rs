//! `sidecache top` in a real terminal: tmux runs it at 160×50 against a
//! sidecache (in-process) in front of a real redis-server while a thread
//! drives GETs and SETs through it; the captured pane is checked against
//! `/metrics` and `/debug/hotkeys` read at about the same time. Then the
//! sidecache goes away (the view says so and keeps running) and `q` quits
//! with status 0.
//!
//! Needs `tmux` (`.ci/run` installs it); without it the test says so and
//! passes.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{http_get, series, temp_dir, Observed, RedisServer};

/// A private tmux server (`tmux -L NAME`), killed on drop; nothing else
/// of tmux is touched.
struct Tmux {
    socket: String,
    /// The socket file and the config's directory, removed on drop.
    files: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Tmux {
    fn installed() -> bool {
        Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// A detached 160×50 session running `cmd`; its pane stays after the
    /// command exits, and the shell writes the command's exit status to a
    /// file (tmux's `#{pane_dead_status}` was seen empty in CI for a
    /// command that had exited).
    fn start(cmd: &str) -> Tmux {
        let dir = temp_dir("tmux");
        let conf = dir.join("tmux.conf");
        let cmd = format!("{cmd}; echo $? > {}", dir.join("status").display());
        let cmd = cmd.as_str();
        std::fs::write(&conf, "set -g remain-on-exit on\n").unwrap();
        let mut t = Tmux {
            socket: dir.file_name().unwrap().to_string_lossy().into_owned(),
            files: None,
        };
        let out = t.run(&[
            "-f",
            conf.to_str().unwrap(),
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "50",
            "-s",
            "top",
            cmd,
        ]);
        assert!(out.status.success(), "tmux: {out:?}");
        let path = t.run(&["display-message", "-p", "#{socket_path}"]);
        let path = String::from_utf8_lossy(&path.stdout).trim().to_owned();
        t.files = Some((path.into(), dir));
        t
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap()
    }

    fn capture(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "top"]);
        assert!(out.status.success(), "capture-pane: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `Some(status)` once the command in the pane exited: its exit
    /// status, as its shell wrote it.
    fn exited(&self) -> Option<i32> {
        let (_, dir) = self.files.as_ref()?;
        let text = std::fs::read_to_string(dir.join("status")).ok()?;
        // Written, not only created.
        text.ends_with('\n').then(|| text.trim().parse().ok())?
    }

    /// Waits until the screen passes `ok`, and returns it.
    async fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let screen = self.capture();
            if ok(&screen) {
                return screen;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "sidecache top never showed {what}:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
        if let Some((socket, dir)) = self.files.take() {
            let _ = std::fs::remove_file(socket);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The screen line containing `has`.
fn line<'a>(screen: &'a str, has: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(has))
        .unwrap_or_else(|| panic!("no line with {has:?}:\n{screen}"))
}

/// A row's cells: the words between the box borders.
fn cells(line: &str) -> Vec<&str> {
    line.split(['│', ' ']).filter(|c| !c.is_empty()).collect()
}

/// The first hot key's row (the line after the `rank` header).
fn first_hot(screen: &str) -> Vec<&str> {
    let mut lines = screen.lines().skip_while(|l| !l.contains("│rank "));
    lines.next();
    cells(
        lines
            .next()
            .unwrap_or_else(|| panic!("no hot keys:\n{screen}")),
    )
}

/// `(hits, misses)` from the hit-ratio line's `(hits N, misses M)`.
fn hits_misses(screen: &str) -> (u64, u64) {
    let l = line(screen, "hit ratio");
    let inner = l.split("(hits ").nth(1).unwrap();
    let (h, rest) = inner.split_once(", misses ").unwrap();
    let m = rest.split(')').next().unwrap();
    (h.parse().unwrap(), m.parse().unwrap())
}

/// The `since start` hit ratio shown, in percent.
fn shown_ratio(screen: &str) -> f64 {
    let l = line(screen, "hit ratio");
    let before = l.split("% since start").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A rate row of the requests/s panel (`L1 hit` → its per-second value).
fn rate(screen: &str, label: &str) -> Option<f64> {
    let l = line(screen, &format!("│{label} "));
    let v = l.split('│').nth(1).unwrap()[label.len()..]
        .split_whitespace()
        .next()
        .unwrap();
    let (n, mult) = match v.strip_suffix('k') {
        Some(n) => (n, 1e3),
        None => match v.strip_suffix('M') {
            Some(n) => (n, 1e6),
            None => (v, 1.0),
        },
    };
    n.parse::<f64>().ok().map(|n| n * mult)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_in_tmux_matches_metrics() {
    if !Tmux::installed() {
        eprintln!("SKIPPED top_in_tmux_matches_metrics: tmux is not installed (apt-get install tmux; .ci/run installs it)");
        return;
    }
    let redis = RedisServer::start(&[]);
    let proxy = Observed::start(&redis.url(), &[]).await;
    let http = proxy.http.to_string();

    // The load: per batch, 8 reads of the hot key, one of 200 others, one
    // write-behind SET of 50 keys.
    let stop = Arc::new(AtomicBool::new(false));
    let load = std::thread::spawn({
        let stop = Arc::clone(&stop);
        let url = format!("redis://{}", proxy.addr);
        move || {
            let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
            let _: () = redis::cmd("SET")
                .arg("top:hot")
                .arg("the hottest value")
                .query(&mut con)
                .unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut p = redis::pipe();
                for _ in 0..8 {
                    p.cmd("GET").arg("top:hot");
                }
                p.cmd("GET").arg(format!("top:cold:{}", i % 200));
                p.cmd("SET").arg(format!("top:w:{}", i % 50)).arg(i);
                let _: Vec<redis::Value> = p.query(&mut con).unwrap();
                i += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });

    let cmd = format!(
        "{} top --metrics {http} --interval 0.5 -n 5",
        env!("CARGO_BIN_EXE_sidecache")
    );
    let tmux = Tmux::start(&cmd);

    // Under load: live, rates above 0, the hot key first, the master ok.
    let screen = tmux
        .wait_for("rates under load", |s| {
            s.contains("live, every 0.5s")
                && s.contains("│L1 hit ")
                && rate(s, "L1 hit").is_some_and(|r| r > 0.0)
                && rate(s, "write-behind").is_some_and(|r| r > 0.0)
                && s.contains("top:hot")
        })
        .await;
    let (_, metrics) = http_get(&http, "/metrics").await;
    let want = 100.0 * series(&metrics, "sidecache_l1_hits_total")
        / (series(&metrics, "sidecache_l1_hits_total")
            + series(&metrics, "sidecache_l1_misses_total"));
    let shown = shown_ratio(&screen);
    assert!(
        (shown - want).abs() < 2.0,
        "hit ratio shown {shown}%, /metrics {want}%:\n{screen}"
    );
    assert!(rate(&screen, "commands").unwrap() >= rate(&screen, "L1 hit").unwrap());
    let row = first_hot(&screen);
    assert_eq!((row[0], row[2], row[3]), ("1", "0", "top:hot"), "{screen}");
    assert_eq!(
        cells(line(&screen, &redis.addr()))[..3],
        [redis.addr().as_str(), "ok", "up"],
        "{screen}"
    );
    assert!(
        line(&screen, "127.0.0.1").contains(" · ready · "),
        "{screen}"
    );

    // Load stopped, queue drained: the screen's totals equal /metrics.
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let t0 = Instant::now();
    while series(
        &http_get(&http, "/metrics").await.1,
        "sidecache_write_queue_depth",
    ) > 0.0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "writes never flushed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, metrics) = http_get(&http, "/metrics").await;
    let (hits, misses) = (
        series(&metrics, "sidecache_l1_hits_total") as u64,
        series(&metrics, "sidecache_l1_misses_total") as u64,
    );
    let screen = tmux
        .wait_for("the idle totals", |s| {
            s.contains("│L1 hit ")
                && hits_misses(s) == (hits, misses)
                && rate(s, "commands") == Some(0.0)
                && line(s, "depth").contains("depth     0 / ")
        })
        .await;
    let want = 100.0 * hits as f64 / (hits + misses) as f64;
    assert!(
        line(&screen, "hit ratio").contains(&format!("{want:.2}% since start")),
        "want {want:.2}%:\n{screen}"
    );
    let max = series(&metrics, "sidecache_write_queue_max") as u64;
    assert!(
        line(&screen, "depth").contains(&format!("depth     0 / {max}")),
        "{screen}"
    );
    let (_, hot) = http_get(&http, "/debug/hotkeys?by=reads&n=1").await;
    let count = hot
        .split("\"count\":")
        .nth(1)
        .unwrap()
        .trim_end_matches(['}', ']', '\n']);
    let row = first_hot(&screen);
    assert_eq!((row[1], row[3]), (count, "top:hot"), "{hot}\n{screen}");
    println!("sidecache top, idle after the load:\n{screen}");

    // The sidecache goes away: shown, retried, not a crash.
    proxy.stop().await;
    let screen = tmux
        .wait_for("disconnected", |s| s.contains("DISCONNECTED ("))
        .await;
    assert!(
        line(&screen, "DISCONNECTED").contains("cannot connect to"),
        "{screen}"
    );
    assert_eq!(tmux.exited(), None, "top exited:\n{screen}");

    // q quits, status 0.
    let out = tmux.run(&["send-keys", "-t", "top", "q"]);
    assert!(out.status.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = tmux.exited() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "q did not quit:\n{}",
            tmux.capture()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 0, "{}", tmux.capture());
    // The terminal is restored: the alternate screen left, the view gone.
    let screen = tmux.capture();
    assert!(!screen.contains("sidecache top"), "{screen}");
}
