//! What to do with a reply that may be a cluster redirect: a pure function,
//! tested without sockets.

use sidecache_resp::frame;

use crate::config::NodeAddr;
use crate::slot::Slot;

/// Redirects followed for one command before giving up (as redis-rs and
/// redis-cli do).
pub const MAX_REDIRECTS: u32 = 5;

/// The decision for one reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Not a redirect: hand the reply to the client.
    Done,
    /// The slot moved for good: update the map, resend to `addr`.
    Moved {
        /// The slot named in the reply.
        slot: Slot,
        /// The node that owns it now.
        addr: NodeAddr,
    },
    /// The slot is migrating: send `ASKING` + the command to `addr`, once.
    Ask {
        /// The importing node.
        addr: NodeAddr,
    },
    /// The command did not run for a passing reason (the cluster is
    /// failing over, a multi-key slot is migrating, the node is loading its
    /// data): wait a bit and resend it, while the request's time lasts.
    Retry(Transient),
    /// Too many redirects: hand the last reply to the client.
    GiveUp,
}

/// Decides what to do with `frame`, the reply to attempt number `attempt`
/// (0-based) of a command.
pub fn decide(frame: &[u8], attempt: u32) -> Action {
    let Some(text) = frame::error_text(frame) else {
        return Action::Done;
    };
    let action = if let Some(rest) = text.strip_prefix(b"MOVED ") {
        match parse_target(rest) {
            Some((slot, addr)) => Action::Moved { slot, addr },
            None => Action::Done,
        }
    } else if let Some(rest) = text.strip_prefix(b"ASK ") {
        match parse_target(rest) {
            Some((_, addr)) => Action::Ask { addr },
            None => Action::Done,
        }
    } else if let Some(kind) = transient(text) {
        Action::Retry(kind)
    } else {
        Action::Done
    };
    // Retries are bounded by time (the caller's), redirects by count.
    if matches!(action, Action::Moved { .. } | Action::Ask { .. }) && attempt >= MAX_REDIRECTS {
        return Action::GiveUp;
    }
    action
}

/// An error Redis answers, without running the command, while something
/// passes; a cluster client waits and sends the command again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transient {
    /// `CLUSTERDOWN`: the cluster is failing over (or lost a master).
    ClusterDown,
    /// `TRYAGAIN`: a multi-key command's slot is being migrated.
    TryAgain,
    /// `LOADING`: the node restarted and is loading its data.
    Loading,
}

impl Transient {
    /// Every kind, in metric order.
    pub const ALL: [Transient; 3] = [
        Transient::ClusterDown,
        Transient::TryAgain,
        Transient::Loading,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Transient::ClusterDown => "clusterdown",
            Transient::TryAgain => "tryagain",
            Transient::Loading => "loading",
        }
    }
}

/// The passing error an error reply's text (without `-`) is, if any.
pub fn transient(text: &[u8]) -> Option<Transient> {
    if text.starts_with(b"CLUSTERDOWN") {
        Some(Transient::ClusterDown)
    } else if text.starts_with(b"TRYAGAIN") {
        Some(Transient::TryAgain)
    } else if text.starts_with(b"LOADING") {
        Some(Transient::Loading)
    } else {
        None
    }
}

/// Whether an error reply (its text, without `-`) is one the cluster gives
/// while its slot map is changing: the command did not run, and the map
/// should be read again soon.
pub fn signals_failover(text: &[u8]) -> bool {
    [
        b"CLUSTERDOWN".as_slice(),
        b"TRYAGAIN",
        b"MASTERDOWN",
        b"LOADING",
        b"READONLY",
    ]
    .iter()
    .any(|p| text.starts_with(p))
}

/// Whether a write-behind write that got the error `text` (without `-`) is
/// sent again rather than failed for good: a failover or a busy script in
/// progress, or a redirect still unresolved after following it (slot maps
/// changing during a failover).
pub fn retry_write(text: &[u8]) -> bool {
    signals_failover(text)
        || [b"BUSY ".as_slice(), b"MOVED ", b"ASK "]
            .iter()
            .any(|p| text.starts_with(p))
}

fn parse_target(rest: &[u8]) -> Option<(Slot, NodeAddr)> {
    let s = std::str::from_utf8(rest).ok()?;
    let (slot, addr) = s.trim().split_once(' ')?;
    Some((Slot::new(slot.parse().ok()?)?, NodeAddr::parse(addr)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        assert_eq!(decide(b"+OK\r\n", 0), Action::Done);
        assert_eq!(decide(b"-ERR wrong type\r\n", 0), Action::Done);
        assert_eq!(
            decide(b"-MOVED 3999 127.0.0.1:6381\r\n", 0),
            Action::Moved {
                slot: Slot::new(3999).expect("valid"),
                addr: NodeAddr {
                    host: "127.0.0.1".into(),
                    port: 6381
                }
            }
        );
        assert_eq!(
            decide(b"-ASK 3999 10.0.0.2:6380\r\n", 1),
            Action::Ask {
                addr: NodeAddr {
                    host: "10.0.0.2".into(),
                    port: 6380
                }
            }
        );
        assert_eq!(
            decide(
                b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
                0
            ),
            Action::Retry(Transient::TryAgain)
        );
        assert_eq!(
            decide(b"-CLUSTERDOWN The cluster is down\r\n", 0),
            Action::Retry(Transient::ClusterDown)
        );
        // Retries are bounded by the caller's time, not by a count.
        assert_eq!(
            decide(b"-LOADING Redis is loading the dataset in memory\r\n", 99),
            Action::Retry(Transient::Loading)
        );
        assert_eq!(decide(b"-MOVED 1 h:1\r\n", MAX_REDIRECTS), Action::GiveUp);
        // Malformed redirects are passed to the client untouched.
        assert_eq!(decide(b"-MOVED x\r\n", 0), Action::Done);
        assert_eq!(decide(b"-MOVED 99999 h:1\r\n", 0), Action::Done);
    }

    #[test]
    fn failover_signals() {
        assert!(signals_failover(b"CLUSTERDOWN The cluster is down"));
        assert!(signals_failover(
            b"READONLY You can't write against a read only replica."
        ));
        assert!(signals_failover(
            b"LOADING Redis is loading the dataset in memory"
        ));
        assert!(signals_failover(b"MASTERDOWN Link with MASTER is down"));
        assert!(signals_failover(
            b"TRYAGAIN Multiple keys request during rehashing"
        ));
        assert!(!signals_failover(b"ERR wrong number of arguments"));
        assert!(!signals_failover(b"BUSY Redis is busy running a script"));
    }
}
