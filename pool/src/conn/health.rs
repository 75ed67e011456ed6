//! The health of one upstream node as its replies show it: answering
//! normally, *suspect* (a request has waited unusually long for its
//! reply), or in *trouble* (its latest reply was `-BUSY`, `-LOADING` or
//! `-MASTERDOWN`). The node's control connection, which carries what
//! must not queue behind a blocked shared connection (PING while in
//! doubt, SCRIPT KILL, FUNCTION KILL), and the prober that runs on it live
//! in [`crate::conn::control`]; what the health means for the whole
//! upstream (PING answered locally, `/readyz`) in `upstream/health.rs`.
//!
//! ```text
//!   every reply on the node's connections ──observe──▶ state ◀──suspect── writer watchdog
//!                                                        │                (a request unanswered
//!   healthy ◀── any other reply ─┐                       │                 for SUSPECT_AFTER)
//!   trouble ◀── BUSY/LOADING/MASTERDOWN ┘                ▼
//!                               prober: PING on the control connection every PROBE_EVERY
//!                               until a reply says healthy (then it stops)
//! ```
//!
//! # Why this shape
//! The proxy answers PING itself: it is the most frequent health check
//! and must stay as fast as Redis's. It may only do so while the upstream
//! would have answered PONG, so the fast path reads one upstream-wide
//! counter of nodes not known healthy ([`Health::unhealthy`]'s source): a
//! single relaxed atomic load, no lock, no allocation. Only while that
//! counter is above zero does PING travel upstream, on the control
//! connection (never a shared one: a shared connection may be the one
//! blocked behind the running script, and Redis answers a connection's
//! commands in order).
//!
//! Measured with `bench/ab.sh` (`TESTS=ping_mbulk`, before and after
//! this check was added, release builds, on a 2-core machine shared with
//! another build): `-P 16` medians of 7 rounds 606k and 608k PINGs per
//! second; an earlier 5-round run gave 576k and 522k (`-P 1`: 39k and
//! 37k), within the spread of single rounds (507k–733k) on that machine.
//!
//! Replies alone cannot reveal a busy script early enough: until Redis
//! starts answering `-BUSY` (after `busy-reply-threshold`, formerly
//! `lua-time-limit`), nothing comes back at all, and the client that ran
//! the script just waits. So each watched connection's writer arms a
//! timer when it writes; if a request written before the timer was armed
//! is still unanswered when it fires ([`SUSPECT_AFTER`]), the node is
//! suspect and the prober starts pinging it. A suspect node that answers
//! PONG (a slow command, not a script) is healthy again at once.
//!
//! The state is what the *latest* reply said. Replies on different
//! connections can be read in any order, so a reply produced just before
//! a script started may clear a trouble state for a moment; the next
//! reply (the prober's, or any other) sets it again.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sidecache_resp::frame;
use tracing::{info, warn};

use crate::config::NodeAddr;
use crate::conn::connect::Connector;

/// A request unanswered this long makes its node suspect.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(80);
/// How often the prober pings a node that is not healthy.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

const HEALTHY: u8 = 0;
const SUSPECT: u8 = 1;
const BUSY: u8 = 2;
const LOADING: u8 = 3;
const MASTERDOWN: u8 = 4;

/// Counters shared by every node of an upstream.
#[derive(Debug, Default)]
pub struct HealthStats {
    /// Connections closed and re-opened because the node answered
    /// `-READONLY` (a standalone primary demoted to a replica).
    pub readonly_reconnects: AtomicU64,
    /// Nodes not known healthy now (suspect or in trouble).
    pub unhealthy: AtomicUsize,
}

/// A node's health; shared by its connections.
pub struct Health {
    addr: NodeAddr,
    connector: Arc<Connector>,
    state: AtomicU8,
    /// The text of the latest trouble reply (for `/readyz`).
    reason: Mutex<String>,
    stats: Arc<HealthStats>,
    probing: AtomicBool,
    /// Starts the prober (installed by the node's control connection).
    prober: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Standalone: a `-READONLY` reply means the endpoint moved, and the
    /// connection that saw it reconnects (see [`crate::conn::mux`]).
    readonly_reconnects: bool,
}

/// Whether `frame`, the reply to command `idx` of the pipeline `sent`,
/// may change what sidecache thinks of the node (its health, a standalone
/// node's demotion): any reply but one that looks like the node's state
/// (`BUSY`, `LOADING`, `MASTERDOWN`, `READONLY`) and answers a script, a
/// function or `DEBUG`, whose error text may be the code's or the
/// caller's own (`return redis.error_reply('READONLY …')`, `DEBUG ERROR`).
/// Only such replies pay for finding their command.
pub(crate) fn node_state(frame: &[u8], sent: &[u8], idx: usize) -> bool {
    if trouble_of(frame).is_none() && !frame.starts_with(b"-READONLY") {
        return true;
    }
    let name = sidecache_resp::request::command_name(sent, idx);
    !crate::coherence::tracking::answers_any_error(name)
}

/// What a trouble reply says, from its first bytes.
fn trouble_of(frame: &[u8]) -> Option<u8> {
    if frame.first() != Some(&b'-') {
        return None;
    }
    let t = &frame[1..];
    if t.starts_with(b"BUSY ") {
        Some(BUSY)
    } else if t.starts_with(b"LOADING") {
        Some(LOADING)
    } else if t.starts_with(b"MASTERDOWN") {
        Some(MASTERDOWN)
    } else {
        None
    }
}

impl Health {
    /// The health of `addr`, healthy until a reply says otherwise.
    pub(crate) fn new(
        addr: NodeAddr,
        connector: Arc<Connector>,
        stats: Arc<HealthStats>,
        readonly_reconnects: bool,
    ) -> Health {
        Health {
            addr,
            connector,
            state: AtomicU8::new(HEALTHY),
            reason: Mutex::new(String::new()),
            stats,
            probing: AtomicBool::new(false),
            prober: OnceLock::new(),
            readonly_reconnects,
        }
    }

    /// The node's address.
    pub fn addr(&self) -> &NodeAddr {
        &self.addr
    }

    /// The connector the node's connections use.
    pub(crate) fn connector(&self) -> &Arc<Connector> {
        &self.connector
    }

    /// Whether connections reconnect when the node answers `-READONLY`.
    pub(crate) fn reconnects_on_readonly(&self) -> bool {
        self.readonly_reconnects
    }

    /// Counts one READONLY reconnect.
    pub(crate) fn note_readonly_reconnect(&self) {
        self.stats
            .readonly_reconnects
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the latest reply was a normal one and nothing is overdue.
    pub fn is_healthy(&self) -> bool {
        self.state.load(Ordering::Relaxed) == HEALTHY
    }

    /// `busy: BUSY Redis is busy…` while the node's latest reply was a
    /// trouble reply; `None` otherwise (healthy, or merely suspect).
    pub fn trouble(&self) -> Option<String> {
        let kind = match self.state.load(Ordering::Relaxed) {
            BUSY => "busy",
            LOADING => "loading",
            MASTERDOWN => "masterdown",
            _ => return None,
        };
        let reason = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        Some(format!("{kind}: {reason}"))
    }

    /// Takes note of one reply frame read from the node. Costs one
    /// relaxed load for a normal reply from a healthy node.
    pub(crate) fn observe(self: &Arc<Self>, frame: &[u8]) {
        if let Some(kind) = trouble_of(frame) {
            let text = frame::error_text(frame).unwrap_or_default();
            *self.reason.lock().unwrap_or_else(|p| p.into_inner()) =
                String::from_utf8_lossy(text).into_owned();
            self.set(kind);
        } else if self.state.load(Ordering::Relaxed) != HEALTHY {
            self.set(HEALTHY);
        }
    }

    /// A request on one of the node's connections is overdue.
    pub(crate) fn suspect(self: &Arc<Self>) {
        if self
            .state
            .compare_exchange(HEALTHY, SUSPECT, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.stats.unhealthy.fetch_add(1, Ordering::AcqRel);
            self.start_prober();
        }
    }

    fn set(self: &Arc<Self>, new: u8) {
        let prev = self.state.swap(new, Ordering::AcqRel);
        match (prev == HEALTHY, new == HEALTHY) {
            (true, false) => {
                self.stats.unhealthy.fetch_add(1, Ordering::AcqRel);
                self.start_prober();
            }
            (false, true) => {
                self.stats.unhealthy.fetch_sub(1, Ordering::AcqRel);
            }
            _ => {}
        }
        if prev != new && (prev >= BUSY || new >= BUSY) {
            match self.trouble() {
                Some(t) => warn!(node = %self.addr, state = %t, "upstream in trouble"),
                None => info!(node = %self.addr, "upstream answering normally again"),
            }
        }
    }

    fn start_prober(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        // No runtime (a unit test): nobody to probe for.
        if tokio::runtime::Handle::try_current().is_err() {
            self.probing.store(false, Ordering::Release);
            return;
        }
        match self.prober.get() {
            Some(start) => start(),
            None => self.probing.store(false, Ordering::Release),
        }
    }

    /// Installs what starts the prober when the node stops being healthy
    /// (the node's [`crate::conn::control::Control`] does, once).
    pub(crate) fn set_prober(&self, start: Box<dyn Fn() + Send + Sync>) {
        let _ = self.prober.set(start);
    }

    /// The prober's end: whether it must go on (the node became unhealthy
    /// again after its last check, and no other prober took over).
    pub(crate) fn probe_ended(&self) -> bool {
        self.probing.store(false, Ordering::Release);
        !self.is_healthy() && !self.probing.swap(true, Ordering::AcqRel)
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("addr", &self.addr)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        // A node forgotten (cluster resharding) while not healthy.
        if self.state.load(Ordering::Acquire) != HEALTHY {
            self.stats.unhealthy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trouble_replies() {
        assert_eq!(
            trouble_of(b"-BUSY Redis is busy running a script.\r\n"),
            Some(BUSY)
        );
        assert_eq!(
            trouble_of(b"-LOADING Redis is loading the dataset in memory\r\n"),
            Some(LOADING)
        );
        assert_eq!(
            trouble_of(b"-MASTERDOWN Link with MASTER is down\r\n"),
            Some(MASTERDOWN)
        );
        assert_eq!(
            trouble_of(b"-BUSYKEY Target key name already exists.\r\n"),
            None
        );
        assert_eq!(
            trouble_of(b"-BUSYGROUP Consumer Group name already exists\r\n"),
            None
        );
        assert_eq!(trouble_of(b"+PONG\r\n"), None);
        assert_eq!(trouble_of(b"$4\r\nBUSY\r\n"), None);
    }

    #[test]
    fn counts_transitions_once() {
        let cfg = crate::config::UpstreamConfig {
            seeds: vec![crate::config::Seed::parse("redis://127.0.0.1:1").expect("url")],
            ..Default::default()
        };
        let connector = Arc::new(Connector::new(&cfg).expect("connector"));
        let stats = Arc::new(HealthStats::default());
        let addr = NodeAddr {
            host: "127.0.0.1".into(),
            port: 1,
        };
        let h = Arc::new(Health::new(addr, connector, Arc::clone(&stats), true));
        let unhealthy = || stats.unhealthy.load(Ordering::Relaxed);
        h.observe(b"+OK\r\n");
        assert_eq!(unhealthy(), 0);
        h.suspect();
        h.suspect();
        assert_eq!(unhealthy(), 1);
        assert!(h.trouble().is_none(), "suspect is not trouble");
        h.observe(b"-BUSY Redis is busy running a script.\r\n");
        assert_eq!(unhealthy(), 1);
        assert_eq!(
            h.trouble().as_deref(),
            Some("busy: BUSY Redis is busy running a script.")
        );
        h.observe(b"+PONG\r\n");
        assert_eq!(unhealthy(), 0);
        assert!(h.is_healthy() && h.trouble().is_none());
        h.observe(b"-LOADING Redis is loading the dataset in memory\r\n");
        assert_eq!(unhealthy(), 1);
        drop(h);
        assert_eq!(unhealthy(), 0, "a dropped node counts no more");
    }
}
