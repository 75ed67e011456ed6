//! Operators' commands over sidecache's own clients, beside a real Redis
//! for the replies: CLIENT KILL in each form.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::time::{Duration, Instant};

use support::{enc, info_field, raw, raw_on, Proxy, RedisServer};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

async fn call(s: &mut TcpStream, line: &str) -> String {
    String::from_utf8_lossy(&raw_on(s, enc(line).as_bytes(), 1).await).into_owned()
}

/// Whether the server closed `s` (within 5 s).
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// A client's `id=` and `addr=` from CLIENT INFO.
async fn me(s: &mut TcpStream) -> (u64, String) {
    let info = call(s, "CLIENT INFO").await;
    let field = |k: &str| {
        info.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .unwrap()
            .to_owned()
    };
    (field("id=").parse().unwrap(), field("addr="))
}

/// Redis's replies to CLIENT KILL's bad forms and to a user with no
/// client, through sidecache as from Redis itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_errors_are_redis_own() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut direct = TcpStream::connect(redis.addr()).await.unwrap();
    let mut through = TcpStream::connect(proxy.addr).await.unwrap();
    // A user the server has, with no client: 0 killed, not `No such user`.
    assert_eq!(
        call(&mut direct, "ACL SETUSER somebody on").await,
        "+OK\r\n"
    );
    for line in [
        "CLIENT KILL USER somebody",
        "MULTI",
        "CLIENT KILL USER somebody",
        "CLIENT KILL USER nobody-here",
        "EXEC",
        "CLIENT KILL",
        "CLIENT KILL ID",
        "CLIENT KILL ID 0",
        "CLIENT KILL ID x",
        "CLIENT KILL ID 999999",
        "CLIENT KILL TYPE foo",
        "CLIENT KILL TYPE master",
        "CLIENT KILL TYPE replica",
        "CLIENT KILL USER nobody-here",
        "CLIENT KILL SKIPME maybe",
        "CLIENT KILL FOO bar",
        "CLIENT KILL ADDR 1.2.3.4:5",
        "CLIENT KILL 1.2.3.4:5",
        "CLIENT KILL a b c",
        "CLIENT KILL ID 99998 99999",
        "CLIENT KILL ID 99999 x",
        "CLIENT KILL MAXAGE 10",
        "CLIENT KILL MAXAGE x",
        "CLIENT KILL MAXAGE -1",
        "CLIENT KILL ID 99999 SKIPME no",
    ] {
        assert_eq!(
            call(&mut through, line).await,
            call(&mut direct, line).await,
            "{line}"
        );
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_closes_the_clients_it_names() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let addr = proxy.addr.to_string();
    let mut op = TcpStream::connect(&addr).await.unwrap();
    // By id.
    let mut a = TcpStream::connect(&addr).await.unwrap();
    let (id, _) = me(&mut a).await;
    assert_eq!(
        call(&mut op, &format!("CLIENT KILL ID {id}")).await,
        ":1\r\n"
    );
    assert!(closed(&mut a).await, "killed by id");
    // The old form, by address.
    let mut b = TcpStream::connect(&addr).await.unwrap();
    let (_, baddr) = me(&mut b).await;
    assert_eq!(
        call(&mut op, &format!("CLIENT KILL {baddr}")).await,
        "+OK\r\n"
    );
    assert!(closed(&mut b).await, "killed by address");
    assert_eq!(
        call(&mut op, &format!("CLIENT KILL {baddr}")).await,
        "-ERR No such client\r\n"
    );
    // TYPE pubsub: the subscriber sees its connection close; TYPE normal
    // leaves it, and the caller (SKIPME yes by default).
    let mut sub = TcpStream::connect(&addr).await.unwrap();
    let confirm =
        String::from_utf8_lossy(&raw_on(&mut sub, enc("SUBSCRIBE news").as_bytes(), 1).await)
            .into_owned();
    assert!(confirm.contains("subscribe"), "{confirm}");
    let mut plain = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(call(&mut plain, "PING").await, "+PONG\r\n");
    assert_eq!(call(&mut op, "CLIENT KILL TYPE normal").await, ":1\r\n");
    assert!(closed(&mut plain).await, "the normal client");
    assert_eq!(call(&mut op, "CLIENT KILL TYPE pubsub").await, ":1\r\n");
    assert!(closed(&mut sub).await, "the subscriber");
    // A blocked client: closed, and its command unblocked upstream.
    let mut blocked = TcpStream::connect(&addr).await.unwrap();
    let (bid, _) = me(&mut blocked).await;
    tokio::io::AsyncWriteExt::write_all(&mut blocked, enc("BLPOP nothing 0").as_bytes())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let upstream_blocked = || async {
        let info =
            String::from_utf8_lossy(&raw(&redis.addr(), b"INFO clients\r\n", 1).await).into_owned();
        info_field(&info, "blocked_clients")
    };
    while upstream_blocked().await != 1 {
        assert!(Instant::now() < deadline, "never blocked upstream");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        call(&mut op, &format!("CLIENT KILL ID {bid}")).await,
        ":1\r\n"
    );
    assert!(closed(&mut blocked).await, "the blocked client");
    while upstream_blocked().await != 0 {
        assert!(Instant::now() < deadline, "still blocked upstream");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Itself, with SKIPME no: the reply, then the close.
    let (opid, _) = me(&mut op).await;
    assert_eq!(
        call(&mut op, &format!("CLIENT KILL ID {opid} SKIPME no")).await,
        ":1\r\n"
    );
    assert!(closed(&mut op).await, "itself");
    proxy.stop().await;
}

/// CLIENT PAUSE's and UNPAUSE's bad forms: Redis's own replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_errors_are_redis_own() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut direct = TcpStream::connect(redis.addr()).await.unwrap();
    let mut through = TcpStream::connect(proxy.addr).await.unwrap();
    for line in [
        "CLIENT PAUSE",
        "CLIENT PAUSE x",
        "CLIENT PAUSE -1",
        "CLIENT PAUSE 10 foo",
        "CLIENT UNPAUSE x",
        "CLIENT UNPAUSE",
    ] {
        assert_eq!(
            call(&mut through, line).await,
            call(&mut direct, line).await,
            "{line}"
        );
    }
    proxy.stop().await;
}

/// CLIENT PAUSE WRITE holds writes (a write-behind SET's acknowledgement
/// too) and lets reads through, until UNPAUSE; ALL holds every command
/// until the timeout. The pause is sidecache's: Redis itself is not paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_holds_what_redis_would() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let addr = proxy.addr.to_string();
    let mut op = TcpStream::connect(&addr).await.unwrap();
    let mut c = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(call(&mut c, "SET k v").await, "+OK\r\n");
    assert_eq!(call(&mut op, "CLIENT PAUSE 100000 WRITE").await, "+OK\r\n");
    assert_eq!(call(&mut c, "GET k").await, "$1\r\nv\r\n");
    assert_eq!(call(&mut c, "STRLEN k").await, ":1\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut c, enc("SET k w").as_bytes())
        .await
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), c.read(&mut b))
            .await
            .is_err(),
        "a write answered during CLIENT PAUSE WRITE"
    );
    // Redis itself takes writes meanwhile.
    assert_eq!(
        String::from_utf8_lossy(&raw(&redis.addr(), enc("SET other 1").as_bytes(), 1).await),
        "+OK\r\n"
    );
    // The held client is in INFO's blocked_clients, as Redis counts its
    // paused clients (its own pause, side by side, below).
    let info = call(&mut op, "INFO").await;
    assert_eq!(info_field(&info, "blocked_clients"), 1);
    assert_eq!(info_field(&info, "paused_clients"), 1);
    assert_eq!(call(&mut op, "CLIENT UNPAUSE").await, "+OK\r\n");
    assert_eq!(
        String::from_utf8_lossy(&raw_on(&mut c, b"", 1).await),
        "+OK\r\n"
    );
    assert_eq!(call(&mut c, "GET k").await, "$1\r\nw\r\n");
    let info = call(&mut op, "INFO").await;
    assert_eq!(info_field(&info, "blocked_clients"), 0);
    assert_eq!(info_field(&info, "paused_clients"), 0);
    let mut rop = TcpStream::connect(redis.addr()).await.unwrap();
    let mut rc = TcpStream::connect(redis.addr()).await.unwrap();
    assert_eq!(call(&mut rop, "CLIENT PAUSE 100000 WRITE").await, "+OK\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut rc, enc("SET rk x").as_bytes())
        .await
        .unwrap();
    support::info_becomes(&redis.addr(), "clients", "blocked_clients", 1).await;
    assert_eq!(call(&mut rop, "CLIENT UNPAUSE").await, "+OK\r\n");
    // ALL: even PING waits for the timeout.
    assert_eq!(call(&mut op, "CLIENT PAUSE 400 ALL").await, "+OK\r\n");
    let t0 = Instant::now();
    assert_eq!(call(&mut c, "PING").await, "+PONG\r\n");
    let held = t0.elapsed();
    assert!(
        held >= Duration::from_millis(300),
        "PING answered after {held:?}"
    );
    assert_eq!(call(&mut c, "GET k").await, "$1\r\nw\r\n");
    proxy.stop().await;
}

/// A pause of any length is taken, as Redis takes it (the longest one
/// for ever here), never a panic; UNPAUSE ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_of_any_length() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut op = TcpStream::connect(proxy.addr).await.unwrap();
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        call(&mut op, "CLIENT PAUSE 9223372036854775807 WRITE").await,
        "+OK\r\n"
    );
    assert_eq!(call(&mut c, "GET k").await, "$-1\r\n");
    assert_eq!(call(&mut op, "CLIENT UNPAUSE").await, "+OK\r\n");
    assert_eq!(call(&mut c, "SET k v").await, "+OK\r\n");
    proxy.stop().await;
}

/// The `key=` names of a CLIENT INFO / CLIENT LIST line, in order.
fn field_names(line: &str) -> Vec<String> {
    line.lines()
        .find(|l| l.contains("id="))
        .unwrap_or("")
        .split_whitespace()
        .map(|f| {
            f.split('=')
                .next()
                .unwrap()
                .trim_start_matches('$')
                .to_owned()
        })
        .collect()
}

/// One field's value in a CLIENT INFO / CLIENT LIST line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// CLIENT LIST and CLIENT INFO show the server's fields, in its order,
/// each client's last command as the server names it (`cmd=get`,
/// `cmd=exec`, `cmd=client|info` for the asking client, `NULL` for an
/// unknown one), and on Valkey 8+ the same traffic counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_the_last_command_and_counters() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut seen: Vec<Vec<String>> = Vec::new();
    for addr in [redis.addr().to_string(), proxy.addr.to_string()] {
        let mut c1 = TcpStream::connect(&addr).await.unwrap();
        let mut c2 = TcpStream::connect(&addr).await.unwrap();
        let info = call(&mut c1, "CLIENT INFO").await;
        let id = field(&info, "id").unwrap().to_owned();
        let mut out = vec![
            field_names(&info).join(" "),
            field(&info, "cmd").unwrap().to_owned(),
            // The running client's query buffer: its command, 26 bytes
            // (0 on Valkey 8+, whose query buffer is shared).
            format!("qbuf={}", field(&info, "qbuf").unwrap()),
        ];
        let list = format!("CLIENT LIST ID {id}");
        for step in [
            &["SET k v", "GET k"][..],
            &["MULTI", "SET k w", "EXEC"],
            &["CLIENT ID"],
            // A blocking command (answered at once here) is counted once
            // its reply is in, before the client's next command.
            &["RPUSH bl a", "BLPOP bl 0"],
            &["NO-SUCH-COMMAND"],
            &["PING"],
        ] {
            for line in step {
                call(&mut c1, line).await;
            }
            let l = call(&mut c2, &list).await;
            assert_eq!(field_names(&l), field_names(&info), "{l}");
            out.push(format!(
                "{:?} cmd={} tot-cmds={:?} tot-net-in={:?}",
                step,
                field(&l, "cmd").unwrap(),
                field(&l, "tot-cmds"),
                field(&l, "tot-net-in")
            ));
        }
        let id2 = call(&mut c2, "CLIENT ID").await;
        let id2 = id2.trim().trim_start_matches(':');
        let l = call(&mut c2, "CLIENT LIST").await;
        assert!(l.contains(&format!("id={id} ")), "{l}");
        let own = l
            .lines()
            .find(|l| l.contains(&format!("id={id2} ")))
            .unwrap();
        out.push(format!(
            "own cmd={} qbuf={}; c1 qbuf={}",
            field(own, "cmd").unwrap(),
            field(own, "qbuf").unwrap(),
            field(
                l.lines()
                    .find(|l| l.contains(&format!("id={id} ")))
                    .unwrap(),
                "qbuf"
            )
            .unwrap()
        ));
        seen.push(out);
    }
    assert_eq!(seen[1], seen[0], "through sidecache, then direct");
    proxy.stop().await;
}

fn encv(args: &[&str]) -> bytes::BytesMut {
    let mut out = bytes::BytesMut::new();
    sidecache_resp::encode::encode_command(&mut out, args);
    out
}

/// Under `CLIENT PAUSE WRITE` on `addr`: after `setup` on a fresh
/// connection, whether `cmd` is held (no reply within 300 ms), and its
/// reply once the pause is over.
async fn held_by_write_pause(addr: &str, setup: &[&[&str]], cmd: &[&str]) -> (bool, String) {
    let mut op = TcpStream::connect(addr).await.unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    for line in setup {
        raw_on(&mut c, &encv(line), 1).await;
    }
    assert_eq!(call(&mut op, "CLIENT PAUSE 100000 WRITE").await, "+OK\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut c, &encv(cmd))
        .await
        .unwrap();
    let mut buf = bytes::BytesMut::new();
    let held = tokio::time::timeout(Duration::from_millis(300), c.read_buf(&mut buf))
        .await
        .is_err();
    assert_eq!(call(&mut op, "CLIENT UNPAUSE").await, "+OK\r\n");
    let mut reply = String::from_utf8_lossy(&buf).into_owned();
    if held {
        reply = String::from_utf8_lossy(&raw_on(&mut c, b"", 1).await).into_owned();
    }
    (held, reply)
}

/// What a WRITE pause holds, side by side with Redis: commands Redis flags
/// `may_replicate` (hidden from COMMAND), scripts by their declared flags
/// (EVAL's body, EVALSHA of a script loaded through sidecache, FCALL's
/// function), EXEC by what it runs, and not a command Redis refuses at
/// once (wrong arity, unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_pause_holds_what_redis_holds() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let ro = "#!lua flags=no-writes\nreturn 2";
    let lib = "#!lua name=plib\nredis.register_function{function_name='pro', callback=function() return 'r' end, flags={'no-writes'}}\nredis.register_function('prw', function() return 'w' end)";
    let mut d = TcpStream::connect(redis.addr()).await.unwrap();
    raw_on(&mut d, &encv(&["FUNCTION", "LOAD", lib]), 1).await;
    raw_on(&mut d, &encv(&["PFADD", "h", "a"]), 1).await;
    let sha = String::from_utf8_lossy(&raw_on(&mut d, &encv(&["SCRIPT", "LOAD", ro]), 1).await)
        .lines()
        .nth(1)
        .unwrap()
        .to_owned();
    raw_on(&mut d, &encv(&["SCRIPT", "FLUSH"]), 1).await;
    let load: &[&str] = &["SCRIPT", "LOAD", ro];
    let queue_ro: &[&str] = &["EVAL", ro, "0"];
    let cases: Vec<(Vec<&[&str]>, Vec<&str>)> = vec![
        (vec![], vec!["SET", "k", "v"]),
        (vec![], vec!["GET", "k"]),
        (vec![], vec!["PFCOUNT", "h"]),
        (vec![], vec!["PUBLISH", "ch", "m"]),
        (vec![], vec!["EVAL", "return 1", "0"]),
        (vec![], vec!["EVAL", ro, "0"]),
        (vec![], vec!["EVAL", "#!lua\nreturn 3", "0"]),
        (vec![], vec!["EVAL_RO", "return 4", "0"]),
        (vec![load], vec!["EVALSHA", &sha, "0"]),
        (vec![], vec!["FCALL", "pro", "0"]),
        (vec![], vec!["FCALL", "prw", "0"]),
        (vec![], vec!["FCALL", "nosuch", "0"]),
        (vec![&["MULTI"], &["GET", "k"], &["PING"]], vec!["EXEC"]),
        (vec![&["MULTI"], &["SET", "k", "w"]], vec!["EXEC"]),
        (vec![&["MULTI"], queue_ro], vec!["EXEC"]),
        (vec![], vec!["SET", "k"]),
        (vec![], vec!["NOSUCHCMD", "k"]),
        (vec![], vec!["EXEC"]),
    ];
    // What Redis 7+ holds, case by case (checked below, so that the
    // comparison cannot pass on a harness that sees nothing held).
    let redis_holds = [
        true, false, true, true, true, false, true, false, false, false, true, true, false, true,
        false, false, false, false,
    ];
    let through = proxy.addr.to_string();
    for ((setup, cmd), holds) in cases.iter().zip(redis_holds) {
        let want = held_by_write_pause(&redis.addr(), setup, cmd).await;
        assert_eq!(want.0, holds, "{cmd:?} after {setup:?}, directly");
        let got = held_by_write_pause(&through, setup, cmd).await;
        assert_eq!(
            got, want,
            "{cmd:?} after {setup:?}: through sidecache, then directly"
        );
    }
    proxy.stop().await;
}

/// A client that leaves while a pause holds its write: the write never
/// runs, as Redis frees a paused client that leaves; it is not counted
/// as held any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_client_that_leaves_does_not_write() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &[]).await;
    let mut op = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(call(&mut op, "CLIENT PAUSE 100000 WRITE").await, "+OK\r\n");
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut c, enc("SET gone v").as_bytes())
        .await
        .unwrap();
    let addr = proxy.addr.to_string();
    support::info_becomes(&addr, "proxy", "paused_clients", 1).await;
    drop(c);
    support::info_becomes(&addr, "proxy", "blocked_clients", 0).await;
    assert_eq!(call(&mut op, "CLIENT UNPAUSE").await, "+OK\r\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(call(&mut op, "EXISTS gone").await, ":0\r\n");
    proxy.stop().await;
}
