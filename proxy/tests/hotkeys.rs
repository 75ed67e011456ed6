//! Hot keys (SIDECACHE HOTKEYS, /debug/hotkeys, `sidecache hotkeys`) and
//! the per-prefix L1 figures (`--prefix-stats`) against a real Redis.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{http_get, promtool_check, raw_on, series, Observed, RedisServer};
use tokio::net::TcpStream;

/// `n` pipelined `GET key`, their replies read.
async fn gets(c: &mut TcpStream, key: &str, n: usize) {
    let input = format!("GET {key}\r\n").repeat(n);
    raw_on(c, input.as_bytes(), n).await;
}

/// Waits until every write-behind write landed.
async fn drained(c: &mut TcpStream) {
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&raw_on(c, b"INFO writebehind\r\n", 1).await)
        .contains("write_queue_depth:0\r\n")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "writes never flushed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `[key, count]` pairs of a SIDECACHE HOTKEYS reply (RESP2).
fn pairs(reply: &[u8]) -> Vec<(String, u64)> {
    let text = String::from_utf8_lossy(reply);
    let lines: Vec<&str> = text.split("\r\n").collect();
    assert!(lines[0].starts_with('*'), "{text}");
    let mut out = Vec::new();
    // *N, then per pair: *2, $len, key, :count.
    let mut i = 1;
    while i + 3 < lines.len() {
        assert_eq!(lines[i], "*2", "{text}");
        let key = lines[i + 2].to_owned();
        let count = lines[i + 3].trim_start_matches(':').parse().unwrap();
        out.push((key, count));
        i += 4;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hotkeys_by_command_http_and_subcommand() {
    let redis = RedisServer::start(&[]);
    let proxy = Observed::start(&redis.url(), &[]).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    for k in ["hot:a", "hot:b", "hot:c"] {
        let set = format!("SET {k} value\r\n");
        assert_eq!(raw_on(&mut c, set.as_bytes(), 1).await, b"+OK\r\n");
    }
    // Writes: w:1 written most.
    let sets = "SET w:1 x\r\n".repeat(400) + &"SET w:2 x\r\n".repeat(40);
    raw_on(&mut c, sets.as_bytes(), 440).await;
    drained(&mut c).await;
    // Reads: a 4000, b 2000, a missing key 1200 (all misses), c 400.
    for _ in 0..4 {
        gets(&mut c, "hot:a", 1000).await;
        gets(&mut c, "hot:b", 500).await;
        gets(&mut c, "cold:x", 300).await;
        gets(&mut c, "hot:c", 100).await;
    }

    let reads = pairs(&raw_on(&mut c, b"SIDECACHE HOTKEYS READS COUNT 4\r\n", 1).await);
    let keys: Vec<&str> = reads.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["hot:a", "hot:b", "cold:x", "hot:c"], "{reads:?}");
    // Estimates (sampled one in 32, times 32) within a third of the truth.
    assert!((2700..5300).contains(&reads[0].1), "{reads:?}");
    assert!((1300..2700).contains(&reads[1].1), "{reads:?}");
    let misses = pairs(&raw_on(&mut c, b"SIDECACHE HOTKEYS MISSES COUNT 1\r\n", 1).await);
    assert_eq!(misses[0].0, "cold:x", "{misses:?}");
    let writes = pairs(&raw_on(&mut c, b"SIDECACHE HOTKEYS writes\r\n", 1).await);
    assert_eq!(writes[0].0, "w:1", "{writes:?}");
    assert!(writes.len() <= 10);
    // Another database has none of them.
    assert_eq!(
        raw_on(&mut c, b"SIDECACHE HOTKEYS DB 1\r\n", 1).await,
        b"*0\r\n"
    );
    // Errors, Redis style.
    for (cmd, want) in [
        (
            "SIDECACHE\r\n",
            "-ERR wrong number of arguments for 'sidecache' command\r\n",
        ),
        (
            "SIDECACHE NOPE\r\n",
            "-ERR unknown subcommand 'NOPE'. Try SIDECACHE HELP.\r\n",
        ),
        ("SIDECACHE HOTKEYS SIZES\r\n", "-ERR syntax error\r\n"),
        (
            "SIDECACHE HOTKEYS COUNT x\r\n",
            "-ERR value is not an integer or out of range\r\n",
        ),
        (
            "SIDECACHE HOTKEYS COUNT 0\r\n",
            "-ERR COUNT must be positive\r\n",
        ),
    ] {
        let got = raw_on(&mut c, cmd.as_bytes(), 1).await;
        assert_eq!(String::from_utf8_lossy(&got), want, "{cmd}");
    }
    // RESP3 keeps the array of pairs.
    let mut c3 = TcpStream::connect(proxy.addr).await.unwrap();
    raw_on(&mut c3, b"HELLO 3\r\n", 1).await;
    let r3 = raw_on(&mut c3, b"SIDECACHE HOTKEYS COUNT 1\r\n", 1).await;
    assert!(String::from_utf8_lossy(&r3).starts_with("*1\r\n*2\r\n$5\r\nhot:a\r\n:"));

    let http = proxy.http.to_string();
    // SIDECACHE counts as itself, not as unknown (5 answered, 5 errors);
    // a batch is tallied just after its replies are written.
    let t0 = Instant::now();
    let sidecache = |text: &str, outcome: &str| {
        series(
            text,
            &format!("sidecache_commands_total{{command=\"sidecache\",outcome=\"{outcome}\"}}"),
        )
    };
    loop {
        let (_, text) = http_get(&http, "/metrics").await;
        if sidecache(&text, "ok") == 5.0 && sidecache(&text, "error") == 5.0 {
            assert!(!text.contains("command=\"unknown\""), "{text}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = http_get(&http, "/debug/hotkeys?by=reads&n=2").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with(
            "{\"by\":\"reads\",\"sample\":32,\"keys\":[{\"db\":0,\"key\":\"hot:a\",\"count\":"
        ),
        "{body}"
    );
    assert!(body.contains("{\"db\":0,\"key\":\"hot:b\""), "{body}");
    assert!(!body.contains("cold:x"), "{body}");
    let (_, body) = http_get(&http, "/debug/hotkeys?by=misses&n=1").await;
    assert!(body.contains("\"key\":\"cold:x\""), "{body}");
    assert_eq!(http_get(&http, "/debug/hotkeys?by=size").await.0, 400);
    assert_eq!(http_get(&http, "/debug/hotkeys?n=0").await.0, 400);

    // The subcommand, as its own process.
    let addr = proxy.addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_sidecache"))
            .args(["hotkeys", "--by", "writes", "-n", "2", "--addr", &addr])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<&str> = text.lines().collect();
    assert!(
        rows[0].contains("rank") && rows[0].contains("writes"),
        "{text}"
    );
    assert!(
        rows[1].trim_start().starts_with("1 ") && rows[1].ends_with(" w:1"),
        "{text}"
    );
    // w:2 (40 writes) may or may not have been sampled.
    assert!((2..=3).contains(&rows.len()), "{text}");
    // Nobody listening: an error and a failure status.
    let out = tokio::task::spawn_blocking(|| {
        Command::new(env!("CARGO_BIN_EXE_sidecache"))
            .args(["hotkeys", "--addr", "127.0.0.1:1"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hotkeys_off() {
    let redis = RedisServer::start(&[]);
    let proxy = Observed::start(&redis.url(), &["--hotkeys-capacity", "0"]).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    gets(&mut c, "k", 10).await;
    assert_eq!(
        String::from_utf8_lossy(&raw_on(&mut c, b"SIDECACHE HOTKEYS\r\n", 1).await),
        "-ERR hot keys are off (--hotkeys-capacity 0)\r\n"
    );
    assert_eq!(
        http_get(&proxy.http.to_string(), "/debug/hotkeys").await.0,
        404
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_metrics() {
    let redis = RedisServer::start(&[]);
    let proxy = Observed::start(&redis.url(), &["--prefix-stats", "user:,session:"]).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        raw_on(&mut c, b"SET user:1 12345\r\nSET misc 1234567\r\n", 2).await,
        b"+OK\r\n+OK\r\n"
    );
    drained(&mut c).await;
    // First reads fill (misses), the next 10 of each hit.
    gets(&mut c, "user:1", 1).await;
    gets(&mut c, "misc", 1).await;
    gets(&mut c, "user:1", 10).await;
    gets(&mut c, "misc", 10).await;
    // A missing key: every read a miss.
    gets(&mut c, "session:9", 7).await;
    // MGET counts its keys too.
    raw_on(&mut c, b"MGET user:1 session:9\r\n", 1).await;
    let http = proxy.http.to_string();
    // The tally is flushed per batch; the scrape comes after the replies.
    let (status, text) = http_get(&http, "/metrics").await;
    assert_eq!(status, 200);
    promtool_check(&text);
    let s = |n: &str| series(&text, n);
    assert_eq!(
        s("sidecache_prefix_hits_total{prefix=\"user:\"}"),
        11.0,
        "{text}"
    );
    assert_eq!(s("sidecache_prefix_misses_total{prefix=\"user:\"}"), 1.0);
    assert_eq!(
        s("sidecache_prefix_hit_bytes_total{prefix=\"user:\"}"),
        55.0
    );
    assert_eq!(s("sidecache_prefix_hits_total{prefix=\"session:\"}"), 0.0);
    assert_eq!(s("sidecache_prefix_misses_total{prefix=\"session:\"}"), 8.0);
    assert_eq!(s("sidecache_prefix_hits_total{prefix=\"other\"}"), 10.0);
    assert_eq!(s("sidecache_prefix_misses_total{prefix=\"other\"}"), 1.0);
    assert_eq!(
        s("sidecache_prefix_hit_bytes_total{prefix=\"other\"}"),
        70.0
    );
    proxy.stop().await;

    // By first segment: learned as keys come.
    let proxy = Observed::start(&redis.url(), &["--prefix-stats-separator", ":"]).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    // One batch's GETs of a key all miss (they join one fetch): the first
    // read alone.
    gets(&mut c, "user:1", 1).await;
    gets(&mut c, "user:1", 3).await;
    gets(&mut c, "session:9", 2).await;
    gets(&mut c, "misc", 1).await;
    gets(&mut c, "misc", 2).await;
    let (_, text) = http_get(&proxy.http.to_string(), "/metrics").await;
    promtool_check(&text);
    let s = |n: &str| series(&text, n);
    assert_eq!(
        s("sidecache_prefix_hits_total{prefix=\"user:\"}"),
        3.0,
        "{text}"
    );
    assert_eq!(s("sidecache_prefix_misses_total{prefix=\"user:\"}"), 1.0);
    assert_eq!(s("sidecache_prefix_misses_total{prefix=\"session:\"}"), 2.0);
    assert_eq!(s("sidecache_prefix_hits_total{prefix=\"other\"}"), 2.0);
    assert_eq!(s("sidecache_prefix_misses_total{prefix=\"other\"}"), 1.0);
    proxy.stop().await;

    // Off by default: no series.
    let proxy = Observed::start(&redis.url(), &[]).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    gets(&mut c, "user:1", 3).await;
    let (_, text) = http_get(&proxy.http.to_string(), "/metrics").await;
    assert!(!text.contains("sidecache_prefix_"), "{text}");
    proxy.stop().await;
}
