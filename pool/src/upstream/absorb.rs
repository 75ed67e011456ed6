//! Absorbing what a cluster client absorbs, so that an application behind
//! sidecache, with a plain standalone client, does not see a failover.
//!
//! A request that meets a passing failure is *held*: it waits (20 ms,
//! doubling to 500 ms, with a slot-map refresh asked for before each try)
//! and is sent again, to the node that serves its slot then, until it is
//! answered or its time is up (`--upstream-timeout` from its start, or
//! from its first wait). Only then does the client get the error. What is
//! held:
//! - a command answered `CLUSTERDOWN`, `TRYAGAIN` or `LOADING`: Redis did
//!   not run it, so any command is sent again, writes included (never a
//!   script or function: such an error may be its own, after writes)
//!   ([`Upstream::follow_via`]);
//! - a pipeline its node was out of reach for (`Error::Connect`: nothing
//!   was sent), and one whose connection was lost before its replies when
//!   every command in it only reads (sending it twice changes nothing); a
//!   pipeline that may write and lost its connection is answered with the
//!   error, its fate unknown (the proxy's `flush`). Write-behind batches
//!   are sent again by their batcher, in order, as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::Upstream;
use crate::backoff::Backoff;
use crate::cluster::redirect::Transient;

/// Upper bounds of the hold-time histogram's buckets, in milliseconds.
pub const HOLD_BUCKETS_MS: [u64; 10] = [1, 5, 25, 100, 250, 500, 1000, 2500, 5000, 10_000];

/// The first wait of a held request; each next one doubles, up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// What held a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absorbed {
    /// An error reply Redis gives while something passes.
    Transient(Transient),
    /// The node could not be reached: nothing was sent.
    Unreachable,
    /// The connection was lost before the replies of a read-only pipeline.
    ConnectionLost,
}

impl Absorbed {
    /// Every kind, in metric order.
    pub const ALL: [Absorbed; 5] = [
        Absorbed::Transient(Transient::ClusterDown),
        Absorbed::Transient(Transient::TryAgain),
        Absorbed::Transient(Transient::Loading),
        Absorbed::Unreachable,
        Absorbed::ConnectionLost,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Absorbed::Transient(t) => t.label(),
            Absorbed::Unreachable => "unreachable",
            Absorbed::ConnectionLost => "connection_lost",
        }
    }

    fn index(self) -> usize {
        Absorbed::ALL.iter().position(|a| *a == self).unwrap_or(0)
    }
}

impl From<Transient> for Absorbed {
    fn from(t: Transient) -> Absorbed {
        Absorbed::Transient(t)
    }
}

/// What following the cluster through failovers took.
#[derive(Debug, Default)]
pub struct FailoverStats {
    /// Slot-map refreshes done (periodic, or asked for after a redirect or
    /// a failure).
    pub refreshes: AtomicU64,
    /// Refreshes after which a master that had left the map was replaced:
    /// failovers (or reshardings) followed.
    pub masters_replaced: AtomicU64,
    /// Requests (a command, or a node's pipeline) held for a passing
    /// failure, counted when their hold ends (answered or timed out).
    pub held: AtomicU64,
    /// Their hold times: one count per [`HOLD_BUCKETS_MS`] bucket (not
    /// cumulative), the last for longer ones.
    pub hold_buckets: [AtomicU64; HOLD_BUCKETS_MS.len() + 1],
    /// The sum of their hold times, in microseconds.
    pub hold_us_sum: AtomicU64,
    /// Read-only pipelines sent again after their connection was lost.
    pub resent_reads: AtomicU64,
    /// Tries made again, by what held them ([`Absorbed::ALL`]'s order).
    pub absorbed: [AtomicU64; Absorbed::ALL.len()],
}

impl FailoverStats {
    /// The count of tries made again for `kind`.
    pub fn absorbed(&self, kind: Absorbed) -> u64 {
        self.absorbed[kind.index()].load(Ordering::Relaxed)
    }
}

/// One request's hold: when it began, and the next wait.
#[derive(Debug)]
pub struct Hold {
    since: Option<Instant>,
    backoff: Backoff,
}

impl Default for Hold {
    fn default() -> Hold {
        Hold {
            since: None,
            backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
        }
    }
}

impl Upstream {
    /// Before trying a held request again (it met `kind`): counts the try,
    /// asks for a slot-map refresh, and waits. `false` when its time is up
    /// (`deadline`; without one, `--upstream-timeout` from its first wait;
    /// `--upstream-timeout 0` waits for ever): then the caller answers
    /// what it has, and passes the hold to [`Upstream::held`].
    pub async fn hold(&self, hold: &mut Hold, kind: Absorbed, deadline: Option<Instant>) -> bool {
        let now = Instant::now();
        let since = *hold.since.get_or_insert(now);
        let until = deadline.or_else(|| self.command_timeout().map(|t| since + t));
        if until.is_some_and(|u| now >= u) {
            return false;
        }
        self.inner.failover.absorbed[kind.index()].fetch_add(1, Ordering::Relaxed);
        if kind != Absorbed::Transient(Transient::Loading) {
            self.request_refresh();
        }
        let wake = now + hold.backoff.next_wait();
        tokio::time::sleep_until(until.map_or(wake, |u| wake.min(u))).await;
        true
    }

    /// A hold ended (the request was answered, or its time was up): counts
    /// it and its time. Nothing for a request that was never held.
    pub fn held(&self, hold: Hold) {
        let Some(since) = hold.since else {
            return;
        };
        let took = since.elapsed();
        let f = &self.inner.failover;
        f.held.fetch_add(1, Ordering::Relaxed);
        let ms = took.as_millis();
        let bucket = HOLD_BUCKETS_MS
            .iter()
            .position(|&b| ms <= u128::from(b))
            .unwrap_or(HOLD_BUCKETS_MS.len());
        f.hold_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        f.hold_us_sum.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// A read-only pipeline whose connection was lost is sent again.
    pub fn note_resent_reads(&self) {
        self.inner
            .failover
            .resent_reads
            .fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) use crate::coherence::tracking::answers_any_error;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_and_debug_answer_any_error() {
        let enc = |args: &[&str]| {
            let mut o = bytes::BytesMut::new();
            sidecache_resp::encode::encode_command(&mut o, args);
            o
        };
        let any = |c: &[u8]| answers_any_error(sidecache_resp::request::command_name(c, 0));
        assert!(any(&enc(&["EVAL", "return 1", "0"])));
        assert!(any(&enc(&["evalsha_ro", "abc", "0"])));
        assert!(any(&enc(&["FCALL", "f", "0"])));
        assert!(any(&enc(&["debug", "error", "LOADING x"])));
        assert!(!any(&enc(&["SET", "k", "v"])));
        assert!(!any(&enc(&["EVALX"])));
        assert!(!any(b"*1\r\n$4\r\nEV"));
        assert!(!any(b""));
    }

    #[test]
    fn kinds_have_their_own_counts() {
        let labels: Vec<&str> = Absorbed::ALL.iter().map(|a| a.label()).collect();
        assert_eq!(
            labels,
            [
                "clusterdown",
                "tryagain",
                "loading",
                "unreachable",
                "connection_lost"
            ]
        );
        assert_eq!(Absorbed::ConnectionLost.index(), 4);
    }
}
