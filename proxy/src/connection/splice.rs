//! Subscriptions and MONITOR: the client's connection is spliced to an
//! upstream connection of its own for the rest of its life.
//!
//! ```text
//!  client ─SUBSCRIBE─▶ earlier replies written, queued writes landed
//!         ─▶ held connection (bounded pool, --max-session-connections)
//!  client ⇄ bytes ⇄ Redis   (both ways, as they come, until either side closes)
//! ```
//!
//! Everything Redis says on a subscribed connection — confirmations,
//! messages, RESP3 pushes interleaved with replies, RESP2's refusal of
//! other commands while subscribed, PING's `pong` — comes from Redis
//! itself, so it is exactly Redis's behaviour. Once spliced, the
//! connection is Redis's: nothing more is answered from the L1 or written
//! behind on it (client libraries give subscribers a connection of their
//! own anyway). A slow subscriber is paced by Redis: sidecache reads from
//! upstream only as fast as the client takes it, so Redis's own
//! `client-output-buffer-limit pubsub` applies to it, and sidecache holds
//! at most its copy buffers for it.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::Client;

/// What started the splice: its first command and the node.
pub(super) struct Splice {
    raw: bytes::Bytes,
    node: usize,
}

impl Client {
    pub(super) fn splice_next(&mut self, raw: bytes::Bytes, node: usize) {
        self.spliced = Some(Splice { raw, node });
    }

    /// Splices `stream` to a new upstream connection, sending it the
    /// command that asked for it and whatever the client sent after it
    /// (`rbuf`), then copies both ways until either side closes or the
    /// proxy shuts down.
    pub(super) async fn run_splice<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        rbuf: &mut BytesMut,
        shutdown: &CancellationToken,
    ) {
        let Some(sp) = self.spliced.take() else {
            return;
        };
        let Some(n) = self.topo.nodes().get(sp.node).cloned() else {
            return;
        };
        if let Err(e) = self.wait_writes(&n).await {
            super::flush::upstream_error(&mut self.wbuf, &e);
            return;
        }
        let up = self.shared.upstream.clone();
        let wait = up.write_behind().config().queue_timeout;
        let conn = match up.sessions().splice(n.addr(), self.session(), wait).await {
            Ok(c) => c,
            Err(e) => {
                super::flush::upstream_error(&mut self.wbuf, &e);
                return;
            }
        };
        let mut wr = conn.wr;
        let mut first = BytesMut::with_capacity(sp.raw.len() + rbuf.len());
        first.extend_from_slice(&sp.raw);
        first.extend_from_slice(rbuf);
        rbuf.clear();
        if wr.write_all(&first).await.is_err() {
            return;
        }
        let stats = &self.shared.stats.splice;
        stats
            .active
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        stats
            .total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut upstream = tokio::io::join(conn.rd, wr);
        tokio::select! {
            r = tokio::io::copy_bidirectional(stream, &mut upstream) => {
                if r.is_err() {
                    self.shared.stats.splice.broken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            () = shutdown.cancelled() => {}
        }
        self.shared
            .stats
            .splice
            .active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
