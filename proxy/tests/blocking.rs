//! Blocking commands through sidecache against real redis-servers: each
//! runs on a held connection of its own, with the command's own timeout
//! (0: for ever), after the client's queued writes, and a client that
//! leaves while blocked is unblocked upstream so nothing is popped for it.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use support::{enc, info_field, raw, raw_on, Cluster, Proxy, RedisServer};
use tokio::net::TcpStream;

async fn send(s: &mut TcpStream, lines: &[&str], replies: usize) -> String {
    let input: String = lines.iter().map(|l| enc(l)).collect();
    String::from_utf8_lossy(&raw_on(s, input.as_bytes(), replies).await).into_owned()
}

async fn proxy_info(proxy: &Proxy) -> String {
    String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await).into_owned()
}

/// Waits until Redis itself has `want` blocked clients (sidecache counts a
/// command blocked a moment before Redis has it).
async fn redis_blocked(redis: &RedisServer, want: u64) {
    support::info_becomes(&redis.addr(), "clients", "blocked_clients", want).await;
}

/// Waits until `field` of INFO proxy is `want`.
async fn info_becomes(proxy: &Proxy, field: &str, want: u64) {
    support::info_becomes(&proxy.addr.to_string(), "proxy", field, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blpop_is_woken_by_another_client() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut a = TcpStream::connect(proxy.addr).await.unwrap();
    let waiter = tokio::spawn(async move {
        // Timeout 0: for ever. A PING pipelined behind it waits its turn.
        let out = send(&mut a, &["BLPOP q 0", "PING"], 2).await;
        (out, a)
    });
    info_becomes(&proxy, "blocked_clients", 1).await;
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(send(&mut b, &["RPUSH q x"], 1).await, ":1\r\n");
    let (out, mut a) = waiter.await.unwrap();
    assert_eq!(out, "*2\r\n$1\r\nq\r\n$1\r\nx\r\n+PONG\r\n");
    // Timeouts are the command's: nil after it (RESP2 and RESP3).
    let t = Instant::now();
    assert_eq!(send(&mut a, &["BRPOP q 0.2"], 1).await, "*-1\r\n");
    assert!(t.elapsed() >= Duration::from_millis(190));
    send(&mut a, &["HELLO 3"], 1).await;
    assert_eq!(send(&mut a, &["BLPOP q 0.05"], 1).await, "_\r\n");
    // Other blocking forms.
    assert_eq!(send(&mut b, &["ZADD z 1 m"], 1).await, ":1\r\n");
    assert_eq!(
        send(&mut b, &["BZPOPMIN z 1"], 1).await,
        "*3\r\n$1\r\nz\r\n$1\r\nm\r\n$1\r\n1\r\n"
    );
    assert_eq!(send(&mut b, &["RPUSH src a"], 1).await, ":1\r\n");
    assert_eq!(
        send(
            &mut b,
            &["BLMOVE src dst LEFT RIGHT 1", "LRANGE dst 0 -1"],
            2
        )
        .await,
        "$1\r\na\r\n*1\r\n$1\r\na\r\n"
    );
    // WAIT with no replica answers at once.
    assert_eq!(
        send(&mut b, &["SET w 1", "WAIT 0 100"], 2).await,
        "+OK\r\n:0\r\n"
    );
    assert_eq!(info_field(&proxy_info(&proxy).await, "blocked_clients"), 0);
    proxy.stop().await;
}

/// XREAD BLOCK with `$` sees an entry another client adds through sidecache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xread_block_sees_new_entries() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut a = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(send(&mut a, &["XADD s 1-1 f v"], 1).await.starts_with("$3"));
    let waiter = tokio::spawn(async move { send(&mut a, &["XREAD BLOCK 0 STREAMS s $"], 1).await });
    redis_blocked(&redis, 1).await;
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(send(&mut b, &["XADD s 2-1 g w"], 1).await, "$3\r\n2-1\r\n");
    let out = waiter.await.unwrap();
    assert_eq!(
        out,
        "*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n2-1\r\n*2\r\n$1\r\ng\r\n$1\r\nw\r\n"
    );
    // Without BLOCK it is a plain read.
    assert!(send(&mut b, &["XREAD STREAMS s 0"], 1)
        .await
        .starts_with("*1\r\n"));
    proxy.stop().await;
}

/// The client's write-behind writes reach upstream before its blocking
/// command: the SET below makes the key a string before BLPOP runs.
#[tokio::test]
async fn queued_writes_land_before_the_blocking_command() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut a = TcpStream::connect(proxy.addr).await.unwrap();
    let out = send(&mut a, &["SET s 1", "BLPOP s 0.1"], 2).await;
    assert!(out.starts_with("+OK\r\n-WRONGTYPE"), "{out}");
    proxy.stop().await;
}

/// A client killed while blocked: its command is unblocked upstream and its
/// held connection closed, so an element pushed afterwards stays in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_client_killed_loses_nothing() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    {
        let mut a = TcpStream::connect(proxy.addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut a, enc("BLPOP jobs 0").as_bytes())
            .await
            .unwrap();
        info_becomes(&proxy, "blocked_clients", 1).await;
    }
    // Unblocked and closed within a second.
    let t = Instant::now();
    info_becomes(&proxy, "blocked_clients", 0).await;
    info_becomes(&proxy, "session_connections_in_use", 0).await;
    assert!(t.elapsed() < Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let list =
            String::from_utf8_lossy(&raw(&redis.addr(), b"CLIENT LIST\r\n", 1).await).into_owned();
        if !list.contains("cmd=blpop") {
            break;
        }
        assert!(Instant::now() < deadline, "still blocked upstream: {list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(send(&mut b, &["RPUSH jobs j1"], 1).await, ":1\r\n");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(raw(&redis.addr(), b"LLEN jobs\r\n", 1).await, b":1\r\n");
    assert_eq!(
        info_field(&proxy_info(&proxy).await, "blocked_unblocked_on_disconnect"),
        1
    );
    proxy.stop().await;
}

/// Cluster: the keys must share a slot; the command goes to its master and
/// is woken by a push through sidecache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_blocking_follows_the_slot() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut a = TcpStream::connect(proxy.addr).await.unwrap();
    let out = send(&mut a, &["BLPOP {a}1 {b}2 0.1"], 1).await;
    assert!(out.starts_with("-CROSSSLOT"), "{out}");
    for key in ["{a}q", "{b}q", "{c}q"] {
        let line = format!("BLPOP {key} 0");
        let waiter = tokio::spawn(async move { send(&mut a, &[&line], 1).await.len() });
        info_becomes(&proxy, "blocked_clients", 1).await;
        let mut b = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(
            send(&mut b, &[&format!("RPUSH {key} x")], 1).await,
            ":1\r\n"
        );
        let len = waiter.await.unwrap();
        assert_eq!(
            len,
            format!("*2\r\n${}\r\n{key}\r\n$1\r\nx\r\n", key.len()).len()
        );
        a = TcpStream::connect(proxy.addr).await.unwrap();
    }
    proxy.stop().await;
}

/// 1,000 clients blocked at once, each on a held connection of its own:
/// all are served when their lists get an element, and sidecache's memory
/// per blocked client stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_blocked_clients() {
    const N: usize = 1000;
    let redis = RedisServer::start(&["--maxclients", "4000"]);
    let proxy = support::ProxyProcess::start(&redis.url(), &["--max-session-connections", "1100"]);
    let before = support::proc_status_bytes(proxy.pid(), "VmRSS");
    let mut waiters = Vec::new();
    for i in 0..N {
        let addr = proxy.addr();
        waiters.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            send(&mut s, &[&format!("BLPOP many:{i} 0")], 1).await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info =
            String::from_utf8_lossy(&raw(&proxy.addr(), b"INFO proxy\r\n", 1).await).into_owned();
        if info_field(&info, "blocked_clients") == N as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "not all blocked: {info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let blocked_rss = support::proc_status_bytes(proxy.pid(), "VmRSS");
    let mut p = TcpStream::connect(proxy.addr()).await.unwrap();
    let pushes: Vec<String> = (0..N).map(|i| format!("RPUSH many:{i} v")).collect();
    let lines: Vec<&str> = pushes.iter().map(String::as_str).collect();
    send(&mut p, &lines, N).await;
    for (i, w) in waiters.into_iter().enumerate() {
        let key = format!("many:{i}");
        assert_eq!(
            w.await.unwrap(),
            format!("*2\r\n${}\r\n{key}\r\n$1\r\nv\r\n", key.len())
        );
    }
    let per_client = blocked_rss.saturating_sub(before) / N as u64;
    eprintln!(
        "{N} blocked clients: RSS {} MB -> {} MB, {} bytes per blocked client",
        before >> 20,
        blocked_rss >> 20,
        per_client
    );
    // Two sockets, a task and a connection's buffers each.
    assert!(
        per_client < 64 * 1024,
        "{per_client} bytes per blocked client"
    );
    proxy.terminate();
}

/// CLIENT UNBLOCK with a sidecache client id reaches the held connection
/// that client blocks on, with TIMEOUT (nil) and ERROR semantics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_unblock_through_sidecache() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    for (mode, want) in [
        ("", "*-1\r\n"),
        (" TIMEOUT", "*-1\r\n"),
        (
            " ERROR",
            "-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n",
        ),
    ] {
        let mut a = TcpStream::connect(proxy.addr).await.unwrap();
        let id = send(&mut a, &["CLIENT ID"], 1).await;
        let id = id.trim_start_matches(':').trim().to_owned();
        let waiter = tokio::spawn(async move { send(&mut a, &["BLPOP never 0"], 1).await });
        redis_blocked(&redis, 1).await;
        // CLIENT LIST shows it blocked, as Redis does (once sidecache has
        // read the held connection's id, right after Redis blocked it).
        let deadline = Instant::now() + Duration::from_secs(5);
        let list = loop {
            let list = send(&mut b, &[&format!("CLIENT LIST ID {id}")], 1).await;
            if list.contains(" flags=b ") || Instant::now() > deadline {
                break list;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            list.contains(&format!("id={id} ")) && list.contains(" flags=b "),
            "{list}"
        );
        assert_eq!(list.matches("id=").count(), 1, "one client line: {list}");
        assert_eq!(
            send(&mut b, &[&format!("CLIENT UNBLOCK {id}{mode}")], 1).await,
            ":1\r\n"
        );
        assert_eq!(waiter.await.unwrap(), want);
        assert_eq!(
            send(&mut b, &[&format!("CLIENT UNBLOCK {id}")], 1).await,
            ":0\r\n"
        );
    }
    proxy.stop().await;
}

/// Redis's `unit/type/list` "BRPOPLPUSH with multiple blocked clients":
/// two clients block on one list back to back, the first towards a key
/// that is not a list; a push then reaches the first (WRONGTYPE, the
/// element stays) and then the second. Redis serves blocked clients first
/// come, first served, and so must sidecache: before the runtime's LIFO
/// slot was turned off it read the second socket first in almost every
/// round, and the first client then blocked for ever.
/// On the proxy's own runtime (`sidecache::runtime`), with one thread as
/// on a 2-CPU machine (tokio's current-thread runtime).
#[test]
fn blocked_clients_are_served_in_the_order_they_blocked() {
    sidecache::runtime(1).unwrap().block_on(served_in_order());
}

async fn served_in_order() {
    use tokio::io::AsyncWriteExt;
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut r = TcpStream::connect(proxy.addr).await.unwrap();
    for round in 0..20 {
        send(
            &mut r,
            &["DEL blist target1 target2", "SET target1 nolist"],
            2,
        )
        .await;
        let mut a = TcpStream::connect(proxy.addr).await.unwrap();
        let mut b = TcpStream::connect(proxy.addr).await.unwrap();
        // Both connections idle, as a client's are between commands (a
        // task started just now reads at once, before one woken).
        send(&mut a, &["PING"], 1).await;
        send(&mut b, &["PING"], 1).await;
        // Every other round the first client has a write queued before
        // its command (it waits for that write to land; the second does
        // not have to).
        let first = if round % 2 == 0 {
            enc("BRPOPLPUSH blist target1 0")
        } else {
            enc(&format!("SET mine{round} x")) + &enc("BRPOPLPUSH blist target1 0")
        };
        // Back to back: both arrive before sidecache reads either.
        a.write_all(first.as_bytes()).await.unwrap();
        b.write_all(enc("BRPOPLPUSH blist target2 0").as_bytes())
            .await
            .unwrap();
        redis_blocked(&redis, 2).await;
        assert_eq!(send(&mut r, &["LPUSH blist foo"], 1).await, ":1\r\n");
        let replies = if round % 2 == 0 { 1 } else { 2 };
        let got_a = String::from_utf8_lossy(&raw_on(&mut a, b"", replies).await).into_owned();
        assert!(
            got_a.ends_with(
                "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
            ),
            "round {round}: the first client blocked got {got_a:?}"
        );
        assert_eq!(
            String::from_utf8_lossy(&raw_on(&mut b, b"", 1).await),
            "$3\r\nfoo\r\n",
            "round {round}"
        );
        assert_eq!(
            send(&mut r, &["LRANGE target2 0 -1"], 1).await,
            "*1\r\n$3\r\nfoo\r\n"
        );
    }
}
