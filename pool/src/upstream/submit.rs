//! Sending a client's pipeline to a node: the one way the proxy sends a
//! client's commands on a node's shared connections (a redirect's retry,
//! [`Upstream::follow`], goes to the node the redirect names directly: the
//! first hop already waited). [`Upstream::submit`] waits for the
//! write-behind writes the pipeline must not overtake, picks the
//! connection, and turns every failure into an [`Error`]; the
//! [`Pending`] it gives back yields the replies.
//!
//! The waits are what keeps read-your-writes across the write-behind
//! queue: everything queued for the node before the pipeline (in every
//! database: FLUSHALL, SWAPDB, MOVE and COPY … DB reach across them), and
//! everything still queued for a master that left the slot map (on its way
//! to the slots' new owners, maybe this node), reaches upstream first.
//! Each wait is bounded by `--write-queue-timeout`, so a client never
//! hangs behind an unreachable upstream: past it the pipeline is not sent
//! and gets [`Error::WritesPending`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Upstream;
use crate::config::Session;
use crate::conn::mux::{MuxConn, Replies};
use crate::conn::node::Node;
use crate::error::{Error, Result};
use crate::slot::Slot;
use crate::write_behind::Barrier;

/// Which of a node's connections carries a pipeline.
#[derive(Debug, Clone, Copy)]
pub enum Lane {
    /// The client's own connection of the node's pool for its session
    /// (`hint` keeps one client on one connection, so its commands stay in
    /// order).
    Client {
        /// The client's database and protocol.
        session: Session,
        /// Spreads clients over the pool.
        hint: usize,
    },
    /// Optin tracking: the invalidation channel's own connection, which
    /// fills the L1 (reads of values to cache, each registered).
    /// The connection stays in the database clients start in; a pipeline
    /// that fills another one `SELECT`s it and ends by selecting the start
    /// database again (Redis's tracking table names keys, not databases,
    /// so one connection tracks them all).
    Fill {
        /// Which of the master's fill connections
        /// ([`crate::Upstream::fill_connections`]).
        lane: usize,
        /// How many reads it registers (for the metrics).
        reads: usize,
    },
}

/// What [`Upstream::submit`] did.
#[derive(Debug)]
pub struct Submitted {
    /// Whether write-behind writes were queued for the node, or for a
    /// master that left the slot map (so the pipeline waited for them).
    pub waited: bool,
    /// The replies to come, or why the pipeline was not sent.
    pub replies: Result<Pending>,
}

/// The replies to a submitted pipeline, in order, once they are in.
#[derive(Debug)]
pub struct Pending {
    rx: oneshot::Receiver<Result<Replies>>,
    node: Arc<Node>,
    deadline: Option<Instant>,
}

impl Pending {
    /// Replies to come on `rx`, from `node`, awaited until `deadline`.
    pub(super) fn new(
        rx: oneshot::Receiver<Result<Replies>>,
        node: Arc<Node>,
        deadline: Option<Instant>,
    ) -> Pending {
        Pending { rx, node, deadline }
    }

    /// Waits for the replies, until the deadline `submit` was given.
    ///
    /// # Errors
    /// The connection's error; [`Error::Timeout`] past the deadline;
    /// [`Error::Closed`] if the connection went away.
    pub async fn replies(self) -> Result<Replies> {
        let Pending { rx, node, deadline } = self;
        match within(deadline, Flatten(rx)).await {
            Some(r) => r,
            None => Err(timed_out(&node)),
        }
    }
}

/// A reply channel's result, a dropped sender as [`Error::Closed`].
struct Flatten(oneshot::Receiver<Result<Replies>>);

impl Future for Flatten {
    type Output = Result<Replies>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Closed)))
    }
}

impl Upstream {
    /// Sends `count` encoded commands to `node` as one pipeline on `lane`,
    /// once the write-behind writes it must not overtake reached upstream
    /// (see the module docs). `deadline` (`--upstream-timeout` from when
    /// the client's batch started) bounds the send and the replies.
    pub async fn submit(
        &self,
        node: &Arc<Node>,
        lane: Lane,
        payload: Bytes,
        count: usize,
        deadline: Option<Instant>,
    ) -> Submitted {
        let waited = match self.wait_writes_first(node).await {
            Ok(waited) => waited,
            Err(failed) => return failed,
        };
        let replies = self.send(node, lane, payload, count, deadline).await;
        Submitted { waited, replies }
    }

    async fn send(
        &self,
        node: &Arc<Node>,
        lane: Lane,
        payload: Bytes,
        count: usize,
        deadline: Option<Instant>,
    ) -> Result<Pending> {
        let owned: Option<MuxConn>;
        let conn = match lane {
            Lane::Client { session, hint } => node
                .conn(session, hint)
                .ok_or_else(|| Error::Config(format!("database {} out of range", session.db)))?,
            Lane::Fill { lane, reads } => {
                if let Some(st) = self.coherence_stats() {
                    st.registered_reads
                        .fetch_add(reads as u64, std::sync::atomic::Ordering::Relaxed);
                }
                owned = self.fill_conn(node, lane);
                owned
                    .as_ref()
                    .ok_or_else(|| Error::Config("no tracking connection to fill on".into()))?
            }
        };
        let rx = match within(deadline, conn.submit(payload, count)).await {
            Some(r) => r?,
            None => return Err(timed_out(node)),
        };
        Ok(Pending {
            rx,
            node: Arc::clone(node),
            deadline,
        })
    }

    /// [`Upstream::wait_writes`] before a pipeline to `node`: whether it
    /// waited, or the pipeline's result when the wait failed.
    pub(super) async fn wait_writes_first(
        &self,
        node: &Node,
    ) -> std::result::Result<bool, Submitted> {
        self.wait_writes(node).await.map_err(|e| Submitted {
            waited: true,
            replies: Err(e),
        })
    }

    /// Waits until the write-behind writes queued for `node` before now
    /// (every database), and those still queued for masters that left the
    /// slot map, reached upstream: whether there were any. For a caller
    /// about to use a connection it holds (a transaction, a blocking
    /// command); [`Upstream::submit`] does this itself.
    ///
    /// # Errors
    /// [`Error::WritesPending`] when one queue did not flush within
    /// `--write-queue-timeout`.
    pub async fn wait_writes(&self, node: &Node) -> Result<bool> {
        let retired = self.retired_barriers();
        self.wait_barriers(node, node.write_barriers().chain(retired))
            .await
    }

    /// Before queuing a write-behind write of `slot` for `node` (database
    /// `db`): when the slot's previous write was queued on another node
    /// (the slot moved), waits until that node's queue applied it, so a
    /// key's writes stay in order (the slot map records each slot's last queue).
    ///
    /// # Errors
    /// [`Error::WritesPending`] past `--write-queue-timeout`.
    pub async fn wait_reroute(&self, slot: Slot, node: &Arc<Node>, db: u16) -> Result<()> {
        let barrier = self.reroute_barrier(slot, node, db);
        self.wait_barriers(node, barrier.into_iter())
            .await
            .map(drop)
    }

    /// Waits for each of `barriers` in turn, each for at most
    /// `--write-queue-timeout`: whether there were any. The error names
    /// `node`, the node the caller is about to use.
    async fn wait_barriers(
        &self,
        node: &Node,
        barriers: impl Iterator<Item = Barrier>,
    ) -> Result<bool> {
        let limit = self.write_behind().config().queue_timeout;
        let mut waited = false;
        for barrier in barriers {
            waited = true;
            if tokio::time::timeout(limit, barrier.wait()).await.is_err() {
                return Err(Error::WritesPending {
                    addr: node.addr().to_string(),
                });
            }
        }
        Ok(waited)
    }
}

/// `fut`'s output, or `None` once `deadline` passed (no deadline: waits).
async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

fn timed_out(node: &Node) -> Error {
    Error::Timeout {
        addr: node.addr().to_string(),
    }
}
