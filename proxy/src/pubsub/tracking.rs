//! Client-side caching served to sidecache's own clients (CLIENT TRACKING):
//! which client follows which key, and the invalidation messages sent to
//! them, through their outboxes.
//!
//! sidecache does not forward a client's CLIENT TRACKING to Redis (its
//! upstream connections are shared by every client); it keeps a tracking
//! table of its own, as Redis does, and fills the clients' messages from
//! what it already learns of changes: Redis's invalidations of the keys it
//! follows upstream, every write made through it, write-behind failures,
//! FLUSHALL/FLUSHDB and a lost invalidation channel (a message with no
//! keys, "flush everything").
//!
//! # Why a client is never left with a stale value
//! A read is registered for its client when it is dispatched, before its
//! value is taken (from the L1 or upstream), so a change learned of after
//! that reaches the client. The message goes through the client's outbox,
//! which the connection drains only between batches, after the batch's
//! replies are written: a client never gets a key's invalidation before the
//! reply it applies to. What sidecache learns of is only what it follows:
//! a key is followed upstream while the L1 holds a value filled for it
//! (`sidecache_l1::L1::followed`), and its node's invalidation channel is
//! up. For a read of a key that is not, the client gets an invalidation of
//! it right after the reply (`Client::end_tracked_reads`): it may use the
//! value once, never cache it past a change.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use smallvec::SmallVec;

use super::{Delivery, Outbox};

/// Default bound of the tracking table (keys followed for default-mode
/// clients), as Redis's `tracking-table-max-keys`.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// How a tracking client wants its messages.
#[derive(Debug, Clone, Default)]
pub struct Sink {
    /// BCAST: every key under `prefixes` (every key when empty).
    pub bcast: bool,
    /// No messages for its own writes.
    pub noloop: bool,
    /// The client that gets its messages (0: itself).
    pub redirect: u64,
    /// BCAST prefixes.
    pub prefixes: Vec<Bytes>,
    /// Nothing read since the last "flush everything" message: another
    /// one would tell it nothing (FLUSHALL reaches sidecache more than
    /// once: at its dispatch, its acknowledgement, and from Redis).
    pub quiet: bool,
}

impl Sink {
    fn wants(&self, key: &[u8]) -> bool {
        self.prefixes.is_empty() || self.prefixes.iter().any(|p| key.starts_with(p))
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Key → the default-mode clients that read it since its last message.
    keys: HashMap<Bytes, SmallVec<[u64; 2]>>,
    /// Tracking clients.
    clients: HashMap<u64, Sink>,
    /// Every client with an outbox (tracking clients and subscribers: the
    /// possible REDIRECT targets).
    outboxes: HashMap<u64, Arc<Outbox>>,
}

/// The tracking table.
#[derive(Debug)]
pub struct Tracked {
    /// Tracking clients: 0 makes every call a single load.
    active: AtomicUsize,
    inner: Mutex<Inner>,
    max_keys: usize,
}

impl Default for Tracked {
    fn default() -> Self {
        Tracked::new(DEFAULT_MAX_KEYS)
    }
}

impl Tracked {
    /// A table that follows at most `max_keys` keys for default-mode clients.
    pub fn new(max_keys: usize) -> Tracked {
        Tracked {
            active: AtomicUsize::new(0),
            inner: Mutex::default(),
            max_keys: max_keys.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any client tracks.
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    /// Client `id` may receive messages (its own, or redirected to it).
    pub fn add_outbox(&self, id: u64, outbox: &Arc<Outbox>) {
        self.lock().outboxes.insert(id, Arc::clone(outbox));
    }

    /// Client `id` left.
    pub fn remove(&self, id: u64) {
        let mut g = self.lock();
        g.outboxes.remove(&id);
        if g.clients.remove(&id).is_some() {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether client `id` can receive messages (a REDIRECT target).
    pub fn has_outbox(&self, id: u64) -> bool {
        self.lock().outboxes.contains_key(&id)
    }

    /// Client `id` tracks, as `sink` says.
    pub fn enable(&self, id: u64, sink: Sink) {
        if self.lock().clients.insert(id, sink).is_none() {
            self.active.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Client `id` stopped tracking.
    pub fn disable(&self, id: u64) {
        if self.lock().clients.remove(&id).is_some() {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Client `id` (BCAST) read something: a flush is news to it again.
    pub fn touch(&self, id: u64) {
        if let Some(s) = self.lock().clients.get_mut(&id) {
            s.quiet = false;
        }
    }

    /// Client `id` (default mode) read `key`: its next change is sent.
    pub fn register(&self, id: u64, key: &Bytes) {
        let mut g = self.lock();
        if let Some(s) = g.clients.get_mut(&id) {
            s.quiet = false;
        }
        let ids = g.keys.entry(key.clone()).or_default();
        if !ids.contains(&id) {
            ids.push(id);
        }
        // Over the bound: forget a key, telling its readers (Redis's
        // tracking-table-max-keys eviction).
        while g.keys.len() > self.max_keys {
            let Some(k) = g.keys.keys().next().cloned() else {
                break;
            };
            if let Some(ids) = g.keys.remove(&k) {
                send(&g, ids.iter().copied(), &k);
            }
        }
    }

    /// `keys` changed (`origin`: the client whose write it was).
    pub fn invalidate(&self, keys: &[Bytes], origin: Option<u64>) {
        if !self.active() {
            return;
        }
        let mut g = self.lock();
        for key in keys {
            let mut to: SmallVec<[u64; 4]> = g.keys.remove(key).unwrap_or_default().into_iter().collect();
            to.extend(
                g.clients
                    .iter()
                    .filter(|(_, s)| s.bcast && s.wants(key))
                    .map(|(id, _)| *id),
            );
            to.retain(|id| {
                g.clients
                    .get(id)
                    .is_some_and(|s| !(s.noloop && origin == Some(*id)))
            });
            send(&g, to.into_iter(), key);
        }
    }

    /// Client `id` only: `keys` may change unseen (read where sidecache
    /// follows no change), so it must not keep them.
    pub fn forget(&self, id: u64, keys: &[Bytes]) {
        let mut g = self.lock();
        for key in keys {
            if let Some(ids) = g.keys.get_mut(key) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    g.keys.remove(key);
                }
            }
            send(&g, std::iter::once(id), key);
        }
    }

    /// Everything may have changed (FLUSHALL, FLUSHDB, a lost channel):
    /// every tracking client gets a message with no keys.
    pub fn flush(&self) {
        if !self.active() {
            return;
        }
        let mut g = self.lock();
        g.keys.clear();
        let mut ids = Vec::new();
        for (id, s) in g.clients.iter_mut() {
            if !std::mem::replace(&mut s.quiet, true) {
                ids.push(*id);
            }
        }
        for id in ids {
            deliver(&g, id, Delivery::Invalidate(None));
        }
    }
}

/// Sends `key`'s invalidation to each tracking client of `ids`.
fn send(g: &Inner, ids: impl Iterator<Item = u64>, key: &Bytes) {
    for id in ids {
        deliver(g, id, Delivery::Invalidate(Some(key.clone())));
    }
}

/// Puts `d` in the outbox of tracking client `id`'s target (itself or its
/// REDIRECT); a redirect target that left gets its client a
/// `tracking-redir-broken` instead.
fn deliver(g: &Inner, id: u64, d: Delivery) {
    let Some(sink) = g.clients.get(&id) else {
        return;
    };
    let to = if sink.redirect != 0 { sink.redirect } else { id };
    match g.outboxes.get(&to) {
        Some(o) => o.push(d),
        None if sink.redirect != 0 => {
            if let Some(o) = g.outboxes.get(&id) {
                o.push(Delivery::RedirectBroken(sink.redirect));
            }
        }
        None => {}
    }
}
