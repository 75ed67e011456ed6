//! A busy upstream shows through: while a script runs past
//! `lua-time-limit`, PING through sidecache answers Redis's `-BUSY`,
//! `/readyz` names the busy node, and SCRIPT KILL / FUNCTION KILL reach
//! Redis (also when the script's own upstream connection is the one shared
//! connection, `--pool-size 1`), as does FUNCTION STATS; afterwards PING
//! is `+PONG` again.
//! Redis's own test "Timedout read-only scripts can be killed by SCRIPT
//! KILL", through the proxy. A restarted node's `-LOADING` is waited out;
//! a script's or DEBUG ERROR's reply that reads like the node's state
//! changes nothing.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use support::{http_get, raw, raw_on, Observed, RedisServer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// One command in RESP (arguments may hold spaces).
fn resp(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    out.into_bytes()
}

async fn call(addr: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&raw(addr, &resp(args), 1).await).into_owned()
}

/// A client that sent `args` and has not read the reply yet (Redis's
/// "deferring client").
async fn deferred(addr: &str, args: &[&str]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&resp(args)).await.unwrap();
    s
}

/// Polls `/readyz` until it answers `want` (10 s at most); the last body.
async fn readyz_until(http: &str, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(http, "/readyz").await;
        if status == want {
            return body;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {status}: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// PING until it answers `+PONG` (5 s at most).
async fn pong_again(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = call(addr, &["PING"]).await;
        if r == "+PONG\r\n" {
            return;
        }
        assert!(Instant::now() < deadline, "PING stayed {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The busy part of Redis's test, for a script started by `start` and
/// ended by `kill`, which `killer` sends (a connection of its own).
async fn busy_then_killed(proxy: &Observed, redis: &RedisServer, start: &[&str], kill: &[&str]) {
    let mut script = deferred(&proxy.addr.to_string(), start).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ping = call(&proxy.addr.to_string(), &["PING"]).await;
    assert!(ping.starts_with("-BUSY"), "PING while busy: {ping:?}");
    // PING with a message, and from a RESP3 client: Redis's error too.
    let ping = call(&proxy.addr.to_string(), &["PING", "hello"]).await;
    assert!(ping.starts_with("-BUSY"), "PING msg while busy: {ping:?}");
    let mut r3 = TcpStream::connect(&proxy.addr.to_string()).await.unwrap();
    let out = raw_on(
        &mut r3,
        &[resp(&["HELLO", "3"]), resp(&["PING"])].concat(),
        2,
    )
    .await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("\r\n-BUSY"), "RESP3 PING while busy: {out:?}");
    let body = readyz_until(&proxy.http.to_string(), 503).await;
    assert!(
        body.starts_with(&format!("upstream {} busy: BUSY", redis.addr())),
        "/readyz while busy: {body:?}"
    );
    assert_eq!(body.lines().count(), 1, "{body:?}");
    let killed = call(&proxy.addr.to_string(), kill).await;
    assert_eq!(killed, "+OK\r\n", "{kill:?}");
    // The script's client gets the script's error.
    let out = raw_on(&mut script, b"", 1).await;
    assert!(out.starts_with(b"-"), "{:?}", String::from_utf8_lossy(&out));
    tokio::time::sleep(Duration::from_millis(200)).await;
    pong_again(&proxy.addr.to_string()).await;
    assert_eq!(
        call(&proxy.addr.to_string(), &["PING", "hello"]).await,
        "$5\r\nhello\r\n"
    );
    assert_eq!(readyz_until(&proxy.http.to_string(), 200).await, "ready\n");
    assert_eq!(
        call(&proxy.addr.to_string(), &["SET", "k", "v"]).await,
        "+OK\r\n"
    );
    assert_eq!(
        call(&proxy.addr.to_string(), &["GET", "k"]).await,
        "$1\r\nv\r\n"
    );
    // Nothing running now: Redis's own answer.
    let r = call(&proxy.addr.to_string(), kill).await;
    assert!(r.starts_with("-NOTBUSY"), "{r:?}");
}

async fn busy_redis() -> RedisServer {
    let redis = RedisServer::start(&[]);
    let r = call(&redis.addr(), &["CONFIG", "SET", "lua-time-limit", "10"]).await;
    assert_eq!(r, "+OK\r\n");
    redis
}

#[tokio::test]
async fn script_kill_from_another_connection() {
    let redis = busy_redis().await;
    let proxy = Observed::start(&redis.url(), &[]).await;
    assert_eq!(call(&proxy.addr.to_string(), &["PING"]).await, "+PONG\r\n");
    assert_eq!(readyz_until(&proxy.http.to_string(), 200).await, "ready\n");
    let eval = ["EVAL", "while true do end", "0"];
    busy_then_killed(&proxy, &redis, &eval, &["SCRIPT", "KILL"]).await;
    // Twice: the state comes and goes.
    busy_then_killed(&proxy, &redis, &eval, &["SCRIPT", "KILL"]).await;
}

#[tokio::test]
async fn script_kill_when_the_upstream_connection_is_shared() {
    let redis = busy_redis().await;
    // One connection per (database, protocol): the killer's commands
    // would queue behind the script on it.
    let proxy = Observed::start(&redis.url(), &["--pool-size", "1"]).await;
    let eval = ["EVAL", "while true do end", "0"];
    busy_then_killed(&proxy, &redis, &eval, &["SCRIPT", "KILL"]).await;
}

#[tokio::test]
async fn function_kill_ends_a_busy_fcall() {
    let redis = busy_redis().await;
    let proxy = Observed::start(&redis.url(), &["--pool-size", "1"]).await;
    let lib = "#!lua name=lib\nredis.register_function{function_name='spin', callback=function() while true do end end, flags={'no-writes'}}";
    assert_eq!(
        call(&proxy.addr.to_string(), &["FUNCTION", "LOAD", lib]).await,
        "$3\r\nlib\r\n"
    );
    let fcall = ["FCALL", "spin", "0"];
    busy_then_killed(&proxy, &redis, &fcall, &["FUNCTION", "KILL"]).await;
}

/// FUNCTION STATS, which Redis answers while a script runs, reports the
/// running function through sidecache too, though the only shared
/// connection (`--pool-size 1`) is the one the FCALL waits on (Redis's
/// test "FUNCTION - test function kill").
#[tokio::test]
async fn function_stats_names_the_running_function() {
    let redis = busy_redis().await;
    let proxy = Observed::start(&redis.url(), &["--pool-size", "1"]).await;
    let addr = proxy.addr.to_string();
    let lib = "#!lua name=lib\nredis.register_function{function_name='spin', callback=function() while true do end end, flags={'no-writes'}}";
    assert_eq!(
        call(&addr, &["FUNCTION", "LOAD", lib]).await,
        "$3\r\nlib\r\n"
    );
    // Idle: no running script.
    let idle = call(&addr, &["FUNCTION", "STATS"]).await;
    assert!(
        idle.starts_with("*4\r\n$14\r\nrunning_script\r\n$-1\r\n"),
        "{idle:?}"
    );
    let mut script = deferred(&addr, &["FCALL", "spin", "0"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let stats = call(&addr, &["FUNCTION", "STATS"]).await;
    assert!(started.elapsed() < Duration::from_secs(1), "{stats:?}");
    assert!(
        stats.contains("running_script") && stats.contains("$4\r\nspin\r\n"),
        "{stats:?}"
    );
    assert!(stats.contains("$5\r\nFCALL\r\n"), "{stats:?}");
    assert_eq!(call(&addr, &["FUNCTION", "KILL"]).await, "+OK\r\n");
    let out = raw_on(&mut script, b"", 1).await;
    assert!(out.starts_with(b"-"), "{:?}", String::from_utf8_lossy(&out));
}

#[tokio::test]
async fn a_node_that_answers_nothing_gets_a_bounded_wait() {
    let redis = RedisServer::start(&["--enable-debug-command", "yes"]);
    let proxy = Observed::start(&redis.url(), &["--connect-timeout", "1"]).await;
    let _sleeper = deferred(&proxy.addr.to_string(), &["DEBUG", "SLEEP", "3"]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let ping = call(&proxy.addr.to_string(), &["PING"]).await;
    assert!(
        ping.starts_with("-ERR upstream") && ping.contains("did not answer in time"),
        "{ping:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(2500));
    pong_again(&proxy.addr.to_string()).await;
}

/// A client's own error replies are not the node's state: a script that
/// returns `READONLY …`, `LOADING …`, `MASTERDOWN …` or `BUSY …` as its
/// error (and `DEBUG ERROR`) reaches the client as Redis sent it, and
/// sidecache neither reconnects (as for a demoted primary) nor marks the
/// node in trouble.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_scripted_error_changes_nothing() {
    let redis = RedisServer::start(&["--enable-debug-command", "yes"]);
    let proxy = Observed::start(&redis.url(), &[]).await;
    let addr = proxy.addr.to_string();
    for text in [
        "READONLY You can't write against a read only replica.",
        "LOADING Redis is loading the dataset in memory",
        "MASTERDOWN Link with MASTER is down",
        "BUSY Redis is busy running a script.",
    ] {
        let script = format!("return redis.error_reply(\"{text}\")");
        for _ in 0..20 {
            let r = call(&addr, &["EVAL", &script, "0"]).await;
            assert_eq!(r, format!("-{text}\r\n"));
        }
        let r = call(&addr, &["DEBUG", "ERROR", text]).await;
        assert_eq!(r, format!("-{text}\r\n"));
    }
    let info = call(&addr, &["INFO", "proxy"]).await;
    assert_eq!(
        support::info_field(&info, "upstream_readonly_reconnects"),
        0,
        "{info}"
    );
    assert!(info.contains("upstream_health:ok\r\n"), "{info}");
    assert_eq!(call(&addr, &["PING"]).await, "+PONG\r\n");
    let (status, body) = http_get(&proxy.http.to_string(), "/readyz").await;
    assert_eq!(status, 200, "{body}");
    proxy.stop().await;
}

/// A restarted Redis answers `-LOADING` while it loads its data: reads
/// through sidecache wait it out (held, then sent again), as a cluster
/// client would, instead of passing the error on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_after_a_restart_is_waited_out() {
    const KEYS: usize = 5000;
    // 5000 keys at 300 µs each: about 1.5 s of loading, during which
    // Redis answers (-LOADING) every KiB it loads.
    let mut redis = RedisServer::start(&[
        "--key-load-delay",
        "300",
        "--loading-process-events-interval-bytes",
        "1024",
    ]);
    let mut direct = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut p = redis::pipe();
    for i in 0..KEYS {
        p.cmd("SET")
            .arg(format!("k{i}"))
            .arg(format!("v{i}"))
            .ignore();
    }
    let () = p.query_async(&mut direct).await.unwrap();
    assert_eq!(support::cli(redis.port, &["save"]), "OK");
    let proxy = support::Proxy::start(&redis.url(), &["--connect-timeout", "1"]).await;
    let mut c = proxy.conn().await;
    let v: String = redis::cmd("GET")
        .arg("k0")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(v, "v0");
    redis.restart();
    let info = support::cli(redis.port, &["info", "persistence"]);
    assert!(info.contains("loading:1"), "Redis was not loading: {info}");
    for i in 1..50 {
        let v: redis::RedisResult<String> = redis::cmd("GET")
            .arg(format!("k{i}"))
            .query_async(&mut c)
            .await;
        assert_eq!(v.as_deref().ok(), Some(format!("v{i}").as_str()), "{v:?}");
    }
    let info = String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await)
        .into_owned();
    assert!(
        support::info_field(&info, "failover_absorbed") > 0,
        "{info}"
    );
    proxy.stop().await;
}
