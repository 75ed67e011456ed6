//! The write journal (`--write-journal`) against real `redis-server`s and
//! the real binary: a sidecache killed with SIGKILL under a pipelined
//! write load loses no acknowledged write once restarted on its journal;
//! a torn or corrupt tail is dropped and every whole record replayed; a
//! restart waits for an upstream that is down; one journal, one sidecache;
//! a journal that cannot be written refuses writes with `-MISCONF`.
#![allow(missing_docs, clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{
    enc, free_port, http_get, info_field, raw, temp_dir, writer, ProxyProcess, RedisServer,
};

type Acked = Arc<Mutex<HashMap<String, String>>>;

/// A sidecache on `redis` with its journal in `dir`.
fn start(redis: &RedisServer, dir: &Path, extra: &[&str]) -> ProxyProcess {
    let mut args = vec!["--write-journal", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    ProxyProcess::start(&redis.url(), &args)
}

/// Runs `writers` pipelined writers (16 SETs per round trip) on `proxy`
/// for `before`, stalls Redis (SIGSTOP) for `stalled` so acknowledged
/// writes pile up in the queue, kills sidecache with SIGKILL, and lets
/// Redis go on. Returns what was acknowledged.
async fn load_then_kill(
    redis: &RedisServer,
    proxy: ProxyProcess,
    prefix: &str,
    before: Duration,
    stalled: Duration,
) -> Acked {
    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|w| {
            tokio::spawn(writer(
                proxy.addr(),
                format!("{prefix}:{w}"),
                200,
                16,
                Duration::ZERO,
                Arc::clone(&acked),
                Arc::clone(&stop),
            ))
        })
        .collect();
    tokio::time::sleep(before).await;
    redis.signal("STOP");
    tokio::time::sleep(stalled).await;
    // SIGKILL: no drain, no flush.
    drop(proxy);
    redis.signal("CONT");
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        // Writers whose connection died mid-batch panic; what they had
        // recorded as acknowledged stands.
        let _ = t.await;
    }
    acked
}

/// Acknowledged writes whose value upstream is older than acknowledged
/// (each key's values only grow), after the queue has drained.
async fn lost(redis: &RedisServer, acked: &Acked) -> Vec<(String, String, Option<String>)> {
    let mut conn = redis.conn().await;
    let acked = acked.lock().unwrap().clone();
    let mut lost = Vec::new();
    for (k, v) in acked {
        let got: Option<String> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        let fine = got
            .as_deref()
            .and_then(|g| g.parse::<u64>().ok())
            .is_some_and(|g| g >= v.parse::<u64>().unwrap());
        if !fine {
            lost.push((k, v, got));
        }
    }
    lost
}

async fn proxy_info(proxy: &ProxyProcess) -> String {
    String::from_utf8_lossy(&raw(&proxy.addr(), b"INFO writebehind\r\n", 1).await).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acknowledged_write_with_fsync_always() {
    let redis = RedisServer::start(&[]);
    let dir = temp_dir("journal-always");
    let mut replayed_total = 0;
    for round in 0..5 {
        let proxy = start(&redis, &dir, &["--write-journal-fsync", "always"]);
        let acked = load_then_kill(
            &redis,
            proxy,
            &format!("always{round}"),
            Duration::from_millis(300),
            Duration::from_millis(300),
        )
        .await;
        let n = acked.lock().unwrap().len();
        assert!(n > 0, "round {round}: nothing acknowledged");
        // Restarted on the same journal: it replays before serving.
        let proxy = start(&redis, &dir, &["--write-journal-fsync", "always"]);
        let info = proxy_info(&proxy).await;
        let replayed = info_field(&info, "write_journal_replayed");
        let lost = lost(&redis, &acked).await;
        eprintln!(
            "round {round}: {n} keys acknowledged, {replayed} writes replayed, {} lost",
            lost.len()
        );
        assert!(
            lost.is_empty(),
            "round {round}: lost {:?}",
            &lost[..lost.len().min(5)]
        );
        replayed_total += replayed;
        // A clean stop empties the journal.
        assert!(proxy.terminate().success());
        assert!(segments(&dir).is_empty(), "{:?}", segments(&dir));
    }
    // The stall left writes queued at every kill: the journal carried them.
    assert!(replayed_total > 0, "nothing was replayed");
}

/// The control: the same kill without a journal loses acknowledged
/// writes (so the test above can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_journal_the_same_kill_loses_writes() {
    let redis = RedisServer::start(&[]);
    let proxy = ProxyProcess::start(&redis.url(), &[]);
    let acked = load_then_kill(
        &redis,
        proxy,
        "nojournal",
        Duration::from_millis(300),
        Duration::from_millis(300),
    )
    .await;
    let _proxy = ProxyProcess::start(&redis.url(), &[]);
    let lost = lost(&redis, &acked).await;
    eprintln!(
        "without a journal: {} of {} keys lost",
        lost.len(),
        acked.lock().unwrap().len()
    );
    assert!(!lost.is_empty(), "the stalled upstream left nothing queued");
}

/// `everysec` and `no` acknowledge a write once its record is appended in
/// memory (the writer thread writes it within moments): a SIGKILL may lose
/// what was not written yet, bounded by about a second of writes. Reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_fsync_everysec_or_no_loses_at_most_about_a_second() {
    let redis = RedisServer::start(&[]);
    for fsync in ["everysec", "no"] {
        let dir = temp_dir(&format!("journal-{fsync}"));
        for round in 0..2 {
            let proxy = start(&redis, &dir, &["--write-journal-fsync", fsync]);
            let t = Instant::now();
            let acked = load_then_kill(
                &redis,
                proxy,
                &format!("{fsync}{round}"),
                Duration::from_millis(300),
                Duration::from_millis(300),
            )
            .await;
            let took = t.elapsed();
            let proxy = start(&redis, &dir, &["--write-journal-fsync", fsync]);
            let info = proxy_info(&proxy).await;
            let behind = lost(&redis, &acked).await;
            // Each writer numbers its writes 0, 1, 2, … over its keys: the
            // writes lost are those after the newest that reached Redis.
            let (acked_writes, lost_writes) = writes_lost(&redis, &acked).await;
            let per_second = acked_writes as f64 / took.as_secs_f64();
            eprintln!(
                "{fsync} round {round}: {acked_writes} writes acknowledged ({per_second:.0}/s), {lost_writes} lost ({:.1} ms of writes; {} keys behind their acknowledged value), {} replayed",
                lost_writes as f64 / per_second * 1e3,
                behind.len(),
                info_field(&info, "write_journal_replayed"),
            );
            assert!(
                (lost_writes as f64) <= per_second,
                "{fsync}: {lost_writes} writes lost, more than a second of writes"
            );
            drop(proxy);
        }
    }
}

/// Writes acknowledged and writes lost, over the 4 writers of
/// `load_then_kill` (each writer's values count its writes).
async fn writes_lost(redis: &RedisServer, acked: &Acked) -> (u64, u64) {
    let acked = acked.lock().unwrap().clone();
    let mut conn = redis.conn().await;
    let mut newest: HashMap<String, (u64, u64)> = HashMap::new();
    for (k, v) in acked {
        let writer = k.rsplit_once(':').map(|(w, _)| w.to_owned()).unwrap();
        let got: Option<String> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        let got = got.and_then(|g| g.parse::<u64>().ok()).unwrap_or(0);
        let e = newest.entry(writer).or_default();
        e.0 = e.0.max(v.parse().unwrap());
        e.1 = e.1.max(got);
    }
    newest.values().fold((0, 0), |(a, l), (acked, landed)| {
        (a + acked + 1, l + acked.saturating_sub(*landed))
    })
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

/// Writes `n` keys `torn:I` one at a time with Redis stalled, then kills
/// sidecache: the journal holds all `n`, in order, and nothing reached
/// Redis. Redis is then restarted empty.
async fn journal_of(redis: &mut RedisServer, dir: &Path, n: usize) {
    let proxy = start(redis, dir, &["--write-journal-fsync", "always"]);
    redis.signal("STOP");
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    for i in 0..n {
        let out =
            support::raw_on(&mut s, enc(&format!("SET torn:{i} value{i}")).as_bytes(), 1).await;
        assert_eq!(out, b"+OK\r\n");
    }
    drop(proxy);
    redis.signal("CONT");
    // Whatever reached Redis's socket is gone with it: only the journal
    // knows these writes now.
    redis.restart();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_or_corrupt_tail_is_dropped_and_every_whole_record_replayed() {
    for damage in ["cut", "flip"] {
        let mut redis = RedisServer::start(&[]);
        let dir = temp_dir(&format!("journal-{damage}"));
        journal_of(&mut redis, &dir, 50).await;
        let seg = segments(&dir).pop().expect("a segment");
        let mut data = std::fs::read(&seg).unwrap();
        let len = data.len();
        match damage {
            // Power lost in the middle of the last record.
            "cut" => data.truncate(len - 9),
            // A flipped byte in the last record's command.
            _ => data[len - 5] ^= 0x20,
        }
        std::fs::write(&seg, &data).unwrap();
        let proxy = start(&redis, &dir, &[]);
        let mut conn = redis.conn().await;
        for i in 0..49 {
            let v: Option<String> = redis::cmd("GET")
                .arg(format!("torn:{i}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(
                v.as_deref(),
                Some(format!("value{i}").as_str()),
                "{damage}: torn:{i}"
            );
        }
        let last: Option<String> = redis::cmd("GET")
            .arg("torn:49")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(last, None, "{damage}: the damaged record is not replayed");
        let info = proxy_info(&proxy).await;
        assert_eq!(info_field(&info, "write_journal_replayed"), 49, "{damage}");
        assert!(
            info_field(&info, "write_journal_dropped_bytes") > 0,
            "{damage}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_upstream_down_waits_and_replays_when_it_is_back() {
    let mut redis = RedisServer::start(&[]);
    let dir = temp_dir("journal-down");
    journal_of(&mut redis, &dir, 20).await;
    redis.kill();
    let url = redis.url();
    // Redis comes back 1.5 s after sidecache starts.
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        redis.restart();
        redis
    });
    let t = Instant::now();
    let proxy = ProxyProcess::start(
        &url,
        &[
            "--write-journal",
            dir.to_str().unwrap(),
            "--upstream-wait",
            "30",
        ],
    );
    let redis = back.join().unwrap();
    eprintln!("serving {:?} after start", t.elapsed());
    assert!(t.elapsed() >= Duration::from_millis(1500));
    let mut conn = redis.conn().await;
    for i in 0..20 {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("torn:{i}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some(format!("value{i}").as_str()), "torn:{i}");
    }
    // New writes come after the replayed ones.
    let out = raw(&proxy.addr(), enc("SET torn:7 newer").as_bytes(), 1).await;
    assert_eq!(out, b"+OK\r\n");
    support::drained(&proxy.addr()).await;
    let v: String = redis::cmd("GET")
        .arg("torn:7")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "newer");
}

#[test]
fn one_journal_one_sidecache() {
    let redis = RedisServer::start(&[]);
    let dir = temp_dir("journal-lock");
    let first = start(&redis, &dir, &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args([
            "--listen",
            &format!("127.0.0.1:{}", free_port(false)),
            "--upstream",
            &redis.url(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--write-journal",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another sidecache"), "{err}");
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_that_cannot_be_written_refuses_writes_with_misconf() {
    let redis = RedisServer::start(&[]);
    let dir = temp_dir("journal-fail");
    // Segments of 64 KB (the smallest); the second one's name is taken by
    // a directory, so the journal fails when it rotates.
    std::fs::create_dir_all(dir.join(format!("journal-{:020}.seg", 2))).unwrap();
    let mport = free_port(false);
    // `always`: each write waits for the writer, so the refusal comes at
    // the write whose record could not be written (with everysec it comes
    // once the writer, which the write does not wait for, has failed).
    let proxy = start(
        &redis,
        &dir,
        &[
            "--write-journal-fsync",
            "always",
            "--write-queue-max-bytes",
            "64kb",
            "--metrics-listen",
            &format!("127.0.0.1:{mport}"),
        ],
    );
    let value = "x".repeat(1000);
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let mut ok = 0;
    let mut refused = None;
    for i in 0..200 {
        let out =
            support::raw_on(&mut s, enc(&format!("SET fail:{i} {value}")).as_bytes(), 1).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        if text == "+OK\r\n" {
            assert!(refused.is_none(), "acknowledged after a refusal: {i}");
            ok += 1;
        } else {
            assert!(
                text.starts_with("-MISCONF Errors writing to the write journal"),
                "{text}"
            );
            refused.get_or_insert(i);
        }
    }
    assert!(
        ok > 0 && refused.is_some(),
        "ok {ok}, refused from {refused:?}"
    );
    // Every acknowledged write reached Redis.
    support::drained(&proxy.addr()).await;
    let mut conn = redis.conn().await;
    for i in 0..ok {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("fail:{i}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some(value.as_str()), "fail:{i}");
    }
    let (_, metrics) = http_get(&format!("127.0.0.1:{mport}"), "/metrics").await;
    assert!(
        metrics.contains("sidecache_write_journal_errors_total 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_metrics() {
    let redis = RedisServer::start(&[]);
    let dir = temp_dir("journal-metrics");
    let mport = free_port(false);
    let proxy = start(
        &redis,
        &dir,
        &[
            "--write-journal-fsync",
            "always",
            "--metrics-listen",
            &format!("127.0.0.1:{mport}"),
        ],
    );
    let input: String = (0..100).map(|i| enc(&format!("SET m:{i} {i}"))).collect();
    raw(&proxy.addr(), input.as_bytes(), 100).await;
    let (status, metrics) = http_get(&format!("127.0.0.1:{mport}"), "/metrics").await;
    assert_eq!(status, 200);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert_eq!(value("sidecache_write_journal_enabled"), 1.0);
    assert_eq!(value("sidecache_write_journal_records_total"), 100.0);
    assert!(value("sidecache_write_journal_bytes") > 100.0 * 20.0);
    assert!(value("sidecache_write_journal_segments") >= 1.0);
    assert!(value("sidecache_write_journal_fsync_duration_seconds_count") >= 1.0);
    assert_eq!(value("sidecache_write_journal_replayed_records_total"), 0.0);
}

/// A cluster: records are replayed to the master that owns each key's
/// slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_routes_by_slot_on_a_cluster() {
    let cluster = support::Cluster::start();
    let dir = temp_dir("journal-cluster");
    let args = [
        "--write-journal",
        dir.to_str().unwrap(),
        "--write-journal-fsync",
        "always",
    ];
    let proxy = ProxyProcess::start(&cluster.seed_url(), &args);
    for n in &cluster.nodes {
        n.signal("STOP");
    }
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let input: String = (0..300).map(|i| enc(&format!("SET c:{i} v{i}"))).collect();
    let out = support::raw_on(&mut s, input.as_bytes(), 300).await;
    assert_eq!(out, "+OK\r\n".repeat(300).as_bytes());
    drop(proxy);
    for n in &cluster.nodes {
        n.signal("CONT");
    }
    // What the killed sidecache had sent is let go: only the journal
    // knows these writes now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in &cluster.nodes {
        assert_eq!(support::cli(n.port, &["FLUSHALL"]), "OK");
    }
    let proxy = ProxyProcess::start(&cluster.seed_url(), &args);
    for i in 0..300 {
        let key = format!("c:{i}");
        let owner = &cluster.nodes[cluster.node_for(&key)];
        assert_eq!(
            support::cli(owner.port, &["GET", &key]),
            format!("v{i}"),
            "{key}"
        );
    }
    let info = proxy_info(&proxy).await;
    assert_eq!(info_field(&info, "write_journal_replayed"), 300);
}
