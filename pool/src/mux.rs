//! A multiplexed, pipelined upstream connection.
//!
//! ```text
//!  callers ──Request{payload, count}──▶ [bounded queue] ──▶ writer ──bytes──▶ upstream
//!                                                              │
//!                                                  Inflight{count, reply}  (bounded, in write order)
//!                                                              ▼
//!  callers ◀──────── Vec<frame> per request ──────────────── reader ◀──replies── upstream
//! ```
//!
//! Many client connections share one upstream connection; the writer
//! coalesces whatever is queued into one write, the reader hands each
//! request's replies back in order (Redis answers in order on a connection).
//! A supervisor reconnects with backoff; while disconnected, requests fail
//! fast instead of piling up.
//!
//! # Race window
//! The writer queues the `Inflight` entry *before* writing the bytes, so the
//! reader always finds the sink for a reply it reads. If the connection
//! breaks, everything in flight fails with [`Error::ConnectionLost`]: those
//! commands may or may not have run upstream.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use crate::config::{NodeAddr, Session};
use crate::conn::{Connector, ReadHalf, WriteHalf};
use crate::error::{Error, Result};
use crate::resp::Scanner;

/// Requests queued per connection before callers wait (backpressure).
const QUEUE: usize = 1024;
/// Requests written but not yet answered, per connection.
const INFLIGHT: usize = 8192;
/// Stop coalescing queued requests into one write past this many bytes.
const MAX_WRITE: usize = 256 * 1024;

/// The replies of one request, one frame per command, in order.
pub type Replies = Vec<Bytes>;

struct Request {
    payload: Bytes,
    count: usize,
    reply: oneshot::Sender<Result<Replies>>,
}

struct Inflight {
    count: usize,
    frames: Replies,
    reply: oneshot::Sender<Result<Replies>>,
}

/// Handle to one multiplexed connection; cheap to clone.
#[derive(Clone, Debug)]
pub struct MuxConn {
    tx: mpsc::Sender<Request>,
}

impl MuxConn {
    /// Starts the connection's supervisor; it connects in the background.
    pub fn spawn(connector: Arc<Connector>, addr: NodeAddr, session: Session) -> MuxConn {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(supervise(connector, addr, session, rx));
        MuxConn { tx }
    }

    /// Queues `count` encoded commands as one unit; the receiver yields their
    /// replies.
    ///
    /// # Errors
    /// [`Error::Closed`] if the connection task is gone.
    pub async fn submit(
        &self,
        payload: Bytes,
        count: usize,
    ) -> Result<oneshot::Receiver<Result<Replies>>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request {
                payload,
                count,
                reply,
            })
            .await
            .map_err(|_| Error::Closed)?;
        Ok(rx)
    }

    /// Submits and waits.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn call(&self, payload: Bytes, count: usize) -> Result<Replies> {
        self.submit(payload, count)
            .await?
            .await
            .map_err(|_| Error::Closed)?
    }
}

async fn supervise(
    connector: Arc<Connector>,
    addr: NodeAddr,
    session: Session,
    mut rx: mpsc::Receiver<Request>,
) {
    let mut backoff = Duration::from_millis(20);
    loop {
        match connector.connect(&addr, session).await {
            Ok((rd, wr)) => {
                debug!(%addr, "upstream connected");
                backoff = Duration::from_millis(20);
                let reason = run_connected(&addr, &connector, rd, wr, &mut rx).await;
                match reason {
                    None => return,
                    Some(e) => warn!(%addr, error = %e, "upstream connection lost"),
                }
            }
            Err(e) => {
                warn!(%addr, error = %e, "upstream connect failed");
                // Fail fast whatever waits, and whatever arrives during the
                // backoff, so clients get an error instead of a hang.
                let deadline = tokio::time::sleep(backoff);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => break,
                        r = rx.recv() => match r {
                            Some(req) => { let _ = req.reply.send(Err(e.clone())); }
                            None => return,
                        },
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Runs until the connection breaks (`Some(error)`) or every handle is
/// dropped (`None`).
async fn run_connected(
    addr: &NodeAddr,
    connector: &Connector,
    rd: ReadHalf,
    mut wr: WriteHalf,
    rx: &mut mpsc::Receiver<Request>,
) -> Option<Error> {
    let (inflight_tx, inflight_rx) = mpsc::channel::<Inflight>(INFLIGHT);
    let mut reader = tokio::spawn(read_loop(
        addr.clone(),
        rd,
        inflight_rx,
        connector.max_reply_bulk(),
    ));
    let mut wbuf = BytesMut::with_capacity(16 * 1024);
    let lost = |reason: String| Error::ConnectionLost {
        addr: addr.to_string(),
        reason,
    };
    loop {
        let first = tokio::select! {
            biased;
            r = &mut reader => {
                return Some(match r {
                    Ok(e) => e,
                    Err(e) => lost(e.to_string()),
                });
            }
            r = rx.recv() => r,
        };
        let Some(first) = first else {
            drop(inflight_tx);
            let _ = wr.shutdown().await;
            let _ = reader.await;
            return None;
        };
        let mut next = Some(first);
        while let Some(req) = next.take() {
            wbuf.extend_from_slice(&req.payload);
            let entry = Inflight {
                count: req.count,
                frames: Vec::with_capacity(req.count),
                reply: req.reply,
            };
            if let Err(mpsc::error::SendError(entry)) = inflight_tx.send(entry).await {
                let _ = entry.reply.send(Err(lost("reader stopped".into())));
            }
            if wbuf.len() < MAX_WRITE {
                next = rx.try_recv().ok();
            }
        }
        if let Err(e) = wr.write_all(&wbuf).await {
            drop(inflight_tx);
            let _ = reader.await;
            return Some(lost(e.to_string()));
        }
        wbuf.clear();
        if wbuf.capacity() > 4 * MAX_WRITE {
            wbuf = BytesMut::with_capacity(16 * 1024);
        }
    }
}

async fn read_loop(
    addr: NodeAddr,
    mut rd: ReadHalf,
    mut inflight: mpsc::Receiver<Inflight>,
    _max_bulk: usize,
) -> Error {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut scanner = Scanner::new();
    let mut current: Option<Inflight> = None;
    let lost = |reason: String| Error::ConnectionLost {
        addr: addr.to_string(),
        reason,
    };
    let err = 'outer: loop {
        loop {
            match scanner.scan(&buf) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    if frame.first() == Some(&b'>') {
                        // Out-of-band push (RESP3); not a reply.
                        continue;
                    }
                    let mut cur = match current.take() {
                        Some(c) => c,
                        None => match inflight.try_recv() {
                            Ok(c) => c,
                            Err(_) => break 'outer lost("reply without a request".into()),
                        },
                    };
                    cur.frames.push(frame);
                    if cur.frames.len() >= cur.count {
                        let _ = cur.reply.send(Ok(cur.frames));
                    } else {
                        current = Some(cur);
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer Error::Protocol(e),
            }
        }
        if buf.capacity() - buf.len() < 8 * 1024 {
            buf.reserve(64 * 1024);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => break lost("closed by server".into()),
            Ok(_) => {}
            Err(e) => break lost(e.to_string()),
        }
    };
    inflight.close();
    if let Some(c) = current {
        let _ = c.reply.send(Err(err.clone()));
    }
    while let Ok(c) = inflight.try_recv() {
        let _ = c.reply.send(Err(err.clone()));
    }
    err
}
