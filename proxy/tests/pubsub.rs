//! Pub/sub and MONITOR through sidecache against real redis-servers: a
//! subscribing client is spliced to an upstream connection of its own, so
//! everything it sees is Redis's own.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use support::{enc, info_field, raw, raw_on, Cluster, Proxy, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn send(s: &mut TcpStream, lines: &[&str], replies: usize) -> String {
    let input: String = lines.iter().map(|l| enc(l)).collect();
    String::from_utf8_lossy(&raw_on(s, input.as_bytes(), replies).await).into_owned()
}

/// Reads until `want` has arrived (or fails after 5 s).
async fn read_until(s: &mut TcpStream, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = tokio::time::timeout(left, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{want:?} never came; got {:?}",
                    String::from_utf8_lossy(&got)
                )
            })
            .unwrap();
        assert!(n > 0, "closed before {want:?}");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

async fn spliced(proxy: &Proxy) -> u64 {
    let info = String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await)
        .into_owned();
    info_field(&info, "spliced_clients")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_redis_own_replies_and_messages() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    // The same session directly and through sidecache, byte for byte.
    let script: &[(&str, usize)] = &[
        ("UNSUBSCRIBE", 1),
        ("PUNSUBSCRIBE a b", 2),
        ("SUBSCRIBE news", 1),
        ("PING", 1),
        ("GET k", 1),
        ("PSUBSCRIBE n*", 1),
        ("UNSUBSCRIBE news", 1),
        ("PUNSUBSCRIBE", 1),
        ("PING", 1),
    ];
    let mut outs = Vec::new();
    for addr in [redis.addr(), proxy.addr.to_string()] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let mut out = String::new();
        for (line, n) in script {
            out.push_str(&send(&mut s, &[line], *n).await);
        }
        outs.push(out);
    }
    assert_eq!(outs[1], outs[0]);
    // Messages published through sidecache reach a subscriber through it.
    let mut sub = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        send(&mut sub, &["SUBSCRIBE jobs"], 1).await,
        "*3\r\n$9\r\nsubscribe\r\n$4\r\njobs\r\n:1\r\n"
    );
    assert_eq!(spliced(&proxy).await, 1);
    let mut publisher = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        send(&mut publisher, &["PUBLISH jobs hello"], 1).await,
        ":1\r\n"
    );
    read_until(
        &mut sub,
        "*3\r\n$7\r\nmessage\r\n$4\r\njobs\r\n$5\r\nhello\r\n",
    )
    .await;
    // A subscriber that leaves frees its connection, upstream too.
    drop(sub);
    let deadline = Instant::now() + Duration::from_secs(5);
    while spliced(&proxy).await != 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        send(&mut publisher, &["PUBSUB NUMSUB jobs"], 1).await,
        "*2\r\n$4\r\njobs\r\n:0\r\n"
    );
    proxy.stop().await;
}

/// RESP3: pushes and replies interleave on one connection; keyspace
/// notifications of writes made through sidecache (write-behind too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_and_keyspace_notifications() {
    let redis = RedisServer::start(&["--notify-keyspace-events", "KEA"]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut sub = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(send(&mut sub, &["HELLO 3"], 1).await.starts_with('%'));
    assert_eq!(
        send(&mut sub, &["PSUBSCRIBE __keyspace@0__:*"], 1).await,
        ">3\r\n$10\r\npsubscribe\r\n$16\r\n__keyspace@0__:*\r\n:1\r\n"
    );
    let mut w = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(send(&mut w, &["SET watched 1"], 1).await, "+OK\r\n");
    read_until(&mut sub, "$22\r\n__keyspace@0__:watched\r\n$3\r\nset\r\n").await;
    // A normal command between pushes gets its reply.
    assert_eq!(send(&mut sub, &["GET watched"], 1).await, "$1\r\n1\r\n");
    proxy.stop().await;
}

/// Cluster: SUBSCRIBE sees messages published on any master (Redis Cluster
/// broadcasts them); SSUBSCRIBE goes to its shard channel's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_pubsub() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut sub = TcpStream::connect(proxy.addr).await.unwrap();
    send(&mut sub, &["SUBSCRIBE chan"], 1).await;
    for n in &cluster.nodes {
        raw(
            &n.addr(),
            &enc(&format!("PUBLISH chan from{}", n.port)).into_bytes(),
            1,
        )
        .await;
        read_until(&mut sub, &format!("from{}", n.port)).await;
    }
    let mut ssub = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        send(&mut ssub, &["SSUBSCRIBE {s}ch"], 1).await,
        "*3\r\n$10\r\nssubscribe\r\n$5\r\n{s}ch\r\n:1\r\n"
    );
    let mut p = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(send(&mut p, &["SPUBLISH {s}ch hi"], 1).await, ":1\r\n");
    read_until(&mut ssub, "$8\r\nsmessage\r\n$5\r\n{s}ch\r\n$2\r\nhi\r\n").await;
    proxy.stop().await;
}

/// MONITOR shows what reaches Redis, in Redis's own format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_streams_upstream_commands() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut m = TcpStream::connect(proxy.addr).await.unwrap();
    m.write_all(b"MONITOR\r\n").await.unwrap();
    read_until(&mut m, "+OK\r\n").await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(send(&mut c, &["INCR seen"], 1).await, ":1\r\n");
    read_until(&mut m, "\"INCR\" \"seen\"").await;
    proxy.stop().await;
}
