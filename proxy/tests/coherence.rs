//! Coherence with other writers (client tracking): writes made by direct
//! clients or through another sidecache reach the L1 within a bound; losing
//! the invalidation channel clears the L1; FLUSHALL clears it; the proxy's
//! own writes stay cached (bcast) or are released once landed and tracked
//! on the next read (optin); with tracking off the TTL cap bounds staleness.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use support::coherence::{
    cache, channel_ids, in_every_mode, info, report, seed_and_cache, time_until, wait_field,
    with_mode, Direct, BOUND,
};
use support::{info_field, Cluster, Proxy, RedisServer};

async fn other_writers_reach_the_l1_standalone(mode: &str) {
    let redis = RedisServer::start(&[]);
    let a = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let b = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut ca = a.conn().await;
    let mut cb = b.conn().await;
    let mut d = redis.conn().await;
    assert!(info(&mut cb).await.contains("coherence_mode:tracking\r\n"));
    assert!(info(&mut cb)
        .await
        .contains(&format!("tracking_mode:{mode}\r\n")));
    assert_eq!(info_field(&info(&mut cb).await, "tracking_channels_up"), 1);

    // A write through another sidecache: seen through B once flushed.
    let mut through = Vec::new();
    for i in 0..200 {
        let key = format!("via:{i}");
        let _: () = d.set(&key, "old").await.unwrap();
        cache(&mut cb, &key).await;
        let _: () = ca.set(&key, "new").await.unwrap();
        // Flushed: upstream has it.
        let t0 = Instant::now();
        while d.get::<_, String>(&key).await.unwrap() != "new" {
            assert!(t0.elapsed() < BOUND, "A never flushed {key}");
            tokio::task::yield_now().await;
        }
        through.push(time_until(&mut cb, &key, "new").await);
    }
    report("write through another sidecache (after its flush)", through);

    // Direct writes: 1,000 of them.
    let mut direct = Vec::new();
    for i in 0..1000 {
        let key = format!("direct:{}", i % 50);
        if i < 50 {
            let _: () = d.set(&key, "start").await.unwrap();
        }
        cache(&mut cb, &key).await;
        let want = format!("v{i}");
        let _: () = d.set(&key, &want).await.unwrap();
        direct.push(time_until(&mut cb, &key, &want).await);
    }
    report("direct write (standalone)", direct);
    assert!(info_field(&info(&mut cb).await, "invalidated_keys") >= 1000);
}
in_every_mode!(other_writers_reach_the_l1_standalone);

async fn other_writers_reach_the_l1_cluster(mode: &str) {
    let cluster = Cluster::start();
    let a = Proxy::start(&cluster.seed_url(), &with_mode(mode, &[])).await;
    let b = Proxy::start(&cluster.seed_url(), &with_mode(mode, &[])).await;
    let mut ca = a.conn().await;
    let mut cb = b.conn().await;
    let mut d = Direct::cluster(&cluster).await;
    assert_eq!(info_field(&info(&mut cb).await, "tracking_channels_up"), 3);
    let mut through = Vec::new();
    let mut direct = Vec::new();
    for i in 0..300 {
        let key = format!("k{i}");
        let _: () = d.conn(&key).set(&key, "old").await.unwrap();
        cache(&mut cb, &key).await;
        if i % 2 == 0 {
            let _: () = ca.set(&key, "new").await.unwrap();
            let t0 = Instant::now();
            while d.conn(&key).get::<_, String>(&key).await.unwrap() != "new" {
                assert!(t0.elapsed() < BOUND, "A never flushed {key}");
                tokio::task::yield_now().await;
            }
            through.push(time_until(&mut cb, &key, "new").await);
        } else {
            let _: () = d.conn(&key).set(&key, "new").await.unwrap();
            direct.push(time_until(&mut cb, &key, "new").await);
        }
    }
    report("cluster, write through another sidecache", through);
    report("cluster, direct write", direct);
}
in_every_mode!(other_writers_reach_the_l1_cluster);

async fn no_stale_key_after_a_write_storm(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    const KEYS: usize = 10_000;
    let mut d = redis.conn().await;
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.set(format!("s:{i}"), 0).ignore();
    }
    let _: () = p.query_async(&mut d).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..4 {
        let mut c = proxy.conn().await;
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut i = r * 977;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut p = redis::pipe();
                for _ in 0..50 {
                    i = (i * 31 + 7) % KEYS;
                    p.get(format!("s:{i}"));
                }
                let _: Vec<Option<String>> = p.query_async(&mut c).await.unwrap();
                n += 50;
            }
            n
        }));
    }
    // Writers: direct, random keys, values that only grow.
    let mut writers = Vec::new();
    for w in 0..2u64 {
        let mut c = redis.conn().await;
        writers.push(tokio::spawn(async move {
            let mut x = w * 7919 + 1;
            for round in 1..=40u64 {
                let mut p = redis::pipe();
                for _ in 0..250 {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    let k = (x >> 33) as usize % KEYS;
                    p.set(format!("s:{k}"), round * 10 + w).ignore();
                }
                let _: () = p.query_async(&mut c).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    // One invalidation delay (generous), then readers stop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = 0;
    for r in readers {
        reads += r.await.unwrap();
    }
    let mut c = proxy.conn().await;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("s:{i}")).collect();
    let upstream: Vec<String> = d.mget(&keys).await.unwrap();
    let mut p = redis::pipe();
    for k in &keys {
        p.get(k);
    }
    let served: Vec<String> = p.query_async(&mut c).await.unwrap();
    let stale: Vec<usize> = (0..KEYS).filter(|&i| upstream[i] != served[i]).collect();
    let inf = info(&mut c).await;
    eprintln!(
        "storm: {reads} reads, l1_hits={} invalidated_keys={} fills_discarded={}",
        info_field(&inf, "l1_hits"),
        info_field(&inf, "invalidated_keys"),
        info_field(&inf, "l1_fills_discarded")
    );
    assert!(
        stale.is_empty(),
        "{} stale keys, e.g. {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
    assert!(info_field(&inf, "l1_hits") > 0, "the L1 was in use");
}
in_every_mode!(no_stale_key_after_a_write_storm);

async fn upstream_restart_clears_then_refills(mode: &str) {
    let mut redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut c = proxy.conn().await;
    {
        let mut d = redis.conn().await;
        for i in 0..100 {
            let _: () = d.set(format!("r:{i}"), "before").await.unwrap();
        }
    }
    for i in 0..100 {
        cache(&mut c, &format!("r:{i}")).await;
    }
    assert!(info_field(&info(&mut c).await, "l1_entries") >= 100);
    // kill -9 and start again (no persistence: it comes back empty).
    redis.restart();
    let mut d = redis.conn().await;
    for i in 0..50 {
        let _: () = d.set(format!("r:{i}"), "after").await.unwrap();
    }
    // Never the value from before the restart. (Right after it, a read may
    // find the proxy's connection still waiting to reconnect: an error, not
    // a value, and tried again.)
    for i in 0..100 {
        let t0 = Instant::now();
        let got: Option<String> = loop {
            match c.get(format!("r:{i}")).await {
                Ok(v) => break v,
                Err(e) => {
                    assert!(t0.elapsed() < Duration::from_secs(5), "r:{i}: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let want = (i < 50).then(|| "after".to_owned());
        assert_eq!(got, want, "r:{i} across the restart");
    }
    let inf = info(&mut c).await;
    assert!(info_field(&inf, "tracking_channel_losses") >= 1);
    // Tracking comes back, and the L1 refills.
    wait_field(&mut c, "tracking_channels_up", 1, Duration::from_secs(10)).await;
    cache(&mut c, "r:1").await;
    // And it is coherent again.
    let _: () = d.set("r:1", "later").await.unwrap();
    time_until(&mut c, "r:1", "later").await;
}
in_every_mode!(upstream_restart_clears_then_refills);

async fn killing_the_channel_clears_the_l1(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &["--fill-connections", "2"])).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    let keys: Vec<String> = (0..20).map(|i| format!("c:{i}")).collect();
    seed_and_cache(&mut d, &mut c, &keys).await;
    assert!(info_field(&info(&mut c).await, "l1_entries") >= 20);
    let ids = channel_ids(&mut d, mode).await;
    // optin: the channel's own connection and one more fill connection
    // (`--fill-connections 2`); bcast: one.
    let want = if mode == "optin" { 2 } else { 1 };
    assert_eq!(ids.len(), want, "tracking connections: {ids:?}");
    // The last opened: under optin a fill connection, whose loss clears
    // the master's keys as the channel's own does.
    support::coherence::kill_tracking_conn(&mut d, &mut c, &ids[want - 1]).await;
    cache(&mut c, "c:1").await;
    let _: () = d.set("c:1", "w").await.unwrap();
    time_until(&mut c, "c:1", "w").await;
}
in_every_mode!(killing_the_channel_clears_the_l1);

async fn direct_flushall_clears_the_l1(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    let keys: Vec<String> = (0..50).map(|i| format!("f:{i}")).collect();
    seed_and_cache(&mut d, &mut c, &keys).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut d).await.unwrap();
    let t0 = Instant::now();
    loop {
        let got: Option<String> = c.get("f:7").await.unwrap();
        if got.is_none() {
            break;
        }
        assert!(t0.elapsed() < BOUND, "f:7 still served after FLUSHALL");
        tokio::task::yield_now().await;
    }
    for i in 0..50 {
        let got: Option<String> = c.get(format!("f:{i}")).await.unwrap();
        assert_eq!(got, None, "f:{i}");
    }
    assert!(info_field(&info(&mut c).await, "invalidation_flushes") >= 1);
}
in_every_mode!(direct_flushall_clears_the_l1);

/// bcast: the proxy's own writes stay cached after their flush (NOLOOP).
/// optin: each leaves the L1 once it landed (Redis does not track a key
/// for the client that wrote it); the next read registers it and fills,
/// and the read after that hits. Both: every value read is the written one.
async fn own_writes_stay_cached(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut c = proxy.conn().await;
    const N: usize = 10_000;
    let mut p = redis::pipe();
    for i in 0..N {
        p.set(format!("o:{i}"), i).ignore();
    }
    let _: () = p.query_async(&mut c).await.unwrap();
    // Flushed, and any invalidation of them would have arrived.
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    if mode == "optin" {
        let inf = info(&mut c).await;
        let (released, uncached) = (
            info_field(&inf, "written_released"),
            info_field(&inf, "written_uncached"),
        );
        // Not cached at all: a key whose read mark (one per key hash) it
        // shares with another key written here, unread (about 1% of 10^4).
        assert_eq!(
            released + uncached,
            N as u64,
            "every written value released once landed, or not cached"
        );
        assert!(uncached < N as u64 / 20, "{inf}");
        let before = info_field(&info(&mut c).await, "registered_reads");
        let vals = get_all(&mut c, N).await;
        assert!(vals.iter().enumerate().all(|(i, &v)| v == i));
        let registered = info_field(&info(&mut c).await, "registered_reads") - before;
        assert_eq!(registered, N as u64, "the first reads register the keys");
    }
    let before = info(&mut c).await;
    let vals = get_all(&mut c, N).await;
    assert!(vals.iter().enumerate().all(|(i, &v)| v == i));
    let after = info(&mut c).await;
    let hits = info_field(&after, "l1_hits") - info_field(&before, "l1_hits");
    let misses = info_field(&after, "l1_misses") - info_field(&before, "l1_misses");
    let ratio = hits as f64 / (hits + misses) as f64;
    eprintln!(
        "{mode}: SET-then-GET hit ratio after flush: {ratio:.4} ({hits} hits, {misses} misses)"
    );
    assert!(ratio >= 0.99, "hit ratio {ratio}");
    // Still coherent: a direct write to each of some of them is seen.
    let mut d = redis.conn().await;
    let mut times = Vec::new();
    for i in 0..100 {
        let key = format!("o:{i}");
        let _: () = d.set(&key, "later").await.unwrap();
        times.push(time_until(&mut c, &key, "later").await);
    }
    report(&format!("{mode}: direct write after an own flush"), times);
}

/// GET o:0 … o:N-1 in one pipeline.
async fn get_all(c: &mut MultiplexedConnection, n: usize) -> Vec<usize> {
    let mut p = redis::pipe();
    for i in 0..n {
        p.get(format!("o:{i}"));
    }
    p.query_async(c).await.unwrap()
}
in_every_mode!(own_writes_stay_cached);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_off_leaves_the_ttl_cap() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &["--tracking", "off", "--l1-ttl-cap", "0.3"]).await;
    let mut c = proxy.conn().await;
    assert!(info(&mut c).await.contains("coherence_mode:off\r\n"));
    let mut d = redis.conn().await;
    let _: () = d.set("t", "old").await.unwrap();
    cache(&mut c, "t").await;
    let written = Instant::now();
    let _: () = d.set("t", "new").await.unwrap();
    // No channel: the old value is still served for now...
    let got: String = c.get("t").await.unwrap();
    assert_eq!(got, "old", "tracking off: only the cap bounds staleness");
    // ...but never past the cap.
    loop {
        let got: String = c.get("t").await.unwrap();
        if got == "new" {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_millis(300) + Duration::from_millis(150),
            "stale past the TTL cap"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A standalone server with an ACL user `app` that may do everything but
/// CLIENT TRACKING, and a direct connection to it.
async fn refusing_tracking() -> (RedisServer, MultiplexedConnection, String) {
    let redis = RedisServer::start(&[]);
    let mut d = redis.conn().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-client|tracking",
        ])
        .query_async(&mut d)
        .await
        .unwrap();
    let url = format!("redis://app:pw@{}", redis.addr());
    (redis, d, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_refusing_tracking_falls_back_to_peers() {
    let (_redis, mut d, url) = refusing_tracking().await;
    let a = Proxy::start(&url, &["--l1-ttl-cap", "0.4"]).await;
    let b = Proxy::start(&url, &["--l1-ttl-cap", "0.4"]).await;
    let mut ca = a.conn().await;
    let mut cb = b.conn().await;
    let inf = info(&mut cb).await;
    assert!(
        inf.contains("coherence_mode:peer (upstream refused CLIENT TRACKING)\r\n"),
        "{inf}"
    );
    assert_eq!(info_field(&inf, "peer_channel_up"), 1);
    // Writes through A (write-behind, and forwarded) reach B's L1 well
    // before the cap would.
    let mut seen = Vec::new();
    for i in 0..100 {
        let key = format!("p:{i}");
        let _: () = d.set(&key, "1").await.unwrap();
        cache(&mut cb, &key).await;
        let want = if i % 2 == 0 {
            let _: () = ca.set(&key, "set-by-a").await.unwrap();
            "set-by-a"
        } else {
            let _: i64 = ca.incr(&key, 1).await.unwrap();
            "2"
        };
        let t0 = Instant::now();
        while d.get::<_, String>(&key).await.unwrap() != want {
            assert!(t0.elapsed() < BOUND, "A never wrote {key}");
            tokio::task::yield_now().await;
        }
        let t = time_until(&mut cb, &key, want).await;
        assert!(
            t < Duration::from_millis(300),
            "{key}: {t:?}, not the peer message"
        );
        seen.push(t);
    }
    report("peer mode, write through another sidecache", seen);
    assert!(info_field(&info(&mut cb).await, "peer_messages_received") >= 50);
    // A's own messages do not evict what A wrote.
    let _: () = ca.set("own", "x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = info_field(&info(&mut ca).await, "l1_hits");
    let _: String = ca.get("own").await.unwrap();
    assert_eq!(info_field(&info(&mut ca).await, "l1_hits"), before + 1);
    // A direct writer is bounded by the cap.
    cache(&mut cb, "p:0").await;
    let written = Instant::now();
    let _: () = d.set("p:0", "direct").await.unwrap();
    loop {
        let got: String = cb.get("p:0").await.unwrap();
        if got == "direct" {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_millis(550),
            "stale past the cap"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The default cap is a safety net behind tracking (600 s), and the bound
/// itself where nothing reports other writers' changes (60 s): an upstream
/// that refuses CLIENT TRACKING, with the peer channel or without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_ttl_cap_is_short_where_it_is_the_only_bound() {
    let redis = RedisServer::start(&[]);
    let tracked = Proxy::start(&format!("redis://{}", redis.addr()), &[]).await;
    let inf = info(&mut tracked.conn().await).await;
    assert!(inf.contains("coherence_mode:tracking"), "{inf}");
    assert_eq!(info_field(&inf, "l1_ttl_cap_seconds"), 600);
    let (_refusing, _d, url) = refusing_tracking().await;
    for extra in [&[][..], &["--peer-invalidation-channel", "off"][..]] {
        let p = Proxy::start(&url, extra).await;
        let inf = info(&mut p.conn().await).await;
        assert!(inf.contains("upstream refused CLIENT TRACKING"), "{inf}");
        assert_eq!(info_field(&inf, "l1_ttl_cap_seconds"), 60, "{extra:?}");
    }
    // A cap the operator gave is kept.
    let p = Proxy::start(&url, &["--l1-ttl-cap", "900"]).await;
    assert_eq!(
        info_field(&info(&mut p.conn().await).await, "l1_ttl_cap_seconds"),
        900
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_refusing_tracking_without_peers_leaves_the_ttl_cap() {
    let (_redis, mut d, url) = refusing_tracking().await;
    let proxy = Proxy::start(
        &url,
        &["--l1-ttl-cap", "0.3", "--peer-invalidation-channel", "off"],
    )
    .await;
    let mut c = proxy.conn().await;
    let inf = info(&mut c).await;
    assert!(
        inf.contains("coherence_mode:ttl-only (upstream refused CLIENT TRACKING)\r\n"),
        "{inf}"
    );
    // Still caches, and the cap bounds staleness.
    let _: () = d.set("t", "old").await.unwrap();
    cache(&mut c, "t").await;
    let written = Instant::now();
    let _: () = d.set("t", "new").await.unwrap();
    loop {
        let got: String = c.get("t").await.unwrap();
        if got == "new" {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_millis(450),
            "stale past the cap"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Writes through it still flush.
    let _: () = c.set("w", "1").await.unwrap();
    let t0 = Instant::now();
    while d.get::<_, Option<String>>("w").await.unwrap().as_deref() != Some("1") {
        assert!(t0.elapsed() < Duration::from_secs(5), "write never flushed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A replica promoted (`CLUSTER FAILOVER`): writes on the new master reach
/// the L1 within the bound (the demoted master keeps reporting the writes it
/// replicates until the slot map refresh moves the channel).
async fn cluster_failover_keeps_the_l1_coherent(mode: &str) {
    let cluster = Cluster::start_with_replicas(1);
    let proxy = Proxy::start(
        &cluster.seed_url(),
        &with_mode(mode, &["--refresh-interval", "1"]),
    )
    .await;
    let mut c = proxy.conn().await;
    let replica = cluster
        .nodes
        .iter()
        .find(|n| support::cli(n.port, &["role"]).starts_with("slave"))
        .expect("a replica")
        .port;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !support::cli(replica, &["info", "replication"]).contains("master_link_status:up") {
        assert!(Instant::now() < deadline, "replica never synced");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut d = Direct::cluster(&cluster).await;
    let keys: Vec<String> = (0..60).map(|i| format!("fo:{i}")).collect();
    for k in &keys {
        let _: () = d.conn(k).set(k, "before").await.unwrap();
        cache(&mut c, k).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    'failover: loop {
        assert_eq!(support::cli(replica, &["cluster", "failover"]), "OK");
        let attempt = Instant::now() + Duration::from_secs(12);
        while Instant::now() < attempt {
            if support::cli(replica, &["role"]).starts_with("master") {
                break 'failover;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(Instant::now() < deadline, "failover did not happen");
    }
    // Direct writes, on the new masters.
    let mut times = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let want = format!("after{i}");
        d.set_anywhere(k, &want).await;
        times.push(time_until(&mut c, k, &want).await);
    }
    report("cluster, direct writes after a failover", times);
    // Once the slot map is refreshed (every second here), the new master
    // has a channel of its own.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_field(&mut c, "tracking_channels_up", 3, Duration::from_secs(10)).await;
    let k = &keys[0];
    cache(&mut c, k).await;
    d.set_anywhere(k, "last").await;
    time_until(&mut c, k, "last").await;
}
in_every_mode!(cluster_failover_keeps_the_l1_coherent);

/// Clients starting in the upstream URL's database: their writes are
/// cached there as in database 0 (that database's batches travel on the
/// tracking connection): after the flush, hits in bcast, and in optin
/// once the first read registered them.
async fn own_writes_stay_cached_in_the_url_database(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&format!("{}/3", redis.url()), &with_mode(mode, &[])).await;
    let mut c = proxy.conn().await;
    let mut p = redis::pipe();
    for i in 0..1000 {
        p.set(format!("o:{i}"), i).ignore();
    }
    let _: () = p.query_async(&mut c).await.unwrap();
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    if mode == "optin" {
        let vals = get_all(&mut c, 1000).await;
        assert!(vals.iter().enumerate().all(|(i, &v)| v == i));
    }
    let before = info_field(&info(&mut c).await, "l1_hits");
    let vals = get_all(&mut c, 1000).await;
    assert!(vals.iter().enumerate().all(|(i, &v)| v == i));
    assert_eq!(info_field(&info(&mut c).await, "l1_hits") - before, 1000);
    // They landed in database 3.
    let mut d = redis::Client::open(format!("{}/3", redis.url()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let v: usize = d.get("o:999").await.unwrap();
    assert_eq!(v, 999);
}
in_every_mode!(own_writes_stay_cached_in_the_url_database);

/// The upstream paused (SIGSTOP) longer than the heartbeat timeout: the
/// channel goes down and the L1 is cleared; on SIGCONT the same connection
/// answers, the channel comes back, and writes queued meanwhile land once.
async fn a_paused_upstream_takes_the_channel_down_and_back(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    let keys: Vec<String> = (0..20).map(|i| format!("z:{i}")).collect();
    seed_and_cache(&mut d, &mut c, &keys).await;
    redis.signal("STOP");
    // Writes acknowledged while the upstream is paused.
    for i in 0..100 {
        let _: () = c.set(format!("w:{i}"), i).await.unwrap();
    }
    let t0 = Instant::now();
    loop {
        let inf = info(&mut c).await;
        if info_field(&inf, "tracking_channels_up") == 0 {
            assert_eq!(info_field(&inf, "l1_entries"), 0, "cleared when down");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "channel never went down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    redis.signal("CONT");
    wait_field(&mut c, "tracking_channels_up", 1, Duration::from_secs(10)).await;
    let inf = info(&mut c).await;
    // One per tracking connection that timed out: optin has one
    // (`--fill-connections 1`, the default), as bcast.
    let connections = 1;
    let losses = info_field(&inf, "tracking_channel_losses");
    assert!((1..=connections).contains(&losses), "{losses} losses");
    // Coherent again, and every write landed.
    cache(&mut c, "z:1").await;
    let _: () = d.set("z:1", "new").await.unwrap();
    time_until(&mut c, "z:1", "new").await;
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    for i in 0..100 {
        let v: i64 = d.get(format!("w:{i}")).await.unwrap();
        assert_eq!(v, i);
    }
}
in_every_mode!(a_paused_upstream_takes_the_channel_down_and_back);

/// Two sidecache processes (the binary) on one upstream: a write through
/// one, once flushed, and a direct write, are served by the other within
/// the bound.
async fn two_processes_see_each_others_writes(mode: &str) {
    let redis = RedisServer::start(&[]);
    let a = support::ProxyProcess::start(&redis.url(), &with_mode(mode, &[]));
    let b = support::ProxyProcess::start(&redis.url(), &with_mode(mode, &[]));
    let conn = |addr: String| async move {
        redis::Client::open(format!("redis://{addr}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    };
    let mut ca = conn(a.addr()).await;
    let mut cb = conn(b.addr()).await;
    let mut d = redis.conn().await;
    let mut times = Vec::new();
    for i in 0..100 {
        let key = format!("pp:{i}");
        let _: () = d.set(&key, "old").await.unwrap();
        cache(&mut cb, &key).await;
        let _: () = ca.set(&key, "via-a").await.unwrap();
        let t0 = Instant::now();
        while d.get::<_, String>(&key).await.unwrap() != "via-a" {
            assert!(t0.elapsed() < BOUND, "A never flushed {key}");
            tokio::task::yield_now().await;
        }
        times.push(time_until(&mut cb, &key, "via-a").await);
        let _: () = d.set(&key, "direct").await.unwrap();
        times.push(time_until(&mut cb, &key, "direct").await);
    }
    report("two processes (through the other, then direct)", times);
    assert_eq!(a.terminate().code(), Some(0));
    assert_eq!(b.terminate().code(), Some(0));
}
in_every_mode!(two_processes_see_each_others_writes);

/// Hot keys written, read and written again through one sidecache, with
/// another writer's direct changes interleaved (`#45`): every read after
/// an own write returns that write (read-your-writes), every read once
/// the write landed is an L1 hit that costs Redis no GET (under optin too:
/// the write's pipeline registered the key again and read it back), and a
/// direct change is served within the bound and never replaced by an
/// older value afterwards.
async fn own_writes_of_hot_keys_stay_cached(mode: &str) {
    const KEYS: usize = 10;
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    let key = |k: usize| format!("hot:{k}");
    let keys: Vec<String> = (0..KEYS).map(key).collect();
    seed_and_cache(&mut d, &mut c, &keys).await;
    let mut foreign = Vec::new();
    for round in 0..60 {
        let own = format!("own{round}");
        for k in 0..KEYS {
            let _: () = c.set(key(k), &own).await.unwrap();
            let got: String = c.get(key(k)).await.unwrap();
            assert_eq!(got, own, "read-your-writes, {} round {round}", key(k));
        }
        wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
        let (hits, gets) = (
            info_field(&info(&mut c).await, "l1_hits"),
            support::upstream_calls(&redis, "get").await,
        );
        for k in 0..KEYS {
            let got: String = c.get(key(k)).await.unwrap();
            assert_eq!(got, own, "{} after landing, round {round}", key(k));
        }
        assert_eq!(
            info_field(&info(&mut c).await, "l1_hits") - hits,
            KEYS as u64,
            "reads after the writes landed are hits ({mode}, round {round})"
        );
        assert_eq!(
            support::upstream_calls(&redis, "get").await,
            gets,
            "no read after landing went upstream ({mode}, round {round})"
        );
        // Another writer changes half the keys: seen, and only the new
        // value from then on.
        if round % 3 == 2 {
            let theirs = format!("direct{round}");
            for k in (0..KEYS).step_by(2) {
                let _: () = d.set(key(k), &theirs).await.unwrap();
                foreign.push(time_until(&mut c, &key(k), &theirs).await);
                for _ in 0..3 {
                    let got: String = c.get(key(k)).await.unwrap();
                    assert_eq!(got, theirs, "{} went back after a direct write", key(k));
                }
            }
        }
    }
    report(
        &format!("direct write between own writes ({mode})"),
        foreign,
    );
}
in_every_mode!(own_writes_of_hot_keys_stay_cached);
