//! End-to-end against a real 3-master Redis Cluster: routing by slot,
//! cross-slot commands split and merged, fan-out, SCAN across masters, and
//! ASK/MOVED during and after a slot migration, and a read after resharding
//! waiting for a write still queued for the slot's old owner.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashSet;

use redis::AsyncCommands;
use support::{cli, raw, Cluster, Proxy};

/// Waits until a node answers `want` (acknowledged writes reach upstream
/// shortly after the acknowledgement with write-behind). Async: the proxy
/// runs on the test's runtime.
async fn eventually(port: u16, args: &[&str], want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let got = cli(port, args);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{args:?} on {port}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn routing_split_and_fan_out() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut c = proxy.conn().await;
    let keys: Vec<String> = (0..30).map(|i| format!("key:{i}")).collect();
    // The keys really live on several masters.
    let owners: HashSet<usize> = keys.iter().map(|k| cluster.node_for(k)).collect();
    assert_eq!(owners.len(), 3);

    // One standalone server to its clients, as HELLO says: INFO does not
    // make tools take it for a cluster node.
    let info: String = redis::cmd("INFO").query_async(&mut c).await.unwrap();
    // Redis says `redis_mode:`, Valkey 8+ `server_mode:`.
    assert!(
        info.contains("redis_mode:standalone\r\n") || info.contains("server_mode:standalone\r\n"),
        "{info}"
    );
    assert!(info.contains("cluster_enabled:0\r\n"), "{info}");
    assert!(
        !info.contains("redis_mode:cluster") && !info.contains("server_mode:cluster"),
        "{info}"
    );
    assert!(info.contains("upstream_mode:cluster\r\n"), "{info}");

    // MSET across slots, then each key is on its own master.
    let pairs: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), format!("v-{k}"))).collect();
    let _: () = c.mset(&pairs).await.unwrap();
    for k in &keys {
        let node = &cluster.nodes[cluster.node_for(k)];
        eventually(node.port, &["get", k], &format!("v-{k}")).await;
    }
    // MGET in the client's order, with misses and duplicates.
    let ask = ["key:3", "nope", "key:17", "key:3", "key:0"];
    let got: Vec<Option<String>> = c.mget(&ask[..]).await.unwrap();
    assert_eq!(
        got,
        vec![
            Some("v-key:3".into()),
            None,
            Some("v-key:17".into()),
            Some("v-key:3".into()),
            Some("v-key:0".into())
        ]
    );
    // EXISTS counts duplicates; DEL/UNLINK/TOUCH sum across masters.
    let n: i64 = redis::cmd("EXISTS")
        .arg("key:1")
        .arg("key:2")
        .arg("key:1")
        .arg("nope")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 3);
    let n: i64 = redis::cmd("TOUCH")
        .arg(&keys[..5])
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 5);
    let n: i64 = c.del(&keys[..10]).await.unwrap();
    assert_eq!(n, 10);
    let n: i64 = c.unlink(&keys[10..12]).await.unwrap();
    assert_eq!(n, 2);
    // DBSIZE sums masters; KEYS concatenates.
    let n: i64 = redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
    assert_eq!(n, 18);
    let all: HashSet<String> = c.keys("key:*").await.unwrap();
    assert_eq!(all, keys[12..].iter().cloned().collect());
    // SCAN visits every master; every key once.
    for i in 0..500 {
        let _: () = c.set(format!("scan:{i}"), i).await.unwrap();
    }
    let mut cursor: u64 = 0;
    let mut seen = HashSet::new();
    let mut rounds = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("scan:*")
            .arg("COUNT")
            .arg(50)
            .query_async(&mut c)
            .await
            .unwrap();
        seen.extend(batch);
        rounds += 1;
        if next == 0 {
            break;
        }
        cursor = next;
        assert!(rounds < 10_000);
    }
    assert_eq!(seen.len(), 500);
    let rk: Option<String> = redis::cmd("RANDOMKEY").query_async(&mut c).await.unwrap();
    assert!(rk.is_some());
    // Commands that cannot be split get Redis Cluster's own error; SELECT
    // the node's own (Valkey 9 numbers a cluster's databases).
    let out = raw(
        &proxy.addr.to_string(),
        b"SUNIONSTORE key:12 key:13 key:14\r\nSELECT 1\r\nSELECT 0\r\n",
        3,
    )
    .await;
    let select = raw(&cluster.nodes[0].addr().to_string(), b"SELECT 1\r\n", 1).await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!(
            "-CROSSSLOT Keys in request don't hash to the same slot\r\n{}+OK\r\n",
            String::from_utf8_lossy(&select)
        )
    );
    assert!(
        select.starts_with(b"-ERR SELECT is not allowed in cluster mode")
            || select.starts_with(b"-ERR DB index is out of range"),
        "{}",
        String::from_utf8_lossy(&select)
    );
    // Hash tags keep multi-key commands on one slot.
    let _: () = c.set("{user1}.a", "x").await.unwrap();
    let _: () = c.rename("{user1}.a", "{user1}.b").await.unwrap();
    let v: String = c.get("{user1}.b").await.unwrap();
    assert_eq!(v, "x");
    // Scripts route by their keys.
    let v: String = redis::cmd("EVAL")
        .arg("return redis.call('get', KEYS[1])")
        .arg(1)
        .arg("{user1}.b")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, "x");
    // A pipeline spanning every master keeps its order.
    let mut p = redis::pipe();
    for i in 0..3000 {
        p.cmd("INCR").arg(format!("ctr:{}", i % 37));
    }
    let r: Vec<i64> = p.query_async(&mut c).await.unwrap();
    for (i, v) in r.iter().enumerate() {
        assert_eq!(*v, (i / 37) as i64 + 1);
    }
    // FLUSHALL reaches every master.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    let n: i64 = redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
    assert_eq!(n, 0);
    proxy.stop().await;
}

#[tokio::test]
async fn ask_during_and_moved_after_slot_migration() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut c = proxy.conn().await;
    let key = "migrating-key";
    let _: () = c.set(key, "before").await.unwrap();
    // A forwarded command waits for the queued write: the key is on its
    // master before the (blocking) redis-cli calls below migrate it.
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let slot = sidecache_pool::Slot::for_key(key.as_bytes()).get();
    let src = cluster.node_for(key);
    let dst = (src + 1) % 3;
    let (sp, dp) = (cluster.nodes[src].port, cluster.nodes[dst].port);
    cluster.begin_migration(slot, src, dst);
    cluster.migrate_keys(src, dst, &[key]);
    // Mid-migration: the source answers ASK; the proxy follows it.
    assert!(cli(sp, &["get", key]).starts_with("ASK"));
    let v: String = c.get(key).await.unwrap();
    assert_eq!(v, "before");
    // Finish the migration: now the source answers MOVED.
    cluster.assign_slot(slot, dst);
    assert!(cli(sp, &["get", key]).starts_with("MOVED"));
    let _: () = c.set(key, "after").await.unwrap();
    eventually(dp, &["get", key], "after").await;
    let v: String = c.get(key).await.unwrap();
    assert_eq!(v, "after");
    // Cross-slot MGET including the moved key still merges correctly.
    let _: () = c.set("other", "o").await.unwrap();
    let got: Vec<Option<String>> = c.mget(&[key, "other", "none"]).await.unwrap();
    assert_eq!(got, vec![Some("after".into()), Some("o".into()), None]);
    proxy.stop().await;
}

/// Resharding while a write to the moved slot is still queued for its old
/// master (stalled there by `CLIENT PAUSE … WRITE`): once the proxy's map
/// names the new owner, a forwarded read of the key waits for that write
/// (which reaches the new owner by MOVED) instead of reading around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_resharding_waits_for_writes_queued_for_the_old_owner() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &["--refresh-interval", "0.2"]).await;
    let mut c = proxy.conn().await;
    let key = "{moved}:k";
    let slot = sidecache_pool::Slot::for_key(key.as_bytes()).get();
    let src = cluster.node_for(key);
    let dst = (src + 1) % 3;
    // A key of another slot on the same master: its write, paused, holds
    // the batch the moved key's write travels behind.
    let stay = (0..)
        .map(|i| format!("{{stay{i}}}"))
        .find(|k| {
            cluster.node_for(k) == src && sidecache_pool::Slot::for_key(k.as_bytes()).get() != slot
        })
        .unwrap();
    let (sp, dp) = (cluster.nodes[src].port, cluster.nodes[dst].port);
    assert_eq!(cli(sp, &["client", "pause", "3000", "write"]), "OK");
    let paused = std::time::Instant::now();
    let _: () = redis::pipe()
        .set(&stay, "s")
        .ignore()
        .set(key, "v")
        .ignore()
        .query_async(&mut c)
        .await
        .unwrap();
    // Move the (upstream still empty) slot to `dst`.
    if support::is_valkey() {
        // Valkey (8.0+) holds CLUSTER SETSLOT on a node under CLIENT PAUSE
        // WRITE (it replicates SETSLOT to the node's replicas), so the
        // paused source is told nothing: it learns the new owner from the
        // cluster bus, as Redis's nodes do when an update misses them.
        cluster.move_slot_leaving_out(slot, src, dst);
        while !cli(sp, &["exists", key]).starts_with("MOVED") {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    } else {
        cluster.begin_migration(slot, src, dst);
        cluster.assign_slot(slot, dst);
    }
    // The proxy's periodic refresh picks the new owner up: two refreshes
    // begun after the move.
    let before = refreshes(&mut c).await;
    while refreshes(&mut c).await < before + 2 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        paused.elapsed() < std::time::Duration::from_millis(2500),
        "too slow to test inside the pause"
    );
    assert_eq!(cli(dp, &["exists", key]), "0", "the write is still queued");
    let n: i64 = redis::cmd("STRLEN")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 1, "read around a write queued for the old owner");
    assert_eq!(cli(dp, &["get", key]), "v");
    eventually(sp, &["get", &stay], "s").await;
    proxy.stop().await;
}

/// INFO's count of slot-map refreshes begun.
async fn refreshes(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("write-behind")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("slotmap_refreshes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Numbered databases in cluster mode. In front of Valkey 9 started with
/// `cluster-databases 16`, SELECT works: each database's keys are routed by
/// slot (written behind and read back on the owning node in that
/// database), cached per database, and another writer's change in that
/// database reaches the L1. Elsewhere (Redis, older Valkey, Valkey 9 with
/// one database) SELECT answers what a node answers directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_in_cluster_mode_is_the_servers() {
    let databases = support::is_valkey() && support::server_major() >= 9;
    let cluster = if databases {
        Cluster::start_configured(0, 5000, &["--cluster-databases", "16"])
    } else {
        Cluster::start()
    };
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let addr = proxy.addr.to_string();
    let direct = cluster.nodes[0].addr().to_string();
    for line in [
        "SELECT 16\r\n",
        "SELECT -1\r\n",
        "SELECT 3\r\n",
        "SELECT 0\r\n",
    ] {
        let t = raw(&addr, line.as_bytes(), 1).await;
        let d = raw(&direct, line.as_bytes(), 1).await;
        assert_eq!(
            String::from_utf8_lossy(&t),
            String::from_utf8_lossy(&d),
            "{line:?}"
        );
    }
    if !databases {
        proxy.stop().await;
        return;
    }
    let client = redis::Client::open(format!("redis://{addr}/3")).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("db3key:{i}")).collect();
    for k in &keys {
        let () = c.set(k, format!("v-{k}")).await.unwrap();
    }
    // Written behind to the owner of each key's slot, in database 3 only.
    for k in &keys {
        let port = cluster.nodes[cluster.node_for(k)].port;
        eventually(port, &["-n", "3", "GET", k], &format!("v-{k}")).await;
        assert_eq!(cli(port, &["-n", "0", "EXISTS", k]), "0");
    }
    // Read back (from the L1, then after another writer's change).
    let k = &keys[7];
    for _ in 0..2 {
        let v: String = c.get(k).await.unwrap();
        assert_eq!(v, format!("v-{k}"));
    }
    let port = cluster.nodes[cluster.node_for(k)].port;
    assert_eq!(cli(port, &["-n", "3", "SET", k, "changed"]), "OK");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let v: String = c.get(k).await.unwrap();
        if v == "changed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {v}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Database 0 through sidecache holds none of them.
    let zero = redis::Client::open(format!("redis://{addr}/0")).unwrap();
    let mut z = zero.get_multiplexed_async_connection().await.unwrap();
    let v: Option<String> = z.get(k).await.unwrap();
    assert_eq!(v, None);
    proxy.stop().await;
}
