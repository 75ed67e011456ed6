//! Per-client ACL users (issue #32, part 2): two users with disjoint key
//! patterns (`~a:*` and `~b:*`) behind one sidecache; each reads and
//! writes its own keys and is refused the other's with Redis's exact
//! texts, on L1 hits (a key another client cached first), misses,
//! write-behind SETs, transactions, scripts, blocking commands and
//! subscriptions; wrong passwords, RESET, HELLO AUTH, and the bounds
//! (`--acl-user-connections`, `--acl-max-users`). Standalone and cluster.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use support::{enc, info_field, raw_on, Cluster, Proxy, RedisServer};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The server's refusal of a key (Redis 7's text, or Valkey's).
fn noperm_keys() -> &'static str {
    if support::is_valkey() {
        "-NOPERM No permissions to access a key\r\n"
    } else {
        "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
    }
}

/// The server's refusal of a channel.
fn noperm_channels() -> &'static str {
    if support::is_valkey() {
        "-NOPERM No permissions to access a channel\r\n"
    } else {
        "-NOPERM this user has no permissions to access one of the channels used as arguments\r\n"
    }
}

/// The server's refusal of a command to `user`.
fn noperm_command(user: &str, cmd: &str) -> String {
    if support::is_valkey() {
        format!("-NOPERM User {user} has no permissions to run the '{cmd}' command\r\n")
    } else {
        format!("-NOPERM this user has no permissions to run the '{cmd}' command\r\n")
    }
}
const WRONGPASS: &str = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
const EXECABORT: &str = "-EXECABORT Transaction discarded because of previous errors.\r\n";

/// The users: alice may touch `a:*` (and channels `a:*`), bob `b:*`.
fn users() -> [[&'static str; 7]; 2] {
    [
        ["SETUSER", "alice", "on", ">pa", "~a:*", "&a:*", "+@all"],
        ["SETUSER", "bob", "on", ">pb", "~b:*", "&b:*", "+@all"],
    ]
}

fn create_users(port: u16) {
    for u in users() {
        let mut args = vec!["ACL"];
        args.extend(u);
        assert_eq!(support::cli(port, &args).trim(), "OK");
    }
}

/// One connection, one command at a time: the raw reply.
struct Conn(TcpStream);

impl Conn {
    async fn open(proxy: &Proxy) -> Conn {
        Conn(TcpStream::connect(proxy.addr).await.unwrap())
    }

    async fn call(&mut self, line: &str) -> String {
        self.calls(line, 1).await
    }

    /// `line` with `replies` replies (several commands joined by `|`).
    async fn calls(&mut self, lines: &str, replies: usize) -> String {
        let input: String = lines.split('|').map(enc).collect();
        String::from_utf8_lossy(&raw_on(&mut self.0, input.as_bytes(), replies).await).into_owned()
    }
}

fn bulk(v: &str) -> String {
    format!("${}\r\n{v}\r\n", v.len())
}

async fn proxy_info(proxy: &Proxy) -> String {
    let mut c = Conn::open(proxy).await;
    c.call("INFO proxy").await
}

async fn l1_hits(proxy: &Proxy) -> u64 {
    let mut c = Conn::open(proxy).await;
    info_field(&c.call("INFO l1").await, "l1_hits")
}

/// What one ACL user's client must be able to do, and be refused, through
/// the proxy: `me` and `other` are key prefixes (`a`, `b`); the other
/// user's keys `{other}:1` (cached in the L1 by the default user's client
/// beforehand) and `{other}:2` (never read) exist upstream.
async fn own_keys_only(
    proxy: &Proxy,
    direct: &mut Conn,
    d: &mut Conn,
    user: &str,
    pass: &str,
    me: &str,
    other: &str,
) {
    // The default user's client caches the other user's key.
    let hits = l1_hits(proxy).await;
    for _ in 0..2 {
        assert_eq!(d.call(&format!("GET {other}:1")).await, bulk(other));
    }
    assert_eq!(l1_hits(proxy).await, hits + 1, "cached");
    let mut c = Conn::open(proxy).await;
    assert_eq!(c.call(&format!("AUTH {user} {pass}")).await, "+OK\r\n");
    assert_eq!(c.call("ACL WHOAMI").await, bulk(user));
    let info = c.call("CLIENT INFO").await;
    assert!(info.contains(&format!(" user={user} ")), "{info}");
    // Its own keys: read (cached by the default client first), missed,
    // written (forwarded: the value is upstream when +OK arrives).
    assert_eq!(c.call(&format!("GET {me}:1")).await, bulk(me));
    assert_eq!(c.call(&format!("SET {me}:w v-{user}")).await, "+OK\r\n");
    assert_eq!(
        direct.call(&format!("GET {me}:w")).await,
        bulk(&format!("v-{user}"))
    );
    assert_eq!(
        c.call(&format!("GET {me}:w")).await,
        bulk(&format!("v-{user}"))
    );
    assert_eq!(c.call(&format!("HGETALL {me}:h")).await, "*0\r\n");
    // The other user's keys: an L1 hit for the default client, a miss, a
    // write-behind SET, MSET, a cached read beyond GET, an INCR.
    let hits = l1_hits(proxy).await;
    assert_eq!(c.call(&format!("GET {other}:1")).await, noperm_keys());
    assert_eq!(l1_hits(proxy).await, hits, "never answered from the L1");
    assert_eq!(c.call(&format!("GET {other}:2")).await, noperm_keys());
    assert_eq!(c.call(&format!("STRLEN {other}:1")).await, noperm_keys());
    assert_eq!(
        c.call(&format!("SET {other}:1 stolen")).await,
        noperm_keys()
    );
    assert_eq!(
        c.call(&format!("MSET {other}:1 stolen")).await,
        noperm_keys()
    );
    assert_eq!(
        c.call(&format!("SETEX {other}:1 100 stolen")).await,
        noperm_keys()
    );
    assert_eq!(c.call(&format!("INCR {other}:n")).await, noperm_keys());
    assert_eq!(
        c.call(&format!("MGET {me}:1 {other}:1")).await,
        noperm_keys()
    );
    // Nothing of it reached Redis.
    assert_eq!(direct.call(&format!("GET {other}:1")).await, bulk(other));
    assert_eq!(direct.call(&format!("EXISTS {other}:n")).await, ":0\r\n");
    // Transactions: refused at queue time as on Redis, its own run.
    assert_eq!(
        c.calls(&format!("MULTI|SET {other}:1 x|EXEC"), 3).await,
        format!("+OK\r\n{}{EXECABORT}", noperm_keys())
    );
    assert_eq!(
        c.calls(&format!("MULTI|SET {me}:t 1|INCR {me}:t|EXEC"), 4)
            .await,
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:2\r\n"
    );
    // A MULTI answered command by command (held connection) and WATCH.
    assert_eq!(c.call(&format!("WATCH {me}:t")).await, "+OK\r\n");
    assert_eq!(c.call("MULTI").await, "+OK\r\n");
    assert_eq!(c.call(&format!("GET {other}:1")).await, noperm_keys());
    assert_eq!(c.call("EXEC").await, EXECABORT);
    // Scripts run as the user.
    let script = format!("return redis.call('get','{other}:1')");
    let mut input = format!(
        "*3\r\n$4\r\nEVAL\r\n${}\r\n{script}\r\n$1\r\n0\r\n",
        script.len()
    );
    let got = String::from_utf8_lossy(&raw_on(&mut c.0, input.as_bytes(), 1).await).into_owned();
    let refusal = if support::is_valkey() {
        "-ERR ACL failure in script: No permissions to access a key"
    } else {
        "-ERR The user executing the script can't access at least one of the keys mentioned in the command arguments"
    };
    assert!(got.starts_with(refusal), "{got}");
    let script = format!("return redis.call('get','{me}:1')");
    input = format!(
        "*3\r\n$4\r\nEVAL\r\n${}\r\n{script}\r\n$1\r\n0\r\n",
        script.len()
    );
    let got = String::from_utf8_lossy(&raw_on(&mut c.0, input.as_bytes(), 1).await).into_owned();
    assert_eq!(got, bulk(me));
    // Blocking commands, on a connection of the user's.
    assert_eq!(c.call(&format!("BLPOP {other}:q 0.1")).await, noperm_keys());
    assert_eq!(c.call(&format!("BLPOP {me}:q 0.1")).await, "*-1\r\n");
    // Subscriptions: Redis is asked first.
    let mut s = Conn::open(proxy).await;
    assert_eq!(s.call(&format!("AUTH {user} {pass}")).await, "+OK\r\n");
    assert_eq!(
        s.call(&format!("SUBSCRIBE {other}:ch")).await,
        noperm_channels()
    );
    assert_eq!(
        s.call(&format!("PSUBSCRIBE {other}:*")).await,
        noperm_channels()
    );
    assert_eq!(
        s.call(&format!("SUBSCRIBE {me}:ch")).await,
        format!(
            "*3\r\n$9\r\nsubscribe\r\n{}:1\r\n",
            bulk(&format!("{me}:ch"))
        )
    );
    // MONITOR is allowed (+@all); a user without it is refused (below).
    // A wrong password keeps the client as it was, as on Redis.
    assert_eq!(c.call(&format!("AUTH {user} wrong")).await, WRONGPASS);
    assert_eq!(c.call("AUTH nobody x").await, WRONGPASS);
    assert_eq!(c.call("ACL WHOAMI").await, bulk(user));
    assert_eq!(c.call(&format!("GET {other}:1")).await, noperm_keys());
    // RESET: back to the default user (the shared path, the L1).
    assert_eq!(c.call("RESET").await, "+RESET\r\n");
    assert_eq!(c.call("ACL WHOAMI").await, bulk("default"));
    assert_eq!(c.call(&format!("GET {other}:1")).await, bulk(other));
    let hits = l1_hits(proxy).await;
    assert_eq!(c.call(&format!("GET {other}:1")).await, bulk(other));
    assert_eq!(l1_hits(proxy).await, hits + 1);
    // HELLO 3 AUTH: the user again, in RESP3.
    let hello = c.call(&format!("HELLO 3 AUTH {user} {pass}")).await;
    assert!(hello.starts_with('%'), "{hello}");
    assert_eq!(c.call(&format!("GET {other}:1")).await, noperm_keys());
    assert_eq!(c.call(&format!("GET {me}:1")).await, bulk(me));
    assert_eq!(
        c.call(&format!("HELLO 3 AUTH {user} wrong")).await,
        WRONGPASS
    );
}

#[tokio::test]
async fn standalone_users_see_only_their_keys() {
    let redis = RedisServer::start(&[]);
    create_users(redis.port);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut direct = Conn(TcpStream::connect(redis.addr()).await.unwrap());
    for k in ["a", "b"] {
        direct.call(&format!("SET {k}:1 {k}")).await;
        direct.call(&format!("SET {k}:2 {k}")).await;
    }
    // The texts are the server's own: asked directly.
    let mut alice = Conn(TcpStream::connect(redis.addr()).await.unwrap());
    assert_eq!(
        alice.calls("AUTH alice pa|GET b:1|SUBSCRIBE b:ch", 3).await,
        format!("+OK\r\n{}{}", noperm_keys(), noperm_channels())
    );
    let mut d = Conn::open(&proxy).await;
    own_keys_only(&proxy, &mut direct, &mut d, "alice", "pa", "a", "b").await;
    own_keys_only(&proxy, &mut direct, &mut d, "bob", "pb", "b", "a").await;

    // Read-your-writes: a write-behind SET of the default client is seen
    // by bob's next read, on his own connection.
    let mut bob = Conn::open(&proxy).await;
    assert_eq!(bob.call("AUTH bob pb").await, "+OK\r\n");
    for i in 0..50 {
        assert_eq!(d.call(&format!("SET b:ryw {i}")).await, "+OK\r\n");
        assert_eq!(bob.call("GET b:ryw").await, bulk(&i.to_string()));
    }
    // bob's write invalidates the L1 entry the default client cached.
    assert_eq!(d.call("GET b:1").await, bulk("b"));
    assert_eq!(bob.call("SET b:1 new").await, "+OK\r\n");
    assert_eq!(d.call("GET b:1").await, bulk("new"));

    // A user without MONITOR is refused it, with Redis's text.
    assert_eq!(
        support::cli(
            redis.port,
            &["ACL", "SETUSER", "carol", "on", ">pc", "~c:*", "+@all", "-monitor"]
        )
        .trim(),
        "OK"
    );
    let mut carol = Conn::open(&proxy).await;
    assert_eq!(carol.call("AUTH carol pc").await, "+OK\r\n");
    assert_eq!(
        carol.call("MONITOR").await,
        noperm_command("carol", "monitor")
    );
    // A disabled user is refused at its next AUTH.
    support::cli(redis.port, &["ACL", "SETUSER", "carol", "off"]);
    let mut carol2 = Conn::open(&proxy).await;
    assert_eq!(carol2.call("AUTH carol pc").await, WRONGPASS);

    let info = proxy_info(&proxy).await;
    assert!(info_field(&info, "acl_logins") >= 7, "{info}");
    assert!(info_field(&info, "acl_auth_failures") >= 7, "{info}");
    assert_eq!(info_field(&info, "acl_users_max"), 16);
    assert!(info_field(&info, "acl_users") >= 2, "{info}");
}

#[tokio::test]
async fn a_full_user_pool_and_too_many_users_are_refused() {
    let redis = RedisServer::start(&[]);
    create_users(redis.port);
    let proxy = Proxy::start(
        &redis.url(),
        &[
            "--acl-user-connections",
            "1",
            "--acl-max-users",
            "1",
            "--write-queue-timeout",
            "0.3",
        ],
    )
    .await;
    let mut b1 = Conn::open(&proxy).await;
    assert_eq!(b1.call("AUTH bob pb").await, "+OK\r\n");
    // b1 blocks on bob's only connection.
    b1.0.try_write(enc("BLPOP b:q 0").as_bytes()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut b2 = Conn::open(&proxy).await;
    assert_eq!(b2.call("AUTH bob pb").await, "+OK\r\n");
    assert_eq!(
        b2.call("GET b:1").await,
        "-ERR max number of connections for ACL user 'bob' reached (1, --acl-user-connections)\r\n"
    );
    // Another user, past --acl-max-users.
    let mut a = Conn::open(&proxy).await;
    assert_eq!(
        a.call("AUTH alice pa").await,
        "-ERR max number of ACL users reached (1, --acl-max-users)\r\n"
    );
    // The default user's clients are not bounded by it.
    let mut d = Conn::open(&proxy).await;
    assert_eq!(d.call("RPUSH b:q x").await, ":1\r\n");
    let got = String::from_utf8_lossy(&raw_on(&mut b1.0, b"", 1).await).into_owned();
    assert_eq!(got, "*2\r\n$3\r\nb:q\r\n$1\r\nx\r\n");
    assert_eq!(b2.call("GET b:1").await, "$-1\r\n");
    let info = proxy_info(&proxy).await;
    assert_eq!(
        info_field(&info, "acl_user_connection_refusals"),
        1,
        "{info}"
    );
    // Once bob's clients are gone, alice may log in.
    drop((b1, b2));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = a.call("AUTH alice pa").await;
        if got == "+OK\r\n" {
            break;
        }
        assert!(Instant::now() < deadline, "{got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(a.call("GET a:1").await, "$-1\r\n");
    assert_eq!(info_field(&proxy_info(&proxy).await, "acl_users"), 1);
}

#[tokio::test]
async fn acl_users_off_keeps_the_old_answer() {
    let redis = RedisServer::start(&[]);
    create_users(redis.port);
    let proxy = Proxy::start(&redis.url(), &["--acl-max-users", "0"]).await;
    let mut c = Conn::open(&proxy).await;
    assert_eq!(c.call("AUTH bob pb").await, WRONGPASS);
    assert_eq!(c.call("AUTH default anything").await, "+OK\r\n");
}

#[tokio::test]
async fn requirepass_still_guards_the_default_user() {
    let redis = RedisServer::start(&[]);
    create_users(redis.port);
    let proxy = Proxy::start(&redis.url(), &["--requirepass", "secret"]).await;
    let mut c = Conn::open(&proxy).await;
    assert_eq!(
        c.call("GET a:1").await,
        "-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.call("AUTH default nope").await, WRONGPASS);
    assert_eq!(c.call("AUTH bob wrong").await, WRONGPASS);
    assert_eq!(
        c.call("GET a:1").await,
        "-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.call("AUTH bob pb").await, "+OK\r\n");
    assert_eq!(c.call("GET a:1").await, noperm_keys());
    // RESET: the default user, which needs --requirepass again.
    assert_eq!(c.call("RESET").await, "+RESET\r\n");
    assert_eq!(
        c.call("GET a:1").await,
        "-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.call("AUTH secret").await, "+OK\r\n");
    assert_eq!(c.call("GET a:1").await, "$-1\r\n");
}

#[tokio::test]
async fn cluster_users_see_only_their_keys() {
    let cluster = Cluster::start();
    for n in &cluster.nodes {
        create_users(n.port);
    }
    let proxy = Proxy::start(&cluster.seed_url(), &[]).await;
    let mut d = Conn::open(&proxy).await;
    let mut alice = Conn::open(&proxy).await;
    let mut bob = Conn::open(&proxy).await;
    assert_eq!(alice.call("AUTH alice pa").await, "+OK\r\n");
    assert_eq!(bob.call("AUTH bob pb").await, "+OK\r\n");
    // Keys on every master.
    for i in 0..30 {
        for (c, me) in [(&mut alice, "a"), (&mut bob, "b")] {
            assert_eq!(c.call(&format!("SET {me}:{i} {i}")).await, "+OK\r\n");
            assert_eq!(c.call(&format!("GET {me}:{i}")).await, bulk(&i.to_string()));
        }
    }
    for i in 0..30 {
        for (c, other) in [(&mut alice, "b"), (&mut bob, "a")] {
            // Cached by the default client, refused to the other user.
            assert_eq!(
                d.call(&format!("GET {other}:{i}")).await,
                bulk(&i.to_string())
            );
            assert_eq!(
                d.call(&format!("GET {other}:{i}")).await,
                bulk(&i.to_string())
            );
            assert_eq!(c.call(&format!("GET {other}:{i}")).await, noperm_keys());
            assert_eq!(c.call(&format!("SET {other}:{i} x")).await, noperm_keys());
        }
    }
    // Split across slots, and a transaction on one slot.
    assert_eq!(
        alice.call("MGET a:1 a:2 a:3").await,
        "*3\r\n$1\r\n1\r\n$1\r\n2\r\n$1\r\n3\r\n"
    );
    assert_eq!(
        alice.calls("MULTI|SET a:{t}1 1|INCR a:{t}1|EXEC", 4).await,
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:2\r\n"
    );
    assert_eq!(
        bob.calls("MULTI|SET a:{t}1 1|EXEC", 3).await,
        format!("+OK\r\n{}{EXECABORT}", noperm_keys())
    );
    assert_eq!(alice.call("ACL WHOAMI").await, bulk("alice"));
}

#[tokio::test]
async fn what_sidecache_answers_itself_is_checked_for_the_user() {
    let redis = RedisServer::start(&[]);
    let setuser = |args: &[&str]| {
        let mut all = vec!["ACL", "SETUSER"];
        all.extend(args);
        assert_eq!(support::cli(redis.port, &all).trim(), "OK");
    };
    // dave may not PING, SELECT, nor CLIENT KILL.
    setuser(&[
        "dave",
        "on",
        ">pd",
        "~d:*",
        "+@all",
        "-ping",
        "-select",
        "-client|kill",
    ]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut c = Conn::open(&proxy).await;
    // In database 3 before AUTH (as Redis lets a client be): dave's
    // connections are in database 3 without dave's SELECT.
    assert_eq!(c.call("SELECT 3").await, "+OK\r\n");
    assert_eq!(c.call("AUTH dave pd").await, "+OK\r\n");
    assert_eq!(c.call("SET d:k in3").await, "+OK\r\n");
    let mut direct = Conn(TcpStream::connect(redis.addr()).await.unwrap());
    assert_eq!(
        direct.calls("SELECT 3|GET d:k", 2).await,
        format!("+OK\r\n{}", bulk("in3"))
    );
    assert_eq!(c.call("PING").await, noperm_command("dave", "ping"));
    assert_eq!(c.call("SELECT 0").await, noperm_command("dave", "select"));
    assert_eq!(
        c.call("CLIENT KILL ID 12345").await,
        noperm_command("dave", "client|kill")
    );
    assert_eq!(c.call("CLIENT ID").await.chars().next(), Some(':'));
    assert_eq!(c.call("ECHO hi").await, bulk("hi"));
    // Deleted: where the server disconnects a deleted user's clients
    // (Redis 7, Valkey 9; not Valkey 8), sidecache disconnects its client
    // at its next command. (Database 0: Valkey 8.0.1 holds back the reply
    // of a refused AUTH pipelined behind a SELECT until the connect
    // timeout, so in another database the client gets that error.)
    setuser(&["erin", "on", ">pe", "~e:*", "+@all"]);
    let mut c = Conn::open(&proxy).await;
    assert_eq!(c.call("AUTH erin pe").await, "+OK\r\n");
    assert_eq!(c.call("GET e:k").await, "$-1\r\n");
    let mut erin = Conn(TcpStream::connect(redis.addr()).await.unwrap());
    assert_eq!(erin.call("AUTH erin pe").await, "+OK\r\n");
    assert_eq!(direct.call("ACL DELUSER erin").await, ":1\r\n");
    erin.0.try_write(enc("GET e:k").as_bytes()).unwrap();
    let mut got = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), erin.0.read(&mut got))
        .await
        .map_or(usize::MAX, |r| r.unwrap_or(0));
    if n == 0 {
        c.0.try_write(enc("GET e:k").as_bytes()).unwrap();
        let mut got = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), c.0.read(&mut got))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "{}", String::from_utf8_lossy(&got[..n]));
    }
    let mut again = Conn::open(&proxy).await;
    assert_eq!(again.call("AUTH erin pe").await, WRONGPASS);
}

/// Without `--requirepass`, AUTH as the default user is Redis's to
/// answer, side by side with a client of Redis itself: no password
/// configured (`AUTH x`: Redis's `-ERR AUTH <password> called without …`),
/// then one set at run time with `CONFIG SET requirepass` through
/// sidecache (wrong and right, both forms, and inside MULTI), with
/// per-user connections on and off.
#[tokio::test]
async fn default_user_auth_is_checked_upstream() {
    for acl in ["--acl-max-users=10", "--acl-max-users=0"] {
        let redis = RedisServer::start(&[]);
        let proxy = Proxy::start(&redis.url(), &[acl]).await;
        let mut through = Conn::open(&proxy).await;
        let mut direct = Conn(TcpStream::connect(redis.addr()).await.unwrap());
        let steps = [
            "AUTH x",
            "AUTH default x",
            "CONFIG SET requirepass s3cret",
            "AUTH x",
            "AUTH default x",
            "AUTH s3cret",
            "AUTH default s3cret",
            "GET k",
        ];
        let mut seen = Vec::new();
        for (i, line) in steps.iter().enumerate() {
            let t = through.call(line).await;
            // Set once, through sidecache; the direct client sees it too.
            let d = if line.starts_with("CONFIG") {
                t.clone()
            } else {
                direct.call(line).await
            };
            assert_eq!(t, d, "{acl}: step {i}: {line}");
            seen.push(t);
        }
        assert!(
            seen[0].starts_with("-ERR AUTH <password> called without"),
            "{seen:?}"
        );
        assert!(seen[3].starts_with("-WRONGPASS"), "{seen:?}");
        assert_eq!(seen[5], "+OK\r\n");
        // A fresh client of sidecache: the run-time password holds.
        let mut fresh = Conn::open(&proxy).await;
        assert!(fresh.call("AUTH nope").await.starts_with("-WRONGPASS"));
        assert_eq!(fresh.call("AUTH s3cret").await, "+OK\r\n");
        // Inside MULTI, checked by Redis at EXEC. Valkey 8.0 leaves the
        // refusal out of EXEC's array (one short: its client waits for
        // ever); sidecache gives it in its place, as Redis 7 and Valkey 9.
        // (In one request: a held connection, opened now, could not log
        // in with the password set at run time.)
        let tx: String = ["MULTI", "AUTH x", "AUTH default s3cret", "EXEC"]
            .iter()
            .map(|l| enc(l))
            .collect();
        let got = raw_on(&mut fresh.0, tx.as_bytes(), 4).await;
        let want = "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n\
            -WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n";
        assert_eq!(String::from_utf8_lossy(&got), want, "{acl}");
        if !(support::is_valkey() && support::server_major() == 8) {
            let direct_got = raw_on(&mut direct.0, tx.as_bytes(), 4).await;
            assert_eq!(String::from_utf8_lossy(&direct_got), want, "{acl}: direct");
        }
        assert_eq!(through.call("CONFIG SET requirepass \"\"").await, "+OK\r\n");
        proxy.stop().await;
    }
}
