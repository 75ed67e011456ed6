//! `txbench`: how many transactions per second a server answers.
//!
//! Each of `--clients` connections sends `--pipeline` transactions
//! (`MULTI`, `SET key:N value`, `INCR counter:N`, `EXEC`) in one write,
//! reads all their replies, and repeats until `--requests` transactions
//! were answered in all. Prints one CSV line: transactions per second,
//! p50 and p99 of the round-trip time of one pipeline (ms). Replies are
//! framed with sidecache's own RESP scanner and every EXEC reply is checked
//! to be an array of two results.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Parser;
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Parser, Debug)]
#[command(about = "Pipelined MULTI/SET/INCR/EXEC load; prints tx/s,p50_ms,p99_ms")]
struct Args {
    /// host:port to load.
    #[arg(long, default_value = "127.0.0.1:6379")]
    addr: String,
    /// Connections.
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Transactions per pipeline (per round trip).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// Transactions in all.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Keys per client (keys cycle over them).
    #[arg(long, default_value_t = 1000)]
    keyspace: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 64)]
    data_size: usize,
}

fn bulk(out: &mut Vec<u8>, a: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(b"\r\n");
}

fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        bulk(out, a);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let left = Arc::new(AtomicU64::new(args.requests));
    let value = vec![b'x'; args.data_size];
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (left, value) = (Arc::clone(&left), value.clone());
        let (addr, pipeline, keyspace) = (args.addr.clone(), args.pipeline, args.keyspace.max(1));
        tasks.push(tokio::spawn(async move {
            client(c, addr, pipeline, keyspace, value, left).await
        }));
    }
    let mut rtts: Vec<Duration> = Vec::new();
    let mut done = 0u64;
    for t in tasks {
        let (n, mut r) = t.await??;
        done += n;
        rtts.append(&mut r);
    }
    let secs = started.elapsed().as_secs_f64();
    rtts.sort();
    let q = |p: f64| {
        rtts.get(((rtts.len() as f64 - 1.0) * p) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!("{:.0},{:.3},{:.3}", done as f64 / secs, q(0.5), q(0.99));
    Ok(())
}

type ClientResult = Result<(u64, Vec<Duration>), std::io::Error>;

async fn client(
    c: usize,
    addr: String,
    pipeline: usize,
    keyspace: u64,
    value: Vec<u8>,
    left: Arc<AtomicU64>,
) -> ClientResult {
    let mut s = TcpStream::connect(&addr).await?;
    s.set_nodelay(true)?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut scanner = Scanner::new();
    let mut out = Vec::new();
    let mut rtts = Vec::new();
    let mut done = 0u64;
    let mut i = 0u64;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    loop {
        let want = pipeline as u64;
        let granted = left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
                (l > 0).then(|| l.saturating_sub(want))
            })
            .map_or(0, |l| l.min(want));
        if granted == 0 {
            return Ok((done, rtts));
        }
        out.clear();
        for _ in 0..granted {
            let key = format!("tx:{c}:{}", i % keyspace);
            let counter = format!("txc:{c}:{}", i % keyspace);
            command(&mut out, &[b"MULTI"]);
            command(&mut out, &[b"SET", key.as_bytes(), &value]);
            command(&mut out, &[b"INCR", counter.as_bytes()]);
            command(&mut out, &[b"EXEC"]);
            i += 1;
        }
        let t = Instant::now();
        s.write_all(&out).await?;
        let mut frames = 0u64;
        let need = granted * 4;
        while frames < need {
            match scanner.scan(&buf) {
                Ok(Some(len)) => {
                    let f = buf.split_to(len);
                    frames += 1;
                    // Every fourth reply is EXEC's: an array of two.
                    if frames.is_multiple_of(4) && !f.starts_with(b"*2\r\n") {
                        return Err(bad(&format!(
                            "unexpected EXEC reply {:?}",
                            String::from_utf8_lossy(&f)
                        )));
                    }
                    continue;
                }
                Ok(None) => {}
                Err(_) => return Err(bad("bad RESP")),
            }
            if s.read_buf(&mut buf).await? == 0 {
                return Err(bad("connection closed"));
            }
        }
        rtts.push(t.elapsed());
        done += granted;
    }
}
