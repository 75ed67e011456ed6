//! Test support: real `redis-server` processes (standalone and a 3-master
//! cluster) on free loopback ports in temporary directories, killed on
//! `Drop`; the proxy run in-process on `127.0.0.1:0`; raw RESP helpers.
//!
//! The server binary is `redis-server` from the PATH, or the one named by
//! `SIDECACHE_TEST_SERVER` (e.g. a `valkey-server`: `.ci/run` runs a subset
//! of these tests against Valkey 8 and 9 that way).
#![allow(dead_code, missing_docs, clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Parser as _;
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/coherence.rs"]
pub mod coherence;
#[path = "support/observed.rs"]
mod observed;
pub use cluster::Cluster;
#[allow(unused_imports)]
pub use observed::{http_get, promtool_check, series, Observed};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The environment variable naming the server binary the tests start.
pub const SERVER_ENV: &str = "SIDECACHE_TEST_SERVER";

/// The server binary the tests start: `$SIDECACHE_TEST_SERVER`, else
/// `redis-server` from the PATH.
pub fn server_bin() -> String {
    std::env::var(SERVER_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// The engine and version of the server binary, from `--version`:
/// `("redis", "7.0.15")`, `("valkey", "9.1.2")`.
pub fn server_engine() -> (String, String) {
    static ENGINE: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let out = Command::new(server_bin())
                .arg("--version")
                .output()
                .unwrap_or_else(|e| panic!("{} --version: {e}", server_bin()));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // "Redis server v=7.0.15 sha=…", "Valkey server v=9.1.2 sha=…"
            let engine = text
                .split_whitespace()
                .next()
                .unwrap_or("redis")
                .to_lowercase();
            let version = text
                .split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .unwrap_or("0")
                .to_owned();
            (engine, version)
        })
        .clone()
}

/// The major version of the server binary (Valkey's own, not its
/// `redis_version`).
pub fn server_major() -> u32 {
    server_engine()
        .1
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// Whether the tests run against Valkey (`SIDECACHE_TEST_SERVER`).
pub fn is_valkey() -> bool {
    server_engine().0 == "valkey"
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "sidecache-test-{}-{}-{}",
        std::process::id(),
        tag,
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A free loopback port (and, for cluster nodes, its bus port +10000).
pub fn free_port(with_bus: bool) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if !with_bus {
            return port;
        }
        if port < 55000 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// One redis-server child process.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
}

impl RedisServer {
    pub fn start(extra: &[&str]) -> RedisServer {
        Self::start_inner(extra, false)
    }

    fn start_inner(extra: &[&str], cluster: bool) -> RedisServer {
        Self::start_node(extra, cluster.then_some(5000))
    }

    /// A server; a cluster node when `node_timeout_ms` is given.
    fn start_node(extra: &[&str], node_timeout_ms: Option<u32>) -> RedisServer {
        for _ in 0..5 {
            let port = free_port(node_timeout_ms.is_some());
            let dir = temp_dir("redis");
            let mut cmd = Command::new(server_bin());
            cmd.arg("--port")
                .arg(port.to_string())
                .args([
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                ])
                .arg("--dir")
                .arg(&dir)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(timeout) = node_timeout_ms {
                cmd.args([
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                ])
                .arg(timeout.to_string());
            }
            let args: Vec<String> = cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let child = cmd.spawn().unwrap_or_else(|e| {
                panic!(
                    "{} must be installed (see .ci/run; {SERVER_ENV} names another binary): {e}",
                    server_bin()
                )
            });
            let mut s = RedisServer {
                child,
                port,
                dir,
                args,
            };
            if s.wait_ready() {
                return s;
            }
            let _ = s.child.kill();
        }
        panic!("could not start {}", server_bin());
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                if s.write_all(b"PING\r\n").is_ok() {
                    // +PONG, or -NOAUTH when a password is required: up either way.
                    let mut b = [0u8; 1];
                    if s.read_exact(&mut b).is_ok() && (b[0] == b'+' || b[0] == b'-') {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("url")
    }

    /// A direct (not through sidecache) multiplexed connection.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis-server")
    }

    /// The server's process id (for SIGSTOP/SIGCONT in fault tests).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal to the server (by pid; never by name).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// Starts the server again on the same port with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Command::new(server_bin())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("server binary");
        assert!(self.wait_ready(), "{} restarted", server_bin());
    }

    /// Kills the server (for failure tests).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The proxy, running in-process.
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    pub unix: Option<PathBuf>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<sidecache_pool::DrainReport>>,
    dir: PathBuf,
}

impl Proxy {
    /// Starts the proxy with `--listen 127.0.0.1:0 --upstream URL` plus `extra` flags.
    pub async fn start(upstream: &str, extra: &[&str]) -> Proxy {
        // Logs for debugging a test: RUST_LOG=sidecache=debug,sidecache_pool=debug
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = temp_dir("proxy");
        let mut args: Vec<String> = vec![
            "sidecache".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--upstream".into(),
            upstream.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let options = sidecache::Options::try_parse_from(&args).expect("valid flags");
        let config = sidecache::Config::from_options(options).expect("valid config");
        let unix = config.unix_socket.as_ref().map(|u| u.0.clone());
        let listeners = sidecache::Listeners::bind(&config).await.expect("bind");
        let addr = listeners.local_addr().expect("addr");
        let shared = sidecache::prepare(config)
            .await
            .expect("upstream reachable");
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(sidecache::run(listeners, shared, async move {
            let _ = rx.await;
        }));
        Proxy {
            addr,
            unix,
            stop: Some(stop),
            task: Some(task),
            dir,
        }
    }

    pub fn dir(&self) -> &PathBuf {
        &self.dir
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("url")
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to proxy")
    }

    /// Graceful shutdown; waits for the drain and returns its report.
    pub async fn stop(mut self) -> sidecache_pool::DrainReport {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let t = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("shutdown in time")
            .expect("no panic")
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whatever arrives on `s` within `wait` (pushes, messages).
pub async fn arrived(s: &mut TcpStream, wait: Duration) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let end = tokio::time::Instant::now() + wait;
    while let Ok(Ok(n)) = tokio::time::timeout_at(end, s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}
/// Sends raw bytes and reads back exactly `replies` RESP frames.
pub async fn raw(addr: &str, input: &[u8], replies: usize) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    raw_on(&mut s, input, replies).await
}

pub async fn raw_on(s: &mut TcpStream, input: &[u8], replies: usize) -> Vec<u8> {
    s.write_all(input).await.expect("write");
    let mut buf = BytesMut::new();
    let mut got = 0;
    let mut consumed = 0;
    let mut sc = Scanner::new();
    while got < replies {
        while got < replies {
            match sc.scan(&buf[consumed..]).expect("valid RESP") {
                Some(n) => {
                    consumed += n;
                    got += 1;
                }
                None => break,
            }
        }
        if got == replies {
            break;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read_buf(&mut buf))
            .await
            .expect("reply in time")
            .expect("read");
        assert!(
            n > 0,
            "connection closed after {got} replies: {:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    buf.to_vec()
}

/// Reads until the peer closes; returns everything read.
pub async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("closed in time")
        .expect("read");
    out
}

/// Polls `addr` with `input` until the replies equal `want` (10 s at most):
/// writes acknowledged by write-behind reach upstream shortly after.
pub async fn eventually_raw(addr: &str, input: &[u8], replies: usize, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = raw(addr, input, replies).await;
        if String::from_utf8_lossy(&got) == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?} on {addr}: {:?}, want {want:?}",
            String::from_utf8_lossy(input),
            String::from_utf8_lossy(&got)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The proxy as its own process (for signals and exit status).
pub struct ProxyProcess {
    child: Child,
    pub port: u16,
}

impl ProxyProcess {
    pub fn start(upstream: &str, extra: &[&str]) -> ProxyProcess {
        let port = free_port(false);
        let child = Command::new(env!("CARGO_BIN_EXE_sidecache"))
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--upstream",
                upstream,
                "--log-level",
                "warn",
            ])
            .env("SIDECACHE_METRICS_LISTEN", "127.0.0.1:0")
            .args(extra)
            .spawn()
            .expect("start sidecache");
        let p = ProxyProcess { child, port };
        // Serving, not only listening: the listener is bound before the
        // upstream is connected and the command table read, and a test
        // that stops the upstream right after start must not catch the
        // proxy still starting (it would give up on the upstream).
        let deadline = Instant::now() + Duration::from_secs(10);
        let pong = || -> bool {
            use std::io::{Read, Write};
            let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                return false;
            };
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 7];
            s.write_all(b"PING\r\n").is_ok()
                && s.read_exact(&mut buf).is_ok()
                && &buf == b"+PONG\r\n"
        };
        while !pong() {
            assert!(Instant::now() < deadline, "sidecache did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Threads named as tokio names its runtime workers (Linux /proc).
    pub fn runtime_threads(&self) -> usize {
        let dir = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(dir)
            .expect("/proc task list")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "tokio-rt-worker")
            .count()
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "sidecache did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of an INFO reply.
pub fn info_field(info: &str, field: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().parse().expect("number"))
        .unwrap_or_else(|| panic!("{field} missing in INFO"))
}

/// Runs `redis-cli -p PORT ARGS…` and returns its trimmed output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Calls of `cmd` in an `INFO commandstats` text (0 if never called).
pub fn command_calls(stats: &str, cmd: &str) -> u64 {
    let prefix = format!("cmdstat_{cmd}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            rest.split(',')
                .next()
                .expect("calls")
                .parse()
                .expect("number")
        })
        .unwrap_or(0)
}

/// Calls of `cmd` the upstream server has seen.
pub async fn upstream_calls(redis: &RedisServer, cmd: &str) -> u64 {
    let stats = raw(&redis.addr(), b"INFO commandstats\r\n", 1).await;
    command_calls(&String::from_utf8_lossy(&stats), cmd)
}

/// A command line as RESP (arguments split on spaces).
pub fn enc(line: &str) -> String {
    let args: Vec<&str> = line.split(' ').collect();
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    out
}

/// Waits until the proxy's write-behind queue is empty.
pub async fn drained(proxy: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info = String::from_utf8_lossy(&raw(proxy, b"INFO proxy\r\n", 1).await).into_owned();
        if info_field(&info, "write_queue_depth") == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "write-behind queue never drained"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `prefix:N` keys (N cycling over `keys`) with increasing values,
/// `depth` SETs per round trip, pausing `pause` between round trips, until
/// `stop`; every write answered `+OK` is recorded in `acked`.
pub async fn writer(
    addr: String,
    prefix: String,
    keys: u64,
    depth: u64,
    pause: Duration,
    acked: Arc<Mutex<HashMap<String, String>>>,
    stop: Arc<AtomicBool>,
) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let batch: Vec<(String, String)> = (0..depth)
            .map(|j| (format!("{prefix}:{}", (i + j) % keys), format!("{}", i + j)))
            .collect();
        let input: String = batch
            .iter()
            .map(|(k, v)| enc(&format!("SET {k} {v}")))
            .collect();
        let out = raw_on(&mut s, input.as_bytes(), batch.len()).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        for ((k, v), reply) in batch.into_iter().zip(text.split_inclusive("\r\n")) {
            if reply == "+OK\r\n" {
                acked.lock().unwrap().insert(k, v);
            }
        }
        i += depth;
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

/// A memory figure of a process from `/proc/PID/status`, in bytes
/// (`VmRSS`: resident now, `VmHWM`: peak resident).
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{field} missing in /proc/{pid}/status"))
        * 1024
}

/// Sends one command on a blocking std socket and returns what one read
/// brings back (for tests that must see how replies are split into writes).
pub fn one_std(s: &mut std::net::TcpStream, line: &str) -> String {
    use std::io::{Read, Write};
    s.write_all(enc(line).as_bytes()).unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Waits (at most 10 s) until `field` of `INFO section` on `addr` (Redis
/// or sidecache) is `want`.
pub async fn info_becomes(addr: &str, section: &str, field: &str, want: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let cmd = enc(&format!("INFO {section}"));
    loop {
        let info = String::from_utf8_lossy(&raw(addr, cmd.as_bytes(), 1).await).into_owned();
        if info_field(&info, field) == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{field} never {want} on {addr}: {info}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
