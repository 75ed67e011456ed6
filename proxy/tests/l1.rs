//! The L1 read path against a real redis-server: hits never reach upstream,
//! misses coalesce, TTLs are honoured, capacity is bounded, every write
//! through the proxy invalidates.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::Duration;

use redis::AsyncCommands;
use support::{info_field, raw, raw_on, upstream_calls, Proxy, RedisServer};

#[tokio::test]
async fn hits_do_not_reach_upstream() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut c = proxy.conn().await;
    for i in 0..100 {
        let _: () = c.set(format!("k{i}"), format!("v{i}")).await.unwrap();
        let _: String = c.get(format!("k{i}")).await.unwrap();
    }
    // Under optin tracking (the default) each written value leaves the L1
    // once its write landed; the next read registers it and fills.
    support::coherence::wait_field(
        &mut c,
        "write_queue_depth",
        0,
        std::time::Duration::from_secs(10),
    )
    .await;
    for i in 0..100 {
        let _: String = c.get(format!("k{i}")).await.unwrap();
    }
    let before = upstream_calls(&redis, "get").await;
    for round in 0..100 {
        let mut p = redis::pipe();
        for i in 0..100 {
            p.get(format!("k{i}"));
        }
        let vals: Vec<String> = p.query_async(&mut c).await.unwrap();
        assert_eq!(vals[round % 100], format!("v{}", round % 100));
    }
    // MGET of cached keys is served from the L1 too.
    let vals: Vec<String> = c.mget(&["k1", "k2", "k3"]).await.unwrap();
    assert_eq!(vals, vec!["v1", "v2", "v3"]);
    assert_eq!(
        upstream_calls(&redis, "get").await - before,
        0,
        "10,000 cached GETs moved upstream cmdstat_get"
    );
    assert_eq!(upstream_calls(&redis, "mget").await, 0);
    let info: String = redis::cmd("INFO")
        .arg("l1")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(info_field(&info, "l1_hits") >= 10_003);
    proxy.stop().await;
}

#[tokio::test]
async fn concurrent_misses_share_one_fetch() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut d = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = d.set("hot", "value").await.unwrap();
    let mut conns = Vec::new();
    for _ in 0..100 {
        conns.push(tokio::net::TcpStream::connect(proxy.addr).await.unwrap());
    }
    let before = upstream_calls(&redis, "get").await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut s| {
            let b = barrier.clone();
            tokio::spawn(async move {
                b.wait().await;
                raw_on(&mut s, b"GET hot\r\n", 1).await
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), b"$5\r\nvalue\r\n");
    }
    let fetched = upstream_calls(&redis, "get").await - before;
    assert!(
        fetched <= 1,
        "100 concurrent GETs made {fetched} upstream GETs"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn upstream_ttl_and_cap_bound_entries() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &["--l1-ttl-cap", "0.5"]).await;
    let mut d = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut c = proxy.conn().await;
    // A key with a 300 ms TTL upstream is nil through the proxy once expired.
    let _: () = redis::cmd("SET")
        .arg("short")
        .arg("v")
        .arg("PX")
        .arg(300)
        .query_async(&mut d)
        .await
        .unwrap();
    let v: Option<String> = c.get("short").await.unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let v: Option<String> = c.get("short").await.unwrap();
    assert_eq!(v, None);
    // TTL/PTTL are forwarded, never answered from the L1.
    let _: () = d.set("ttl", "x").await.unwrap();
    let _: String = c.get("ttl").await.unwrap();
    let _: () = d.expire("ttl", 100).await.unwrap();
    let ttl: i64 = c.ttl("ttl").await.unwrap();
    assert!(ttl > 90);
    // An entry with no TTL lives at most the cap (here 0.5 s): a change made
    // behind the proxy's back is visible after it.
    let _: () = d.set("capped", "old").await.unwrap();
    let v: String = c.get("capped").await.unwrap();
    assert_eq!(v, "old");
    let _: () = d.set("capped", "new").await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let v: String = c.get("capped").await.unwrap();
    assert_eq!(v, "new");
    proxy.stop().await;
}

#[tokio::test]
async fn nil_is_cached_only_when_asked() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let before = upstream_calls(&redis, "get").await;
    for _ in 0..3 {
        assert_eq!(
            raw(&proxy.addr.to_string(), b"GET missing\r\n", 1).await,
            b"$-1\r\n"
        );
    }
    assert_eq!(upstream_calls(&redis, "get").await - before, 3);
    proxy.stop().await;
    let proxy = Proxy::start(&redis.url(), &["--l1-cache-nil", "5"]).await;
    let before = upstream_calls(&redis, "get").await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(raw_on(&mut s, b"GET missing\r\n", 1).await, b"$-1\r\n");
    assert_eq!(raw_on(&mut s, b"GET missing\r\n", 1).await, b"$-1\r\n");
    // RESP3 clients get a RESP3 nil from the cache.
    let _ = raw_on(&mut s, b"HELLO 3\r\n", 1).await;
    assert_eq!(
        raw_on(&mut s, b"GET missing\r\nMGET missing missing\r\n", 2).await,
        b"_\r\n*2\r\n_\r\n_\r\n"
    );
    assert_eq!(upstream_calls(&redis, "get").await - before, 1);
    // A write through the proxy ends the cached nil at once.
    assert_eq!(
        raw_on(&mut s, b"SET missing here\r\nGET missing\r\n", 2).await,
        b"+OK\r\n$4\r\nhere\r\n"
    );
    proxy.stop().await;
}

#[test]
fn capacity_bounds_memory() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = RedisServer::start(&[]);
    // The proxy as its own process, so its RSS is measurable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &redis.url(),
            "--l1-max-bytes",
            "4mb",
            "--log-level",
            "warn",
        ])
        .env("SIDECACHE_METRICS_LISTEN", "127.0.0.1:0")
        .spawn()
        .unwrap();
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches(" kB")
            .trim()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    rt.block_on(async {
        let url = format!("redis://127.0.0.1:{port}");
        let mut c = loop {
            match redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
            {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let mut d = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        // 40 MB of distinct values, ten times the L1's capacity.
        let value = |i: usize| format!("{i:08}").repeat(128);
        for chunk in 0..40 {
            let mut p = redis::pipe();
            for i in chunk * 1000..(chunk + 1) * 1000 {
                p.set(format!("big:{i}"), value(i)).ignore();
            }
            let _: () = p.query_async(&mut d).await.unwrap();
        }
        let warm = rss(child.id());
        for round in 0..2 {
            for chunk in 0..40 {
                let mut p = redis::pipe();
                for i in chunk * 1000..(chunk + 1) * 1000 {
                    p.get(format!("big:{i}"));
                }
                let vals: Vec<String> = p.query_async(&mut c).await.unwrap();
                for (j, v) in vals.iter().enumerate() {
                    assert_eq!(*v, value(chunk * 1000 + j), "round {round}");
                }
            }
        }
        let info: String = redis::cmd("INFO")
            .arg("l1")
            .query_async(&mut c)
            .await
            .unwrap();
        let bytes = info_field(&info, "l1_bytes");
        let evictions = info_field(&info, "l1_evictions");
        let grown = rss(child.id()).saturating_sub(warm);
        assert!(bytes <= 4 * 1024 * 1024, "l1_bytes {bytes}");
        assert!(evictions > 0);
        // Stated bound: the L1 capacity plus 24 MB of buffers and allocator slack,
        // far below the 40 MB the values would take if the L1 were unbounded.
        assert!(grown < 28 * 1024 * 1024, "RSS grew by {grown} bytes");
    });
    let _ = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
}

#[tokio::test]
async fn every_write_family_invalidates() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let pa = proxy.addr.to_string();
    // (set-up through the proxy, the write under test) — then GET k through
    // the proxy must equal GET k on Redis.
    let cases: &[(&str, &str)] = &[
        ("SET k v", "APPEND k x"),
        ("SET k 1", "INCR k"),
        ("SET k 1", "INCRBY k 5"),
        ("SET k 1", "DECR k"),
        ("SET k 1", "DECRBY k 2"),
        ("SET k 1.5", "INCRBYFLOAT k 1"),
        ("SET k hello", "SETRANGE k 0 J"),
        ("SET k v", "SET k w XX"),
        ("SET k v", "SET k w GET"),
        ("SET k v", "SET k w KEEPTTL"),
        ("SET k v", "GETSET k w"),
        ("SET k v", "GETDEL k"),
        ("SET k v", "GETEX k PERSIST"),
        ("SET k v", "DEL k"),
        ("SET k v", "UNLINK k"),
        ("SET k v", "EXPIRE k 0"),
        ("SET k v", "PEXPIRE k 0"),
        ("SET k v", "EXPIREAT k 1"),
        ("SET k v", "SETEX k 100 w"),
        ("SET k v", "PSETEX k 100000 w"),
        ("SET k v", "MSET a 1 k w"),
        ("SET src new", "RENAME src k"),
        ("SET src new", "COPY src k REPLACE"),
        ("SET k v", "MOVE k 1"),
        ("SET k v", "FLUSHDB"),
        ("SET k v", "FLUSHALL"),
        ("SET k v", "EVAL return_redis.call('set',KEYS[1],'lua') 1 k"),
        ("RPUSH src b a", "SORT src ALPHA STORE k"),
        ("SET k v", "DEL k"),
        ("SET k v", "LPUSH k x"),
        ("SET k v", "SWAPDB 0 1"),
        ("SET k 1", "BITOP NOT k k"),
        ("SET k v", "RESTORE k 0 bogus REPLACE"),
    ];
    for (setup, write) in cases {
        let run = |line: &str| line.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let enc = |args: Vec<String>| {
            let mut out = format!("*{}\r\n", args.len());
            for a in args {
                out.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
            }
            out
        };
        let _ = raw(&pa, b"FLUSHALL\r\n", 1).await;
        // `_` stands for a space inside one argument (the EVAL script).
        let write_args = if write.starts_with("EVAL") {
            let mut parts: Vec<String> = write.split(' ').map(str::to_owned).collect();
            parts[1] = parts[1].replace('_', " ");
            parts
        } else {
            run(write)
        };
        let script = format!("{}GET k\r\n{}GET k\r\n", enc(run(setup)), enc(write_args));
        let via_proxy = raw(&pa, script.as_bytes(), 4).await;
        // A forwarded command waits for the writes queued before it (a
        // write-behind SET may still be on its way): Redis is then current.
        let _ = raw(&pa, b"EXISTS k\r\n", 1).await;
        let direct = raw(&redis.addr(), b"GET k\r\n", 1).await;
        let text = String::from_utf8_lossy(&via_proxy).into_owned();
        assert!(
            text.ends_with(&*String::from_utf8_lossy(&direct)),
            "{setup} / {write}: proxy {text:?}, redis says GET k = {:?}",
            String::from_utf8_lossy(&direct)
        );
    }
    proxy.stop().await;
}

#[tokio::test]
async fn pipelined_write_then_read_sees_the_write() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let out = raw(
        &proxy.addr.to_string(),
        b"SET k a\r\nGET k\r\nAPPEND k x\r\nGET k\r\nMGET k k\r\nDEL k\r\nGET k\r\n",
        7,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        "+OK\r\n$1\r\na\r\n:2\r\n$2\r\nax\r\n*2\r\n$2\r\nax\r\n$2\r\nax\r\n:1\r\n$-1\r\n"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn writers_and_readers_race_then_agree() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let keys: Vec<String> = (0..20).map(|i| format!("race:{i}")).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mut c, keys, stop) = (proxy.conn().await, keys.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let k = &keys[(n % 20) as usize];
                match n % 4 {
                    0 => {
                        let _: () = c.set(k, n).await.unwrap();
                    }
                    1 => {
                        let _: i64 = c.incr(k, 1).await.unwrap();
                    }
                    2 => {
                        let _: i64 = c.append(k, "7").await.unwrap();
                    }
                    _ => {
                        let _: i64 = c.del(k).await.unwrap();
                    }
                }
                n += 1;
            }
        })
    };
    let mut readers = Vec::new();
    for _ in 0..4 {
        let (mut c, keys, stop) = (proxy.conn().await, keys.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut p = redis::pipe();
                for k in &keys {
                    p.get(k);
                }
                let _: Vec<Option<String>> = p.query_async(&mut c).await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    for r in readers {
        r.await.unwrap();
    }
    let mut c = proxy.conn().await;
    let mut d = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for k in &keys {
        let via: Option<String> = c.get(k).await.unwrap();
        let direct: Option<String> = d.get(k).await.unwrap();
        assert_eq!(via, direct, "{k}");
    }
    proxy.stop().await;
}
