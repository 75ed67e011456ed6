//! Transactions through sidecache against real redis-servers: MULTI/EXEC/
//! DISCARD/WATCH/UNWATCH answered exactly as Redis answers them, standalone
//! and cluster, with write-behind and the L1 kept out of the transaction.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::Duration;

use support::{enc, info_field, raw, raw_on, Cluster, Proxy, RedisServer};
use tokio::net::TcpStream;

/// Sends `lines` (one command each, arguments split on spaces) as one
/// pipeline and returns the raw replies (`replies` frames).
async fn pipeline(s: &mut TcpStream, lines: &[&str], replies: usize) -> String {
    let input: String = lines.iter().map(|l| enc(l)).collect();
    String::from_utf8_lossy(&raw_on(s, input.as_bytes(), replies).await).into_owned()
}

/// The same script on Redis directly and through sidecache (each on a fresh
/// database), every reply byte for byte; `split`: send each command alone,
/// waiting for its reply (the transaction then spans requests), instead of
/// as one pipeline.
async fn same_as_redis(redis: &RedisServer, proxy: &Proxy, script: &[&str], split: bool) {
    let mut outs = Vec::new();
    for addr in [redis.addr(), proxy.addr.to_string()] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        pipeline(&mut s, &["FLUSHALL"], 1).await;
        let mut out = String::new();
        if split {
            for l in script {
                out.push_str(&pipeline(&mut s, &[l], 1).await);
            }
        } else {
            out = pipeline(&mut s, script, script.len()).await;
        }
        outs.push(without_ids(&out));
    }
    assert_eq!(outs[1], outs[0], "script {script:?} (split: {split})");
}

/// `replies` with the client ids of HELLO's replies left out (sidecache's
/// clients have ids of their own).
fn without_ids(replies: &str) -> String {
    let mut out = String::new();
    let mut rest = replies;
    while let Some(at) = rest.find("$2\r\nid\r\n:") {
        let end = at + "$2\r\nid\r\n:".len();
        out.push_str(&rest[..end]);
        rest = rest[end..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

const SCRIPTS: &[&[&str]] = &[
    &["MULTI", "SET k 1", "INCR k", "GET k", "EXEC", "GET k"],
    &["MULTI", "SET k 1", "DISCARD", "GET k", "EXISTS k"],
    // A queue-time error aborts the whole transaction.
    &[
        "MULTI",
        "SET k 1",
        "NOSUCHCOMMAND x",
        "GET k",
        "EXEC",
        "EXISTS k",
    ],
    &["MULTI", "SET k", "EXEC", "EXISTS k"],
    // Errors at run time land inside EXEC's array.
    &["SET s x", "MULTI", "INCR s", "SET t 1", "EXEC", "GET t"],
    // Nested MULTI and WATCH inside MULTI are refused without aborting.
    &["MULTI", "MULTI", "WATCH k", "SET k 2", "EXEC", "GET k"],
    &["EXEC", "DISCARD", "UNWATCH", "MULTI", "EXEC"],
    // GET and PING inside MULTI are queued, not answered.
    &[
        "SET k v", "GET k", "MULTI", "GET k", "PING", "ECHO hi", "EXEC",
    ],
    // WATCH: a key this client changes itself fails its EXEC.
    &[
        "SET w 1", "WATCH w", "SET w 2", "MULTI", "INCR w", "EXEC", "GET w",
    ],
    &[
        "SET w 1", "WATCH w", "GET w", "MULTI", "INCR w", "EXEC", "GET w",
    ],
    &["WATCH w", "UNWATCH", "SET w 5", "MULTI", "INCR w", "EXEC"],
    &[
        "WATCH w", "MULTI", "DISCARD", "SET w 5", "MULTI", "INCR w", "EXEC",
    ],
    &["WATCH a b c", "WATCH d", "MULTI", "SET a 1", "EXEC", "EXEC"],
];

#[tokio::test]
async fn transactions_reply_as_redis_does() {
    let redis = RedisServer::start(&[]);
    let upstream = RedisServer::start(&[]);
    let proxy = Proxy::start(&upstream.url(), &[]).await;
    for script in SCRIPTS {
        same_as_redis(&redis, &proxy, script, false).await;
        same_as_redis(&redis, &proxy, script, true).await;
    }
    // RESP3: EXEC's array and a failed WATCH's null pass through too.
    let mut outs = Vec::new();
    for addr in [redis.addr(), proxy.addr.to_string()] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let hello = pipeline(&mut s, &["HELLO 3"], 1).await;
        assert!(hello.starts_with('%'), "{hello}");
        outs.push(
            pipeline(
                &mut s,
                &[
                    "SET r 1",
                    "WATCH r",
                    "SET r 2",
                    "MULTI",
                    "GET r",
                    "EXEC",
                    "MULTI",
                    "HGETALL nohash",
                    "EXEC",
                ],
                9,
            )
            .await,
        );
    }
    assert_eq!(outs[1], outs[0]);
    proxy.stop().await;
}

/// Inside MULTI nothing comes from the L1 or goes through write-behind; the
/// client's queued writes land before the transaction; what it wrote leaves
/// the L1.
#[tokio::test]
async fn l1_and_write_behind_stay_out_of_transactions() {
    let redis = RedisServer::start(&[]);
    // No tracking: an upstream change would not reach the L1 by itself.
    let proxy = Proxy::start(&redis.url(), &["--tracking", "off"]).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    // Acknowledged from memory, then INCRed inside MULTI: the transaction
    // sees the write (it was applied upstream first).
    assert_eq!(
        pipeline(&mut s, &["SET n 1", "MULTI", "INCR n", "EXEC"], 4).await,
        "+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:2\r\n"
    );
    // A cached value changed behind the proxy's back: MULTI's GET is
    // Redis's, the plain GET still the (tracking-off) cached one.
    assert_eq!(
        pipeline(&mut s, &["SET c old", "GET c"], 2).await,
        "+OK\r\n$3\r\nold\r\n"
    );
    support::drained(&proxy.addr.to_string()).await;
    raw(&redis.addr(), &enc("SET c new").into_bytes(), 1).await;
    assert_eq!(
        pipeline(&mut s, &["MULTI", "GET c", "EXEC", "GET c"], 4).await,
        "+OK\r\n+QUEUED\r\n*1\r\n$3\r\nnew\r\n$3\r\nold\r\n"
    );
    // A SET inside MULTI is not written behind (QUEUED, then EXEC's OK),
    // and the key leaves the L1: the next GET reads the new value.
    assert_eq!(
        pipeline(
            &mut s,
            &["MULTI", "SET c tx", "APPEND c !", "EXEC", "GET c"],
            5
        )
        .await,
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:3\r\n$3\r\ntx!\r\n"
    );
    let info = String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await)
        .into_owned();
    assert!(info_field(&info, "transactions_executed") >= 3, "{info}");
    proxy.stop().await;
}

/// WATCH races between two clients through one sidecache, including a write
/// of the other client still queued for write-behind when EXEC arrives.
#[tokio::test]
async fn watch_sees_other_clients_writes() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut a = TcpStream::connect(proxy.addr).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    pipeline(&mut a, &["SET w 1"], 1).await;
    assert_eq!(
        pipeline(&mut a, &["WATCH w", "GET w"], 2).await,
        "+OK\r\n$1\r\n1\r\n"
    );
    // B's SET is acknowledged from memory; A's EXEC must still see it.
    assert_eq!(pipeline(&mut b, &["SET w 2"], 1).await, "+OK\r\n");
    assert_eq!(
        pipeline(&mut a, &["MULTI", "SET w 10", "EXEC", "GET w"], 4).await,
        "+OK\r\n+QUEUED\r\n*-1\r\n$1\r\n2\r\n"
    );
    // Untouched: it runs.
    assert_eq!(
        pipeline(
            &mut a,
            &["WATCH w", "MULTI", "SET w 10", "EXEC", "GET w"],
            5
        )
        .await,
        "+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n$2\r\n10\r\n"
    );
    // This client's own write queued before WATCH never fails its WATCH.
    assert_eq!(
        pipeline(
            &mut a,
            &["SET own 1", "WATCH own", "MULTI", "INCR own", "EXEC"],
            5
        )
        .await,
        "+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:2\r\n"
    );
    let info = String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await)
        .into_owned();
    assert!(
        info_field(&info, "transactions_watch_failed") >= 1,
        "{info}"
    );
    assert_eq!(info_field(&info, "session_connections_in_use"), 0, "{info}");
    proxy.stop().await;
}

/// A client that disconnects in the middle of a transaction (MULTI open on
/// a held connection, or keys watched) discards it: nothing runs, and its
/// held connection is closed.
#[tokio::test]
async fn disconnect_mid_transaction_discards_it() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let pa = proxy.addr.to_string();
    {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(pipeline(&mut s, &["MULTI"], 1).await, "+OK\r\n");
        assert_eq!(pipeline(&mut s, &["SET gone 1"], 1).await, "+QUEUED\r\n");
        let info = String::from_utf8_lossy(&raw(&pa, b"INFO proxy\r\n", 1).await).into_owned();
        assert_eq!(info_field(&info, "session_connections_in_use"), 1, "{info}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let info = String::from_utf8_lossy(&raw(&pa, b"INFO proxy\r\n", 1).await).into_owned();
        if info_field(&info, "session_connections_in_use") == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "held connection kept: {info}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(raw(&redis.addr(), b"EXISTS gone\r\n", 1).await, b":0\r\n");
    // Upstream, no client is left in MULTI or watching.
    let list =
        String::from_utf8_lossy(&raw(&redis.addr(), b"CLIENT LIST\r\n", 1).await).into_owned();
    assert!(!list.contains("flags=x"), "{list}");
    proxy.stop().await;
}

/// Past `--max-session-connections`, a WATCH gets a clear error instead of
/// waiting for ever; once the holder is done, it works.
#[tokio::test]
async fn held_connections_are_bounded() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(
        &redis.url(),
        &[
            "--max-session-connections",
            "1",
            "--write-queue-timeout",
            "0.3",
        ],
    )
    .await;
    let mut a = TcpStream::connect(proxy.addr).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(pipeline(&mut a, &["WATCH x"], 1).await, "+OK\r\n");
    let started = std::time::Instant::now();
    let refused = pipeline(&mut b, &["WATCH y"], 1).await;
    assert!(
        refused.starts_with(
            "-ERR max number of session connections reached (1, --max-session-connections)"
        ),
        "{refused}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // A MULTI … EXEC without WATCH needs no held connection.
    assert_eq!(
        pipeline(&mut b, &["MULTI", "INCR y", "EXEC"], 3).await,
        "+OK\r\n+QUEUED\r\n*1\r\n:1\r\n"
    );
    assert_eq!(pipeline(&mut a, &["UNWATCH"], 1).await, "+OK\r\n");
    assert_eq!(pipeline(&mut b, &["WATCH y"], 1).await, "+OK\r\n");
    let info = String::from_utf8_lossy(&raw(&proxy.addr.to_string(), b"INFO proxy\r\n", 1).await)
        .into_owned();
    assert!(
        info_field(&info, "session_connection_refusals") >= 1,
        "{info}"
    );
    proxy.stop().await;
}

/// Cluster: a transaction goes to the master of its first key's slot; a
/// command of another slot gets Redis Cluster's own CROSSSLOT and the EXEC
/// aborts; keyless transactions go to any master; WATCH holds a connection
/// to its key's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_transactions_follow_their_slot() {
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        pipeline(
            &mut s,
            &["MULTI", "SET {u}a 1", "INCR {u}a", "SET {u}b x", "EXEC"],
            5
        )
        .await,
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n:2\r\n+OK\r\n"
    );
    let out = pipeline(&mut s, &["MULTI", "SET {u}a 1", "SET {v}a 1", "EXEC"], 4).await;
    assert!(out.starts_with("+OK\r\n+QUEUED\r\n-CROSSSLOT"), "{out}");
    assert!(
        out.ends_with("-EXECABORT Transaction discarded because of previous errors.\r\n"),
        "{out}"
    );
    assert_eq!(
        pipeline(&mut s, &["MULTI", "PING", "EXEC"], 3).await,
        "+OK\r\n+QUEUED\r\n*1\r\n+PONG\r\n"
    );
    // Spanning requests, on whichever master owns the slot.
    for key in ["{u}w", "{v}w", "{x}w"] {
        let lines = [
            format!("SET {key} 1"),
            format!("WATCH {key}"),
            "MULTI".to_owned(),
            format!("INCR {key}"),
            "EXEC".to_owned(),
        ];
        let mut out = String::new();
        for l in &lines {
            out.push_str(&pipeline(&mut s, &[l.as_str()], 1).await);
        }
        assert_eq!(out, "+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:2\r\n", "{key}");
    }
    // A MULTI sent alone (each command waiting for its reply, as
    // redis-cli or Lettuce send it): held on the first master until a key
    // binds it, then moved to the key's master, keyless commands before
    // it included; logins inside it (a protocol switch on the held
    // connection), as one Redis answers them.
    let redis = RedisServer::start(&[]);
    for tag in ["{u}", "{v}", "{x}"] {
        let set = format!("SET {tag}k 1");
        let get = format!("GET {tag}k");
        let map = format!("HGETALL {tag}nope");
        for script in [
            &["MULTI", &set, "EXEC"][..],
            &["MULTI", "PING", "SELECT 0", &set, &get, "EXEC", &get],
            &["MULTI", "HELLO 3", &set, &map, "AUTH x", "EXEC", &map],
        ] {
            same_as_redis(&redis, &proxy, script, false).await;
            same_as_redis(&redis, &proxy, script, true).await;
        }
    }
    proxy.stop().await;
}

/// A MULTI that no new upstream connection can take (its handshake's
/// SELECT refused: a script keeps Redis busy) ends as on Redis: MULTI is
/// accepted, and the EXEC aborts without running anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_during_a_busy_script_aborts_cleanly() {
    let redis = RedisServer::start(&[]);
    raw(
        &redis.addr(),
        &enc("CONFIG SET lua-time-limit 10").into_bytes(),
        1,
    )
    .await;
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut b = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        pipeline(&mut b, &["SELECT 9", "SET xx 1"], 2).await,
        "+OK\r\n+OK\r\n"
    );
    support::drained(&proxy.addr.to_string()).await;
    // A script that spins until killed, on a connection of its own.
    let mut a = TcpStream::connect(redis.addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut a,
        b"*3\r\n$4\r\nEVAL\r\n$17\r\nwhile true do end\r\n$1\r\n0\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pipeline(&mut b, &["MULTI"], 1).await, "+OK\r\n");
    // Redis would say -BUSY here; sidecache, whose MULTI found no
    // connection, queues it locally for an EXEC that will abort.
    let queued = pipeline(&mut b, &["INCR xx"], 1).await;
    assert!(
        queued.starts_with("-BUSY") || queued == "+QUEUED\r\n",
        "{queued}"
    );
    assert_eq!(
        raw(&redis.addr(), &enc("SCRIPT KILL").into_bytes(), 1).await,
        b"+OK\r\n"
    );
    // The script ends at its next check, shortly after SCRIPT KILL: until
    // then a connection sidecache opens (the GET below, uncached in
    // database 9 under optin) is refused -BUSY.
    let t0 = std::time::Instant::now();
    while raw(&redis.addr(), b"PING\r\n", 1).await != b"+PONG\r\n" {
        assert!(t0.elapsed() < Duration::from_secs(5), "still busy");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pipeline(&mut b, &["INCR xx"], 1).await, "+QUEUED\r\n");
    assert_eq!(
        pipeline(&mut b, &["EXEC"], 1).await,
        "-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    assert_eq!(pipeline(&mut b, &["GET xx"], 1).await, "$1\r\n1\r\n");
    proxy.stop().await;
}

/// Cluster: a transaction sent on a stale slot map is redirected before it
/// runs (ASK while its slot migrates, MOVED after) and re-run whole on the
/// key's new owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_transaction_follows_ask_and_moved() {
    use support::cli;
    let cluster = Cluster::start();
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let key = "txmove";
    // Forwarded (not write-behind), so the key is on its master now.
    assert_eq!(pipeline(&mut s, &["INCRBY txmove 10"], 1).await, ":10\r\n");
    let slot = sidecache_pool::Slot::for_key(key.as_bytes()).get();
    let src = cluster.node_for(key);
    let dst = (src + 1) % 3;
    let (sp, dp) = (cluster.nodes[src].port, cluster.nodes[dst].port);
    cluster.begin_migration(slot, src, dst);
    cluster.migrate_keys(src, dst, &[key]);
    assert!(cli(sp, &["incr", key]).starts_with("ASK"));
    // Mid-migration: the source answers ASK; the block runs on the target.
    assert_eq!(
        pipeline(&mut s, &["MULTI", "INCR txmove", "EXEC"], 3).await,
        "+OK\r\n+QUEUED\r\n*1\r\n:11\r\n"
    );
    cluster.assign_slot(slot, dst);
    assert!(cli(sp, &["incr", key]).starts_with("MOVED"));
    // After it: MOVED, and the block runs on the new owner.
    assert_eq!(
        pipeline(&mut s, &["MULTI", "INCR txmove", "EXEC"], 3).await,
        "+OK\r\n+QUEUED\r\n*1\r\n:12\r\n"
    );
    assert_eq!(cli(dp, &["get", key]), "12");
    proxy.stop().await;
}

/// AUTH, HELLO and MONITOR inside MULTI are queued and run at EXEC, in
/// their places, as Redis runs them: credentials checked then, a protocol
/// switch applying to the replies after it, MONITOR refused as a
/// transaction's commands may not block; SYNC and PSYNC get the server's
/// own queue-time refusal.
#[tokio::test]
async fn logins_inside_multi_run_at_exec_as_on_redis() {
    const LOGINS: &[&[&str]] = &[
        &["MULTI", "AUTH x", "AUTH u x", "AUTH a b c", "EXEC"],
        &["MULTI", "SET k 1", "AUTH", "EXEC", "EXISTS k"],
        &[
            "MULTI",
            "HELLO 3",
            "SET a 1",
            "HGETALL nope",
            "GET a",
            "EXEC",
            "HGETALL nope",
        ],
        &[
            "MULTI",
            "HELLO 3 AUTH u bad",
            "HGETALL nope",
            "EXEC",
            "HGETALL nope",
        ],
        &[
            "MULTI",
            "HELLO 3 SETNAME x",
            "CLIENT GETNAME",
            "HGETALL nope",
            "EXEC",
        ],
        &[
            "HELLO 3",
            "MULTI",
            "HELLO 2",
            "HGETALL nope",
            "EXEC",
            "HGETALL nope",
        ],
        &["MULTI", "HELLO 4", "HELLO", "EXEC"],
        &["MULTI", "MONITOR", "EXEC", "PING"],
        &["MULTI", "MONITOR x", "EXEC"],
        &["MULTI", "SYNC", "EXEC"],
        &["MULTI", "PSYNC ? -1", "EXEC"],
        // Watching: a login that keeps the user, and a protocol switch
        // the EXEC then answers in.
        &[
            "WATCH a",
            "HELLO 3",
            "AUTH x",
            "MULTI",
            "HGETALL nope",
            "EXEC",
        ],
    ];
    // Valkey 8.0 leaves out the reply of a refused password inside EXEC
    // (its array is then one short, and a client waits for ever);
    // sidecache answers it as Redis 7 and Valkey 9 do, so those cases are
    // compared on them only.
    let drops_reply = support::is_valkey() && support::server_major() == 8;
    let refused = |l: &&str| l.contains(" u ") || l.contains("bad") || l.contains("nope");
    let redis = RedisServer::start(&[]);
    let upstream = RedisServer::start(&[]);
    let proxy = Proxy::start(&upstream.url(), &[]).await;
    for script in LOGINS {
        if drops_reply && script.iter().any(refused) {
            continue;
        }
        same_as_redis(&redis, &proxy, script, false).await;
        same_as_redis(&redis, &proxy, script, true).await;
    }
    // An ACL user's AUTH at EXEC: the client is that user from then on.
    let acl = ["ACL SETUSER bob on >pw ~b* +@all"];
    for addr in [redis.addr(), upstream.addr()] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        assert_eq!(pipeline(&mut s, &acl, 1).await, "+OK\r\n");
    }
    let script = [
        "MULTI",
        if drops_reply { "PING" } else { "AUTH bob nope" },
        "AUTH bob pw",
        "EXEC",
        "ACL WHOAMI",
        "SET a 1",
        "SET bx 1",
    ];
    same_as_redis(&redis, &proxy, &script, false).await;
    same_as_redis(&redis, &proxy, &script, true).await;
    proxy.stop().await;

    // sidecache's own --requirepass, against a server's requirepass.
    let redis = RedisServer::start(&["--requirepass", "sec"]);
    let proxy = Proxy::start(&upstream.url(), &["--requirepass", "sec"]).await;
    for script in [
        &[
            "MULTI", "AUTH sec", "EXEC", "AUTH sec", "MULTI", "AUTH bad", "EXEC",
        ][..],
        &[
            "AUTH sec",
            "MULTI",
            "HELLO 3 AUTH default bad",
            "HELLO 3 AUTH default sec",
            "HGETALL x",
            "EXEC",
        ],
        &[
            "AUTH sec",
            "WATCH k",
            "AUTH sec",
            "AUTH a b c",
            "MULTI",
            "EXEC",
        ],
    ] {
        if drops_reply && script.iter().any(refused) {
            continue;
        }
        same_as_redis(&redis, &proxy, script, false).await;
        same_as_redis(&redis, &proxy, script, true).await;
    }
    proxy.stop().await;
}

/// A RESP3 client that turns CLIENT TRACKING on inside MULTI: from EXEC
/// on it hears of the keys it reads, as on Redis. `reads_inside`: the
/// read is queued in the same transaction (Redis tracks it from EXEC,
/// which sidecache cannot follow there: its message comes right after
/// EXEC's reply, never before it). Returns EXEC's reply with what came
/// with it, and what came once another client changed the key.
async fn tracking_from_exec(addr: &str, writer: &str, reads_inside: bool) -> (String, String) {
    let mut t = TcpStream::connect(addr).await.unwrap();
    let mut w = TcpStream::connect(writer).await.unwrap();
    pipeline(&mut t, &["HELLO 3", "SET tk 1"], 2).await;
    let exec = if reads_inside {
        pipeline(
            &mut t,
            &["MULTI", "CLIENT TRACKING on", "GET tk", "EXEC"],
            4,
        )
        .await
    } else {
        let mut out = pipeline(&mut t, &["MULTI", "CLIENT TRACKING on", "EXEC"], 3).await;
        out.push_str(&pipeline(&mut t, &["GET tk"], 1).await);
        out
    };
    let exec = exec + &support::arrived(&mut t, Duration::from_millis(300)).await;
    pipeline(&mut w, &["SET tk 2"], 1).await;
    let after = support::arrived(&mut t, Duration::from_millis(300)).await;
    (exec, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_turned_on_inside_multi_reports_changes() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let push = ">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\ntk\r\n";
    let replies = "+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n$1\r\n1\r\n";
    let direct = tracking_from_exec(&redis.addr(), &redis.addr(), false).await;
    assert_eq!(direct, (replies.to_owned(), push.to_owned()));
    let through = tracking_from_exec(&proxy.addr.to_string(), &redis.addr(), false).await;
    assert_eq!(through, direct, "through sidecache, then directly");

    let replies = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n$1\r\n1\r\n";
    let direct = tracking_from_exec(&redis.addr(), &redis.addr(), true).await;
    assert_eq!(direct, (replies.to_owned(), push.to_owned()));
    // Told once, after EXEC's reply (at once, or when the key changes).
    let (exec, after) = tracking_from_exec(&proxy.addr.to_string(), &redis.addr(), true).await;
    assert!(exec.starts_with(replies), "{exec:?}");
    assert_eq!(format!("{exec}{after}"), format!("{replies}{push}"));
    proxy.stop().await;
}
