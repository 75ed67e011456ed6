//! Observability: `/metrics` checked by `promtool` and moving with known
//! traffic, `/readyz` before and after the upstream is reachable (and while
//! cluster slots are uncovered), INFO sections, and no secret in logs,
//! INFO or metrics.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{cli, http_get, promtool_check, raw, raw_on, series, Cluster, Observed, RedisServer};

#[tokio::test]
async fn metrics_pass_promtool_and_follow_traffic() {
    let redis = RedisServer::start(&[]);
    let proxy = Observed::start(&redis.url(), &[]).await;
    let http = proxy.http.to_string();
    let pa = proxy.addr.to_string();
    let mut c = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    // Warm: the write-behind SET puts the value in the L1 until it lands
    // (optin tracking, the default); once it did, a read fills it again.
    assert_eq!(raw_on(&mut c, b"SET hot v\r\n", 1).await, b"+OK\r\n");
    assert_eq!(raw_on(&mut c, b"GET hot\r\n", 1).await, b"$1\r\nv\r\n");
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&raw_on(&mut c, b"INFO writebehind\r\n", 1).await)
        .contains("write_queue_depth:0\r\n")
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "SET never flushed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(raw_on(&mut c, b"GET hot\r\n", 1).await, b"$1\r\nv\r\n");

    let (status, before) = http_get(&http, "/metrics").await;
    assert_eq!(status, 200);
    promtool_check(&before);

    // 100 GET hits in one pipeline, one unknown command, one upstream read
    // (TTL: not a read the L1 caches).
    let pipeline = b"GET hot\r\n".repeat(100);
    raw_on(&mut c, &pipeline, 100).await;
    let out = raw_on(&mut c, b"NOSUCHCMD x\r\nTTL hot\r\n", 2).await;
    assert!(out.starts_with(b"-ERR unknown command"), "{out:?}");
    // A request that cannot be parsed closes that connection.
    let bad = raw(&pa, b"*1\r\n$x\r\n", 1).await;
    assert!(bad.starts_with(b"-ERR Protocol error"), "{bad:?}");

    let (_, after) = http_get(&http, "/metrics").await;
    promtool_check(&after);
    let delta = |name: &str| series(&after, name) - series(&before, name);
    assert_eq!(delta("sidecache_l1_hits_total"), 100.0);
    assert_eq!(
        delta(r#"sidecache_commands_total{command="get",outcome="ok"}"#),
        100.0
    );
    assert_eq!(
        delta(r#"sidecache_command_duration_seconds_count{path="l1_hit"}"#),
        100.0
    );
    assert_eq!(
        delta(r#"sidecache_commands_total{command="unknown",outcome="error"}"#),
        1.0
    );
    assert_eq!(
        delta(r#"sidecache_commands_total{command="ttl",outcome="ok"}"#),
        1.0
    );
    assert_eq!(
        delta(r#"sidecache_command_duration_seconds_count{path="upstream"}"#),
        2.0
    );
    assert_eq!(delta("sidecache_protocol_errors_total"), 1.0);
    let shard = format!(
        r#"sidecache_upstream_commands_total{{shard="{}"}}"#,
        redis.addr()
    );
    assert_eq!(delta(&shard), 2.0);
    assert_eq!(series(&after, "sidecache_writes_queued_total"), 1.0);
    assert_eq!(series(&after, "sidecache_ready"), 1.0);
    assert_eq!(series(&after, "sidecache_connected_clients"), 1.0);
    // Coherence: the mode in force, the channel, invalidations from a
    // direct writer.
    assert_eq!(
        series(&after, r#"sidecache_coherence_mode{mode="tracking"}"#),
        1.0
    );
    assert_eq!(
        series(&after, r#"sidecache_coherence_mode{mode="off"}"#),
        0.0
    );
    let up = format!(r#"sidecache_tracking_up{{shard="{}"}}"#, redis.addr());
    assert_eq!(series(&after, &up), 1.0);
    raw(&redis.addr(), b"SET hot direct\r\n", 1).await;
    let t0 = std::time::Instant::now();
    loop {
        let (_, now) = http_get(&http, "/metrics").await;
        if series(&now, "sidecache_invalidated_keys_total")
            > series(&after, "sidecache_invalidated_keys_total")
        {
            assert!(
                series(&now, "sidecache_invalidations_received_total")
                    > series(&after, "sidecache_invalidations_received_total")
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no invalidation counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(raw_on(&mut c, b"GET hot\r\n", 1).await, b"$6\r\ndirect\r\n");

    // Health endpoints; anything else is 404.
    assert_eq!(http_get(&http, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(http_get(&http, "/readyz").await, (200, "ready\n".into()));
    assert_eq!(http_get(&http, "/nope").await.0, 404);

    // INFO: the headline section alone, or everything.
    let info = String::from_utf8(raw_on(&mut c, b"INFO proxy\r\n", 1).await).unwrap();
    assert!(info.contains("# Proxy\r\n"), "{info}");
    assert!(!info.contains("# L1"), "{info}");
    assert!(!info.contains("# Server"), "{info}");
    for field in [
        "l1_hit_ratio:",
        "write_queue_depth:0",
        "writes_failed:0",
        "tracking:up",
        "coherence_mode:tracking",
        "upstream_mode:standalone",
        "upstream_masters:1",
    ] {
        assert!(info.contains(field), "{field} in {info}");
    }
    let info = String::from_utf8(raw_on(&mut c, b"INFO\r\n", 1).await).unwrap();
    for section in [
        "# Proxy",
        "# L1",
        "# Write-behind",
        "# Coherence",
        "# Server",
        "# Keyspace",
    ] {
        assert!(info.contains(section), "{section} in INFO");
    }
    let info = String::from_utf8(raw_on(&mut c, b"INFO l1\r\n", 1).await).unwrap();
    assert!(
        info.contains("l1_hits:") && !info.contains("# Proxy"),
        "{info}"
    );
    drop(c);
    proxy.stop().await;
}

#[tokio::test]
async fn metrics_off_keeps_the_proxy_serving() {
    let redis = RedisServer::start(&[]);
    let proxy = support::Proxy::start(&redis.url(), &["--metrics-listen", "off"]).await;
    let out = raw(&proxy.addr.to_string(), b"SET k v\r\nGET k\r\n", 2).await;
    assert_eq!(out, b"+OK\r\n$1\r\nv\r\n");
    proxy.stop().await;
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The binary, with its output captured to files in a temp dir.
struct Binary {
    child: std::process::Child,
    http: String,
    port: u16,
    log: std::path::PathBuf,
}

impl Binary {
    fn start(upstream: &str, extra: &[&str]) -> Binary {
        let port = free_port();
        let http = format!("127.0.0.1:{}", free_port());
        let log = std::env::temp_dir().join(format!(
            "sidecache-metrics-test-{}-{port}.log",
            std::process::id()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sidecache"))
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--metrics-listen",
                &http,
                "--upstream",
                upstream,
            ])
            .args(extra)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Binary {
            child,
            http,
            port,
            log,
        }
    }

    async fn wait_http(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(&self.http).await.is_err() {
            assert!(Instant::now() < deadline, "endpoint did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM (by pid), wait, and the captured output.
    fn terminate(mut self) -> String {
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Polls `/readyz` until it answers `want` (20 s at most); the last body.
async fn readyz_until(http: &str, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = http_get(http, "/readyz").await;
        if status == want {
            return body;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn readyz_is_503_until_the_upstream_is_reachable() {
    let mut redis = RedisServer::start(&[]);
    redis.kill();
    let proxy = Binary::start(
        &redis.url(),
        &["--upstream-wait", "60", "--connect-timeout", "1"],
    );
    proxy.wait_http().await;
    assert_eq!(http_get(&proxy.http, "/healthz").await.0, 200);
    let (status, body) = http_get(&proxy.http, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.starts_with("upstream not reached yet"), "{body}");
    assert_eq!(body.lines().count(), 1, "{body}");
    let (_, metrics) = http_get(&proxy.http, "/metrics").await;
    promtool_check(&metrics);
    assert_eq!(series(&metrics, "sidecache_ready"), 0.0);

    redis.restart();
    readyz_until(&proxy.http, 200).await;
    let out = raw(&format!("127.0.0.1:{}", proxy.port), b"PING\r\n", 1).await;
    assert_eq!(out, b"+PONG\r\n");
    let log = proxy.terminate();
    assert!(log.contains("upstream not usable yet; retrying"), "{log}");
}

/// Whether a `CLUSTER NODES` line lists slot 0 (slots start at field 9).
fn serves_slot_0(line: &str) -> bool {
    line.split(' ')
        .skip(8)
        .any(|f| f == "0" || f.starts_with("0-"))
}

#[tokio::test]
async fn readyz_is_503_while_cluster_slots_are_uncovered() {
    let cluster = Cluster::start();
    // Slot 0 served by nobody: its owner gives it up, every node forgets it.
    let owner = cluster
        .nodes
        .iter()
        .position(|n| {
            cli(n.port, &["cluster", "nodes"])
                .lines()
                .any(|l| l.contains("myself") && serves_slot_0(l))
        })
        .expect("an owner of slot 0");
    for n in &cluster.nodes {
        assert_eq!(cli(n.port, &["cluster", "delslots", "0"]), "OK");
    }
    let uncovered_everywhere = || {
        cluster.nodes.iter().all(|n| {
            !cli(n.port, &["cluster", "nodes"])
                .lines()
                .any(serves_slot_0)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !uncovered_everywhere() {
        assert!(Instant::now() < deadline, "slot 0 still assigned somewhere");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let proxy = Observed::start(&cluster.seed_url(), &["--refresh-interval", "1"]).await;
    let http = proxy.http.to_string();
    let (status, body) = http_get(&http, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body, "1 of 16384 hash slots are served by no master\n");
    let (_, metrics) = http_get(&http, "/metrics").await;
    promtool_check(&metrics);
    assert_eq!(series(&metrics, "sidecache_cluster_slots_uncovered"), 1.0);
    assert_eq!(series(&metrics, "sidecache_upstream_masters"), 3.0);
    let info = String::from_utf8(raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await).unwrap();
    assert!(info.contains("cluster_slots_uncovered:1"), "{info}");
    assert!(info.contains("upstream_mode:cluster"), "{info}");

    // The owner takes the slot back: ready once the proxy's map has it.
    assert_eq!(
        cli(cluster.nodes[owner].port, &["cluster", "addslots", "0"]),
        "OK"
    );
    readyz_until(&http, 200).await;
    let (_, metrics) = http_get(&http, "/metrics").await;
    assert_eq!(series(&metrics, "sidecache_cluster_slots_uncovered"), 0.0);
    proxy.stop().await;
}

#[tokio::test]
async fn secrets_never_reach_logs_info_or_metrics() {
    const SECRET: &str = "s3cr3t-pw-8842";
    let redis = RedisServer::start(&["--requirepass", SECRET]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", redis.port);
    for format in ["text", "json"] {
        let proxy = Binary::start(
            &url,
            &[
                "--log-level",
                "debug",
                "--log-format",
                format,
                "--requirepass",
                "client-pw-5531",
            ],
        );
        proxy.wait_http().await;
        readyz_until(&proxy.http, 200).await;
        let addr = format!("127.0.0.1:{}", proxy.port);
        let out = raw(
            &addr,
            b"AUTH client-pw-5531\r\nSET k v\r\nGET k\r\nGET other\r\nINFO\r\n",
            5,
        )
        .await;
        let text = String::from_utf8_lossy(&out).into_owned();
        assert!(text.contains("# Proxy"), "{text}");
        assert!(!text.contains(SECRET), "INFO leaks the upstream password");
        assert!(!text.contains("client-pw-5531"), "INFO leaks requirepass");
        let (_, metrics) = http_get(&proxy.http, "/metrics").await;
        assert!(!metrics.contains(SECRET));
        let log = proxy.terminate();
        assert!(
            !log.contains(SECRET),
            "log leaks the upstream password:\n{log}"
        );
        assert!(
            !log.contains("client-pw-5531"),
            "log leaks requirepass:\n{log}"
        );
        assert!(log.contains("<auth>@"), "effective config logged:\n{log}");
        assert!(log.contains("requirepass=<set>"), "{log}");
        if format == "json" {
            for line in log.lines().filter(|l| !l.is_empty()) {
                assert!(
                    line.starts_with('{') && line.ends_with('}'),
                    "not a JSON line: {line}"
                );
            }
        }
    }
}

/// The default metrics address already taken (another sidecache on the
/// host): the proxy still serves Redis, without the endpoint. An address
/// given explicitly that cannot be bound is a start-up error.
#[tokio::test]
async fn a_taken_default_metrics_address_is_not_fatal() {
    let redis = RedisServer::start(&[]);
    // Hold the default address (if something else already does, the same).
    let _hold = std::net::TcpListener::bind(sidecache::config::DEFAULT_METRICS_LISTEN);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &redis.url(),
        ])
        .env_remove("SIDECACHE_METRICS_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if cli(port, &["ping"]) == "PONG" {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "sidecache exited");
        assert!(Instant::now() < deadline, "sidecache did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(log.contains("default metrics address unavailable"), "{log}");

    // Explicit: refused at start, naming the option.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &redis.url(),
            "--metrics-listen",
            &taken.local_addr().unwrap().to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--metrics-listen"), "{err}");
}
