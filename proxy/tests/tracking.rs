//! CLIENT TRACKING served to sidecache's own clients, side by side with a
//! direct connection to the same Redis: the same commands, the same replies
//! and the same invalidation messages (RESP3 pushes, RESP2 REDIRECT
//! messages), for default mode, OPTIN, OPTOUT, BCAST with PREFIX, NOLOOP,
//! REDIRECT and FLUSHALL; and a read of a key sidecache does not follow is
//! invalidated at once.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::Duration;

use support::{arrived, enc, one_std, raw_on, Cluster, Proxy, RedisServer};
use tokio::net::TcpStream;

async fn one(s: &mut TcpStream, line: &str) -> String {
    String::from_utf8_lossy(&raw_on(s, enc(line).as_bytes(), 1).await).into_owned()
}

fn push(key: &str) -> String {
    format!(
        ">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{key}\r\n",
        key.len()
    )
}

/// The pushes in `s`, sorted: messages about different keys may come in
/// another order through sidecache (each master's, and each of its fill
/// connections', invalidations travel on their own connection).
fn messages(s: &str) -> Vec<String> {
    let mut m: Vec<String> = s
        .split(">2\r\n")
        .filter(|p| !p.is_empty())
        .map(|p| format!(">2\r\n{p}"))
        .collect();
    m.sort();
    m
}

/// Marks a step compared only under `--tracking optin`.
const OPTIN_ONLY: &str = "optin only: ";

const NULL_PUSH: &str = ">2\r\n$10\r\ninvalidate\r\n_\r\n";
const WAIT: Duration = Duration::from_millis(300);

/// One scenario run against `addr` (sidecache or Redis), writes made by
/// `writer` (always direct to Redis): what the tracking client saw.
async fn scenario(addr: &str, writer: &str) -> Vec<String> {
    let mut w = TcpStream::connect(writer).await.unwrap();
    let mut seen = Vec::new();
    for k in ["a", "b", "c", "user:1", "other"] {
        one(&mut w, &format!("SET {k} 0")).await;
    }
    // Default mode, RESP3.
    let mut t = TcpStream::connect(addr).await.unwrap();
    one(&mut t, "HELLO 3").await;
    seen.push(one(&mut t, "CLIENT TRACKING ON").await);
    seen.push(one(&mut t, "GET a").await);
    seen.push(one(&mut t, "MGET b c").await);
    one(&mut w, "SET a 1").await;
    seen.push(arrived(&mut t, WAIT).await);
    one(&mut w, "MSET b 1 c 1").await;
    seen.push(arrived(&mut t, WAIT).await);
    // Not read again: no second message.
    one(&mut w, "SET a 2").await;
    seen.push(arrived(&mut t, WAIT).await);
    // Its own write: the reply, then the message.
    seen.push(one(&mut t, "GET a").await);
    one(&mut t, "SET a 3").await;
    seen.push(arrived(&mut t, WAIT).await);
    seen.push(one(&mut t, "CLIENT TRACKINGINFO").await);
    seen.push(one(&mut t, "CLIENT GETREDIR").await);
    seen.push(one(&mut t, "CLIENT TRACKING OFF").await);
    seen.push(one(&mut t, "GET b").await);
    one(&mut w, "SET b 2").await;
    seen.push(arrived(&mut t, WAIT).await);

    // NOLOOP: its own writes say nothing, others' do.
    let mut n = TcpStream::connect(addr).await.unwrap();
    one(&mut n, "HELLO 3").await;
    seen.push(one(&mut n, "CLIENT TRACKING ON NOLOOP").await);
    seen.push(one(&mut n, "GET c").await);
    seen.push(one(&mut n, "SET c 5").await);
    seen.push(arrived(&mut n, WAIT).await);
    seen.push(one(&mut n, "GET c").await);
    one(&mut w, "SET c 6").await;
    seen.push(arrived(&mut n, WAIT).await);

    // A value it wrote itself, read back at once: no message until
    // another writer changes it (through sidecache the read goes to Redis,
    // which then follows the key, rather than to the written value).
    let mut own = TcpStream::connect(addr).await.unwrap();
    one(&mut own, "HELLO 3").await;
    seen.push(one(&mut own, "CLIENT TRACKING ON").await);
    seen.push(one(&mut own, "SET mine 1").await);
    seen.push(one(&mut own, "GET mine").await);
    seen.push(arrived(&mut own, WAIT).await);
    one(&mut w, "SET mine 2").await;
    seen.push(arrived(&mut own, WAIT).await);

    // OPTIN: only after CLIENT CACHING YES.
    let mut o = TcpStream::connect(addr).await.unwrap();
    one(&mut o, "HELLO 3").await;
    seen.push(one(&mut o, "CLIENT TRACKING ON OPTIN").await);
    seen.push(one(&mut o, "GET a").await);
    one(&mut w, "SET a 4").await;
    seen.push(arrived(&mut o, WAIT).await);
    seen.push(one(&mut o, "CLIENT CACHING YES").await);
    seen.push(one(&mut o, "GET a").await);
    one(&mut w, "SET a 5").await;
    seen.push(arrived(&mut o, WAIT).await);

    // OPTOUT: all but after CLIENT CACHING NO.
    let mut x = TcpStream::connect(addr).await.unwrap();
    one(&mut x, "HELLO 3").await;
    seen.push(one(&mut x, "CLIENT TRACKING ON OPTOUT").await);
    seen.push(one(&mut x, "CLIENT CACHING NO").await);
    seen.push(one(&mut x, "GET b").await);
    one(&mut w, "SET b 3").await;
    seen.push(arrived(&mut x, WAIT).await);
    seen.push(one(&mut x, "GET b").await);
    one(&mut w, "SET b 4").await;
    seen.push(arrived(&mut x, WAIT).await);

    // BCAST with a prefix: changes under it (through sidecache: of the
    // keys it follows, so read through it, and of every key written
    // through it).
    let mut bc = TcpStream::connect(addr).await.unwrap();
    one(&mut bc, "HELLO 3").await;
    seen.push(one(&mut bc, "CLIENT TRACKING ON BCAST PREFIX user:").await);
    seen.push(one(&mut bc, "GET user:1").await);
    seen.push(arrived(&mut bc, WAIT).await);
    one(&mut w, "SET user:1 x").await;
    one(&mut w, "SET other x").await;
    seen.push(arrived(&mut bc, WAIT).await);
    // Writes by another client of the same server: one message per write
    // (an MSET's keys in one, in byte order; through sidecache, not again
    // when Redis reports the followed user:1 back), and one when a key's
    // time to live runs out.
    let mut m = TcpStream::connect(addr).await.unwrap();
    one(&mut m, "MSET user:2 a user:1 b").await;
    seen.push(arrived(&mut bc, WAIT).await);
    one(&mut m, "SET user:3 v PX 100").await;
    seen.push(arrived(&mut bc, Duration::from_millis(900)).await);
    // A transaction over several round trips (a held connection), NOLOOP:
    // its own writes tell it nothing, its read inside MULTI is answered
    // with EXEC, and the key its write gave 1 ms to live expires once, in
    // one message after EXEC's reply (Redis runs the SET at EXEC, not when
    // it is queued).
    let mut tx = TcpStream::connect(addr).await.unwrap();
    one(&mut tx, "HELLO 3").await;
    seen.push(one(&mut tx, "CLIENT TRACKING ON BCAST PREFIX tx: NOLOOP").await);
    one(&mut tx, "MULTI").await;
    one(&mut tx, "SET tx:k v PX 1").await;
    one(&mut tx, "SET tx:other v").await;
    one(&mut tx, "GET tx:k").await;
    // (Under `--tracking bcast` Redis also reports the transaction's writes
    // to sidecache, and that report may come after EXEC's reply has made
    // the client's reads news again: a second message, so this step is
    // compared under optin, the default, only.)
    seen.push(
        OPTIN_ONLY.to_owned()
            + &one(&mut tx, "EXEC").await
            + &arrived(&mut tx, Duration::from_millis(900)).await,
    );

    // Scripts: a script that runs no read tracks nothing; one that reads
    // the key it declares tracks it. (Redis 7.0 tracks every declared key
    // of a script that reads anything, Redis 7.2 and Valkey the keys it
    // read: these two scripts get the same from both.)
    let mut sc = TcpStream::connect(addr).await.unwrap();
    one(&mut sc, "HELLO 3").await;
    seen.push(one(&mut sc, "CLIENT TRACKING ON").await);
    let no_read = "EVAL redis.call('set','s:3','bar') 2 s:1 s:2";
    let reads = "EVAL_RO return(redis.call('get',KEYS[1])) 1 s:1";
    seen.push(one(&mut sc, no_read).await);
    one(&mut w, "MSET s:2 2 s:1 2").await;
    seen.push(arrived(&mut sc, WAIT).await);
    seen.push(one(&mut sc, reads).await);
    seen.push(arrived(&mut sc, WAIT).await);
    one(&mut w, "MSET s:2 3 s:1 3").await;
    seen.push(arrived(&mut sc, WAIT).await);

    // REDIRECT to a RESP2 subscriber; FLUSHALL is one message with no keys.
    let mut r = TcpStream::connect(addr).await.unwrap();
    let id = one(&mut r, "CLIENT ID").await;
    let id = id.trim_start_matches(':').trim_end();
    one(&mut r, "SUBSCRIBE __redis__:invalidate").await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    seen.push(one(&mut c, &format!("CLIENT TRACKING ON REDIRECT {id}")).await);
    seen.push(one(&mut c, "GET a").await);
    one(&mut w, "SET a 6").await;
    seen.push(arrived(&mut r, WAIT).await);
    seen.push(one(&mut c, "GET a").await);
    one(&mut w, "FLUSHALL").await;
    seen.push(arrived(&mut r, WAIT).await);
    seen.push(arrived(&mut bc, Duration::from_millis(50)).await);
    seen.push(arrived(&mut t, Duration::from_millis(50)).await);
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_clients_see_what_redis_would_send() {
    let redis = RedisServer::start(&[]);
    let direct = scenario(&redis.addr(), &redis.addr()).await;
    for mode in ["optin", "bcast"] {
        let proxy = Proxy::start(&redis.url(), &["--tracking", mode]).await;
        let through = scenario(&proxy.addr.to_string(), &redis.addr()).await;
        for (i, (d, p)) in direct.iter().zip(&through).enumerate() {
            if mode != "optin" && d.starts_with(OPTIN_ONLY) {
                continue;
            }
            assert_eq!(
                messages(p),
                messages(d),
                "step {i} ({mode}): sidecache {p:?}, Redis {d:?}"
            );
        }
        assert_eq!(through.len(), direct.len());
        proxy.stop().await;
    }
    // The scenario saw messages at all (it could not pass on silence).
    assert!(direct.iter().any(|s| s == &push("a")), "{direct:?}");
    assert!(direct.iter().any(|s| s.contains("__redis__:invalidate")));
    assert!(direct.iter().any(|s| s == NULL_PUSH), "{direct:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_sidecache_does_not_follow_is_invalidated_at_once() {
    let redis = RedisServer::start(&[]);
    // The L1 off: sidecache follows no key it reads on a client's
    // connection, so such a tracked read is invalidated right after its
    // reply, and no value is kept past a change.
    let proxy = Proxy::start(&redis.url(), &["--l1-max-bytes", "0"]).await;
    let mut w = TcpStream::connect(redis.addr()).await.unwrap();
    one(&mut w, "SET k v").await;
    // A RESP2 client, its messages REDIRECTed to a subscriber. A read
    // whose RESP2 reply sidecache can show from RESP3 goes to a fill lane,
    // which Redis follows: no message until the key changes, as from
    // Redis. One it cannot (GEOPOS: a nil array in RESP2) goes its usual
    // way, which Redis does not follow for sidecache: told at once.
    let mut r = TcpStream::connect(proxy.addr).await.unwrap();
    let id = one(&mut r, "CLIENT ID").await;
    let id = id.trim_start_matches(':').trim_end().to_owned();
    one(&mut r, "SUBSCRIBE __redis__:invalidate").await;
    let mut t = TcpStream::connect(proxy.addr).await.unwrap();
    one(&mut t, &format!("CLIENT TRACKING ON REDIRECT {id}")).await;
    let message = |key: &str| {
        format!(
            "*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n${}\r\n{key}\r\n",
            key.len()
        )
    };
    assert_eq!(one(&mut t, "GET k").await, "$1\r\nv\r\n");
    assert_eq!(one(&mut t, "STRLEN k").await, ":1\r\n");
    assert_eq!(arrived(&mut r, WAIT).await, "");
    one(&mut w, "SET k v2").await;
    assert_eq!(arrived(&mut r, WAIT).await, message("k"));
    one(&mut w, "SET k v").await;
    assert_eq!(one(&mut t, "GEOPOS g m").await, "*1\r\n*-1\r\n");
    assert_eq!(arrived(&mut r, WAIT).await, message("g"));
    // A RESP3 client's read goes to a fill lane, which Redis follows
    // (the L1 off or not): no message until the key changes.
    let mut t3 = TcpStream::connect(proxy.addr).await.unwrap();
    one(&mut t3, "HELLO 3").await;
    one(&mut t3, "CLIENT TRACKING ON").await;
    assert_eq!(one(&mut t3, "GET k").await, "$1\r\nv\r\n");
    assert_eq!(arrived(&mut t3, WAIT).await, "");
    one(&mut w, "SET k v2").await;
    assert_eq!(arrived(&mut t3, WAIT).await, push("k"));
    one(&mut w, "SET k v").await;
    // With the L1 on, a key read on a fill lane is followed, whether it
    // exists or not (Redis tracks what that connection read): no message
    // until it changes.
    let proxy2 = Proxy::start(&redis.url(), &[]).await;
    let mut t2 = TcpStream::connect(proxy2.addr).await.unwrap();
    one(&mut t2, "HELLO 3").await;
    one(&mut t2, "CLIENT TRACKING ON").await;
    assert_eq!(one(&mut t2, "GET missing").await, "_\r\n");
    assert_eq!(arrived(&mut t2, WAIT).await, "");
    one(&mut w, "SET missing now").await;
    assert_eq!(arrived(&mut t2, WAIT).await, push("missing"));
    // A followed key: no message until it changes.
    one(&mut t2, "GET k").await;
    assert_eq!(arrived(&mut t2, WAIT).await, "");
    one(&mut w, "SET k w").await;
    assert_eq!(arrived(&mut t2, WAIT).await, push("k"));
    proxy.stop().await;
    proxy2.stop().await;
}

/// What is readable once the first bytes after `line` arrived: a blocking
/// read (woken by the first write that reaches the socket), then what else
/// a non-blocking read finds at once, as a client-side cache checks for
/// pending invalidations when it next serves a read.
fn at_reply(s: &mut std::net::TcpStream, line: &str) -> String {
    use std::io::{ErrorKind, Read, Write};
    s.write_all(enc(line).as_bytes()).unwrap();
    let mut buf = [0u8; 4096];
    let mut n = s.read(&mut buf).unwrap();
    s.set_nonblocking(true).unwrap();
    loop {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(m) => n += m,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    s.set_nonblocking(false).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// A client-side cache (redis-py's) looks for invalidations only when it
/// is about to serve a read: the one a client's own write causes must be
/// there once its reply is, as Redis writes both in one output buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_write_is_invalidated_in_the_write_of_its_reply() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let direct = redis.addr();
    let through = proxy.addr.to_string();
    tokio::task::spawn_blocking(move || {
        let mut w = std::net::TcpStream::connect(&direct).unwrap();
        for addr in [direct.clone(), through] {
            let mut t = std::net::TcpStream::connect(&addr).unwrap();
            t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            one_std(&mut t, "HELLO 3");
            one_std(&mut t, "CLIENT TRACKING ON");
            for round in 0..50 {
                let key = format!("own:{round}");
                one_std(&mut w, &format!("SET {key} a"));
                // Read twice: a fill (so sidecache follows the key), then
                // an L1 hit through sidecache.
                assert_eq!(at_reply(&mut t, &format!("GET {key}")), "$1\r\na\r\n");
                assert_eq!(at_reply(&mut t, &format!("GET {key}")), "$1\r\na\r\n");
                let got = at_reply(&mut t, &format!("SET {key} b"));
                assert_eq!(
                    got,
                    format!("+OK\r\n{}", push(&key)),
                    "{addr} round {round}"
                );
            }
        }
    })
    .await
    .unwrap();
    proxy.stop().await;
}

/// rueidis caches a read as `CLIENT CACHING YES`, `MULTI`, `PTTL k`, the
/// read, `EXEC` (OPTIN): as on Redis, the CLIENT CACHING covers the whole
/// transaction, so a later change of the key reaches the client (through
/// sidecache at the latest then; earlier when sidecache does not follow
/// the key). The same with the CLIENT CACHING queued inside the MULTI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optin_reads_inside_a_transaction_are_tracked() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut w = TcpStream::connect(redis.addr()).await.unwrap();
    for addr in [redis.addr(), proxy.addr.to_string()] {
        let mut t = TcpStream::connect(&addr).await.unwrap();
        one(&mut t, "HELLO 3").await;
        one(&mut t, "CLIENT TRACKING ON OPTIN").await;
        for (round, inside) in [(0, false), (1, true), (2, false)] {
            let key = format!("rue:{round}");
            one(&mut w, &format!("SET {key} v")).await;
            let tx = if inside {
                format!("MULTI\r\nCLIENT CACHING YES\r\nPTTL {key}\r\nGET {key}\r\nEXEC\r\n")
            } else {
                format!("CLIENT CACHING YES\r\nMULTI\r\nPTTL {key}\r\nGET {key}\r\nEXEC\r\n")
            };
            {
                use tokio::io::AsyncWriteExt;
                t.write_all(tx.as_bytes()).await.unwrap();
            }
            let reply = arrived(&mut t, WAIT).await;
            let value = ":-1\r\n$1\r\nv\r\n";
            let Some(at) = reply.find(value) else {
                panic!("{addr} round {round}: {reply:?}");
            };
            // What came after EXEC's reply.
            let mut early = reply[at + value.len()..].to_string();
            // An untracked read after EXEC (the CLIENT CACHING is spent).
            one(&mut t, "GET other").await;
            early += &arrived(&mut t, WAIT).await;
            one(&mut w, &format!("SET {key} changed")).await;
            one(&mut w, "SET other changed").await;
            // Nothing before the key changed: the value may be kept (through
            // sidecache the transaction ran where Redis follows its reads).
            assert_eq!(early, "", "{addr} round {round}: {reply:?}");
            let seen = early + &arrived(&mut t, WAIT).await;
            // Everything after EXEC's reply: the key's message, once.
            assert_eq!(seen, push(&key), "{addr} round {round}: {reply:?}");
        }
    }
    proxy.stop().await;
}

/// What a REDIRECT target hears when keys sidecache follows (on either
/// fill connection) are written through it and read back at once, in
/// database `db`, then changed by another writer: through sidecache,
/// Redis's report of sidecache's own write must not reach the client as a
/// change it did not see.
async fn own_writes_then_others(addr: &str, writer: &str, db: u16) -> Vec<String> {
    let keys: Vec<String> = (0..20).map(|i| format!("own{db}:{i}")).collect();
    let mut w = TcpStream::connect(writer).await.unwrap();
    one(&mut w, &format!("SELECT {db}")).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    one(&mut s, &format!("SELECT {db}")).await;
    for k in &keys {
        one(&mut w, &format!("SET {k} 0")).await;
        // Read through sidecache: it follows the key from now on.
        one(&mut s, &format!("GET {k}")).await;
    }
    let mut r = TcpStream::connect(addr).await.unwrap();
    let id = one(&mut r, "CLIENT ID").await;
    let id = id.trim_start_matches(':').trim_end();
    one(&mut r, "SUBSCRIBE __redis__:invalidate").await;
    let mut t = TcpStream::connect(addr).await.unwrap();
    one(&mut t, &format!("SELECT {db}")).await;
    one(&mut t, &format!("CLIENT TRACKING ON REDIRECT {id}")).await;
    let mut seen = Vec::new();
    for k in &keys {
        one(&mut s, &format!("SET {k} 1")).await;
        seen.push(one(&mut t, &format!("GET {k}")).await);
    }
    if addr != writer {
        support::drained(addr).await;
    }
    seen.push(arrived(&mut r, WAIT).await);
    for k in &keys {
        one(&mut w, &format!("SET {k} 2")).await;
    }
    seen.push(arrived(&mut r, WAIT).await);
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_writes_are_not_reported_again_in_any_database() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    for db in [0, 9] {
        let direct = own_writes_then_others(&redis.addr(), &redis.addr(), db).await;
        let through = own_writes_then_others(&proxy.addr.to_string(), &redis.addr(), db).await;
        let n = direct.len();
        // Nothing after the writes through the proxy; every key's message
        // after the other writer's.
        assert_eq!(direct[n - 2], "", "db {db}");
        assert_eq!(direct[n - 1].matches("invalidate").count(), 20, "db {db}");
        for (i, (d, p)) in direct.iter().zip(&through).enumerate() {
            assert_eq!(sorted_lines(p), sorted_lines(d), "db {db} step {i}");
        }
    }
    proxy.stop().await;
}

/// Redis applies a lowered `tracking-table-max-keys` at its next command
/// and tells the readers of the keys it stops following before that
/// command's reply (Redis's regression test #11715): through sidecache,
/// a client in MULTI hears of it before its next QUEUED too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_tracking_table_bound_is_told_before_the_next_reply() {
    let redis = RedisServer::start(&["--enable-debug-command", "yes"]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut admin = TcpStream::connect(redis.addr()).await.unwrap();
    // Only commands evict, as in Redis's test: no cron.
    assert_eq!(one(&mut admin, "DEBUG PAUSE-CRON 1").await, "+OK\r\n");
    for addr in [redis.addr(), proxy.addr.to_string()] {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        one(&mut c, "CONFIG SET tracking-table-max-keys 2").await;
        let mut t = TcpStream::connect(&addr).await.unwrap();
        one(&mut t, "HELLO 3").await;
        one(&mut t, "CLIENT TRACKING ON").await;
        assert_eq!(one(&mut t, "MGET 1{tag} 2{tag}").await, "*2\r\n_\r\n_\r\n");
        one(&mut t, "MULTI").await;
        assert_eq!(
            one(&mut c, "CONFIG SET tracking-table-max-keys 1").await,
            "+OK\r\n"
        );
        let got = one(&mut t, "PING").await + &arrived(&mut t, WAIT).await;
        assert!(
            got == format!("{}+QUEUED\r\n", push("1{tag}"))
                || got == format!("{}+QUEUED\r\n", push("2{tag}")),
            "{addr}: {got:?}"
        );
        one(&mut t, "DISCARD").await;
        one(&mut c, "CONFIG SET tracking-table-max-keys 1000000").await;
    }
    one(&mut admin, "DEBUG PAUSE-CRON 0").await;
    proxy.stop().await;
}

/// The RESP2 pub/sub messages of `s` (one per key), sorted.
fn sorted_lines(s: &str) -> Vec<String> {
    let mut m: Vec<String> = s
        .split("*3\r\n")
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    m.sort();
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tracking_clients_hear_of_every_master() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut t = TcpStream::connect(proxy.addr).await.unwrap();
    one(&mut t, "HELLO 3").await;
    one(&mut t, "CLIENT TRACKING ON").await;
    let mut p = TcpStream::connect(proxy.addr).await.unwrap();
    // Keys on every master (they hash to different slots).
    let keys: Vec<String> = (0..30).map(|i| format!("key:{i}")).collect();
    for k in &keys {
        one(&mut p, &format!("SET {k} 0")).await;
    }
    support::drained(&proxy.addr.to_string()).await;
    for k in &keys {
        one(&mut t, &format!("GET {k}")).await;
    }
    // Settled: whatever was not followed was invalidated already.
    arrived(&mut t, WAIT).await;
    for k in &keys {
        one(&mut t, &format!("GET {k}")).await;
    }
    assert_eq!(arrived(&mut t, WAIT).await, "", "followed keys, no change");
    for (i, k) in keys.iter().enumerate() {
        let node = &cluster.nodes[cluster.node_for(k)];
        let mut d = TcpStream::connect(node.addr()).await.unwrap();
        one(&mut d, &format!("SET {k} {i}")).await;
        assert_eq!(arrived(&mut t, WAIT).await, push(k), "{k}");
    }
    proxy.stop().await;
}

/// A tracking client's scripts, another client writing directly to Redis:
/// what the tracking client was told after each write.
async fn script_scenario(addr: &str, writer: &str) -> Vec<String> {
    let mut w = TcpStream::connect(writer).await.unwrap();
    let mut t = TcpStream::connect(addr).await.unwrap();
    one(&mut t, "HELLO 3").await;
    assert_eq!(one(&mut t, "CLIENT TRACKING on").await, "+OK\r\n");
    one(&mut w, "MSET key1{t} 1 key2{t} 1").await;
    let mut seen = Vec::new();
    for (script, write) in [
        // Reads nothing: nothing is followed.
        (
            "EVAL redis.call('set','key3{t}','bar') 2 key1{t} key2{t}",
            "MSET key2{t} 2 key1{t} 2",
        ),
        // Reads key2 only: Redis 7.0 follows both keys it declares, Redis
        // 7.2 and Valkey only key2.
        (
            "EVAL redis.call('get','key2{t}') 2 key1{t} key2{t}",
            "MSET key2{t} 2 key3{t} 2",
        ),
        (
            "EVAL_RO redis.call('ping') 2 key1{t} key2{t}",
            "MSET key1{t} 2 key2{t} 2",
        ),
        (
            "EVAL_RO return(redis.call('get',KEYS[1])) 2 key1{t} key2{t}",
            "MSET key1{t} 3 key2{t} 3",
        ),
    ] {
        one(&mut t, script).await;
        one(&mut w, write).await;
        seen.push(arrived(&mut t, WAIT).await);
    }
    seen
}

/// Which keys a script leaves followed for a tracking client is the
/// server's rule: every declared key once the script reads (Redis 7.0),
/// or only the keys its reads read (Redis 7.2, Valkey); a script that reads
/// nothing leaves nothing. Side by side with a direct client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_leave_followed_what_the_server_would() {
    let redis = RedisServer::start(&[]);
    let direct = script_scenario(&redis.addr(), &redis.addr()).await;
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let through = script_scenario(&proxy.addr.to_string(), &redis.addr()).await;
    for (i, (d, p)) in direct.iter().zip(&through).enumerate() {
        assert_eq!(
            messages(p),
            messages(d),
            "step {i}: sidecache {p:?}, server {d:?}"
        );
    }
    assert_eq!(direct[0], "", "a script that read nothing");
    assert!(direct[1].contains(&push("key2{t}")), "{direct:?}");
    proxy.stop().await;
}

/// A tracking client's transaction that reads keys it writes, sent whole
/// (one batch: a fill lane) or one command per round trip (a held
/// connection): what it hears after EXEC and when another writer changes
/// the keys. As on Redis: its own write tells it only of a key it was
/// following before, and the read after the write keeps the key followed.
async fn tx_reads_own_writes(addr: &str, writer: &str, whole: bool) -> Vec<String> {
    let mut w = TcpStream::connect(writer).await.unwrap();
    let mut t = TcpStream::connect(addr).await.unwrap();
    one(&mut t, "HELLO 3").await;
    one(&mut t, "CLIENT TRACKING ON").await;
    let tag = if whole { "whole" } else { "held" };
    let (fresh, known) = (format!("txf:{tag}"), format!("txk:{tag}"));
    one(&mut w, &format!("SET {known} 0")).await;
    let mut seen = vec![one(&mut t, &format!("GET {known}")).await];
    let cmds = [
        "MULTI".to_string(),
        format!("SET {fresh} 1"),
        format!("SET {known} 1"),
        format!("GET {fresh}"),
        format!("GET {known}"),
        "EXEC".to_string(),
    ];
    if whole {
        use tokio::io::AsyncWriteExt;
        let all: String = cmds.iter().map(|c| enc(c)).collect();
        t.write_all(all.as_bytes()).await.unwrap();
        seen.push(arrived(&mut t, WAIT).await);
    } else {
        for c in &cmds {
            seen.push(one(&mut t, c).await);
        }
        // What came after EXEC's reply.
        seen.push(arrived(&mut t, WAIT).await);
    }
    one(&mut w, &format!("SET {fresh} 2")).await;
    seen.push(arrived(&mut t, WAIT).await);
    one(&mut w, &format!("SET {known} 2")).await;
    seen.push(arrived(&mut t, WAIT).await);
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_reads_its_writes_keeps_them_followed() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    for whole in [true, false] {
        let direct = tx_reads_own_writes(&redis.addr(), &redis.addr(), whole).await;
        let through = tx_reads_own_writes(&proxy.addr.to_string(), &redis.addr(), whole).await;
        assert_eq!(through, direct, "whole {whole}");
        // The other writer's changes were heard, each once.
        let tag = if whole { "whole" } else { "held" };
        let n = direct.len();
        assert_eq!(direct[n - 2], push(&format!("txf:{tag}")), "{direct:?}");
        assert_eq!(direct[n - 1], push(&format!("txk:{tag}")), "{direct:?}");
    }
    proxy.stop().await;
}

/// A RESP3 tracking client writes a key it read whose registration
/// another writer's change (or a FLUSHALL) had ended, reads it back, and
/// the other writer changes it again: what the client was told after each
/// step. sidecache re-reads the written key in the write's own batch
/// (`MGET`, which registers it again): that read, like any, ends the wait
/// for the write's echo, so the next change is reported, not taken for
/// the echo of sidecache's own write.
async fn written_after_a_lost_registration(addr: &str, writer: &str) -> Vec<String> {
    let mut w = TcpStream::connect(writer).await.unwrap();
    let mut t = TcpStream::connect(addr).await.unwrap();
    one(&mut t, "HELLO 3").await;
    one(&mut t, "CLIENT TRACKING on").await;
    let mut seen = Vec::new();
    for (i, ended_by) in ["SET lost:k z", "FLUSHALL"].into_iter().enumerate() {
        seen.push(one(&mut t, &format!("SET lost:k x{i}")).await);
        seen.push(one(&mut t, "GET lost:k").await);
        one(&mut w, ended_by).await;
        seen.push(arrived(&mut t, WAIT).await);
        seen.push(one(&mut t, &format!("SET lost:k w{i}")).await);
        // Read once the write landed (and its re-read refilled the L1): a
        // hit, no read of its own upstream.
        if addr != writer {
            support::drained(addr).await;
        }
        seen.push(arrived(&mut t, WAIT).await);
        seen.push(one(&mut t, "GET lost:k").await);
        one(&mut w, "SET lost:k y").await;
        seen.push(arrived(&mut t, WAIT).await);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_after_a_lost_registration_keeps_others_reported() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let direct = written_after_a_lost_registration(&redis.addr(), &redis.addr()).await;
    let through = written_after_a_lost_registration(&proxy.addr.to_string(), &redis.addr()).await;
    // Directly: the other writer's last change is reported, each round.
    assert_eq!(direct[6], push("lost:k"));
    assert_eq!(direct[13], push("lost:k"));
    for (i, (d, p)) in direct.iter().zip(&through).enumerate() {
        assert_eq!(p, d, "step {i}: through sidecache, then directly");
    }
    proxy.stop().await;
}

/// Redis's `unit/tracking` "Tracking invalidation message of eviction
/// keys should be before response": a key the client follows, evicted by
/// `maxmemory` when its next command runs, is told of before that
/// command's reply. `admin` is a direct connection for the limits.
async fn eviction_told_before_the_reply(addr: &str, admin: &str) -> String {
    let mut a = TcpStream::connect(admin).await.unwrap();
    one(&mut a, "FLUSHALL").await;
    let mut t = TcpStream::connect(addr).await.unwrap();
    one(&mut t, "HELLO 3").await;
    one(&mut t, "CLIENT TRACKING on").await;
    let info = one(&mut a, "INFO memory").await;
    let field = |k: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let limit = field("used_memory:") - field("mem_not_counted_for_evict:") + 150 * 1024;
    one(&mut a, &format!("CONFIG SET maxmemory {limit}")).await;
    one(&mut a, "CONFIG SET maxmemory-policy volatile-random").await;
    one(&mut t, "SETEX volatile-key 10000 x").await;
    one(&mut t, "GET volatile-key").await;
    // Each step's bytes: its reply and what came with it.
    let mut out = String::new();
    for line in ["SETBIT big-key 1600000 0", "GETBIT big-key 0"] {
        out += &String::from_utf8_lossy(&raw_on(&mut t, enc(line).as_bytes(), 1).await);
        out += &arrived(&mut t, Duration::from_millis(100)).await;
        out.push('|');
    }
    one(&mut a, "CONFIG SET maxmemory 0").await;
    one(&mut a, "CONFIG SET maxmemory-policy noeviction").await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_is_told_before_the_reply_of_the_command_that_caused_it() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let direct = eviction_told_before_the_reply(&redis.addr(), &redis.addr()).await;
    assert_eq!(direct, format!(":0\r\n|{}:0\r\n|", push("volatile-key")));
    // Any command the server runs evicts once memory is over the limit:
    // the proxy's heartbeat PING (once a second) landing between the two
    // steps evicts the key then, and the report comes with the first
    // step's reply, as it would for any other client's command there. So
    // up to three tries, each from a flushed server.
    let mut through = String::new();
    for _ in 0..3 {
        through = eviction_told_before_the_reply(&proxy.addr.to_string(), &redis.addr()).await;
        if through == direct {
            break;
        }
    }
    assert_eq!(through, direct);
    proxy.stop().await;
}
