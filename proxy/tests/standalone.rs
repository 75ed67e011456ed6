//! End-to-end against a real standalone redis-server: replies through the
//! proxy must equal replies from Redis itself, byte for byte.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use redis::AsyncCommands;
use support::{eventually_raw, raw, raw_on, read_to_close, Proxy, RedisServer};
use tokio::io::AsyncWriteExt;

/// Encodes commands as RESP arrays.
fn resp(cmds: &[&[&[u8]]]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in cmds {
        out.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
        for a in *c {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }
    out
}

fn split(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
}

/// Runs the same script on Redis directly and through the proxy (each on a
/// fresh, flushed database) and compares every reply byte for byte.
async fn same_as_redis(redis: &RedisServer, proxy: &Proxy, script: &[&str]) {
    let cmds: Vec<Vec<Vec<u8>>> = script.iter().map(|l| split(l)).collect();
    let refs: Vec<Vec<&[u8]>> = cmds
        .iter()
        .map(|c| c.iter().map(|a| a.as_slice()).collect())
        .collect();
    let refs2: Vec<&[&[u8]]> = refs.iter().map(|c| c.as_slice()).collect();
    let input = resp(&refs2);
    raw(&redis.addr(), b"FLUSHALL\r\n", 1).await;
    let direct = raw(&redis.addr(), &input, script.len()).await;
    raw(&redis.addr(), b"FLUSHALL\r\n", 1).await;
    let proxied = raw(&proxy.addr.to_string(), &input, script.len()).await;
    assert_eq!(
        String::from_utf8_lossy(&proxied),
        String::from_utf8_lossy(&direct),
        "script: {script:?}"
    );
}

#[tokio::test]
async fn every_data_type_matches_redis() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    same_as_redis(
        &redis,
        &proxy,
        &[
            "SET s hello",
            "GET s",
            "APPEND s world",
            "STRLEN s",
            "GETRANGE s 0 3",
            "SETRANGE s 0 J",
            "GET s",
            "INCR n",
            "INCRBY n 10",
            "DECR n",
            "INCRBYFLOAT f 1.5",
            "GET nope",
            "MSET a 1 b 2",
            "MGET a b nope",
            "SETNX a 9",
            "GETSET a 3",
            "GETDEL a",
            "EXISTS a b",
            "DEL b nope",
            "TYPE s",
            "LPUSH l a b c",
            "RPUSH l d",
            "LRANGE l 0 -1",
            "LPOP l",
            "RPOP l",
            "LLEN l",
            "LINDEX l 0",
            "LSET l 0 z",
            "LREM l 0 z",
            "SADD st a b c",
            "SCARD st",
            "SISMEMBER st a",
            "SREM st a",
            "SMEMBERS nope",
            "SINTERCARD 1 st",
            "HSET h f v g w",
            "HGET h f",
            "HMGET h f g x",
            "HLEN h",
            "HDEL h g",
            "HGETALL h",
            "HINCRBY h n 5",
            "HEXISTS h f",
            "ZADD z 1 a 2 b 3 c",
            "ZRANGE z 0 -1 WITHSCORES",
            "ZSCORE z b",
            "ZINCRBY z 5 a",
            "ZRANK z a",
            "ZREM z c",
            "ZCARD z",
            "ZRANGEBYSCORE z -inf +inf",
            "XADD x 1-1 f v",
            "XLEN x",
            "XRANGE x - +",
            "XREAD COUNT 1 STREAMS x 0",
            "PFADD hll a b c",
            "PFCOUNT hll",
            "SETBIT bits 7 1",
            "GETBIT bits 7",
            "BITCOUNT bits",
            "GEOADD geo 13.361389 38.115556 Palermo",
            "GEOPOS geo Palermo",
            "EXPIRE s 100",
            "TTL s",
            "PERSIST s",
            "TTL s",
            "RENAME s s2",
            "GET s2",
            "EVAL return.1 0",
            "EVAL return_redis.call('get',KEYS[1]) 1 s2",
            "GET",
            "SET k",
            "NOSUCHCMD a b",
            "LPUSH s2 x",
            "INCR s2",
            "HGET",
            "OBJECT ENCODING n",
            "DBSIZE",
            "EXISTS s2 s2 nope",
            "UNLINK s2",
            "TOUCH n z",
            "ECHO hi",
            "PING",
            "PING hello",
            "ECHO",
            "PING a b",
        ],
    )
    .await;
    proxy.stop().await;
}

#[tokio::test]
async fn binary_empty_and_large_values() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut c = proxy.conn().await;
    let binary: Vec<u8> = (0..=255u8).chain([b'\r', b'\n', 0, b'$', b'*']).collect();
    let _: () = c.set(&binary[..], &binary[..]).await.unwrap();
    let got: Vec<u8> = c.get(&binary[..]).await.unwrap();
    assert_eq!(got, binary);
    let _: () = c.set("empty", "").await.unwrap();
    let got: Vec<u8> = c.get("empty").await.unwrap();
    assert!(got.is_empty());
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let _: () = c.set("big", &big[..]).await.unwrap();
    let got: Vec<u8> = c.get("big").await.unwrap();
    assert_eq!(got, big);
    // And what reached Redis is the same value.
    let mut d = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let direct: Vec<u8> = d.get("big").await.unwrap();
    assert_eq!(direct, big);
    proxy.stop().await;
}

#[tokio::test]
async fn pipeline_of_ten_thousand_in_order() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut c = proxy.conn().await;
    let mut p = redis::pipe();
    for i in 0..10_000 {
        p.cmd("SET").arg(format!("k{i}")).arg(i).ignore();
        p.cmd("INCR").arg(format!("k{i}"));
    }
    let r: Vec<i64> = p.query_async(&mut c).await.unwrap();
    assert_eq!(r.len(), 10_000);
    for (i, v) in r.iter().enumerate() {
        assert_eq!(*v, i as i64 + 1);
    }
    // Raw pipelining: 5,000 PINGs in one write, inline and multibulk mixed.
    let mut input = Vec::new();
    for i in 0..5000 {
        if i % 2 == 0 {
            input.extend_from_slice(b"PING\r\n");
        } else {
            input.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        }
    }
    let out = raw(&proxy.addr.to_string(), &input, 5000).await;
    assert_eq!(out, b"+PONG\r\n".repeat(5000));
    proxy.stop().await;
}

#[tokio::test]
async fn malformed_input_gets_redis_errors_and_close() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let cases: &[&[u8]] = &[
        b"*3000000000\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n",
        b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n",
        b"*1\r\nfoo\r\n",
        b"set \"a b\"c\r\n",
        b"PING\r\n*abc\r\n",
    ];
    for case in cases {
        if *case == b"set \"a b\"c\r\n" && support::is_valkey() && support::server_major() >= 9 {
            // Valkey 9 reads `"a b"c` as `a bc` (SET with one argument)
            // and keeps the connection; sidecache splits as its upstream.
            let direct = raw(&redis.addr(), case, 1).await;
            let proxied = raw(&proxy.addr.to_string(), case, 1).await;
            assert_eq!(
                String::from_utf8_lossy(&proxied),
                String::from_utf8_lossy(&direct)
            );
            assert!(proxied.starts_with(b"-ERR wrong number of arguments"));
            continue;
        }
        let mut d = tokio::net::TcpStream::connect(redis.addr()).await.unwrap();
        d.write_all(case).await.unwrap();
        let direct = read_to_close(&mut d).await;
        let mut p = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        p.write_all(case).await.unwrap();
        let proxied = read_to_close(&mut p).await;
        assert_eq!(
            String::from_utf8_lossy(&proxied),
            String::from_utf8_lossy(&direct),
            "input {:?}",
            String::from_utf8_lossy(case)
        );
        assert!(
            proxied.starts_with(b"-ERR Protocol error")
                || proxied.starts_with(b"+PONG\r\n-ERR Protocol error")
        );
    }
    // Unknown commands and wrong arity keep the connection open.
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let out = raw_on(&mut s, b"FOO\r\nGET\r\nPING\r\n", 3).await;
    assert!(String::from_utf8_lossy(&out).ends_with("+PONG\r\n"));
    proxy.stop().await;
}

#[tokio::test]
async fn resp3_after_hello_3() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let script = b"HSET h a 1\r\nHGETALL h\r\nGET nope\r\nZADD z 1.5 m\r\nZSCORE z m\r\nSMEMBERS nope\r\nEXISTS h\r\n";
    let run = |addr: String| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let hello = raw_on(&mut s, b"HELLO 3\r\n", 1).await;
        assert!(
            hello.starts_with(b"%7\r\n"),
            "HELLO 3 replies a map: {:?}",
            String::from_utf8_lossy(&hello)
        );
        raw_on(&mut s, script, 7).await
    };
    raw(&redis.addr(), b"FLUSHALL\r\n", 1).await;
    let direct = run(redis.addr()).await;
    raw(&redis.addr(), b"FLUSHALL\r\n", 1).await;
    let proxied = run(proxy.addr.to_string()).await;
    assert_eq!(
        String::from_utf8_lossy(&proxied),
        String::from_utf8_lossy(&direct)
    );
    assert!(
        proxied.windows(4).any(|w| w == b"%1\r\n"),
        "RESP3 map in HGETALL"
    );
    // HELLO errors as Redis words them.
    let out = raw(
        &proxy.addr.to_string(),
        b"HELLO 4\r\nHELLO x\r\nHELLO 3 FOO\r\n",
        3,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        "-NOPROTO unsupported protocol version\r\n-ERR Protocol version is not an integer or out of range\r\n-ERR Syntax error in HELLO option 'FOO'\r\n"
    );
    proxy.stop().await;
}

/// HELLO names the upstream's engine, version and modules as the server
/// does (Valkey: `valkey`, `9.1.2`, the `lua` module), with the
/// connection's own id.
#[tokio::test]
async fn hello_shows_the_upstreams_engine_version_and_modules() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    // The value after "id" is each connection's own.
    let without_id = |reply: Vec<u8>| {
        let text = String::from_utf8(reply).unwrap();
        let (head, rest) = text.split_once("$2\r\nid\r\n:").unwrap();
        let (_, tail) = rest.split_once("\r\n").unwrap();
        format!("{head}$2\r\nid\r\n:N\r\n{tail}")
    };
    for hello in ["HELLO 3\r\n", "HELLO 2\r\n", "HELLO\r\n"] {
        let direct = without_id(raw(&redis.addr(), hello.as_bytes(), 1).await);
        let proxied = without_id(raw(&proxy.addr.to_string(), hello.as_bytes(), 1).await);
        assert_eq!(proxied, direct, "{hello:?}");
    }
    let text = String::from_utf8(raw(&proxy.addr.to_string(), b"HELLO 3\r\n", 1).await).unwrap();
    let (engine, version) = support::server_engine();
    assert!(
        text.contains(&format!(
            "$6\r\nserver\r\n${}\r\n{engine}\r\n",
            engine.len()
        )) && text.contains(&format!(
            "$7\r\nversion\r\n${}\r\n{version}\r\n",
            version.len()
        )),
        "{engine} {version}: {text:?}"
    );
    // INFO and the metrics name the same engine and version.
    let info = String::from_utf8(raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await).unwrap();
    assert!(
        info.contains(&format!(
            "\r\nupstream_engine:{engine}\r\nupstream_version:{version}\r\n"
        )),
        "{info}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn select_travels_with_the_client() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let out = raw(
        &proxy.addr.to_string(),
        b"SELECT 5\r\nSET k five\r\nSELECT 0\r\nSET k zero\r\nSELECT 16\r\nSELECT x\r\n",
        6,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        "+OK\r\n+OK\r\n+OK\r\n+OK\r\n-ERR DB index is out of range\r\n-ERR value is not an integer or out of range\r\n"
    );
    eventually_raw(
        &redis.addr(),
        b"SELECT 5\r\nGET k\r\nSELECT 0\r\nGET k\r\n",
        4,
        "+OK\r\n$4\r\nfive\r\n+OK\r\n$4\r\nzero\r\n",
    )
    .await;
    // redis-rs with a db in the URL.
    let mut c = redis::Client::open(format!("{}/5", proxy.url()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let v: String = c.get("k").await.unwrap();
    assert_eq!(v, "five");
    proxy.stop().await;
}

#[tokio::test]
async fn handshake_commands_answered_locally() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let out = raw(
        &proxy.addr.to_string(),
        b"CLIENT SETNAME app-1\r\nCLIENT GETNAME\r\nCLIENT SETINFO LIB-NAME redis-py\r\nCLIENT SETINFO LIB-VER 5.0\r\nCLIENT SETNAME \"bad name\"\r\nCLIENT SETINFO nope x\r\nCLIENT BOGUS\r\nAUTH x\r\n",
        8,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        "+OK\r\n$5\r\napp-1\r\n+OK\r\n+OK\r\n-ERR Client names cannot contain spaces, newlines or special characters.\r\n-ERR Unrecognized option 'nope'\r\n-ERR unknown subcommand 'BOGUS'. Try CLIENT HELP.\r\n-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n"
    );
    let info = raw(&proxy.addr.to_string(), b"CLIENT INFO\r\n", 1).await;
    assert!(String::from_utf8_lossy(&info).contains(" resp=2"));
    let info = raw(&proxy.addr.to_string(), b"INFO\r\n", 1).await;
    let text = String::from_utf8_lossy(&info);
    assert!(
        text.contains("# Proxy\r\n") && text.contains("redis_version:"),
        "{text}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn requirepass_gates_commands() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &["--requirepass", "s3cret"]).await;
    let out = raw(
        &proxy.addr.to_string(),
        b"GET k\r\nAUTH nope\r\nAUTH s3cret\r\nGET k\r\n",
        4,
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        "-NOAUTH Authentication required.\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n$-1\r\n"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn unsupported_commands_are_refused_clearly() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let out = raw(
        &proxy.addr.to_string(),
        b"SYNC\r\nPSYNC ? -1\r\nREPLCONF listening-port 1\r\nPING\r\n",
        4,
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert_eq!(
        text.matches("-ERR replication commands cannot be proxied")
            .count(),
        3,
        "{text}"
    );
    assert!(text.ends_with("+PONG\r\n"));
    proxy.stop().await;
}

#[tokio::test]
async fn unix_socket_serves_and_is_replaced_when_stale() {
    let redis = RedisServer::start(&[]);
    let dir = std::env::temp_dir().join(format!("sidecache-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.sock");
    // A stale socket file left by a dead process.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let p = path.to_str().unwrap().to_owned();
    let proxy = Proxy::start(
        &redis.url(),
        &["--unix-socket", &p, "--unix-socket-mode", "0600"],
    )
    .await;
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let mut c = redis::Client::open(format!("unix://{p}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = c.set("u", "via-unix").await.unwrap();
    let v: String = c.get("u").await.unwrap();
    assert_eq!(v, "via-unix");
    // A second proxy on the same live socket is refused.
    let args = [
        "sidecache",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "redis://127.0.0.1:1",
        "--unix-socket",
        &p,
    ];
    let cfg = sidecache::Config::from_options(
        <sidecache::Options as clap::Parser>::try_parse_from(args).unwrap(),
    )
    .unwrap();
    assert!(sidecache::Listeners::bind(&cfg).await.is_err());
    proxy.stop().await;
    assert!(!path.exists(), "socket removed on shutdown");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_work() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut c = proxy.conn().await;
    let mut p = redis::pipe();
    for i in 0..2000 {
        p.cmd("SET").arg(format!("g{i}")).arg(i).ignore();
    }
    let pending = tokio::spawn(async move { p.query_async::<()>(&mut c).await });
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let addr = proxy.addr;
    proxy.stop().await;
    // The pipeline either completed in full or the connection closed
    // between batches; nothing hangs, and new connections are refused.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), pending)
        .await
        .expect("no hang");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn maxclients_refuses_with_redis_error() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &["--maxclients", "1"]).await;
    let mut first = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let _ = raw_on(&mut first, b"PING\r\n", 1).await;
    let mut second = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let out = read_to_close(&mut second).await;
    assert_eq!(out, b"-ERR max number of clients reached\r\n");
    drop(first);
    proxy.stop().await;
}

#[test]
fn unreachable_upstream_fails_fast_with_one_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &format!("redis://127.0.0.1:{port}"),
            "--log-level",
            "error",
        ])
        .env("SIDECACHE_METRICS_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("unreachable"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args(["--bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sidecache"))
        .args(["--upstream", "redis://h", "--listen", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen"));
}

#[tokio::test]
async fn upstream_restart_gives_errors_then_recovers() {
    let mut redis = RedisServer::start(&[]);
    let proxy = Proxy::start(
        &redis.url(),
        &["--connect-timeout", "1", "--upstream-timeout", "1"],
    )
    .await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(raw_on(&mut s, b"SET k v\r\n", 1).await, b"+OK\r\n");
    eventually_raw(&redis.addr(), b"GET k\r\n", 1, "$1\r\nv\r\n").await;
    redis.kill();
    // While upstream is down: what must go upstream is held for the node
    // to come back, and gets a clear error at --upstream-timeout, not a
    // hang; the client connection stays usable. (The L1 holds nothing of
    // it: its invalidation channel is lost, and under optin the written
    // value left the L1 once it landed.)
    let t0 = std::time::Instant::now();
    let out = raw_on(&mut s, b"GET other\r\nPING\r\nGET k\r\n", 3).await;
    let held = t0.elapsed();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("-ERR upstream"), "{text}");
    assert!(text.contains("\r\n+PONG\r\n-ERR upstream"), "{text}");
    assert!(
        held >= std::time::Duration::from_millis(800) && held < std::time::Duration::from_secs(5),
        "answered after {held:?}"
    );
    // A write acknowledged while upstream is down is flushed once it is back.
    assert_eq!(raw_on(&mut s, b"SET k again\r\n", 1).await, b"+OK\r\n");
    redis.restart();
    eventually_raw(&redis.addr(), b"GET k\r\n", 1, "$5\r\nagain\r\n").await;
    // The multiplexed connections reconnect by themselves.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = raw_on(&mut s, b"STRLEN k\r\n", 1).await;
        if out == b":5\r\n" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no recovery: {}",
            String::from_utf8_lossy(&out)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    proxy.stop().await;
}

/// A stalled upstream (SIGSTOP): forwarded commands and L1 misses get
/// `-ERR upstream … did not answer in time` after `--upstream-timeout`,
/// never a hang. Once it resumes, the late replies are not handed to later
/// commands: every reply matches its command again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_upstream_times_out_forwarded_commands() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(
        &redis.url(),
        &["--upstream-timeout", "0.5", "--pool-size", "1"],
    )
    .await;
    let pa = proxy.addr.to_string();
    assert_eq!(
        raw(&pa, b"SET seen 1\r\nGET seen\r\n", 2).await,
        b"+OK\r\n$1\r\n1\r\n"
    );
    // Nothing queued for write-behind: the commands below only wait for
    // their own replies.
    support::drained(&pa).await;
    // Read once it landed, so the L1 holds it (optin, the default, drops a
    // written value once its write landed; this read fills it again).
    assert_eq!(raw(&pa, b"GET seen\r\n", 1).await, b"$1\r\n1\r\n");
    redis.signal("STOP");
    let started = std::time::Instant::now();
    let out = raw(&pa, b"INCR counter\r\nGET missing\r\nTTL seen\r\n", 3).await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(
        text.matches(" did not answer in time\r\n").count(),
        3,
        "{text}"
    );
    assert!(text.starts_with("-ERR upstream 127.0.0.1:"), "{text}");
    assert!(
        took >= std::time::Duration::from_millis(450) && took < std::time::Duration::from_secs(3),
        "answered after {took:?}"
    );
    // The L1 still answers what it holds, without upstream.
    assert_eq!(raw(&pa, b"GET seen\r\n", 1).await, b"$1\r\n1\r\n");
    redis.signal("CONT");
    // The timed-out INCR ran late (its outcome was unknown, as for any
    // client timeout); each later reply belongs to its own command.
    assert_eq!(
        raw(
            &pa,
            b"INCR counter\r\nECHO x\r\nGET missing\r\nTTL seen\r\n",
            4
        )
        .await,
        b":2\r\n$1\r\nx\r\n$-1\r\n:-1\r\n"
    );
    proxy.stop().await;
}

/// CLIENT REPLY OFF / SKIP / ON drop replies exactly as Redis does.
#[tokio::test]
async fn client_reply_off_skip_on() {
    let redis = RedisServer::start(&[]);
    let upstream = RedisServer::start(&[]);
    let proxy = Proxy::start(&upstream.url(), &[]).await;
    let script = resp(&[
        &[b"CLIENT", b"REPLY", b"OFF"],
        &[b"SET", b"a", b"1"],
        &[b"INCR", b"n"],
        &[b"GET", b"a"],
        &[b"CLIENT", b"REPLY", b"ON"],
        &[b"GET", b"a"],
        &[b"CLIENT", b"REPLY", b"SKIP"],
        &[b"INCR", b"n"],
        &[b"GET", b"n"],
    ]);
    // Redis answers 3 of them: REPLY ON, GET a, GET n.
    let want = raw(&redis.addr(), &script, 3).await;
    assert_eq!(want, b"+OK\r\n$1\r\n1\r\n$1\r\n2\r\n");
    assert_eq!(raw(&proxy.addr.to_string(), &script, 3).await, want);
    // A SKIP after a read that went upstream: the next command's dispatch
    // answers the batch before it (a write-behind SET, a write after an
    // optin fill), and its reply is still the one skipped.
    for next in [&[b"SET".as_slice(), b"b", b"1"][..], &[b"INCR", b"m"]] {
        let script = resp(&[
            &[b"GET", b"missing"],
            &[b"CLIENT", b"REPLY", b"SKIP"],
            next,
            &[b"GET", b"missing"],
        ]);
        let want = raw(&redis.addr(), &script, 2).await;
        assert_eq!(want, b"$-1\r\n$-1\r\n");
        assert_eq!(raw(&proxy.addr.to_string(), &script, 2).await, want);
    }
    proxy.stop().await;
}

/// CLIENT LIST's `idle` counts, as Redis's does, the seconds since the
/// client last sent something, and `age` the seconds since it connected.
#[tokio::test]
async fn client_list_idle_counts_from_the_last_command() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut quiet = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        raw_on(&mut quiet, b"CLIENT SETNAME quiet\r\n", 1).await,
        b"+OK\r\n"
    );
    let line = |list: &[u8]| -> (u64, u64) {
        let list = String::from_utf8_lossy(list).into_owned();
        let l = list
            .lines()
            .find(|l| l.contains(" name=quiet "))
            .unwrap_or_else(|| panic!("no quiet client in {list}"))
            .to_owned();
        let field = |f: &str| -> u64 {
            l.split(' ')
                .find_map(|kv| kv.strip_prefix(f))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {f} in {l}"))
        };
        (field("age="), field("idle="))
    };
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let (age, idle) = line(&raw(&proxy.addr.to_string(), b"CLIENT LIST\r\n", 1).await);
    assert!(
        age >= 2 && idle >= 2 && idle <= age,
        "age={age} idle={idle}"
    );
    assert_eq!(raw_on(&mut quiet, b"PING\r\n", 1).await, b"+PONG\r\n");
    let (age, idle) = line(&raw(&proxy.addr.to_string(), b"CLIENT LIST\r\n", 1).await);
    assert!(age >= 2 && idle <= 1, "after a PING: age={age} idle={idle}");
    proxy.stop().await;
}
