//! Optin tracking's own races (`--tracking optin`, the default): the fills
//! are read on the invalidation channel's own connection (one per master),
//! the proxy's own write-behind batches travel on it too, as plain
//! pipelines; a written key that was being read is registered again and
//! read back in its write's pipeline and stays cached, the others leave
//! the L1 once their write landed (Redis does not track a key for the
//! client that wrote it). Checked here: own writes of read keys stay
//! cached and tracked, the others are served until they land, released,
//! then tracked from the next read (a direct write, even right after the
//! landing, is seen within the bound); writes on every other
//! connection invalidate (direct, another sidecache, this sidecache's own
//! forwarded writes); a pipeline's fills never read a later command's
//! write; own and foreign writes racing on the same keys leave nothing
//! stale; writes of keys nobody read are kept too while such writes are
//! read later (and not after); other databases are cached and tracked
//! too; Redis's tracking-table evictions
//! (`tracking-table-max-keys`) arrive as invalidations. Standalone and
//! cluster.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::coherence::{cache, info, time_until, wait_field, Direct, BOUND};
use support::{info_field, upstream_calls, Cluster, Proxy, RedisServer};

/// Every proxy here runs optin (the default, named so it stays optin).
const OPTIN: &[&str] = &["--tracking", "optin"];

/// Writes of a key with no read between that are still re-read
/// (`sidecache_l1`'s `UNREAD_WRITES`); the next one is not cached.
const UNREAD_WRITES: usize = 64;

/// Writes through the proxy, waits for the flush. The keys read before
/// their write were registered again and read back in the write's
/// pipeline (`sidecache_pool::coherence::refill`): they stay cached. The
/// others were released once landed, so their first read goes upstream
/// (and registers the key), the second is an L1 hit. A direct write
/// afterwards reaches the L1 for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_of_read_keys_stay_cached_the_others_are_released() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    assert!(info(&mut c).await.contains("tracking_mode:optin\r\n"));
    // Half the keys read (and so tracked) before the write, half never.
    for i in 0..100 {
        let key = format!("o:{i}");
        if i % 2 == 0 {
            let _: () = d.set(&key, "direct").await.unwrap();
            cache(&mut c, &key).await;
        }
        let _: () = c.set(&key, format!("own{i}")).await.unwrap();
    }
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let inf = info(&mut c).await;
    assert_eq!(info_field(&inf, "written_released"), 50, "{inf}");
    assert_eq!(info_field(&inf, "written_kept"), 50, "{inf}");
    let gets = upstream_calls(&redis, "get").await;
    // The first read of each key never read before goes upstream
    // (released); the keys read before are hits; the second read of all
    // is an L1 hit (upstream GETs counted from before the first).
    for (why, misses) in [
        (
            "released: the first read of the unread half goes upstream",
            50,
        ),
        ("the second read is an L1 hit", 50),
    ] {
        for i in 0..100 {
            let got: String = c.get(format!("o:{i}")).await.unwrap();
            assert_eq!(got, format!("own{i}"));
        }
        assert_eq!(upstream_calls(&redis, "get").await, gets + misses, "{why}");
    }
    // Still tracked: a direct write is seen.
    let mut times = Vec::new();
    for i in 0..100 {
        let key = format!("o:{i}");
        let _: () = d.set(&key, "later").await.unwrap();
        times.push(time_until(&mut c, &key, "later").await);
    }
    support::coherence::report("direct write after an own flush (optin)", times);
}

/// Another writer's `SET`, `PEXPIRE` or `DEL` right after an own write,
/// in both of an own write's shapes under optin:
/// - of a key read since its last write: the write re-reads it in its
///   pipeline (registration after the write), and the foreign change
///   races the write's landing and that registration;
/// - of a key written again and again with no read between: not cached
///   at all, so a read before it lands waits for it upstream
///   (read-your-writes), and the foreign change races the landing.
///
/// Whatever order the two reach Redis in, the proxy answers what the
/// server answers within the bound, side by side. The same under bcast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_change_between_an_own_write_and_its_registration_is_seen() {
    for mode in ["optin", "bcast"] {
        let redis = RedisServer::start(&[]);
        let proxy = Proxy::start(&redis.url(), &["--tracking", mode]).await;
        let mut c = proxy.conn().await;
        let mut d = redis.conn().await;
        let mut times = Vec::new();
        for round in 0..180 {
            let key = format!("race:{}", round % 10);
            let own = format!("own{round}");
            if round % 2 == 0 {
                // Read since its last write: this write is re-read.
                let _: Option<String> = c.get(&key).await.unwrap();
                let _: () = c.set(&key, &own).await.unwrap();
            } else {
                // Written UNREAD_WRITES + 2 times, no read between: the
                // last ones are not cached.
                for n in 0..=UNREAD_WRITES {
                    let _: () = c.set(&key, format!("earlier{round}.{n}")).await.unwrap();
                }
                let _: () = c.set(&key, &own).await.unwrap();
                let got: Option<String> = c.get(&key).await.unwrap();
                assert_eq!(
                    got.as_deref(),
                    Some(own.as_str()),
                    "{mode}: read-your-writes"
                );
            }
            match round % 3 {
                0 => {
                    let _: () = d.set(&key, format!("direct{round}")).await.unwrap();
                }
                1 => {
                    let _: bool = d.pexpire(&key, 20).await.unwrap();
                }
                _ => {
                    let _: i64 = d.del(&key).await.unwrap();
                }
            }
            wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
            if round % 3 == 1 {
                // Past the expiry, if the PEXPIRE ran after the write.
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            let want: Option<String> = d.get(&key).await.unwrap();
            let t0 = Instant::now();
            loop {
                let got: Option<String> = c.get(&key).await.unwrap();
                if got == want {
                    break;
                }
                assert!(
                    t0.elapsed() < BOUND,
                    "{mode}, round {round}: {key} is {got:?} through the proxy, {want:?} on the server"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            times.push(t0.elapsed());
        }
        if mode == "optin" {
            let inf = info(&mut c).await;
            assert!(info_field(&inf, "written_kept") > 0, "{inf}");
            assert!(info_field(&inf, "written_uncached") > 0, "{inf}");
        }
        support::coherence::report(
            &format!("foreign SET/PEXPIRE/DEL right after an own write ({mode})"),
            times,
        );
    }
}

/// A key written again and again with no read between costs Redis a plain
/// `SET` each time once 64 writes went unread: nothing is cached,
/// released, re-read or echoed. A read between two writes brings the
/// re-read back for the next writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_with_no_read_between_are_not_cached_and_cost_redis_only_the_set() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    for i in 0..50 {
        let _: () = d.set(format!("w:{i}"), "direct").await.unwrap();
        cache(&mut c, &format!("w:{i}")).await;
    }
    let pttls = upstream_calls(&redis, "pttl").await;
    // The first UNREAD_WRITES rounds re-read (the keys were read that many
    // writes ago or less); the two after them are not cached.
    let rounds = UNREAD_WRITES + 2;
    for round in 0..rounds {
        let mut p = redis::pipe();
        for i in 0..50 {
            p.set(format!("w:{i}"), format!("r{round}")).ignore();
        }
        let _: () = p.query_async(&mut c).await.unwrap();
        wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let inf = info(&mut c).await;
    let kept = 50 * UNREAD_WRITES as u64;
    assert_eq!(info_field(&inf, "written_kept"), kept, "{inf}");
    assert_eq!(info_field(&inf, "written_uncached"), 100, "{inf}");
    assert_eq!(info_field(&inf, "written_released"), 0, "{inf}");
    // Echoes: the writes of keys registered for this sidecache, by the
    // fills (round 0) and by each re-read (the rounds after, up to the
    // first not cached); none after.
    assert_eq!(info_field(&inf, "tracking_echoes"), kept + 50, "{inf}");
    assert_eq!(
        upstream_calls(&redis, "pttl").await,
        pttls + kept,
        "one re-read each, in the first UNREAD_WRITES rounds only"
    );
    // Read between: the next write is re-read again and stays cached.
    for i in 0..50 {
        let got: String = c.get(format!("w:{i}")).await.unwrap();
        assert_eq!(got, format!("r{}", rounds - 1));
    }
    for i in 0..50 {
        let _: () = c.set(format!("w:{i}"), "r3").await.unwrap();
    }
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let inf = info(&mut c).await;
    assert_eq!(info_field(&inf, "written_kept"), kept + 50, "{inf}");
    let gets = upstream_calls(&redis, "get").await;
    for i in 0..50 {
        let got: String = c.get(format!("w:{i}")).await.unwrap();
        assert_eq!(got, "r3");
    }
    assert_eq!(upstream_calls(&redis, "get").await, gets, "all hits");
    // Still followed: a direct write is seen.
    let _: () = d.set("w:7", "direct").await.unwrap();
    time_until(&mut c, "w:7", "direct").await;
}

/// Writes `n` fresh keys `tag:i` through the proxy in pipelines of 200,
/// waits for each to land, and (`read`) reads them back, checking each
/// value. Returns how many of those reads went upstream.
async fn write_fresh(
    c: &mut redis::aio::MultiplexedConnection,
    redis: &RedisServer,
    tag: &str,
    n: usize,
    read: bool,
) -> u64 {
    let gets = upstream_calls(redis, "get").await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut p = redis::pipe();
        for i in chunk {
            p.set(format!("{tag}:{i}"), format!("v{i}")).ignore();
        }
        let _: () = p.query_async(c).await.unwrap();
        wait_field(c, "write_queue_depth", 0, Duration::from_secs(10)).await;
        // Landed and answered (written_released / written_kept settled).
        tokio::time::sleep(Duration::from_millis(50)).await;
        if read {
            for i in chunk {
                let got: String = c.get(format!("{tag}:{i}")).await.unwrap();
                assert_eq!(got, format!("v{i}"));
            }
        }
    }
    upstream_calls(redis, "get").await - gets
}

/// Keys first written, then read (a session created, then used): their
/// writes are not re-read at first (nobody read the keys), so their first
/// reads miss. Once a sample of them shows that such reads come, writes
/// of unread keys are re-read too and their first reads are hits. Writes
/// nobody reads turn it off again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_writes_are_kept_while_they_are_read_later() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let inf = info(&mut c).await;
    assert_eq!(info_field(&inf, "rereading_unread_writes"), 0, "{inf}");
    // 1 key in 16 is sampled; 64 sampled writes read back decide.
    let misses = write_fresh(&mut c, &redis, "warm", 2000, true).await;
    let inf = info(&mut c).await;
    assert_eq!(info_field(&inf, "rereading_unread_writes"), 1, "{inf}");
    assert!(misses > 64, "{misses} first reads of 2,000 went upstream");
    // Now a first read after a first write is a hit outside the sample.
    let kept = info_field(&inf, "written_kept");
    let misses = write_fresh(&mut c, &redis, "new", 400, true).await;
    assert!(misses < 60, "{misses} first reads of 400 went upstream");
    let inf = info(&mut c).await;
    assert!(info_field(&inf, "written_kept") >= kept + 340, "{inf}");
    // Writes nobody reads: off again, and their values are released.
    write_fresh(&mut c, &redis, "unread", 4000, false).await;
    let inf = info(&mut c).await;
    assert_eq!(info_field(&inf, "rereading_unread_writes"), 0, "{inf}");
    let released = info_field(&inf, "written_released");
    write_fresh(&mut c, &redis, "after", 400, false).await;
    let inf = info(&mut c).await;
    assert!(
        info_field(&inf, "written_released") >= released + 390,
        "{inf}"
    );
    // Still coherent: a direct write of a kept key is seen.
    let mut d = redis.conn().await;
    let _: () = d.set("new:7", "direct").await.unwrap();
    time_until(&mut c, "new:7", "direct").await;
}

/// A direct write right after one of the proxy's own writes landed: the
/// written value, served from the L1 while queued, must not outlive the
/// landing by more than the invalidation bound. Readers hammer the key
/// through the proxy meanwhile, so the value is in the L1 when the direct
/// write comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_write_right_after_an_own_write_landed_is_seen() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut r = proxy.conn().await;
    let mut d = redis.conn().await;
    let mut times = Vec::new();
    for round in 0..200 {
        let key = format!("l:{}", round % 20);
        let own = format!("own{round}");
        let _: () = c.set(&key, &own).await.unwrap();
        // Read-your-writes at once (from the L1 while queued).
        let got: String = r.get(&key).await.unwrap();
        assert_eq!(got, own);
        // As soon as upstream has it, a foreign write.
        let t0 = Instant::now();
        while d.get::<_, Option<String>>(&key).await.unwrap().as_deref() != Some(own.as_str()) {
            assert!(t0.elapsed() < BOUND, "{key} never flushed");
        }
        let foreign = format!("direct{round}");
        let _: () = d.set(&key, &foreign).await.unwrap();
        times.push(time_until(&mut r, &key, &foreign).await);
    }
    support::coherence::report(
        "direct write right after an own write landed (optin)",
        times,
    );
}

/// A key cached by proxy A is changed on every other kind of connection:
/// directly, by A's own forwarded write (the client's connection, not the
/// fill connection), by proxy B's write-behind flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_other_connections_invalidate() {
    let redis = RedisServer::start(&[]);
    let a = Proxy::start(&redis.url(), OPTIN).await;
    let b = Proxy::start(&redis.url(), OPTIN).await;
    let mut ca = a.conn().await;
    let mut cb = b.conn().await;
    let mut d = redis.conn().await;
    for round in 0..50 {
        let key = format!("x:{round}");
        let _: () = d.set(&key, "1").await.unwrap();
        cache(&mut ca, &key).await;
        let _: () = d.set(&key, "2").await.unwrap();
        time_until(&mut ca, &key, "2").await;
        cache(&mut ca, &key).await;
        // Forwarded (conditional SET: not written behind) through A.
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg("3")
            .arg("XX")
            .query_async(&mut ca)
            .await
            .unwrap();
        let got: String = ca.get(&key).await.unwrap();
        assert_eq!(got, "3", "own forwarded write");
        cache(&mut ca, &key).await;
        // Through B, once flushed.
        let _: () = cb.set(&key, "4").await.unwrap();
        let t0 = Instant::now();
        while d.get::<_, String>(&key).await.unwrap() != "4" {
            assert!(t0.elapsed() < BOUND, "B never flushed {key}");
            tokio::task::yield_now().await;
        }
        time_until(&mut ca, &key, "4").await;
    }
}

/// In one pipeline, a fill (on the fill connection) and a later write on
/// the client's connection: the GET answers the value from before the
/// write, and the next read sees the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_fill_never_reads_a_later_write() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    for i in 0..200 {
        let key = format!("p:{i}");
        let _: () = d.set(&key, 10).await.unwrap();
        let (before, incr, after): (i64, i64, i64) = redis::pipe()
            .get(&key)
            .incr(&key, 1)
            .get(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!((before, incr, after), (10, 11, 11), "{key}");
        // And a write-behind SET after a fill in one pipeline.
        let (old, (), new): (i64, (), i64) = redis::pipe()
            .get(format!("q:{i}"))
            .set(format!("q:{i}"), 7)
            .get(format!("q:{i}"))
            .query_async(&mut c)
            .await
            .map(|(o, (), n): (Option<i64>, (), i64)| (o.unwrap_or(0), (), n))
            .unwrap();
        assert_eq!((old, new), (0, 7), "q:{i}");
        let got: i64 = c.get(&key).await.unwrap();
        assert_eq!(got, 11);
    }
}

/// Own write-behind writes and direct writes to the same keys, with
/// readers through the proxy: once both stop and the queue is drained,
/// every key read through the proxy is upstream's value (no written value
/// outlived its landing, none was kept by a stamp that did not match).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_and_foreign_writes_to_the_same_keys() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    const KEYS: usize = 2_000;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for r in 0..2usize {
        let mut c = proxy.conn().await;
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = r * 131;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut p = redis::pipe();
                for _ in 0..40 {
                    i = (i * 31 + 7) % KEYS;
                    p.get(format!("m:{i}"));
                }
                let _: Vec<Option<String>> = p.query_async(&mut c).await.unwrap();
            }
        }));
    }
    let mut writers = Vec::new();
    for w in 0..2u64 {
        // One writer through the proxy, one direct.
        let mut c = if w == 0 {
            proxy.conn().await
        } else {
            redis.conn().await
        };
        writers.push(tokio::spawn(async move {
            let mut x = w * 7919 + 3;
            for round in 0..60u64 {
                let mut p = redis::pipe();
                for _ in 0..100 {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    let k = (x >> 33) as usize % KEYS;
                    p.set(format!("m:{k}"), format!("{w}:{round}")).ignore();
                }
                let _: () = p.query_async(&mut c).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let mut c = proxy.conn().await;
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let mut d = redis.conn().await;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("m:{i}")).collect();
    let upstream: Vec<Option<String>> = d.mget(&keys).await.unwrap();
    let mut p = redis::pipe();
    for k in &keys {
        p.get(k);
    }
    let served: Vec<Option<String>> = p.query_async(&mut c).await.unwrap();
    let stale: Vec<usize> = (0..KEYS).filter(|&i| upstream[i] != served[i]).collect();
    let inf = info(&mut c).await;
    eprintln!(
        "own+foreign storm: l1_hits={} written_released={} invalidated_keys={}",
        info_field(&inf, "l1_hits"),
        info_field(&inf, "written_released"),
        info_field(&inf, "invalidated_keys")
    );
    assert!(
        stale.is_empty(),
        "{} stale keys, e.g. {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
    assert!(info_field(&inf, "written_released") > 0);
}

/// Optin caches every database: a fill of another database than the
/// start one selects it on the tracking connection and selects the start
/// one again, so Redis tracks the key (its table names keys, not
/// databases) and the connection's own writes stay in the start database.
/// Checked: hits in database 2, a direct write there is seen, one pipeline
/// reading the same key name in databases 0 and 2 gets each its own value,
/// and write-behind to database 0 after it still lands in database 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_databases_are_cached_and_tracked() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut d0 = redis.conn().await;
    let mut d2 = redis::Client::open(format!("{}/2", redis.url()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = d0.set("k", "zero").await.unwrap();
    let _: () = d2.set("k", "two").await.unwrap();
    let _: () = redis::cmd("SELECT")
        .arg(2)
        .query_async(&mut c)
        .await
        .unwrap();
    let gets = upstream_calls(&redis, "get").await;
    for _ in 0..5 {
        let got: String = c.get("k").await.unwrap();
        assert_eq!(got, "two");
    }
    assert_eq!(
        upstream_calls(&redis, "get").await,
        gets + 1,
        "cached in database 2"
    );
    let _: () = d2.set("k", "two-later").await.unwrap();
    let mut times = vec![time_until(&mut c, "k", "two-later").await];
    // A write to the same name in database 0 drops it too (a lost hit).
    let _: () = d0.set("k", "zero-later").await.unwrap();
    times.push(time_until(&mut c, "k", "two-later").await);
    support::coherence::report("direct write in database 2 (optin)", times);
    // One pipeline across databases, on a fresh client (start database 0).
    let mut m = proxy.conn().await;
    for _ in 0..3 {
        let (a, b, e): (String, String, String) = redis::pipe()
            .get("k")
            .cmd("SELECT")
            .arg(2)
            .ignore()
            .get("k")
            .cmd("SELECT")
            .arg(0)
            .ignore()
            .get("k")
            .query_async(&mut m)
            .await
            .unwrap();
        assert_eq!(
            (a.as_str(), b.as_str(), e.as_str()),
            ("zero-later", "two-later", "zero-later")
        );
    }
    // The tracking connection was put back in database 0: write-behind
    // of the start database lands there.
    let _: () = m.set("back", "in-zero").await.unwrap();
    let t0 = Instant::now();
    while d0
        .get::<_, Option<String>>("back")
        .await
        .unwrap()
        .as_deref()
        != Some("in-zero")
    {
        assert!(
            t0.elapsed() < BOUND,
            "write-behind did not land in database 0"
        );
        tokio::task::yield_now().await;
    }
    let in_two: Option<String> = d2.get("back").await.unwrap();
    assert_eq!(in_two, None);
    // Write-behind in database 2 is cached, released once landed, and
    // tracked from the next read.
    let _: () = c.set("w", "own").await.unwrap();
    let got: String = c.get("w").await.unwrap();
    assert_eq!(got, "own");
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    let got: String = c.get("w").await.unwrap();
    assert_eq!(got, "own");
    let _: () = d2.set("w", "direct").await.unwrap();
    time_until(&mut c, "w", "direct").await;
}

/// `--fill-connections 3`: three tracking connections per master carry
/// the fills (each key on one of them); a direct write to any cached key
/// is seen, and losing any one of them clears the master's keys, after
/// which caching resumes once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_fill_connections_each_track_their_keys() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(
        &redis.url(),
        &["--tracking", "optin", "--fill-connections", "3"],
    )
    .await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    let ids = support::coherence::channel_ids(&mut d, "optin").await;
    assert_eq!(ids.len(), 3, "{ids:?}");
    const N: usize = 300;
    let keys: Vec<String> = (0..N).map(|i| format!("f:{i}")).collect();
    support::coherence::seed_and_cache(&mut d, &mut c, &keys).await;
    assert!(info_field(&info(&mut c).await, "registered_reads") >= N as u64);
    let gets = upstream_calls(&redis, "get").await;
    for k in &keys {
        let _: String = c.get(k).await.unwrap();
    }
    assert_eq!(upstream_calls(&redis, "get").await, gets, "all cached");
    // Every key is tracked on whichever connection filled it.
    let mut times = Vec::new();
    for k in &keys {
        let _: () = d.set(k, "new").await.unwrap();
        times.push(time_until(&mut c, k, "new").await);
    }
    support::coherence::report("direct writes, three fill connections (optin)", times);
    for id in &ids {
        for k in &keys[..30] {
            cache(&mut c, k).await;
        }
        assert!(info_field(&info(&mut c).await, "l1_entries") >= 30);
        support::coherence::kill_tracking_conn(&mut d, &mut c, id).await;
    }
    cache(&mut c, "f:1").await;
    let _: () = d.set("f:1", "last").await.unwrap();
    time_until(&mut c, "f:1", "last").await;
}

/// Redis's tracking table is full (`tracking-table-max-keys`): the keys it
/// evicts are invalidated, so none is served stale after direct writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_table_evictions_are_invalidations() {
    let redis = RedisServer::start(&["--tracking-table-max-keys", "100"]);
    let proxy = Proxy::start(&redis.url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut d = redis.conn().await;
    const N: usize = 500;
    for i in 0..N {
        let _: () = d.set(format!("e:{i}"), "old").await.unwrap();
        cache(&mut c, &format!("e:{i}")).await;
    }
    let t0 = Instant::now();
    let evicted = loop {
        let n = info_field(&info(&mut c).await, "invalidated_keys");
        if n as usize >= N - 100 {
            break n;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{n} evictions seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("tracking-table-max-keys 100, {N} keys cached: {evicted} invalidated by Redis");
    for i in 0..N {
        let _: () = d.set(format!("e:{i}"), "new").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..N {
        let got: String = c.get(format!("e:{i}")).await.unwrap();
        assert_eq!(got, "new", "e:{i}");
    }
}

/// The same on a 3-master cluster: own writes are released once landed
/// and tracked from the next read, foreign writes on each master reach
/// the L1, a pipeline's fills never read its later writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_own_writes_and_foreign_writes() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), OPTIN).await;
    let mut c = proxy.conn().await;
    let mut d = Direct::cluster(&cluster).await;
    wait_field(&mut c, "tracking_channels_up", 3, Duration::from_secs(5)).await;
    for i in 0..150 {
        let key = format!("c:{i}");
        if i % 3 == 0 {
            let _: () = d.conn(&key).set(&key, "direct").await.unwrap();
            cache(&mut c, &key).await;
        }
        let _: () = c.set(&key, format!("own{i}")).await.unwrap();
    }
    wait_field(&mut c, "write_queue_depth", 0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The two thirds never read before at least (see the standalone test).
    assert!(info_field(&info(&mut c).await, "written_released") >= 100);
    // Released: the first read of each registers it.
    for i in 0..150 {
        let got: String = c.get(format!("c:{i}")).await.unwrap();
        assert_eq!(got, format!("own{i}"));
    }
    let before = info_field(&info(&mut c).await, "l1_hits");
    for i in 0..150 {
        let got: String = c.get(format!("c:{i}")).await.unwrap();
        assert_eq!(got, format!("own{i}"));
    }
    let inf = info(&mut c).await;
    eprintln!(
        "cluster own writes: hits {} of 150, written_released={} invalidated_keys={} losses={}",
        info_field(&inf, "l1_hits") - before,
        info_field(&inf, "written_released"),
        info_field(&inf, "invalidated_keys"),
        info_field(&inf, "tracking_channel_losses")
    );
    assert_eq!(info_field(&inf, "l1_hits") - before, 150);
    let mut times = Vec::new();
    for i in 0..150 {
        let key = format!("c:{i}");
        let _: () = d.conn(&key).set(&key, "later").await.unwrap();
        times.push(time_until(&mut c, &key, "later").await);
    }
    support::coherence::report("cluster, direct write after an own flush (optin)", times);
    for i in 0..60 {
        let key = format!("{{t}}:{i}");
        let _: () = d.conn(&key).set(&key, 5).await.unwrap();
        let (before, incr): (i64, i64) = redis::pipe()
            .get(&key)
            .incr(&key, 1)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!((before, incr), (5, 6));
    }
}
