//! Replica reads (`--read-from`) against a real Redis Cluster with
//! replicas: where misses go (counted in each node's `INFO
//! commandstats`), the fall-back when the chosen replicas die, and
//! read-your-writes while replicas lag (`CLIENT PAUSE … WRITE` on a
//! replica stops it applying the replication stream while it still
//! answers reads and INFO).
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::{cli, command_calls, Cluster, Proxy};

/// Per master (node index): its replicas' node indexes, by port.
fn shards(cluster: &Cluster) -> HashMap<usize, Vec<usize>> {
    let port_of: HashMap<u16, usize> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.port, i))
        .collect();
    let mut out: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, n) in cluster.nodes.iter().enumerate() {
        let role = cli(n.port, &["role"]);
        let lines: Vec<&str> = role.lines().collect();
        if lines.first() == Some(&"master") {
            out.entry(i).or_default();
        } else {
            let master_port: u16 = lines[2].parse().unwrap();
            out.entry(port_of[&master_port]).or_default().push(i);
        }
    }
    for v in out.values_mut() {
        v.sort_by_key(|&i| cluster.nodes[i].port);
    }
    out
}

fn reset_stats(cluster: &Cluster, nodes: &[usize]) {
    for &i in nodes {
        assert_eq!(cli(cluster.nodes[i].port, &["config", "resetstat"]), "OK");
    }
}

/// GETs node `i` executed since its stats were reset.
fn gets(cluster: &Cluster, i: usize) -> u64 {
    command_calls(
        &cli(cluster.nodes[i].port, &["info", "commandstats"]),
        "get",
    )
}

fn sum_gets(cluster: &Cluster, nodes: &[usize]) -> u64 {
    nodes.iter().map(|&i| gets(cluster, i)).sum()
}

/// SETs `prefix{0..n}` through the proxy (write-behind), then waits until
/// the writes landed and the replicas were proven to hold them.
async fn load(proxy: &Proxy, prefix: &str, n: usize) {
    let mut c = proxy.conn().await;
    let mut p = redis::pipe();
    for i in 0..n {
        p.set(format!("{prefix}{i}"), format!("v{i}")).ignore();
    }
    let () = p.query_async(&mut c).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// Waits until `replicas` hold `keys` keys in all (Redis replication
/// applied the loaded writes; sidecache reads the master until a replica
/// is proven to hold them).
async fn replicas_hold(cluster: &Cluster, replicas: &[usize], keys: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held: usize = replicas
            .iter()
            .map(|&i| {
                cli(cluster.nodes[i].port, &["dbsize"])
                    .parse::<usize>()
                    .unwrap_or(0)
            })
            .sum();
        if held >= keys {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas hold {held} of {keys} keys"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn az_affinity_reads_the_same_zone_then_falls_back() {
    const N: usize = 600;
    let mut cluster = Cluster::start_with_replicas(2);
    cluster.wait_replicas_listed(2).await;
    let shards = shards(&cluster);
    assert_eq!(shards.len(), 3);
    let masters: Vec<usize> = shards.keys().copied().collect();
    // The first replica of each master in zone az-a (sidecache's), the
    // second in az-b.
    let same: Vec<usize> = shards.values().map(|r| r[0]).collect();
    let other: Vec<usize> = shards.values().map(|r| r[1]).collect();
    let all: Vec<usize> = (0..cluster.nodes.len()).collect();
    let mut flags: Vec<String> = ["--read-from", "az-affinity", "--az", "az-a"]
        .map(String::from)
        .to_vec();
    // Valkey 8+ says its zone itself (`availability-zone`, in its HELLO
    // reply); Redis's come from --replica-az.
    for (zone, nodes) in [("az-a", &same), ("az-b", &other), ("az-b", &masters)] {
        for &i in nodes {
            if support::is_valkey() {
                let port = cluster.nodes[i].port;
                assert_eq!(
                    cli(port, &["config", "set", "availability-zone", zone]),
                    "OK"
                );
            } else {
                flags.push("--replica-az".into());
                flags.push(format!("{}={zone}", cluster.nodes[i].addr()));
            }
        }
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = Proxy::start(&cluster.seed_url(), &flags).await;
    load(&proxy, "az:", N).await;
    load(&proxy, "later:", N).await;
    let replicas: Vec<usize> = same.iter().chain(&other).copied().collect();
    replicas_hold(&cluster, &replicas, 2 * 2 * N).await;

    // Misses: every key read once, on a fresh connection.
    reset_stats(&cluster, &all);
    let mut c = proxy.conn().await;
    for i in 0..N {
        let v: Option<String> = c.get(format!("az:{i}")).await.unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_str()));
    }
    let (s, o, m) = (
        sum_gets(&cluster, &same),
        sum_gets(&cluster, &other),
        sum_gets(&cluster, &masters),
    );
    eprintln!("misses: same-zone replicas {s}, other-zone replicas {o}, masters {m} (of {N})");
    assert!(
        s as f64 >= 0.95 * N as f64,
        "same-zone replicas served {s} of {N} misses"
    );
    assert_eq!(o, 0, "a miss went to the other zone");

    // Read again: hits, cached from the replicas (tracked there).
    for i in 0..N {
        let v: Option<String> = c.get(format!("az:{i}")).await.unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_str()));
    }
    let again = sum_gets(&cluster, &all) - (s + o + m);
    eprintln!("second pass: {again} GETs upstream (of {N})");
    assert!(
        (again as f64) < 0.05 * N as f64,
        "replica-read values were not cached: {again} GETs upstream"
    );

    // The same-zone replicas die: reads fall back, no client error.
    reset_stats(&cluster, &masters);
    reset_stats(&cluster, &other);
    for &i in &same {
        cluster.nodes[i].kill();
    }
    let mut errors = 0;
    for i in 0..N {
        match c.get::<_, Option<String>>(format!("later:{i}")).await {
            Ok(v) => assert_eq!(v.as_deref(), Some(format!("v{i}").as_str())),
            Err(e) => {
                errors += 1;
                eprintln!("later:{i}: {e}");
            }
        }
    }
    let (o, m) = (sum_gets(&cluster, &other), sum_gets(&cluster, &masters));
    eprintln!("after the kill: other-zone replicas {o}, masters {m} (of {N}), {errors} errors");
    assert_eq!(errors, 0);
    assert!(o + m >= N as u64);
    assert!(o > 0, "az-affinity falls back to another zone's replica");
    drop(proxy);
}

/// A client alternating write-behind SETs (and forwarded INCRs) with GETs
/// of the same keys, while the replicas are paused now and then: it never
/// reads an older value than it wrote, though the replicas hold older
/// ones, and reads of other keys do go to the replicas meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_are_read_back_while_replicas_lag() {
    let cluster = Cluster::start_with_replicas(1);
    cluster.wait_replicas_listed(1).await;
    let shards = shards(&cluster);
    let replicas: Vec<usize> = shards.values().flatten().copied().collect();
    let all: Vec<usize> = (0..cluster.nodes.len()).collect();
    // A long max lag: lagging replicas stay in use, so read-your-writes
    // rests on the write stamps alone.
    let proxy = Proxy::start(
        &cluster.seed_url(),
        &["--read-from", "replica", "--replica-max-lag", "10"],
    )
    .await;
    load(&proxy, "bg:", 300).await;
    replicas_hold(&cluster, &replicas, 300).await;
    reset_stats(&cluster, &all);

    let stop = Arc::new(AtomicBool::new(false));
    // Pauses every replica's replication now and then.
    let pauser = {
        let ports: Vec<u16> = replicas.iter().map(|&i| cluster.nodes[i].port).collect();
        let stop = Arc::clone(&stop);
        tokio::task::spawn_blocking(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(300));
                for &p in &ports {
                    cli(p, &["client", "pause", "700", "write"]);
                }
                std::thread::sleep(Duration::from_millis(900));
            }
        })
    };
    // Another client reading the same keys (filling the shared L1).
    let other_reads = Arc::new(AtomicU64::new(0));
    let other = {
        let url = proxy.url();
        let stop = Arc::clone(&stop);
        let n = Arc::clone(&other_reads);
        tokio::spawn(async move {
            let mut c = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _: Option<String> = c.get(format!("ryw:{}", i % 20)).await.unwrap();
                let _: Option<String> = c.get(format!("bg:{}", i % 300)).await.unwrap();
                n.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        })
    };

    let mut c = proxy.conn().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut rounds, mut stale) = (0u64, Vec::new());
    let mut lag_seen = 0u64;
    let mut i = 0u64;
    while Instant::now() < deadline {
        i += 1;
        let key = format!("ryw:{}", i % 20);
        let want = format!("v{i}");
        let () = c.set(&key, &want).await.unwrap();
        // At once (the value may still be in the L1), then after it
        // landed and left the L1.
        for wait in [0u64, 15] {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let got: Option<String> = c.get(&key).await.unwrap();
            if got.as_deref() != Some(want.as_str()) {
                stale.push(format!("{key}: wrote {want}, read {got:?}"));
            }
        }
        let n: i64 = c.incr(format!("ctr:{}", i % 7), 1).await.unwrap();
        let got: Option<i64> = c.get(format!("ctr:{}", i % 7)).await.unwrap();
        if got.unwrap_or(0) < n {
            stale.push(format!("ctr:{}: INCR gave {n}, GET {got:?}", i % 7));
        }
        let _: Option<String> = c.get(format!("bg:{}", i % 300)).await.unwrap();
        // Whether some replica is behind its master just now (has read
        // replication traffic it has not applied).
        if i.is_multiple_of(10) {
            let lagging = replicas.iter().any(|&r| {
                let info = cli(cluster.nodes[r].port, &["info", "replication"]);
                let off = |f: &str| -> u64 {
                    info.lines()
                        .find_map(|l| l.strip_prefix(f))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                };
                off("slave_repl_offset:") < off("slave_read_repl_offset:")
            });
            if lagging {
                lag_seen += 1;
            }
        }
        rounds += 1;
    }
    stop.store(true, Ordering::Relaxed);
    other.await.unwrap();
    pauser.await.unwrap();
    let replica_gets = sum_gets(&cluster, &replicas);
    eprintln!(
        "{rounds} rounds, {} reads by the other client, replicas lagging at {lag_seen} checks, {replica_gets} GETs on replicas, {} stale",
        other_reads.load(Ordering::Relaxed),
        stale.len()
    );
    assert!(stale.is_empty(), "older values read back: {stale:?}");
    assert!(
        lag_seen > 0,
        "the replicas never lagged: the test proves nothing"
    );
    assert!(replica_gets > 0, "no read went to a replica");
    drop(proxy);
}

/// Standalone: the master's replicas are found in its INFO replication;
/// misses go to them, and a client's own writes are read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_replicas_are_found_and_read() {
    const N: usize = 300;
    let master = support::RedisServer::start(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = support::RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cli(replica.port, &["info", "replication"]).contains("master_link_status:up") {
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let proxy = Proxy::start(&master.url(), &["--read-from", "replica"]).await;
    load(&proxy, "s:", N).await;
    // The replica holds the writes (sidecache reads the master until it
    // proves that; a replica that has not applied them gets no read).
    let deadline = Instant::now() + Duration::from_secs(20);
    while cli(replica.port, &["dbsize"]) != N.to_string() {
        assert!(
            Instant::now() < deadline,
            "the replica never applied the writes (Redis replication): {}",
            cli(replica.port, &["info", "replication"])
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for p in [master.port, replica.port] {
        assert_eq!(cli(p, &["config", "resetstat"]), "OK");
    }
    let mut c = proxy.conn().await;
    for i in 0..N {
        let v: Option<String> = c.get(format!("s:{i}")).await.unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_str()));
    }
    let on = |p: u16| command_calls(&cli(p, &["info", "commandstats"]), "get");
    let (r, m) = (on(replica.port), on(master.port));
    eprintln!("standalone misses: replica {r}, master {m} (of {N})");
    assert!(r as f64 >= 0.95 * N as f64, "the replica served {r} of {N}");
    // Own writes, with the replica's replication paused.
    cli(replica.port, &["client", "pause", "1500", "write"]);
    for i in 0..50 {
        let key = format!("s:{i}");
        let () = c.set(&key, format!("w{i}")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let v: Option<String> = c.get(&key).await.unwrap();
        assert_eq!(v.as_deref(), Some(format!("w{i}").as_str()));
    }
    drop(proxy);
}

/// Replica reads from the first request: the replicas are probed before
/// sidecache takes clients, so the first misses after it is ready go to
/// the replica (it took 2–4 s before: every miss meanwhile went to the
/// master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_reads_start_at_once() {
    const N: usize = 600;
    let master = support::RedisServer::start(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = support::RedisServer::start(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cli(replica.port, &["info", "replication"]).contains("master_link_status:up") {
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut direct = master
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut p = redis::pipe();
    for i in 0..N {
        p.set(format!("a:{i}"), format!("v{i}")).ignore();
    }
    let () = p.query_async(&mut direct).await.unwrap();
    while cli(replica.port, &["dbsize"]) != N.to_string() {
        assert!(
            Instant::now() < deadline,
            "the replica never applied the writes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for p in [master.port, replica.port] {
        assert_eq!(cli(p, &["config", "resetstat"]), "OK");
    }
    let proxy = Proxy::start(&master.url(), &["--read-from", "replica"]).await;
    let mut c = proxy.conn().await;
    for i in 0..N {
        let v: Option<String> = c.get(format!("a:{i}")).await.unwrap();
        assert_eq!(v.as_deref(), Some(format!("v{i}").as_str()));
    }
    let on = |p: u16| command_calls(&cli(p, &["info", "commandstats"]), "get");
    let (r, m) = (on(replica.port), on(master.port));
    assert_eq!(
        (r, m),
        (N as u64, 0),
        "the first {N} misses: replica {r}, master {m}"
    );
    drop(proxy);
}
