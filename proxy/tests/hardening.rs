//! Hardening through the public interface: protected mode, `--timeout`,
//! and a panicking client task that closes only its own client.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{enc, info_field, raw, raw_on, Proxy, RedisServer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn sidecache() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sidecache"))
}

/// A non-loopback listen address without --requirepass refuses to start,
/// with a one-line reason; --protected-mode no or a password allow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protected_mode_refuses_an_open_listener() {
    let redis = RedisServer::start(&[]);
    let port = support::free_port(false);
    let out = sidecache()
        .args([
            "--listen",
            &format!("0.0.0.0:{port}"),
            "--upstream",
            &redis.url(),
        ])
        .args(["--metrics-listen", "off"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--listen")
            && err.contains("--requirepass")
            && err.contains("--protected-mode no"),
        "{err}"
    );
    for extra in [
        &["--protected-mode", "no"][..],
        &["--requirepass", "secret"][..],
    ] {
        let port = support::free_port(false);
        let mut child = sidecache()
            .args([
                "--listen",
                &format!("0.0.0.0:{port}"),
                "--upstream",
                &redis.url(),
            ])
            .args(["--metrics-listen", "off", "--log-level", "warn"])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(child.try_wait().unwrap().is_none(), "{extra:?}: exited");
            assert!(Instant::now() < deadline, "{extra:?}: not listening");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// --timeout closes an idle client, never a blocked one or a subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_closes_idle_clients_only() {
    let redis = RedisServer::start(&[]);
    let proxy = Proxy::start(&redis.url(), &["--timeout", "1"]).await;
    let mut idle = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(raw_on(&mut idle, b"PING\r\n", 1).await, b"+PONG\r\n");
    let mut sub = TcpStream::connect(proxy.addr).await.unwrap();
    raw_on(&mut sub, enc("SUBSCRIBE quiet").as_bytes(), 1).await;
    let mut blocked = TcpStream::connect(proxy.addr).await.unwrap();
    blocked
        .write_all(enc("BLPOP never 0").as_bytes())
        .await
        .unwrap();
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), support::read_to_close(&mut idle))
        .await
        .expect("idle client still open after 5 s");
    assert!(closed.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Past the timeout twice over, the others are still served.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut p = TcpStream::connect(proxy.addr).await.unwrap();
    assert_eq!(
        raw_on(&mut p, enc("PUBLISH quiet still-here").as_bytes(), 1).await,
        b":1\r\n"
    );
    assert_eq!(
        raw_on(&mut p, enc("RPUSH never v").as_bytes(), 1).await,
        b":1\r\n"
    );
    let got = raw_on(&mut blocked, b"", 1).await;
    assert_eq!(got, b"*2\r\n$5\r\nnever\r\n$1\r\nv\r\n");
    let got = raw_on(&mut sub, b"", 1).await;
    assert!(String::from_utf8_lossy(&got).contains("still-here"));
    proxy.stop().await;
}

/// A panic in one client's task closes that client only: the others keep
/// being served, its acknowledged writes still reach Redis, and the panic
/// is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_client_task_closes_only_its_client() {
    let redis = RedisServer::start(&[]);
    let port = support::free_port(false);
    let mut child = sidecache()
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--upstream",
            &redis.url(),
        ])
        .args(["--metrics-listen", "off", "--log-level", "error"])
        .env("SIDECACHE_TEST_PANIC", "1")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "not listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut other = TcpStream::connect(&addr).await.unwrap();
    raw_on(&mut other, enc("SUBSCRIBE bystander").as_bytes(), 1).await;
    let mut victim = TcpStream::connect(&addr).await.unwrap();
    // Acknowledged from memory, then the task panics.
    let lines = format!(
        "{}{}",
        enc("SET survived yes"),
        enc("CLIENT SIDECACHE-TEST-PANIC")
    );
    victim.write_all(lines.as_bytes()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), support::read_to_close(&mut victim))
        .await
        .expect("panicked client not closed");
    assert!(got.is_empty() || got.starts_with(b"+OK"), "{got:?}");
    let info = String::from_utf8_lossy(&raw(&addr, b"INFO proxy\r\n", 1).await).into_owned();
    assert_eq!(info_field(&info, "client_panics"), 1);
    // The process is up, the other client is served, the write landed.
    let mut p = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(
        raw_on(&mut p, enc("PUBLISH bystander hi").as_bytes(), 1).await,
        b":1\r\n"
    );
    let got = raw_on(&mut other, b"", 1).await;
    assert!(String::from_utf8_lossy(&got).contains("hi"));
    support::eventually_raw(
        &redis.addr(),
        enc("GET survived").as_bytes(),
        1,
        "$3\r\nyes\r\n",
    )
    .await;
    assert!(child.try_wait().unwrap().is_none(), "the process stays up");
    let _ = child.kill();
    let _ = child.wait();
}

/// A client that pipelines 300 GETs of a 1 MB value and reads nothing is
/// not read either once its pending replies pass the output bound
/// (`--client-output-buffer-limit normal 16mb 0 0` by default): sidecache's
/// memory stays bounded, other clients are served, and every reply
/// arrives once the client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_is_paced_not_buffered() {
    const GETS: usize = 300;
    let redis = RedisServer::start(&[]);
    let proxy = support::ProxyProcess::start(&redis.url(), &[]);
    let big = "v".repeat(1 << 20);
    let mut w = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        raw_on(&mut w, enc(&format!("SET big {big}")).as_bytes(), 1).await,
        b"+OK\r\n"
    );
    let before = support::proc_status_bytes(proxy.pid(), "VmRSS");
    let mut slow = TcpStream::connect(proxy.addr()).await.unwrap();
    let gets = enc("GET big").repeat(GETS);
    slow.write_all(gets.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = support::proc_status_bytes(proxy.pid(), "VmRSS");
    // 300 MB of replies were asked for; others are served meanwhile.
    assert_eq!(raw_on(&mut w, b"PING\r\n", 1).await, b"+PONG\r\n");
    eprintln!(
        "slow reader of {GETS} x 1 MB: RSS {} MB -> {} MB",
        before >> 20,
        held >> 20
    );
    assert!(
        held.saturating_sub(before) < 64 << 20,
        "RSS grew {} MB",
        (held - before) >> 20
    );
    // Every reply, in full, once it reads.
    let one = format!("${}\r\n{big}\r\n", big.len()).len();
    read_exactly(&mut slow, one * GETS).await;
}

/// Reads `total` bytes (every reply asked for), failing if they stop
/// coming for 30 s or the connection closes first.
async fn read_exactly(s: &mut TcpStream, total: usize) {
    use tokio::io::AsyncReadExt;
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    while got < total {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("replies stopped")
            .unwrap();
        assert!(n > 0, "closed after {got} bytes");
        got += n;
    }
    assert_eq!(got, total);
}

/// Large values that are not cached (each GET forwarded, its reply's size
/// unknown until it arrives): ten slow readers hold about the output limit
/// each, not their whole first pipeline (a first batch of 16 such GETs
/// was 16 MB per reader when the first estimate was a sixteenth of the
/// limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_readers_of_uncached_values_hold_about_the_limit() {
    const GETS: usize = 60;
    const READERS: usize = 10;
    let redis = RedisServer::start(&[]);
    let proxy = support::ProxyProcess::start(
        &redis.url(),
        &[
            "--l1-exclude-prefix",
            "big",
            "--client-output-buffer-limit",
            "normal 4mb 0 0",
        ],
    );
    let big = "v".repeat(1 << 20);
    let mut w = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        raw_on(&mut w, enc(&format!("SET big {big}")).as_bytes(), 1).await,
        b"+OK\r\n"
    );
    // The write-behind SET upstream before the GETs read it.
    support::eventually_raw(
        &redis.addr(),
        b"STRLEN big\r\n",
        1,
        &format!(":{}\r\n", big.len()),
    )
    .await;
    let before = support::proc_status_bytes(proxy.pid(), "VmRSS");
    let gets = enc("GET big").repeat(GETS);
    let mut slow = Vec::new();
    for _ in 0..READERS {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        s.write_all(gets.as_bytes()).await.unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = support::proc_status_bytes(proxy.pid(), "VmRSS");
    assert_eq!(raw_on(&mut w, b"PING\r\n", 1).await, b"+PONG\r\n");
    eprintln!(
        "{READERS} slow readers of {GETS} x 1 MB uncached: RSS {} MB -> {} MB",
        before >> 20,
        held >> 20
    );
    assert!(
        held.saturating_sub(before) < (READERS as u64) * (8 << 20),
        "RSS grew {} MB for {READERS} readers",
        (held - before) >> 20
    );
    let one = format!("${}\r\n{big}\r\n", big.len()).len();
    for s in &mut slow {
        read_exactly(s, one * GETS).await;
    }
}
