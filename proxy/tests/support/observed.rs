//! The proxy in-process with its metrics endpoint, and what reads that
//! endpoint: a plain HTTP GET, one series of a scrape, `promtool check`.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The proxy in-process with its HTTP endpoint on a free port.
pub struct Observed {
    pub addr: std::net::SocketAddr,
    pub http: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<sidecache_pool::DrainReport>>,
    http_stop: tokio_util::sync::CancellationToken,
}

impl Observed {
    pub async fn start(upstream: &str, extra: &[&str]) -> Observed {
        let mut args: Vec<String> = [
            "sidecache",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let config = sidecache::Config::from_options(
            <sidecache::Options as clap::Parser>::try_parse_from(&args).unwrap(),
        )
        .unwrap();
        let listeners = sidecache::Listeners::bind(&config).await.unwrap();
        let addr = listeners.local_addr().unwrap();
        let http_listener = tokio::net::TcpListener::bind(config.metrics_listen.unwrap())
            .await
            .unwrap();
        let http = http_listener.local_addr().unwrap();
        let exporter = std::sync::Arc::new(sidecache::report::export::Exporter::new());
        let http_stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(sidecache::report::http::serve(
            http_listener,
            std::sync::Arc::clone(&exporter),
            http_stop.clone(),
        ));
        let shared = sidecache::prepare(config).await.unwrap();
        exporter.attach(&shared);
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(sidecache::run(listeners, shared, async move {
            let _ = rx.await;
        }));
        Observed {
            addr,
            http,
            stop: Some(stop),
            task: Some(task),
            http_stop,
        }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap();
        }
        self.http_stop.cancel();
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.http_stop.cancel();
    }
}

/// A plain HTTP/1.1 GET: (status, body).
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// The value of one series (`name` or `name{labels}`), 0 when absent.
pub fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Runs `promtool check metrics` on `text`; fails the test on any problem.
pub fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool must be installed (Debian package prometheus; see .ci/run)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool: {report}\n{text}");
    assert!(report.trim().is_empty(), "promtool: {report}");
}
