//! Reads beyond GET in the L1 (HGETALL, SMEMBERS, ZRANGE, STRLEN …), against
//! real redis-server: each reply is Redis's own in RESP2 and RESP3, a hit
//! never reaches Redis, every kind of write drops the key's cached reads
//! (another writer, a write through this or another sidecache, write-behind,
//! expiry, FLUSHALL), and `--l1-commands` limits what is cached.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use support::coherence::{in_every_mode, report, with_mode, Direct, BOUND};
use support::{enc, raw_on, upstream_calls, Cluster, Proxy, RedisServer};
use tokio::net::TcpStream;

/// Every cached read, on keys `seed` makes (one of each type).
const READS: &[&str] = &[
    "GET k",
    "GETRANGE k 0 2",
    "STRLEN k",
    "EXISTS k",
    "EXISTS nokey",
    "TYPE h",
    "HGET h a",
    "HGET h nofield",
    "HMGET h a nofield b",
    "HGETALL h",
    "HEXISTS h a",
    "HLEN h",
    "HKEYS h",
    "HVALS h",
    "HSTRLEN h a",
    "SMEMBERS s",
    "SISMEMBER s x",
    "SMISMEMBER s x nope",
    "SCARD s",
    "ZRANGE z 0 -1",
    "ZRANGE z 0 -1 WITHSCORES",
    "ZRANGE z 0 10 BYSCORE LIMIT 0 2 WITHSCORES",
    "ZRANGE z +inf -inf BYSCORE REV WITHSCORES",
    "ZREVRANGE z 0 1 withscores",
    "ZRANGEBYSCORE z -inf +inf WITHSCORES",
    "ZREVRANGEBYSCORE z +inf -inf",
    "ZRANGEBYLEX lex - +",
    "ZSCORE z a",
    "ZSCORE z nomember",
    "ZMSCORE z a nomember b",
    "ZCARD z",
    "ZCOUNT z 1 2",
    "ZLEXCOUNT lex - +",
    "LRANGE l 0 -1",
    "LLEN l",
    "LINDEX l 1",
];

/// The commands of `READS` as named in INFO commandstats.
fn names() -> Vec<String> {
    let mut n: Vec<String> = READS
        .iter()
        .map(|r| r.split(' ').next().unwrap().to_ascii_lowercase())
        .collect();
    n.sort();
    n.dedup();
    n
}

async fn upstream_reads(redis: &RedisServer) -> u64 {
    let mut total = 0;
    for n in names() {
        total += upstream_calls(redis, &n).await;
    }
    total
}

async fn seed(d: &mut TcpStream) {
    let cmds = [
        "SET k hello",
        "HSET h a 1 b 2 c 3",
        "SADD s x y z",
        "ZADD z 1.1 a 2 b 3.5 c",
        "ZADD lex 0 a 0 b 0 c",
        "RPUSH l a b c",
    ];
    let input: String = cmds.iter().map(|c| enc(c)).collect();
    raw_on(d, input.as_bytes(), cmds.len()).await;
}

/// A connection speaking RESP `proto`.
async fn connect(addr: &str, proto: u8) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    if proto == 3 {
        let hello = raw_on(&mut s, enc("HELLO 3").as_bytes(), 1).await;
        assert!(hello.starts_with(b"%"), "HELLO 3: {hello:?}");
    }
    s
}

async fn one(s: &mut TcpStream, line: &str) -> Vec<u8> {
    raw_on(s, enc(line).as_bytes(), 1).await
}

async fn every_read_is_redis_reply_and_hits_stay_local(mode: &str) {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let addr = proxy.addr.to_string();
    let mut d = TcpStream::connect(redis.addr()).await.unwrap();
    seed(&mut d).await;
    // The first client's protocol is the one replies are cached in; the
    // other protocol's clients get them converted. Both orders.
    for order in [[2u8, 3], [3, 2]] {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut proxy.conn().await)
            .await
            .unwrap();
        seed(&mut d).await;
        for proto in order {
            let mut p = connect(&addr, proto).await;
            let mut direct = connect(&redis.addr(), proto).await;
            for r in READS {
                let want = one(&mut direct, r).await;
                let first = one(&mut p, r).await;
                let again = one(&mut p, r).await;
                assert_eq!(
                    String::from_utf8_lossy(&first),
                    String::from_utf8_lossy(&want),
                    "RESP{proto} {r} (order {order:?}), first read"
                );
                assert_eq!(
                    String::from_utf8_lossy(&again),
                    String::from_utf8_lossy(&want),
                    "RESP{proto} {r} (order {order:?}), second read"
                );
            }
        }
        // Everything is cached now but the read of a missing key (not
        // cached without --l1-cache-nil): a round in each protocol reaches
        // Redis only for that one.
        let uncached = 2 * READS.iter().filter(|r| r.contains("nokey")).count() as u64;
        let before = upstream_reads(&redis).await;
        for proto in [2, 3] {
            let mut p = connect(&addr, proto).await;
            for r in READS {
                one(&mut p, r).await;
            }
        }
        let after = upstream_reads(&redis).await;
        assert_eq!(
            after - before,
            uncached,
            "{} cached reads reached Redis {} times ({mode})",
            2 * READS.len(),
            after - before
        );
    }
    proxy.stop().await;
}

/// Reads `line` through `p` until it answers `want`; how long it took.
async fn until(p: &mut TcpStream, line: &str, want: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let got = one(p, line).await;
        if got == want.as_bytes() {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < BOUND,
            "{line}: still {:?}, not {want:?}, after {:?}",
            String::from_utf8_lossy(&got),
            t0.elapsed()
        );
        tokio::task::yield_now().await;
    }
}

/// Reads `line` until a second read of it is a hit (the L1's read_hits
/// grows).
async fn cache(proxy: &Proxy, p: &mut TcpStream, line: &str) {
    let mut c = proxy.conn().await;
    let t0 = Instant::now();
    loop {
        let hits = |info: &str| support::info_field(info, "l1_read_hits");
        let before: String = redis::cmd("INFO")
            .arg("l1")
            .query_async(&mut c)
            .await
            .unwrap();
        one(p, line).await;
        one(p, line).await;
        let after: String = redis::cmd("INFO")
            .arg("l1")
            .query_async(&mut c)
            .await
            .unwrap();
        if hits(&after) > hits(&before) {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{line} never cached");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn every_kind_of_write_drops_the_cached_reads(mode: &str) {
    let redis = RedisServer::start(&[]);
    let a = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let b = Proxy::start(&redis.url(), &with_mode(mode, &[])).await;
    let mut d = TcpStream::connect(redis.addr()).await.unwrap();
    let mut pa = TcpStream::connect(a.addr).await.unwrap();
    let mut pb = TcpStream::connect(b.addr).await.unwrap();
    let mut times = Vec::new();
    for i in 0..50 {
        let h = format!("h{i}");
        one(&mut d, &format!("HSET {h} f 0")).await;
        // Another writer, direct to Redis.
        cache(&b, &mut pb, &format!("HGETALL {h}")).await;
        one(&mut d, &format!("HSET {h} f 1")).await;
        times.push(
            until(
                &mut pb,
                &format!("HGETALL {h}"),
                "*2\r\n$1\r\nf\r\n$1\r\n1\r\n",
            )
            .await,
        );
        // A write through another sidecache.
        cache(&b, &mut pb, &format!("HLEN {h}")).await;
        one(&mut pa, &format!("HSET {h} g 2")).await;
        times.push(until(&mut pb, &format!("HLEN {h}"), ":2\r\n").await);
    }
    report(
        &format!("HGETALL/HLEN after another's HSET ({mode})"),
        times,
    );

    // Writes through this sidecache: read your own write at once.
    let steps: &[(&str, &str, &str, &str)] = &[
        (
            "RPUSH l a b",
            "LRANGE l 0 -1",
            "LPOP l",
            "*1\r\n$1\r\nb\r\n",
        ),
        ("SADD s x", "SMEMBERS s", "SREM s x", "*0\r\n"),
        ("ZADD z 1 m", "ZSCORE z m", "ZINCRBY z 2 m", "$1\r\n3\r\n"),
        ("HSET h2 a 1", "HGET h2 a", "HDEL h2 a", "$-1\r\n"),
        // A write-behind SET (acknowledged from memory).
        ("SET k abc", "STRLEN k", "SET k abcdef", ":6\r\n"),
        (
            "SET k2 abc",
            "GETRANGE k2 0 -1",
            "APPEND k2 d",
            "$4\r\nabcd\r\n",
        ),
        ("SET k3 v", "TYPE k3", "DEL k3", "+none\r\n"),
    ];
    for (setup, read, write, want) in steps {
        one(&mut pb, setup).await;
        cache(&b, &mut pb, read).await;
        one(&mut pb, write).await;
        assert_eq!(
            String::from_utf8_lossy(&one(&mut pb, read).await),
            *want,
            "{read} right after {write}"
        );
    }
    // Expiry: the cached read goes with the key.
    one(&mut pb, "HSET e a 1").await;
    one(&mut pb, "PEXPIRE e 300").await;
    cache(&b, &mut pb, "HLEN e").await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    until(&mut pb, "HLEN e", ":0\r\n").await;
    // FLUSHALL through the other sidecache.
    one(&mut pb, "SADD f x").await;
    cache(&b, &mut pb, "SCARD f").await;
    one(&mut pa, "FLUSHALL").await;
    until(&mut pb, "SCARD f", ":0\r\n").await;
    a.stop().await;
    b.stop().await;
}

in_every_mode!(every_read_is_redis_reply_and_hits_stay_local);
in_every_mode!(every_kind_of_write_drops_the_cached_reads);

#[tokio::test]
async fn l1_commands_chooses_the_cached_reads() {
    let redis = RedisServer::start(&[]);
    let mut d = TcpStream::connect(redis.addr()).await.unwrap();
    seed(&mut d).await;
    // GET only: HGETALL goes upstream each time.
    let proxy = Proxy::start(&redis.url(), &["--l1-commands", "get"]).await;
    let mut p = TcpStream::connect(proxy.addr).await.unwrap();
    let before = upstream_calls(&redis, "hgetall").await;
    for _ in 0..5 {
        one(&mut p, "HGETALL h").await;
    }
    assert_eq!(upstream_calls(&redis, "hgetall").await - before, 5);
    proxy.stop().await;
    // HGETALL only: cached; HLEN is not.
    let proxy = Proxy::start(&redis.url(), &["--l1-commands", "HGETALL"]).await;
    let mut p = TcpStream::connect(proxy.addr).await.unwrap();
    let (hg, hl) = (
        upstream_calls(&redis, "hgetall").await,
        upstream_calls(&redis, "hlen").await,
    );
    for _ in 0..5 {
        one(&mut p, "HGETALL h").await;
        one(&mut p, "HLEN h").await;
    }
    assert_eq!(upstream_calls(&redis, "hgetall").await - hg, 1);
    assert_eq!(upstream_calls(&redis, "hlen").await - hl, 5);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_hgetall_hits_stay_local_and_another_sidecaches_hset_is_seen() {
    let cluster = Cluster::start();
    let a = Proxy::start(&cluster.seed_url(), &[]).await;
    let b = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut d = Direct::cluster(&cluster).await;
    let mut pa = TcpStream::connect(a.addr).await.unwrap();
    let mut pb = TcpStream::connect(b.addr).await.unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("session:{i}")).collect();
    for k in &keys {
        let _: () = d.conn(k).hset(k, "user", "0").await.unwrap();
        cache(&b, &mut pb, &format!("HGETALL {k}")).await;
    }
    let calls = |c: &Cluster| {
        let nodes: Vec<String> = c.nodes.iter().map(|n| n.addr()).collect();
        async move {
            let mut total = 0;
            for n in nodes {
                let stats = support::raw(&n, b"INFO commandstats\r\n", 1).await;
                total += support::command_calls(&String::from_utf8_lossy(&stats), "hgetall");
            }
            total
        }
    };
    let before = calls(&cluster).await;
    for _ in 0..10 {
        for k in &keys {
            one(&mut pb, &format!("HGETALL {k}")).await;
        }
    }
    assert_eq!(
        calls(&cluster).await - before,
        0,
        "600 HGETALL hits reached a master"
    );
    let mut times = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        one(&mut pa, &format!("HSET {k} user {i}")).await;
        let want = format!("*2\r\n$4\r\nuser\r\n${}\r\n{i}\r\n", i.to_string().len());
        times.push(until(&mut pb, &format!("HGETALL {k}"), &want).await);
    }
    report("cluster, HGETALL after another sidecache's HSET", times);
    a.stop().await;
    b.stop().await;
}

/// Random writes made directly to Redis (another writer) while every read
/// of the written key is cached through sidecache: after each write, each
/// read through sidecache equals Redis's own reply within the invalidation
/// bound, in RESP2 and RESP3, standalone and cluster.
async fn other_writers_random(upstream: &str, direct: Vec<String>, cluster: bool) {
    let proxy = Proxy::start(upstream, &[]).await;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // The direct connection owning each key (cluster: by slot).
    async fn owner(direct: &[String], key: &str, cluster: bool, proto: u8) -> TcpStream {
        if !cluster {
            return connect(&direct[0], proto).await;
        }
        for d in direct {
            let mut s = connect(d, proto).await;
            let r = one(&mut s, &format!("TYPE {key}")).await;
            if !r.starts_with(b"-MOVED") {
                return s;
            }
        }
        panic!("no master owns {key}");
    }
    let mut times = Vec::new();
    for round in 0..120 {
        let proto = if round % 2 == 0 { 2 } else { 3 };
        let ty = next(4);
        let key = format!("{}:{}", ["h", "s", "z", "l"][ty as usize], next(5));
        let mut d = owner(&direct, &key, cluster, proto).await;
        let mut p = connect(&proxy.addr.to_string(), proto).await;
        let (writes, reads): (Vec<String>, Vec<String>) = match ty {
            0 => (
                vec![
                    format!("HSET {key} f{} v{}", next(4), next(100)),
                    format!("HDEL {key} f{}", next(4)),
                    format!("HINCRBY {key} n 1"),
                ],
                ["HGETALL", "HLEN", "HKEYS", "HVALS"]
                    .iter()
                    .map(|c| format!("{c} {key}"))
                    .chain([
                        format!("HGET {key} f1"),
                        format!("HMGET {key} f0 f1 f2"),
                        format!("HEXISTS {key} f2"),
                        format!("HSTRLEN {key} f3"),
                    ])
                    .collect(),
            ),
            1 => (
                vec![
                    format!("SADD {key} m{}", next(6)),
                    format!("SREM {key} m{}", next(6)),
                ],
                vec![
                    format!("SMEMBERS {key}"),
                    format!("SCARD {key}"),
                    format!("SISMEMBER {key} m1"),
                    format!("SMISMEMBER {key} m0 m1 m2"),
                ],
            ),
            2 => (
                vec![
                    format!("ZADD {key} {}.5 m{}", next(10), next(6)),
                    format!("ZINCRBY {key} 1 m{}", next(6)),
                    format!("ZREM {key} m{}", next(6)),
                ],
                vec![
                    format!("ZRANGE {key} 0 -1 WITHSCORES"),
                    format!("ZRANGE {key} 0 -1"),
                    format!("ZRANGE {key} +inf 2 BYSCORE REV LIMIT 0 3 WITHSCORES"),
                    format!("ZSCORE {key} m1"),
                    format!("ZMSCORE {key} m0 m1"),
                    format!("ZCARD {key}"),
                    format!("ZCOUNT {key} 2 8"),
                ],
            ),
            _ => (
                vec![
                    format!("RPUSH {key} e{}", next(9)),
                    format!("LPOP {key}"),
                    format!("LSET {key} 0 x{}", next(9)),
                ],
                vec![
                    format!("LRANGE {key} 0 -1"),
                    format!("LLEN {key}"),
                    format!("LINDEX {key} 0"),
                    format!("TYPE {key}"),
                    format!("EXISTS {key}"),
                ],
            ),
        };
        // Cache every read (twice through sidecache), then write directly.
        for r in &reads {
            one(&mut p, r).await;
            one(&mut p, r).await;
        }
        let w = &writes[next(writes.len() as u64) as usize];
        one(&mut d, w).await;
        for r in &reads {
            let want = one(&mut d, r).await;
            let t0 = Instant::now();
            loop {
                let got = one(&mut p, r).await;
                if got == want {
                    break;
                }
                assert!(
                    t0.elapsed() < BOUND,
                    "RESP{proto} {r} after a direct {w}: {:?}, Redis says {:?}",
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&want)
                );
                tokio::task::yield_now().await;
            }
            times.push(t0.elapsed());
        }
    }
    report(
        &format!("random reads after another writer's write (cluster: {cluster})"),
        times,
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_writers_random_standalone() {
    let redis = RedisServer::start(&[]);
    other_writers_random(&redis.url(), vec![redis.addr()], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_writers_random_cluster() {
    let cluster = Cluster::start();
    let direct = cluster.nodes.iter().map(|n| n.addr()).collect();
    other_writers_random(&cluster.seed_url(), direct, true).await;
}

/// Reads the L1 does not cache whose RESP2 reply sidecache shows from a
/// fill lane's RESP3 one (`cmd::reads::resp2_shape`), and some it sends
/// its usual way, on `seed`'s keys and on missing ones.
const TRACKED_RESP2: &[&str] = &[
    "GETBIT k 1",
    "BITCOUNT k",
    "BITPOS k 1",
    "BITFIELD_RO k GET u8 0",
    "LPOS l b",
    "LPOS l zz",
    "LPOS l a COUNT 0",
    "TTL k",
    "PTTL nokey",
    "EXPIRETIME k",
    "PEXPIRETIME k",
    "XLEN x",
    "XRANGE x - +",
    "XREVRANGE x + - COUNT 1",
    "SINTERCARD 1 s",
    "ZINTERCARD 1 z",
    "SRANDMEMBER nokey",
    "SRANDMEMBER nokey 2",
    "OBJECT ENCODING h",
    "OBJECT ENCODING nokey",
    "GEOHASH g pal nomember",
    "GEOPOS g pal nomember",
    "LCS k k",
    "SORT_RO l ALPHA",
    "DUMP nokey",
    "ZRANK z b",
    "ZRANDMEMBER nokey 2 WITHSCORES",
    "HRANDFIELD nokey 2 WITHVALUES",
    "GETBIT h 1",
    "XRANGE k - +",
];

/// A RESP2 tracking client's reads (default mode, its messages
/// REDIRECTed): every reply is Redis's own, byte for byte, also for reads
/// that go to a RESP3 fill lane so that Redis follows their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp2_tracking_clients_reads_are_redis_own() {
    let redis = RedisServer::start(&[]);
    let upstream = RedisServer::start(&[]);
    let proxy = Proxy::start(&upstream.url(), &[]).await;
    let mut outs = Vec::new();
    for (addr, seeded) in [
        (redis.addr(), redis.addr()),
        (proxy.addr.to_string(), upstream.addr()),
    ] {
        let mut d = TcpStream::connect(&seeded).await.unwrap();
        seed(&mut d).await;
        for c in [
            "XADD x 1-0 f v",
            "XADD x 2-0 g w",
            "GEOADD g 13.361389 38.115556 pal",
        ] {
            one(&mut d, c).await;
        }
        let mut r = connect(&addr, 2).await;
        let id = String::from_utf8(one(&mut r, "CLIENT ID").await).unwrap();
        one(&mut r, "SUBSCRIBE __redis__:invalidate").await;
        let mut t = connect(&addr, 2).await;
        let on = format!(
            "CLIENT TRACKING ON REDIRECT {}",
            id.trim_matches([':', '\r', '\n'])
        );
        assert_eq!(one(&mut t, &on).await, b"+OK\r\n");
        let mut got = Vec::new();
        for line in TRACKED_RESP2 {
            got.push((
                *line,
                String::from_utf8_lossy(&one(&mut t, line).await).into_owned(),
            ));
        }
        outs.push(got);
    }
    for (d, p) in outs[0].iter().zip(&outs[1]) {
        assert_eq!(p, d, "through sidecache, then directly");
    }
    proxy.stop().await;
}
