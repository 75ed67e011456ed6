//! Errors of the upstream side (the write journal's among them), and how
//! one reaches a client. Which upstream replies are redirects or retried
//! is decided in `redirect`.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    /// The upstream secret (an IAM token, a password file) could not be
    /// fetched.
    #[error("upstream credentials: {0}")]
    Credentials(String),
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
    /// Every connection of one ACL user's pool is in use (clients
    /// authenticated as that user run on connections of their own).
    #[error(
        "max number of connections for ACL user '{user}' reached ({max}, --acl-user-connections)"
    )]
    UserConnectionsExhausted {
        /// The user.
        user: String,
        /// The configured maximum.
        max: usize,
    },
    /// The pool is shutting down.
    #[error("upstream pool is shut down")]
    Closed,
    /// The write journal could not record a write.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// What can go wrong with the write journal (`write_behind::journal`,
/// which re-exports it); here, a layer below it, so [`Error`] can carry it.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Another process holds the journal's lock file.
    #[error("--write-journal {path}: in use by another sidecache (its lock file {lock} is held); each sidecache needs a journal of its own")]
    Locked {
        /// The journal directory.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// Opening or reading the journal failed.
    #[error("--write-journal {path}: {message}")]
    Open {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// Writing or syncing the journal failed; it accepts no more writes.
    #[error("Errors writing to the write journal (--write-journal): {0}")]
    Failed(Arc<str>),
}

impl Error {
    /// Appends the error as the client sees it: `-ERR <text>` (CR and LF
    /// in the text become spaces). The one place an upstream failure turns
    /// into a reply; Redis's own error replies pass through untouched.
    pub fn write_reply(&self, out: &mut BytesMut) {
        let text = self.to_string().replace(['\r', '\n'], " ");
        out.reserve(text.len() + 7);
        out.put_slice(b"-ERR ");
        out.put_slice(text.as_bytes());
        out.put_slice(b"\r\n");
    }

    /// Whether a connection's handshake was refused for its credentials
    /// (`WRONGPASS`, `NOAUTH`): the user was deleted or disabled, or its
    /// password removed, since.
    pub fn refuses_credentials(&self) -> bool {
        matches!(self, Error::Handshake { reply, .. }
            if reply.starts_with("WRONGPASS") || reply.starts_with("NOAUTH"))
    }

    /// [`Error::write_reply`] as a frame of its own.
    pub fn reply(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.write_reply(&mut out);
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_is_one_error_line() {
        let e = Error::Topology("a\r\nb".into());
        assert_eq!(
            &e.reply()[..],
            b"-ERR cannot read cluster topology: a  b\r\n"
        );
    }
}
