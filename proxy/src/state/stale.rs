//! `--l1-stale-if-error`: serving what the L1 holds for a master while it
//! is out of reach, for a bounded time.
//!
//! Without it, losing a master's invalidation channel drops the master's
//! part of the L1 at once (nothing there is followed any more). With it,
//! the loss opens a *window* instead: the entries stay and are served,
//! counted as stale hits, until the first of
//! - the channel is back: the window's entries are dropped before the
//!   channel is marked up (`CoherenceListener::resumed`), so before any
//!   fill or read under the new registration;
//! - a new slot map changes the masters (a failover's successor): the
//!   install drops everything, as it always did;
//! - the window's limit passes: a timer drops its entries, and a hit
//!   after the limit is a miss even before the timer ran.
//!
//! Fills in flight when the channel was lost are discarded (their epochs
//! move), and none starts while it is down, so a window holds only what
//! was coherent when contact was lost, plus this proxy's own writes since.
//! Misses and writes are unchanged: misses wait for the master (or its
//! successor) within `--upstream-timeout`, writes are queued behind.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sidecache_pool::{NodeAddr, Slot};

/// The open windows, and the count of hits they served.
#[derive(Debug)]
pub struct Stale {
    limit: Option<Duration>,
    /// Whether any window is open: the one load a hit pays.
    active: AtomicBool,
    windows: Mutex<Vec<Window>>,
    next_id: AtomicU64,
    /// Hits served from an open window (`sidecache_l1_stale_served_total`).
    pub served: AtomicU64,
}

/// What one lost channel left served.
#[derive(Debug)]
pub struct Window {
    id: u64,
    /// The channel's node (`None`: the peer channel, every master).
    node: Option<NodeAddr>,
    until: Instant,
    /// Per slot, whether the window covers it (`None`: every key).
    slots: Option<Box<[bool]>>,
}

impl Window {
    /// Whether the window covers `key`.
    pub fn covers(&self, key: &[u8]) -> bool {
        self.slots.as_ref().is_none_or(|s| slot_in(s, key))
    }
}

/// Whether `key`'s slot is one of `slots` (one flag per slot).
pub fn slot_in(slots: &[bool], key: &[u8]) -> bool {
    slots
        .get(usize::from(Slot::for_key(key).get()))
        .copied()
        .unwrap_or(true)
}

/// What a hit in an open window's reach may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// No window covers the key.
    Fresh,
    /// A window covers it: served, counted.
    Stale,
    /// Its window's time is up: a miss.
    Expired,
}

impl Stale {
    /// Windows of `limit` (`None`: none are opened).
    pub fn new(limit: Option<Duration>) -> Stale {
        Stale {
            limit,
            active: AtomicBool::new(false),
            windows: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    /// How long a window lasts, if windows are opened at all.
    pub fn limit(&self) -> Option<Duration> {
        self.limit
    }

    /// Whether any window is open (one relaxed load: the hit path's cost).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Opens a window for `node`'s lost channel covering `slots` (`None`:
    /// every key); returns its id and when it ends. A window already
    /// open for the node stays as it is (the outage began then).
    pub fn open(
        &self,
        node: Option<&NodeAddr>,
        slots: Option<Box<[bool]>>,
    ) -> Option<(u64, Instant)> {
        let limit = self.limit?;
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = w.iter().find(|x| x.node.as_ref() == node) {
            return Some((open.id, open.until));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + limit;
        w.push(Window {
            id,
            node: node.cloned(),
            until,
            slots,
        });
        self.active.store(true, Ordering::Release);
        Some((id, until))
    }

    /// Closes the windows of `node` (`None`: all of them), or only the
    /// window `id`: returns them, for the caller to drop what they cover.
    pub fn close(&self, node: Option<&NodeAddr>, id: Option<u64>) -> Vec<Window> {
        let mut w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let (gone, kept): (Vec<Window>, Vec<Window>) = std::mem::take(&mut *w)
            .into_iter()
            .partition(|x| match (id, node) {
                (Some(id), _) => x.id == id,
                (None, Some(n)) => x.node.as_ref() == Some(n),
                (None, None) => true,
            });
        *w = kept;
        if w.is_empty() {
            self.active.store(false, Ordering::Release);
        }
        gone
    }

    /// Whether window `id` is still open.
    pub fn is_open(&self, id: u64) -> bool {
        let w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        w.iter().any(|x| x.id == id)
    }

    /// For a hit on `key` while some window is open: whether to serve it.
    pub fn check(&self, key: &[u8], now: Instant) -> Serve {
        let w = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        match w.iter().find(|x| x.covers(key)) {
            None => Serve::Fresh,
            Some(x) if now >= x.until => Serve::Expired,
            Some(_) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                Serve::Stale
            }
        }
    }
}

/// How often the slot map is read again while a window is open: served
/// hits ask for nothing, and a failover's successor must end the window.
pub const REFRESH_EVERY: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> NodeAddr {
        NodeAddr {
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[test]
    fn a_window_serves_its_slots_until_closed_or_over() {
        let s = Stale::new(Some(Duration::from_secs(30)));
        assert!(!s.active());
        let mut slots = vec![false; 16384];
        slots[usize::from(Slot::for_key(b"in").get())] = true;
        let (id, until) = s.open(Some(&addr(1)), Some(slots.into())).expect("on");
        assert!(s.active());
        // Opened again while open: the first outage's window stands.
        assert_eq!(s.open(Some(&addr(1)), None).map(|w| w.0), Some(id));
        let now = Instant::now();
        assert_eq!(s.check(b"in", now), Serve::Stale);
        assert_eq!(s.check(b"out", now), Serve::Fresh);
        assert_eq!(s.check(b"in", until), Serve::Expired);
        assert_eq!(s.served.load(Ordering::Relaxed), 1);
        // Another node's close leaves it; its own takes it.
        assert!(s.close(Some(&addr(2)), None).is_empty());
        let gone = s.close(Some(&addr(1)), None);
        assert_eq!(gone.len(), 1);
        assert!(gone[0].covers(b"in") && !gone[0].covers(b"out"));
        assert!(!s.active());
        assert!(Stale::new(None).open(None, None).is_none());
    }

    #[test]
    fn a_timer_closes_only_its_own_window() {
        let s = Stale::new(Some(Duration::from_secs(30)));
        let (old, _) = s.open(None, None).expect("on");
        s.close(None, None);
        let (new, _) = s.open(None, None).expect("on");
        assert!(s.close(None, Some(old)).is_empty());
        assert_eq!(s.close(None, Some(new)).len(), 1);
    }
}
