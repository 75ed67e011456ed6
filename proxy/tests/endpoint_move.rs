//! A standalone primary endpoint that moves (ElastiCache failover): the
//! endpoint's name moves to the new primary and the old one becomes a
//! replica answering `-READONLY` on connections that still work. Emulated
//! with two local Redis swapped by REPLICAOF behind a switchable relay
//! reached as `localhost` (new connections follow the switch, existing
//! ones stay where they are, as with a DNS change). Under pipelined
//! write-behind SETs, every acknowledged write must end up on the new
//! primary with its last acknowledged value.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{info_field, raw, raw_on, Proxy, RedisServer};
use tokio::net::{TcpListener, TcpStream};

/// Forwards each new connection to the port `target` names when it is
/// accepted; the port the relay listens on.
async fn relay(target: Arc<AtomicU16>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = l.accept().await else {
                return;
            };
            let to = target.load(Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut out) = TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    port
}

fn enc(args: &[&str]) -> String {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    out
}

async fn call(addr: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&raw(addr, enc(args).as_bytes(), 1).await).into_owned()
}

/// `depth` pipelined SETs per round trip over `keys` keys, values
/// increasing; every `+OK`'d key's last value recorded.
async fn writer(
    addr: String,
    prefix: String,
    keys: u64,
    depth: u64,
    acked: Arc<Mutex<HashMap<String, String>>>,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let (mut i, mut refused) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let batch: Vec<(String, String)> = (0..depth)
            .map(|j| (format!("{prefix}:{}", (i + j) % keys), format!("{}", i + j)))
            .collect();
        let input: String = batch.iter().map(|(k, v)| enc(&["SET", k, v])).collect();
        let out = raw_on(&mut s, input.as_bytes(), batch.len()).await;
        let text = String::from_utf8_lossy(&out).into_owned();
        for ((k, v), reply) in batch.into_iter().zip(text.split_inclusive("\r\n")) {
            if reply == "+OK\r\n" {
                acked.lock().unwrap().insert(k, v);
            } else {
                refused += 1;
            }
        }
        i += depth;
    }
    refused
}

/// INFO `section` of `addr` as text.
async fn info(addr: &str, section: &str) -> String {
    call(addr, &["INFO", section]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_follow_the_endpoint_to_the_new_primary() {
    endpoint_moves_under_writes(500, Duration::from_millis(1500), &[]).await;
}

/// With batches sent ahead of earlier ones' answers: a later batch must
/// not reach the new primary before an earlier one's retried writes (few
/// keys, so that batches close together share keys; writers stop as the
/// move completes, so the writes around it are the last ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_follow_the_endpoint_with_pipelined_batches() {
    let args = ["--write-pipeline", "4", "--write-batch", "20"];
    endpoint_moves_under_writes(20, Duration::ZERO, &args).await;
}

/// The same under `--tracking bcast` (the default is optin, where
/// write-behind batches travel on the tracking connection and each written
/// value leaves the L1 once it landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_follow_the_endpoint_under_bcast() {
    let args = ["--tracking", "bcast"];
    endpoint_moves_under_writes(500, Duration::from_millis(1500), &args).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_follow_the_endpoint_under_bcast_with_pipelined_batches() {
    let args = [
        "--tracking",
        "bcast",
        "--write-pipeline",
        "4",
        "--write-batch",
        "20",
    ];
    endpoint_moves_under_writes(20, Duration::ZERO, &args).await;
}

/// Four writers over `keys` keys each while the endpoint moves, and for
/// `after` once it moved.
async fn endpoint_moves_under_writes(keys: u64, after: Duration, extra: &[&str]) {
    let a = RedisServer::start(&[]);
    let b = RedisServer::start(&[]);
    let port_a = a.port.to_string();
    let port_b = b.port.to_string();
    assert_eq!(
        call(&b.addr(), &["REPLICAOF", "127.0.0.1", &port_a]).await,
        "+OK\r\n"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !info(&b.addr(), "replication")
        .await
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "B never synced with A");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let target = Arc::new(AtomicU16::new(a.port));
    let endpoint = relay(Arc::clone(&target)).await;
    let mut args = vec!["--connect-timeout", "1"];
    args.extend_from_slice(extra);
    let proxy = Proxy::start(&format!("redis://localhost:{endpoint}"), &args).await;
    let acked: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            tokio::spawn(writer(
                proxy.addr.to_string(),
                format!("w{w}"),
                keys,
                16,
                Arc::clone(&acked),
                Arc::clone(&stop),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The failover, as a managed service runs it: writes on the old
    // primary held, the replica caught up, roles swapped, the name moved,
    // writes released (the old primary now answers them READONLY).
    assert_eq!(
        call(&a.addr(), &["CLIENT", "PAUSE", "10000", "WRITE"]).await,
        "+OK\r\n"
    );
    let offset = |text: &str| info_field(text, "master_repl_offset");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (oa, ob) = (
            offset(&info(&a.addr(), "replication").await),
            offset(&info(&b.addr(), "replication").await),
        );
        if oa == ob {
            break;
        }
        assert!(Instant::now() < deadline, "B behind A: {ob} < {oa}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        call(&b.addr(), &["REPLICAOF", "NO", "ONE"]).await,
        "+OK\r\n"
    );
    target.store(b.port, Ordering::SeqCst);
    assert_eq!(
        call(&a.addr(), &["REPLICAOF", "127.0.0.1", &port_b]).await,
        "+OK\r\n"
    );
    assert_eq!(call(&a.addr(), &["CLIENT", "UNPAUSE"]).await, "+OK\r\n");

    tokio::time::sleep(after).await;
    stop.store(true, Ordering::Relaxed);
    let mut refused = 0;
    for w in writers {
        refused += w.await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let wb = info(&proxy.addr.to_string(), "writebehind").await;
        if info_field(&wb, "write_queue_depth") == 0 {
            assert_eq!(info_field(&wb, "writes_failed"), 0, "{wb}");
            break;
        }
        assert!(Instant::now() < deadline, "queue never drained: {wb}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len() as u64, 4 * keys, "keys acknowledged");
    let mut missing = Vec::new();
    for (k, v) in &acked {
        let got = call(&b.addr(), &["GET", k]).await;
        if got != format!("${}\r\n{v}\r\n", v.len()) {
            missing.push(format!("{k}: acknowledged {v}, B holds {got:?}"));
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes missing on the new primary (first: {:?})",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
    let proxy_info = info(&proxy.addr.to_string(), "proxy").await;
    let reconnects = info_field(&proxy_info, "upstream_readonly_reconnects");
    assert!(reconnects > 0, "{proxy_info}");
    eprintln!("readonly reconnects: {reconnects}, writes refused to clients: {refused}");
    // Writes after the move go to B directly.
    assert_eq!(
        call(&proxy.addr.to_string(), &["SET", "after", "1"]).await,
        "+OK\r\n"
    );
    support::eventually_raw(
        &b.addr(),
        enc(&["GET", "after"]).as_bytes(),
        1,
        "$1\r\n1\r\n",
    )
    .await;
}
