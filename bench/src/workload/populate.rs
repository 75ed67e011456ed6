//! `--populate`: every key of the key space written once (version 0)
//! before the load, in pipelined batches, the key range split over the
//! connections, so that every read finds its key. Owns only the writing
//! of the keys; what a write looks like is `command`'s.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use bytes::BytesMut;
use sidecache_resp::frame::Scanner;
use tokio::io::AsyncWriteExt;

use super::command::Cfg;
use super::conn::{connect, read_frame, Io};

/// Writes every key of `cfg` over `conns` connections to `target`,
/// `batch` commands per round trip; reports the time taken on stderr.
///
/// # Errors
/// A connection failing, or any error reply.
pub(crate) async fn all(
    cfg: &Arc<Cfg>,
    target: &str,
    unix: Option<&str>,
    conns: usize,
    batch: usize,
) -> Result<()> {
    let started = Instant::now();
    let per = cfg.keys.div_ceil(conns as u64);
    let mut tasks = Vec::new();
    for c in 0..conns as u64 {
        let (from, to) = ((c * per).min(cfg.keys), ((c + 1) * per).min(cfg.keys));
        let s = connect(target, unix).await?;
        let cfg = Arc::clone(cfg);
        tasks.push(tokio::spawn(range(s, cfg, from, to, batch)));
    }
    let mut errors = 0;
    for t in tasks {
        errors += t.await??;
    }
    eprintln!(
        "workload: populated {} keys in {:.2} s ({} errors)",
        cfg.keys,
        started.elapsed().as_secs_f64(),
        errors
    );
    if errors > 0 {
        bail!("{errors} populate writes failed");
    }
    Ok(())
}

/// Writes keys `from..to` (version 0), `batch` commands per round trip;
/// returns the error replies.
async fn range(mut s: Box<dyn Io>, cfg: Arc<Cfg>, from: u64, to: u64, batch: usize) -> Result<u64> {
    let mut out = Vec::with_capacity(batch * (cfg.value_size + 64));
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut sc = Scanner::new();
    let mut errors = 0;
    let mut k = from;
    while k < to {
        let end = (k + batch as u64).min(to);
        out.clear();
        for key in k..end {
            cfg.push_write(&mut out, key, 0, 0);
        }
        s.write_all(&out).await?;
        for _ in k..end {
            let f = read_frame(&mut s, &mut buf, &mut sc).await?;
            if f.first() == Some(&b'-') {
                if errors == 0 {
                    eprintln!(
                        "workload: populate error: {}",
                        String::from_utf8_lossy(&f).trim_end()
                    );
                }
                errors += 1;
            }
        }
        k = end;
    }
    Ok(errors)
}
