//! Write-behind against real redis-servers: acknowledged from memory,
//! flushed in order, in batches of up to 200, nothing lost on SIGTERM,
//! upstream crashes or slot migrations, backpressure when the queue is full.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use redis::AsyncCommands;
use sidecache_resp::frame::Scanner;
use support::{
    cli, drained, enc, eventually_raw, info_field, raw, writer, Cluster, Proxy, ProxyProcess,
    RedisServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn writes_then_forwarded_commands_keep_order() {
    let redis = RedisServer::start(&[]);
    let reference = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    // Each script runs in one pipeline through the proxy and directly on a
    // reference Redis: every reply, then the upstream state, must match.
    let scripts: &[&[&str]] = &[
        &["SET k 1", "INCR k", "GET k"],
        &["SET k a", "APPEND k b", "GET k", "STRLEN k"],
        &["SET k v", "EXPIRE k 100", "GET k"],
        &["SET k v", "DEL k", "GET k", "EXISTS k"],
        &["SET k v", "RENAME k k2", "GET k", "GET k2"],
        &["SET k v", "LPUSH k x", "GET k"],
        &["SETEX k 100 v", "GET k", "PERSIST k", "GET k"],
        &["PSETEX k 100000 v", "GET k"],
        &["MSET a 1 b 2 c 3", "MGET a b c", "INCR b", "MGET a b c"],
        &["INCR k", "SET k 5", "INCR k", "SET k 9", "GET k"],
        &[
            "SET k 1",
            "SET k 2",
            "SET k 3",
            "GET k",
            "SET k 4 NX",
            "SET k 5 XX",
            "SET k 6 GET",
            "GET k",
        ],
        &["SET k v EX 100", "SET k w KEEPTTL", "GET k"],
        &["SET k v PX 1", "GET nothing", "SET j v"],
        &["SET k v EXAT 1", "GET k", "EXISTS k"],
        &["LPUSH k x", "SET k v", "GET k", "TYPE k"],
        &[
            "SET k v",
            "SET k 1 EX 0",
            "SET k 1 EX x",
            "SET k v EX 1 PX 1",
            "GET k",
        ],
    ];
    for script in scripts {
        let input: String = script.iter().map(|l| enc(l)).collect();
        raw(&redis.addr(), b"FLUSHALL\r\n", 1).await;
        raw(&reference.addr(), b"FLUSHALL\r\n", 1).await;
        let via = raw(&proxy.addr.to_string(), input.as_bytes(), script.len()).await;
        let want = raw(&reference.addr(), input.as_bytes(), script.len()).await;
        assert_eq!(
            String::from_utf8_lossy(&via),
            String::from_utf8_lossy(&want),
            "{script:?}"
        );
        drained(&proxy.addr.to_string()).await;
        // Let the 1 ms TTLs of the scripts pass on both servers.
        tokio::time::sleep(Duration::from_millis(10)).await;
        for key in ["k", "k2", "a", "b", "c", "j"] {
            let q = enc(&format!("GET {key}")) + &enc(&format!("TYPE {key}"));
            let up = raw(&redis.addr(), q.as_bytes(), 2).await;
            let re = raw(&reference.addr(), q.as_bytes(), 2).await;
            assert_eq!(
                String::from_utf8_lossy(&up),
                String::from_utf8_lossy(&re),
                "{script:?}: upstream {key}"
            );
        }
        let ttl = raw(&redis.addr(), b"TTL k\r\n", 1).await;
        let want_ttl = raw(&reference.addr(), b"TTL k\r\n", 1).await;
        assert_eq!(
            ttl.starts_with(b":-"),
            want_ttl.starts_with(b":-"),
            "{script:?}: TTL presence"
        );
    }
    proxy.stop().await;
}

/// 50 clients, pipelines of 16, 100,000 SETs (every key written twice, the
/// second value must win), then SIGTERM: exit 0 and everything upstream.
#[test]
fn sigterm_flushes_every_acknowledged_write() {
    sigterm_after_writes(&[]);
}

/// The same on a one-thread runtime (`--threads 1`, tokio's
/// current-thread runtime): every task of the write path shares the main
/// thread and nothing waits on another thread.
#[test]
fn one_worker_thread_flushes_every_acknowledged_write() {
    sigterm_after_writes(&["--threads", "1"]);
}

fn sigterm_after_writes(extra: &[&str]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisServer::start(&[]);
    let proxy = ProxyProcess::start(&redis.url(), extra);
    if let Some(pos) = extra.iter().position(|a| *a == "--threads") {
        // One thread is the current-thread runtime: no worker threads,
        // every task on the main thread.
        let threads = extra[pos + 1].parse::<usize>().unwrap();
        let workers = if threads == 1 { 0 } else { threads };
        assert_eq!(proxy.runtime_threads(), workers, "worker threads");
    }
    let keys = 50_000usize;
    rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..50 {
            let addr = proxy.addr();
            tasks.push(tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                for round in 0..2 {
                    let mut i = c;
                    while i < keys {
                        let mut batch = String::new();
                        let mut n = 0;
                        while n < 16 && i < keys {
                            batch.push_str(&enc(&format!("SET key:{i} v{round}-{i}")));
                            n += 1;
                            i += 50;
                        }
                        let out = support::raw_on(&mut s, batch.as_bytes(), n).await;
                        assert_eq!(out, b"+OK\r\n".repeat(n));
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    // Every write is acknowledged; SIGTERM must flush them all before exit.
    let status = proxy.terminate();
    assert!(status.success(), "exit status {status:?}");
    rt.block_on(async {
        let mut d = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let n: usize = redis::cmd("DBSIZE").query_async(&mut d).await.unwrap();
        assert_eq!(n, keys);
        for chunk in (0..keys).collect::<Vec<_>>().chunks(1000) {
            let names: Vec<String> = chunk.iter().map(|i| format!("key:{i}")).collect();
            let vals: Vec<String> = d.mget(&names).await.unwrap();
            for (i, v) in chunk.iter().zip(vals) {
                assert_eq!(v, format!("v1-{i}"));
            }
        }
    });
}

#[test]
fn redis_benchmark_load_then_sigterm() {
    let redis = RedisServer::start(&[]);
    let proxy = ProxyProcess::start(&redis.url(), &[]);
    let out = std::process::Command::new("redis-benchmark")
        .args([
            "-p",
            &proxy.port.to_string(),
            "-t",
            "set",
            "-n",
            "100000",
            "-P",
            "16",
            "-c",
            "50",
            "-r",
            "100000",
            "-q",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let info = std::process::Command::new("redis-cli")
        .args(["-p", &proxy.port.to_string(), "info", "writebehind"])
        .output()
        .unwrap();
    let queued = info_field(&String::from_utf8_lossy(&info.stdout), "writes_queued");
    assert!(queued >= 100_000, "queued {queued}");
    let status = proxy.terminate();
    assert!(status.success(), "exit status {status:?}");
    let stats = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "info", "commandstats"])
        .output()
        .unwrap();
    let calls = support::command_calls(&String::from_utf8_lossy(&stats.stdout), "set");
    assert_eq!(
        calls, queued,
        "every acknowledged SET reached upstream exactly once"
    );
}

/// Upstream killed with SIGKILL and restarted (AOF, fsync always) during a
/// write load: every acknowledged write is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_loses_no_acknowledged_write() {
    crash_during_writes(&[], 1, Fault::KillAndRestart).await;
}

/// Several batches out at once (`--write-pipeline`): batches sent after
/// the one a crash broke go again after it, so every key ends with its last
/// acknowledged value. Small batches and pipelined clients keep whole
/// batches waiting, so batches really are sent ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_with_pipelined_batches_keeps_order() {
    crash_during_writes(PIPELINED, 20, Fault::KillAndRestart).await;
}

/// The same with the upstream up and its connections killed again and
/// again (CLIENT KILL): the proxy reconnects at once, so a batch queued
/// behind a broken one can land on the new connection before the broken
/// one is resent — it must then be sent again after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_kills_with_pipelined_batches_keep_order() {
    crash_during_writes(PIPELINED, 20, Fault::ClientKills).await;
}

const PIPELINED: &[&str] = &["--write-pipeline", "4", "--write-batch", "10"];

enum Fault {
    /// SIGKILL, then a restart from the AOF.
    KillAndRestart,
    /// `CLIENT KILL TYPE normal SKIPME yes` every 20 ms for 800 ms.
    ClientKills,
}

/// Four writers (`depth` SETs per round trip, over 500 keys each, values
/// increasing) while `fault` hits the upstream; then every key upstream
/// holds its last acknowledged value.
async fn crash_during_writes(extra: &[&str], depth: u64, fault: Fault) {
    let redis = Arc::new(Mutex::new(RedisServer::start(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])));
    let url = redis.lock().unwrap().url();
    let upstream_addr = redis.lock().unwrap().addr();
    let mut args = vec!["--connect-timeout", "1"];
    args.extend_from_slice(extra);
    let proxy = Proxy::start(&url, &args).await;
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (acked, stop, addr) = (acked.clone(), stop.clone(), proxy.addr.to_string());
        writers.push(tokio::spawn(writer(
            addr,
            format!("w{w}"),
            500,
            depth,
            Duration::ZERO,
            acked,
            stop,
        )));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    match fault {
        Fault::KillAndRestart => {
            redis.lock().unwrap().signal("KILL");
            tokio::time::sleep(Duration::from_millis(400)).await;
            {
                let r = redis.clone();
                tokio::task::spawn_blocking(move || r.lock().unwrap().restart())
                    .await
                    .unwrap();
            }
        }
        Fault::ClientKills => {
            let kill = enc("CLIENT KILL TYPE normal SKIPME yes");
            for _ in 0..40 {
                raw(&upstream_addr, kill.as_bytes(), 1).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    drained(&proxy.addr.to_string()).await;
    if extra.contains(&"--write-pipeline") {
        let info = raw(&proxy.addr.to_string(), b"INFO writebehind\r\n", 1).await;
        let ahead = info_field(&String::from_utf8_lossy(&info), "write_batches_ahead");
        assert!(ahead > 0, "no batch was ever sent ahead");
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 100);
    for (k, v) in &acked {
        let got = raw(&upstream_addr, enc(&format!("GET {k}")).as_bytes(), 1).await;
        assert_eq!(
            String::from_utf8_lossy(&got),
            format!("${}\r\n{v}\r\n", v.len()),
            "acknowledged {k}={v} lost"
        );
    }
    proxy.stop().await;
}

/// A TCP relay between the proxy and Redis that records, for every read
/// from the proxy side, how many complete commands it finished.
async fn relay(upstream: String) -> (u16, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let max = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let (m, t) = (max.clone(), total.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut down, _)) = l.accept().await else {
                return;
            };
            let up = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (mut ur, mut uw) = up.into_split();
            let (m, t) = (m.clone(), t.clone());
            tokio::spawn(async move {
                let (mut dr, mut dw) = down.split();
                let to_client = async { tokio::io::copy(&mut ur, &mut dw).await };
                let to_server = async {
                    let mut buf = BytesMut::new();
                    let mut sc = Scanner::new();
                    let mut chunk = vec![0u8; 1 << 20];
                    loop {
                        let n = dr.read(&mut chunk).await?;
                        if n == 0 {
                            return Ok::<(), std::io::Error>(());
                        }
                        uw.write_all(&chunk[..n]).await?;
                        buf.extend_from_slice(&chunk[..n]);
                        let mut done = 0;
                        // Writes only: the connection also carries the
                        // tracking channel's PING heartbeat.
                        while let Ok(Some(len)) = sc.scan(&buf) {
                            let frame = buf.split_to(len);
                            let is_set = frame[..]
                                .split(|&b| b == b'\n')
                                .nth(2)
                                .is_some_and(|a| a.eq_ignore_ascii_case(b"SET\r"));
                            done += usize::from(is_set);
                        }
                        m.fetch_max(done, Ordering::Relaxed);
                        t.fetch_add(done, Ordering::Relaxed);
                    }
                };
                let _ = tokio::join!(to_client, to_server);
            });
        }
    });
    (port, max, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_pipelines_carry_up_to_200_writes() {
    let redis = RedisServer::start(&[]);
    let (port, max, total) = relay(redis.addr()).await;
    // One batch out at a time: what the relay reads at once is one batch
    // (by default up to `--write-pipeline` 4 follow each other).
    let proxy = Proxy::start(
        &format!("redis://127.0.0.1:{port}"),
        &["--write-pipeline", "1"],
    )
    .await;
    let mut tasks = Vec::new();
    for c in 0..20 {
        let addr = proxy.addr.to_string();
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            for r in 0..50 {
                let batch: String = (0..100)
                    .map(|i| enc(&format!("SET k{c}:{r}:{i} v")))
                    .collect();
                support::raw_on(&mut s, batch.as_bytes(), 100).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drained(&proxy.addr.to_string()).await;
    let max = max.load(Ordering::Relaxed);
    // Seen on the wire: batches fill up to the limit and never exceed it.
    assert!(max <= 200, "a pipeline of {max} commands");
    assert!(max >= 150, "largest pipeline only {max} commands");
    assert!(total.load(Ordering::Relaxed) >= 100_000);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_pushes_back_and_memory_stays_bounded() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(
        &redis.url(),
        &["--write-queue-max", "500", "--write-queue-timeout", "0.3"],
    )
    .await;
    redis.signal("STOP");
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let batch: String = (0..1000).map(|i| enc(&format!("SET q{i} v{i}"))).collect();
    let started = std::time::Instant::now();
    let out = support::raw_on(&mut s, batch.as_bytes(), 1000).await;
    // One queue timeout for the whole pipeline, not one per write.
    assert!(started.elapsed() < Duration::from_secs(3));
    let text = String::from_utf8_lossy(&out).into_owned();
    let ok = text.matches("+OK\r\n").count();
    let refused = text.matches("-ERR write-behind queue full").count();
    assert_eq!(ok + refused, 1000, "{text}");
    assert!((400..=500).contains(&ok), "acknowledged {ok}");
    assert!(refused >= 500, "refused {refused}");
    let info =
        String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO writebehind\r\n", 1).await)
            .into_owned();
    assert!(info_field(&info, "write_queue_depth") <= 500);
    assert!(info_field(&info, "writes_refused") >= 500);
    redis.signal("CONT");
    drained(&proxy.addr.to_string()).await;
    // Exactly the acknowledged writes are upstream, nothing else.
    let n = raw(&redis.addr(), b"DBSIZE\r\n", 1).await;
    assert_eq!(String::from_utf8_lossy(&n), format!(":{ok}\r\n"));
    proxy.stop().await;
}

#[tokio::test]
async fn write_through_acknowledges_after_upstream() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &["--write-mode", "write-through"]).await;
    let mut c = proxy.conn().await;
    let mut d = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for i in 0..200 {
        let _: () = c.set(format!("t{i}"), i).await.unwrap();
        let v: i64 = d.get(format!("t{i}")).await.unwrap();
        assert_eq!(v, i, "acknowledged before upstream had it");
    }
    let info: String = redis::cmd("INFO")
        .arg("writebehind")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(info_field(&info, "writes_queued"), 0);
    proxy.stop().await;
}

#[tokio::test]
async fn relative_expiry_becomes_absolute() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let out = raw(
        &proxy.addr.to_string(),
        b"SET k v EX 100\r\nSETEX j 50 v\r\n",
        2,
    )
    .await;
    assert_eq!(out, b"+OK\r\n+OK\r\n");
    drained(&proxy.addr.to_string()).await;
    // What reached upstream carried an absolute PXAT (seen in its command stats).
    let stats = String::from_utf8_lossy(&raw(&redis.addr(), b"INFO commandstats\r\n", 1).await)
        .into_owned();
    assert!(stats.contains("cmdstat_set:calls=2"), "{stats}");
    assert!(!stats.contains("cmdstat_setex"), "{stats}");
    let ttl =
        String::from_utf8_lossy(&raw(&redis.addr(), b"PTTL k\r\nPTTL j\r\n", 2).await).into_owned();
    let ttls: Vec<i64> = ttl
        .lines()
        .map(|l| l.trim_start_matches(':').parse().unwrap())
        .collect();
    assert!(ttls[0] > 95_000 && ttls[0] <= 100_000, "{ttls:?}");
    assert!(ttls[1] > 45_000 && ttls[1] <= 50_000, "{ttls:?}");
    // Expired through the proxy exactly when upstream expires it.
    let out = raw(&proxy.addr.to_string(), b"SET s v PX 200\r\nGET s\r\n", 2).await;
    assert_eq!(out, b"+OK\r\n$1\r\nv\r\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        raw(&proxy.addr.to_string(), b"GET s\r\n", 1).await,
        b"$-1\r\n"
    );
    eventually_raw(&redis.addr(), b"EXISTS s\r\n", 1, ":0\r\n").await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_writes_land_on_their_masters_through_a_migration() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    // Pick a slot to migrate and keys in it, plus keys everywhere.
    let hot: Vec<String> = (0..200).map(|i| format!("{{hot}}:{i}")).collect();
    let slot = sidecache_pool::Slot::for_key(b"{hot}").get().to_string();
    let src = cluster.node_for("{hot}");
    let dst = (src + 1) % 3;
    let (sp, dp) = (cluster.nodes[src].port, cluster.nodes[dst].port);
    let src_id = cli(sp, &["cluster", "myid"]);
    let dst_id = cli(dp, &["cluster", "myid"]);
    let addr = proxy.addr.to_string();
    let writer = tokio::spawn({
        let (addr, hot) = (addr.clone(), hot.clone());
        async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            for round in 0..20 {
                let mut batch = String::new();
                for i in 0..100 {
                    batch.push_str(&enc(&format!("SET k:{round}:{i} {round}")));
                }
                for k in &hot {
                    batch.push_str(&enc(&format!("SET {k} {round}")));
                }
                let out = support::raw_on(&mut s, batch.as_bytes(), 100 + hot.len()).await;
                assert!(
                    out.iter().all(|b| *b != b'-'),
                    "{}",
                    String::from_utf8_lossy(&out)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Migrate the slot while the writer runs.
    tokio::task::spawn_blocking(move || {
        cli(dp, &["cluster", "setslot", &slot, "importing", &src_id]);
        cli(sp, &["cluster", "setslot", &slot, "migrating", &dst_id]);
        loop {
            let keys = cli(sp, &["cluster", "getkeysinslot", &slot, "100"]);
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["migrate", "127.0.0.1"];
            let dps = dp.to_string();
            args.push(&dps);
            args.extend(["", "0", "5000", "REPLACE", "KEYS"]);
            args.extend(keys.lines());
            cli(sp, &args);
        }
        for port in [sp, dp] {
            cli(port, &["cluster", "setslot", &slot, "node", &dst_id]);
        }
    })
    .await
    .unwrap();
    writer.await.unwrap();
    drained(&addr).await;
    // Every key is on the master that owns it, with its last value.
    for k in &hot {
        assert_eq!(cli(dp, &["get", k]), "19", "{k}");
    }
    for round in [0, 19] {
        for i in 0..100 {
            let k = format!("k:{round}:{i}");
            let owner = cluster.node_for(&k);
            assert_eq!(
                cli(cluster.nodes[owner].port, &["get", &k]),
                round.to_string(),
                "{k}"
            );
        }
    }
    proxy.stop().await;
}

/// A write upstream refuses for good (`-OOM`) is counted, and the proxy
/// stops serving the value upstream never got.
#[tokio::test]
async fn permanently_failed_write_is_counted_and_uncached() {
    let redis = RedisServer::start(&["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let pa = proxy.addr.to_string();
    // Fill upstream directly until it refuses writes.
    let big = "x".repeat(64 * 1024);
    for i in 0..200 {
        let r = raw(
            &redis.addr(),
            enc(&format!("SET fill{i} {big}")).as_bytes(),
            1,
        )
        .await;
        if r.starts_with(b"-OOM") {
            break;
        }
    }
    // Well over the limit now: a refused write frees its query buffer, and
    // a later one could otherwise fit under the limit again.
    assert_eq!(
        raw(&redis.addr(), b"CONFIG SET maxmemory 1mb\r\n", 1).await,
        b"+OK\r\n"
    );
    // Acknowledged by the proxy (write-behind), refused by upstream.
    assert_eq!(
        raw(&pa, enc(&format!("SET victim {big}")).as_bytes(), 1).await,
        b"+OK\r\n"
    );
    drained(&pa).await;
    let info = String::from_utf8_lossy(&raw(&pa, b"INFO proxy\r\n", 1).await).into_owned();
    assert!(info_field(&info, "writes_failed") >= 1, "{info}");
    // Not served from the L1 any more: the read goes upstream, which has nothing.
    assert_eq!(
        raw(&pa, b"EXISTS victim\r\nGET victim\r\n", 2).await,
        b":0\r\n$-1\r\n"
    );
    proxy.stop().await;
}

/// A stalled upstream (SIGSTOP) under writers of 4 KB values: the queue
/// stops at `--write-queue-max-bytes` (not at its 100000-write count, which
/// would be 400 MB), writers wait and then get the error naming the bound,
/// never a hang, and sidecache's peak RSS stays within L1 + queue + a
/// margin. After SIGCONT every acknowledged write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_upstream_bounds_memory_in_bytes() {
    let redis = RedisServer::start(&[]);
    let proxy = ProxyProcess::start(
        &redis.url(),
        &[
            "--write-queue-max-bytes",
            "16mb",
            "--l1-max-bytes",
            "16mb",
            "--write-queue-timeout",
            "1",
        ],
    );
    let before = support::proc_status_bytes(proxy.pid(), "VmHWM");
    redis.signal("STOP");
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let slowest = Arc::new(Mutex::new(Duration::ZERO));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (acked, stop, refused, slowest) = (
            acked.clone(),
            stop.clone(),
            refused.clone(),
            slowest.clone(),
        );
        let addr = proxy.addr();
        writers.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let pad = "x".repeat(4090);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<(String, String)> = (0..16)
                    .map(|j| {
                        (
                            format!("s{w}:{}", (i + j) % 5000),
                            format!("{}:{pad}", i + j),
                        )
                    })
                    .collect();
                let input: String = batch
                    .iter()
                    .map(|(k, v)| enc(&format!("SET {k} {v}")))
                    .collect();
                let t = std::time::Instant::now();
                let out = support::raw_on(&mut s, input.as_bytes(), batch.len()).await;
                let took = t.elapsed();
                {
                    let mut m = slowest.lock().unwrap();
                    *m = (*m).max(took);
                }
                let text = String::from_utf8_lossy(&out).into_owned();
                for ((k, v), reply) in batch.into_iter().zip(text.split_inclusive("\r\n")) {
                    if reply == "+OK\r\n" {
                        acked.lock().unwrap().insert(k, v);
                    } else {
                        assert!(
                            reply.starts_with("-ERR write-behind queue full")
                                && reply.contains("--write-queue-max-bytes"),
                            "{reply}"
                        );
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 16;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let info =
        String::from_utf8_lossy(&raw(&proxy.addr(), b"INFO writebehind\r\n", 1).await).into_owned();
    let peak = support::proc_status_bytes(proxy.pid(), "VmHWM");
    redis.signal("CONT");
    let queued_bytes = info_field(&info, "write_queue_bytes");
    assert!(queued_bytes <= 16 << 20, "{info}");
    assert!(queued_bytes > 8 << 20, "the queue never filled: {info}");
    assert!(info_field(&info, "write_backpressure_waits") > 0, "{info}");
    assert!(refused.load(Ordering::Relaxed) > 0, "no write was refused");
    // Backpressure, then the error: a round trip takes about one
    // --write-queue-timeout, never more than a few.
    let slowest = *slowest.lock().unwrap();
    assert!(
        slowest < Duration::from_secs(4),
        "a writer waited {slowest:?}"
    );
    // L1 16 MB + queue 16 MB + buffers and allocator slack (measured: about
    // 50 MB of growth in all, debug build): 96 MB is a generous bound, and
    // without the byte bound the queue alone would take 400 MB.
    let grew = peak.saturating_sub(before);
    eprintln!(
        "stalled upstream: peak RSS {} MB (at start {} MB), queue {} bytes, {} writes refused",
        peak >> 20,
        before >> 20,
        queued_bytes,
        refused.load(Ordering::Relaxed)
    );
    assert!(
        grew < 96 << 20,
        "peak RSS grew {} MB (from {} MB)",
        grew >> 20,
        before >> 20
    );
    drained(&proxy.addr()).await;
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 1000, "only {} acknowledged", acked.len());
    for (k, v) in &acked {
        let got = raw(&redis.addr(), enc(&format!("GET {k}")).as_bytes(), 1).await;
        assert_eq!(
            String::from_utf8_lossy(&got),
            format!("${}\r\n{v}\r\n", v.len()),
            "acknowledged {k} lost"
        );
    }
    let status = proxy.terminate();
    assert!(status.success());
}
