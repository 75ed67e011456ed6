//! Cluster failover under a write-behind load, against real redis-servers
//! (3 masters, 3 replicas): a master killed with SIGKILL, and a graceful
//! `CLUSTER FAILOVER`. Every acknowledged write must end upstream with its
//! last acknowledged value; a single missing one fails the test.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{cli, drained, enc, info_field, raw, writer, Cluster, Proxy, ProxyProcess};

/// How the master goes away.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL; the cluster promotes the replica after its node timeout.
    Kill,
    /// `CLUSTER FAILOVER` on the replica (no data loss in Redis itself).
    Graceful,
}

/// Four pipelining writers over 3000 keys each; returns their handles.
fn start_writers(
    addr: &str,
    acked: &Arc<Mutex<HashMap<String, String>>>,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|w| {
            tokio::spawn(writer(
                addr.to_owned(),
                format!("f{w}"),
                3000,
                20,
                Duration::from_millis(1),
                acked.clone(),
                stop.clone(),
            ))
        })
        .collect()
}

/// Waits until every replica finished its initial sync (a replica that has
/// not cannot be promoted).
async fn replicas_synced(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in &cluster.nodes {
        if !cli(n.port, &["role"]).starts_with("slave") {
            continue;
        }
        while !cli(n.port, &["info", "replication"]).contains("master_link_status:up") {
            assert!(Instant::now() < deadline, "replica never synced");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Waits until every replica holds as many keys as its master (what was
/// written before a kill survives it: Redis replicates asynchronously).
async fn replicas_caught_up(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for n in &cluster.nodes {
        let info = cli(n.port, &["info", "replication"]);
        if !info.contains("role:slave") {
            continue;
        }
        let master: u16 = info
            .lines()
            .find_map(|l| l.strip_prefix("master_port:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("master_port");
        while cli(n.port, &["dbsize"]) != cli(master, &["dbsize"]) {
            assert!(Instant::now() < deadline, "a replica never caught up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Index of a master and of its replica.
fn master_and_replica(cluster: &Cluster) -> (usize, usize) {
    for (r, n) in cluster.nodes.iter().enumerate() {
        let info = cli(n.port, &["info", "replication"]);
        if !info.contains("role:slave") {
            continue;
        }
        let port: u16 = info
            .lines()
            .find_map(|l| l.strip_prefix("master_port:"))
            .and_then(|p| p.trim().parse().ok())
            .expect("master_port");
        let m = cluster
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("its master");
        return (m, r);
    }
    panic!("no replica");
}

/// Brings `master` down by `fault` and waits until `replica` is a master
/// that every live node agrees owns slots.
async fn fail_over(cluster: &mut Cluster, master: usize, replica: usize, fault: Fault) {
    let port = cluster.nodes[replica].port;
    let deadline = Instant::now() + Duration::from_secs(60);
    match fault {
        Fault::Kill => {
            cluster.nodes[master].kill();
            while !cli(port, &["role"]).starts_with("master") {
                assert!(Instant::now() < deadline, "replica never promoted");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Fault::Graceful => 'failover: loop {
            assert_eq!(cli(port, &["cluster", "failover"]), "OK");
            let attempt = Instant::now() + Duration::from_secs(12);
            while Instant::now() < attempt {
                if cli(port, &["role"]).starts_with("master") {
                    break 'failover;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(Instant::now() < deadline, "failover did not happen");
        },
    }
}

/// Every acknowledged key holds its last acknowledged value on the master
/// that owns it now (the other live nodes answer MOVED).
async fn assert_all_landed(
    cluster: &Cluster,
    dead: Option<usize>,
    acked: &HashMap<String, String>,
) {
    assert!(
        acked.len() > 1000,
        "only {} writes acknowledged",
        acked.len()
    );
    let keys: Vec<&String> = acked.keys().collect();
    let input: String = keys.iter().map(|k| enc(&format!("GET {k}"))).collect();
    let mut found: HashMap<String, String> = HashMap::new();
    for (i, n) in cluster.nodes.iter().enumerate() {
        if Some(i) == dead {
            continue;
        }
        let out = raw(&n.addr(), input.as_bytes(), keys.len()).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        let mut lines = text.split("\r\n");
        for k in &keys {
            let head = lines.next().unwrap_or_default();
            if let Some(len) = head.strip_prefix('$') {
                if len != "-1" {
                    found.insert((*k).clone(), lines.next().unwrap_or_default().to_owned());
                }
            }
        }
    }
    let lost: Vec<String> = acked
        .iter()
        .filter(|(k, v)| found.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}={v} (upstream {:?})", found.get(k)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(5)]
    );
}

async fn failover_under_load(fault: Fault, extra: &[&str]) {
    let mut cluster = Cluster::start_with(1, 2000);
    replicas_synced(&cluster).await;
    let mut args = vec!["--connect-timeout", "1"];
    args.extend_from_slice(extra);
    let proxy = Proxy::start(&cluster.seed_url(), &args).await;
    let (master, replica) = master_and_replica(&cluster);
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&proxy.addr.to_string(), &acked, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    fail_over(&mut cluster, master, replica, fault).await;
    // Writes keep being acknowledged, and flushed, after the promotion.
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    drained(&proxy.addr.to_string()).await;
    let info =
        String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO writebehind\r\n", 1).await)
            .into_owned();
    assert_eq!(info_field(&info, "writes_failed"), 0, "{info}");
    assert!(info_field(&info, "failovers_followed") >= 1, "{info}");
    if fault == Fault::Kill {
        // The writes queued for the dead master went to its replica.
        assert!(info_field(&info, "writes_rerouted") > 0, "{info}");
    }
    let acked = acked.lock().unwrap().clone();
    let dead = (fault == Fault::Kill).then_some(master);
    assert_all_landed(&cluster, dead, &acked).await;
    let report = proxy.stop().await;
    assert_eq!(report.unflushed, 0);
}

/// A master killed with SIGKILL under a pipelined write load: the writes
/// queued for it (and those in flight when it died) follow its slots to the
/// promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_loses_no_acknowledged_write() {
    failover_under_load(Fault::Kill, &[]).await;
}

/// The same under `--tracking bcast` (the default is optin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_under_bcast_loses_no_acknowledged_write() {
    failover_under_load(Fault::Kill, &["--tracking", "bcast"]).await;
}

/// A replica promoted with `CLUSTER FAILOVER` during a write load: queued and
/// new writes follow the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_failover_loses_no_acknowledged_write() {
    failover_under_load(Fault::Graceful, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_failover_under_bcast_loses_no_acknowledged_write() {
    failover_under_load(Fault::Graceful, &["--tracking", "bcast"]).await;
}

/// sidecache as its own process: a master killed under load, then SIGTERM
/// as soon as the replica is promoted. The drain re-routes what was queued
/// for the dead master, exits 0, and nothing acknowledged is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_after_failover_drains_and_exits_0() {
    let mut cluster = Cluster::start_with(1, 2000);
    replicas_synced(&cluster).await;
    let proxy = ProxyProcess::start(&cluster.seed_url(), &["--connect-timeout", "1"]);
    let (master, replica) = master_and_replica(&cluster);
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers = start_writers(&proxy.addr(), &acked, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    fail_over(&mut cluster, master, replica, Fault::Kill).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let status = tokio::task::spawn_blocking(move || proxy.terminate())
        .await
        .unwrap();
    assert!(status.success(), "sidecache exited with {status}");
    let acked = acked.lock().unwrap().clone();
    assert_all_landed(&cluster, Some(master), &acked).await;
}

/// Reads through sidecache, from one standalone client, while something
/// fails: counts of reads answered, of errors, and of wrong values.
#[derive(Default)]
struct ReadLoad {
    reads: u64,
    errors: Vec<String>,
    wrong: Vec<String>,
}

/// `readers` tasks reading `keys` keys (`r{i}` holding `v{i}`) through
/// `addr` until `stop`: GET (cached), and every fifth an uncached read
/// (EXISTS) and a multi-key one (MGET).
fn start_readers(
    addr: &str,
    keys: usize,
    readers: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<ReadLoad>> {
    (0..readers)
        .map(|r| {
            let addr = addr.to_owned();
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = redis::Client::open(format!("redis://{addr}")).unwrap();
                let mut c = client.get_multiplexed_async_connection().await.unwrap();
                let mut load = ReadLoad::default();
                let mut i = r * 37;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 1) % keys;
                    let (k, v) = (format!("r{i}"), format!("v{i}"));
                    let got: redis::RedisResult<Option<String>> = if i % 5 == 0 {
                        let n: redis::RedisResult<i64> =
                            redis::cmd("EXISTS").arg(&k).query_async(&mut c).await;
                        n.map(|n| (n == 1).then(|| v.clone()))
                    } else {
                        redis::cmd("GET").arg(&k).query_async(&mut c).await
                    };
                    load.reads += 1;
                    match got {
                        Ok(Some(g)) if g == v => {}
                        Ok(g) => load.wrong.push(format!("{k}: {g:?}")),
                        Err(e) => load.errors.push(format!("{k}: {e}")),
                    }
                }
                load
            })
        })
        .collect()
}

/// Sums the readers' loads.
async fn stop_readers(
    stop: &AtomicBool,
    readers: Vec<tokio::task::JoinHandle<ReadLoad>>,
) -> ReadLoad {
    stop.store(true, Ordering::Relaxed);
    let mut all = ReadLoad::default();
    for r in readers {
        let l = r.await.unwrap();
        all.reads += l.reads;
        all.errors.extend(l.errors);
        all.wrong.extend(l.wrong);
    }
    all
}

/// Writes `r{i}` = `v{i}` for `keys` keys through `addr` and waits until
/// they landed.
async fn seed_reads(addr: &str, keys: usize) {
    let client = redis::Client::open(format!("redis://{addr}")).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    for i in 0..keys {
        let _: () = redis::cmd("SET")
            .arg(format!("r{i}"))
            .arg(format!("v{i}"))
            .query_async(&mut c)
            .await
            .unwrap();
    }
    drained(addr).await;
}

/// A plain (standalone) client reading through sidecache while a master
/// fails over: sidecache holds the reads of the master's slots until its
/// successor serves them, as a cluster client would, so the client sees
/// no error and no wrong value (issue #46: it saw 175 errors).
async fn reads_through_failover(fault: Fault) {
    let mut cluster = Cluster::start_with(1, 2000);
    replicas_synced(&cluster).await;
    let proxy = Proxy::start(&cluster.seed_url(), &["--connect-timeout", "1"]).await;
    let addr = proxy.addr.to_string();
    seed_reads(&addr, 300).await;
    replicas_caught_up(&cluster).await;
    let (master, replica) = master_and_replica(&cluster);
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&addr, 300, 4, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let began = Instant::now();
    fail_over(&mut cluster, master, replica, fault).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let load = stop_readers(&stop, readers).await;
    eprintln!(
        "failover took {:?}; {} reads through it",
        began.elapsed(),
        load.reads
    );
    assert!(load.reads > 1000, "only {} reads", load.reads);
    assert!(
        load.errors.is_empty(),
        "{} errors reached the client, e.g. {:?}",
        load.errors.len(),
        &load.errors[..load.errors.len().min(5)]
    );
    assert!(
        load.wrong.is_empty(),
        "wrong values: {:?}",
        &load.wrong[..load.wrong.len().min(5)]
    );
    let info = String::from_utf8_lossy(&raw(&addr, b"INFO proxy\r\n", 1).await).into_owned();
    if fault == Fault::Kill {
        assert!(info_field(&info, "failover_held") > 0, "{info}");
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_killed_reaches_no_reader() {
    reads_through_failover(Fault::Kill).await;
}

/// `CLUSTER FAILOVER` under a read load: no `CLUSTERDOWN` (or any other
/// error) reaches the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_failover_reaches_no_reader() {
    reads_through_failover(Fault::Graceful).await;
}

/// Every upstream connection of sidecache killed (`CLIENT KILL`) every
/// 100 ms under a read load: the reads whose connection went are sent
/// again, and none is answered with an error.
///
/// A kill only catches a read in flight when Redis had not yet read it
/// from the socket, a narrow window: the kills go on (for at most 20 s)
/// until at least one read was sent again, so the test does not depend on
/// the machine's timing to exercise the resend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_upstream_connections_reach_no_reader() {
    let redis = support::RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let addr = proxy.addr.to_string();
    seed_reads(&addr, 300).await;
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&addr, 300, 4, &stop);
    let resent = || async {
        let info = String::from_utf8_lossy(&raw(&addr, b"INFO proxy\r\n", 1).await).into_owned();
        info_field(&info, "failover_resent_reads")
    };
    let mut killed = 0;
    let mut rounds = 0;
    while rounds < 15 || (rounds < 200 && resent().await == 0) {
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let n: u64 = cli(
            redis.port,
            &["client", "kill", "type", "normal", "skipme", "yes"],
        )
        .trim()
        .parse()
        .unwrap_or(0);
        killed += n;
    }
    let load = stop_readers(&stop, readers).await;
    assert!(killed >= 15, "only {killed} connections killed");
    assert!(load.reads > 1000, "only {} reads", load.reads);
    assert!(
        load.errors.is_empty(),
        "{} of {} reads answered with an error, e.g. {:?}",
        load.errors.len(),
        load.reads,
        &load.errors[..load.errors.len().min(5)]
    );
    assert!(
        load.wrong.is_empty(),
        "wrong values: {:?}",
        &load.wrong[..load.wrong.len().min(5)]
    );
    assert!(
        resent().await > 0,
        "no read was sent again after {killed} connections killed in {rounds} rounds"
    );
    proxy.stop().await;
}

/// `--l1-stale-if-error 30s`: a master killed under a read load of cached
/// keys. Its cached keys go on being served from the L1 while it is out
/// of reach (no error at all reaches the reader), and once the proxy
/// follows the new master they are dropped: values written on the new
/// master after that are read, never the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_if_error_serves_cached_reads_through_a_master_kill() {
    const KEYS: usize = 300;
    let mut cluster = Cluster::start_with(1, 2000);
    replicas_synced(&cluster).await;
    let proxy = Proxy::start(
        &cluster.seed_url(),
        &["--connect-timeout", "1", "--l1-stale-if-error", "30s"],
    )
    .await;
    let addr = proxy.addr.to_string();
    seed_reads(&addr, KEYS).await;
    replicas_caught_up(&cluster).await;
    let client = redis::Client::open(format!("redis://{addr}")).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    for _ in 0..2 {
        for i in 0..KEYS {
            let v: Option<String> = redis::cmd("GET")
                .arg(format!("r{i}"))
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(v, Some(format!("v{i}")));
        }
    }
    let (master, replica) = master_and_replica(&cluster);
    let stop = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&addr, KEYS, 4, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    fail_over(&mut cluster, master, replica, Fault::Kill).await;
    // Until sidecache follows the new master.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info =
            String::from_utf8_lossy(&raw(&addr, b"INFO writebehind\r\n", 1).await).into_owned();
        if info_field(&info, "failovers_followed") >= 1 {
            break;
        }
        if Instant::now() >= deadline {
            let more =
                String::from_utf8_lossy(&raw(&addr, b"INFO proxy\r\n", 1).await).into_owned();
            let l1 = String::from_utf8_lossy(&raw(&addr, b"INFO l1\r\n", 1).await).into_owned();
            panic!("the failover was never followed: {info}{more}{l1}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let load = stop_readers(&stop, readers).await;
    assert!(
        load.errors.is_empty(),
        "{} errors reached the client, e.g. {:?}",
        load.errors.len(),
        &load.errors[..load.errors.len().min(5)]
    );
    assert!(
        load.wrong.is_empty(),
        "wrong values: {:?}",
        &load.wrong[..load.wrong.len().min(5)]
    );
    let info = String::from_utf8_lossy(&raw(&addr, b"INFO l1\r\n", 1).await).into_owned();
    assert!(info_field(&info, "l1_stale_served") > 0, "{info}");
    // New values, written straight to whichever live master owns each key.
    let mut live = Vec::new();
    for (i, n) in cluster.nodes.iter().enumerate() {
        if i != master {
            live.push(n.client().get_multiplexed_async_connection().await.unwrap());
        }
    }
    for i in 0..KEYS {
        let (k, v) = (format!("r{i}"), format!("w{i}"));
        let mut done = false;
        for d in &mut live {
            let r: redis::RedisResult<()> = redis::cmd("SET").arg(&k).arg(&v).query_async(d).await;
            if r.is_ok() {
                done = true;
                break;
            }
        }
        assert!(done, "no live master took {k}");
    }
    for i in 0..KEYS {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("r{i}"))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(
            v,
            Some(format!("w{i}")),
            "a stale read of r{i} after the failover"
        );
    }
    proxy.stop().await;
}
