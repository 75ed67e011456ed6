//! Errors of the upstream side: who caused them and whether a retry can help.

use std::sync::Arc;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which side of the proxy an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The upstream server or the network to it.
    Upstream,
    /// Our own configuration or an invariant of the proxy.
    Internal,
}

/// Everything that can go wrong talking to upstream.
///
/// Errors are `Clone` because one failed connection fails every request that
/// was in flight on it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A TCP/TLS connection to an upstream node could not be made.
    #[error("upstream {addr} unreachable: {reason}")]
    Connect {
        /// `host:port` of the node.
        addr: String,
        /// What failed.
        reason: String,
    },
    /// An established upstream connection broke; in-flight commands may or
    /// may not have run.
    #[error("upstream {addr} connection lost: {reason}")]
    ConnectionLost {
        /// `host:port` of the node.
        addr: String,
        /// What failed.
        reason: String,
    },
    /// A standalone node answered `-READONLY` (it is a replica now: the
    /// endpoint moved), so its connection was closed to reconnect through
    /// a fresh name resolution. Commands still unanswered when the drain
    /// gave up may or may not have run.
    #[error("upstream {addr} answered READONLY (a replica now): reconnecting")]
    Demoted {
        /// `host:port` of the node.
        addr: String,
    },
    /// The connection handshake (AUTH, HELLO, SELECT) was refused.
    #[error("upstream {addr} refused the handshake: {reply}")]
    Handshake {
        /// `host:port` of the node.
        addr: String,
        /// The server's error reply.
        reply: String,
    },
    /// The upstream sent bytes that are not RESP.
    #[error("upstream protocol error: {0}")]
    Protocol(#[from] sidecache_resp::frame::ProtocolError),
    /// A command did not complete within the configured timeout.
    #[error("upstream {addr} did not answer in time")]
    Timeout {
        /// `host:port` of the node.
        addr: String,
    },
    /// A cluster redirect chain did not settle.
    #[error("too many cluster redirections (last: {last})")]
    TooManyRedirects {
        /// The last redirect reply seen.
        last: String,
    },
    /// No node serves the slot (cluster down or map incomplete).
    #[error("no upstream node serves slot {0}")]
    SlotUnassigned(u16),
    /// The cluster topology could not be read.
    #[error("cannot read cluster topology: {0}")]
    Topology(String),
    /// The configuration cannot work.
    #[error("invalid upstream configuration: {0}")]
    Config(String),
    /// TLS setup failed.
    #[error("TLS: {0}")]
    Tls(Arc<str>),
    /// The write-behind queue stayed full.
    #[error("write-behind queue full: {max} writes queued (--write-queue-max) for {waited:?} (--write-queue-timeout)")]
    QueueFull {
        /// The configured maximum.
        max: usize,
        /// How long the write waited.
        waited: std::time::Duration,
    },
    /// The write-behind queue stayed full in bytes.
    #[error("write-behind queue full: {max_bytes} bytes queued (--write-queue-max-bytes) for {waited:?} (--write-queue-timeout)")]
    QueueBytesFull {
        /// The configured maximum.
        max_bytes: usize,
        /// How long the write waited.
        waited: std::time::Duration,
    },
    /// One write is larger than the whole byte bound of the queue.
    #[error("write of {size} bytes is larger than the write-behind queue ({max_bytes} bytes, --write-queue-max-bytes)")]
    TooLargeToQueue {
        /// The write's encoded size.
        size: usize,
        /// The configured maximum.
        max_bytes: usize,
    },
    /// A command had to wait for earlier write-behind writes to its node,
    /// and they were not flushed in time.
    #[error("upstream {addr}: earlier writes are not flushed yet (upstream unavailable?)")]
    WritesPending {
        /// `host:port` of the node.
        addr: String,
    },
    /// Every held session connection is in use.
    #[error("max number of session connections reached ({max}, --max-session-connections): a transaction or WATCH needs one")]
    SessionsExhausted {
        /// The configured maximum.
        max: usize,
    },
    /// The pool is shutting down.
    #[error("upstream pool is shut down")]
    Closed,
}

impl Error {
    /// Which side caused the error.
    pub fn side(&self) -> Side {
        match self {
            Error::Config(_) | Error::Tls(_) | Error::Closed => Side::Internal,
            _ => Side::Upstream,
        }
    }

    /// Whether sending the same command again (after a refresh or a
    /// reconnect) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. } | Error::SlotUnassigned(_) | Error::Timeout { .. }
        )
    }
}
