//! The tracking table: which of sidecache's clients follows which key,
//! BCAST prefixes, REDIRECT targets, the told maps that keep one message
//! per change, expiries, and the messages sent through the clients'
//! outboxes. The contract and the race argument: [`crate::tracking`].

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::pubsub::{Delivery, Keys, Outbox};

/// Keys a BCAST client was told of by sidecache itself and has not read
/// since, kept at most per client (past it, the set is emptied: echoes are
/// then sent again, never a message withheld that a read made needed).
const MAX_TOLD: usize = 4096;

/// A write made through sidecache that the client was told of (or, NOLOOP,
/// made itself): Redis's later invalidation of the key is the echo of that
/// write, not news (see [`Tracked::invalidate_learned`]).
const TOLD: u8 = 1;
/// A message naming the key was queued for the client: a read dispatched
/// before it needs no message of its own (see [`Tracked::forget`]).
const SENT: u8 = 2;
/// The client was sent a message after reading the key, because sidecache
/// did not follow it ([`Tracked::forget`]): it holds no value of it, and
/// the expiry of the key it stood in for is not sent again.
const FORGOT: u8 = 4;

/// What made keys change, for [`Tracked::invalidate_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// A write made through sidecache.
    Write,
    /// Redis's invalidation.
    Learned,
    /// A time to live set through sidecache ran out.
    Expiry,
    /// A write of the origin's script that may not have changed the keys
    /// ([`Tracked::invalidate_sparing`]).
    Spare,
}

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
    /// Which of its prefixes `key` falls under (0 with no prefixes), if
    /// any: Redis sends a BCAST client one message per prefix.
    fn prefix_of(&self, key: &[u8]) -> Option<usize> {
        if self.prefixes.is_empty() {
            return Some(0);
        }
        self.prefixes.iter().position(|p| key.starts_with(p))
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
    /// BCAST clients' changed keys not sent yet: (the writing client or
    /// 0, client, prefix, key).
    held: Vec<(u64, u64, usize, Bytes)>,
    /// Per BCAST client, what it heard of each key since its last read
    /// was dispatched ([`TOLD`], [`SENT`], [`FORGOT`]).
    told: HashMap<u64, HashMap<Bytes, u8>>,
    /// Keys written through sidecache with a time to live that a tracking
    /// client follows, by when they expire (see [`Tracked::expire_at`]).
    expiring: BinaryHeap<Reverse<(Instant, Bytes)>>,
}

/// The tracking table.
#[derive(Debug)]
pub struct Tracked {
    /// Tracking clients: 0 makes every call a single load.
    active: AtomicUsize,
    inner: Mutex<Inner>,
    max_keys: usize,
    /// Invalidation messages queued for clients.
    messages: AtomicU64,
    /// `Inner::held` is not empty.
    holding: AtomicBool,
    /// Wakes [`Tracked::report_expiries`] for an earlier expiry.
    expiry_wake: Arc<tokio::sync::Notify>,
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
            messages: AtomicU64::new(0),
            holding: AtomicBool::new(false),
            expiry_wake: Arc::new(tokio::sync::Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tracking clients, keys followed for them, and messages sent so far.
    pub fn figures(&self) -> (usize, usize, u64) {
        let keys = self.lock().keys.len();
        (
            self.active.load(Ordering::Acquire),
            keys,
            self.messages.load(Ordering::Relaxed),
        )
    }

    /// As Redis's INFO `tracking_total_items` (key and reader pairs of
    /// default-mode clients) and `tracking_total_prefixes` (distinct BCAST
    /// prefixes; BCAST without PREFIX is the empty one).
    pub fn totals(&self) -> (usize, usize) {
        let g = self.lock();
        let items = g.keys.values().map(|ids| ids.len()).sum();
        let mut prefixes: Vec<&[u8]> = Vec::new();
        for s in g.clients.values().filter(|s| s.bcast) {
            if s.prefixes.is_empty() {
                prefixes.push(b"");
            }
            prefixes.extend(s.prefixes.iter().map(|p| &p[..]));
        }
        prefixes.sort_unstable();
        prefixes.dedup();
        (items, prefixes.len())
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
        g.told.remove(&id);
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

    /// Client `id` (BCAST) read something, or a batch of its reads was
    /// answered: a flush, and every change, is news to it again.
    pub fn touch(&self, id: u64) {
        let mut g = self.lock();
        if let Some(s) = g.clients.get_mut(&id) {
            s.quiet = false;
        }
        g.told.remove(&id);
    }

    /// Whether client `id` (default mode) is to be told of `key`'s next
    /// change.
    pub fn registered(&self, id: u64, key: &[u8]) -> bool {
        self.lock()
            .keys
            .get(key)
            .is_some_and(|ids| ids.contains(&id))
    }

    /// Client `id` (default mode) read `key`: its next change is sent.
    pub fn register(&self, id: u64, key: &Bytes) {
        let mut g = self.lock();
        if let Some(s) = g.clients.get_mut(&id) {
            s.quiet = false;
        }
        match g.keys.get_mut(key) {
            Some(ids) if ids.contains(&id) => {}
            Some(ids) => ids.push(id),
            None => {
                g.keys.insert(owned(key), smallvec::smallvec![id]);
            }
        }
        // Over the bound: forget a key, telling its readers (Redis's
        // tracking-table-max-keys eviction).
        while g.keys.len() > self.max_keys {
            let Some(k) = g.keys.keys().next().cloned() else {
                break;
            };
            if let Some(ids) = g.keys.remove(&k) {
                self.messages
                    .fetch_add(send(&g, ids.iter().copied(), &k), Ordering::Relaxed);
            }
        }
    }

    /// `keys` changed by a write made through sidecache (`origin`: the
    /// client whose write it was). Their default-mode readers are told
    /// now; BCAST clients when [`Tracked::release`] runs.
    pub fn invalidate(&self, keys: &[Bytes], origin: Option<u64>) {
        self.invalidate_with(keys, origin, Change::Write);
    }

    /// [`Tracked::invalidate`] for a script of client `origin` run where
    /// Redis follows what it reads for sidecache (a fill lane): `origin`
    /// is not told and keeps its registrations of `keys` (Redis reports
    /// the keys the script read when they change, its own writes
    /// included; sidecache cannot tell which ones it wrote).
    pub fn invalidate_sparing(&self, keys: &[Bytes], origin: u64) {
        if !self.active() {
            return;
        }
        self.invalidate_with(keys, Some(origin), Change::Spare);
    }

    /// Client `origin` sent a write of `keys` to Redis; its
    /// acknowledgement calls [`Tracked::invalidate`]. Redis may report the
    /// change back (when sidecache follows a key) before that reply is
    /// read, so what the acknowledgement would settle is settled now:
    /// a NOLOOP `origin` stops following the keys (it hears nothing of its
    /// own write, and Redis's registration ends with it), and BCAST
    /// clients count them as told (the acknowledgement's message tells
    /// them). A change by another writer that Redis reports meanwhile is
    /// then told only by that message, at most the write's round trip
    /// later.
    pub fn writing(&self, keys: &[Bytes], origin: u64) {
        if !self.active() {
            return;
        }
        let mut g = self.lock();
        let g = &mut *g;
        if g.clients.get(&origin).is_some_and(|s| s.noloop && !s.bcast) {
            for key in keys {
                if let Some(ids) = g.keys.get_mut(key) {
                    ids.retain(|i| *i != origin);
                    if ids.is_empty() {
                        g.keys.remove(key);
                    }
                }
            }
        }
        for (id, s) in &g.clients {
            if !s.bcast {
                continue;
            }
            for key in keys {
                if s.prefix_of(key).is_some() {
                    mark_told(&mut g.told, *id, key, TOLD);
                }
            }
        }
    }

    /// `keys` changed, as Redis reported (its invalidation channel). A
    /// write made through sidecache comes back this way too when its key
    /// was followed upstream; a BCAST client already told of it (or that
    /// made it, NOLOOP) and that has read nothing since is not told again,
    /// as Redis sends one message per write. Withholding it never leaves
    /// a stale value: since that message the client read nothing, so it
    /// holds no value of the key (the set is emptied when a read is
    /// dispatched and again when its batch is answered, so a read in
    /// flight across the message makes the next change news again).
    pub fn invalidate_learned(&self, keys: &[Bytes]) {
        self.invalidate_with(keys, None, Change::Learned);
    }

    fn invalidate_with(&self, keys: &[Bytes], origin: Option<u64>, change: Change) {
        if !self.active() {
            return;
        }
        let mut g = self.lock();
        let g = &mut *g;
        let wanted = |id: u64, clients: &HashMap<u64, Sink>| {
            clients
                .get(&id)
                .is_some_and(|s| !(s.noloop && origin == Some(id)))
        };
        let spared = if change == Change::Spare {
            origin
        } else {
            None
        };
        for key in keys {
            if let Some(ids) = g.keys.remove(key) {
                if let Some(o) = spared.filter(|o| ids.contains(o)) {
                    g.keys.insert(owned(key), smallvec::smallvec![o]);
                }
                // A client that read the key and then switched to BCAST
                // hears of it only as BCAST (as Redis skips it).
                let to = ids.into_iter().filter(|id| {
                    Some(*id) != spared
                        && wanted(*id, &g.clients)
                        && g.clients.get(id).is_some_and(|s| !s.bcast)
                });
                let n = send(g, to, key);
                self.messages.fetch_add(n, Ordering::Relaxed);
            }
            for (id, s) in &g.clients {
                if !s.bcast || Some(*id) == spared {
                    continue;
                }
                let Some(p) = s.prefix_of(key) else {
                    continue;
                };
                let told = g
                    .told
                    .get(id)
                    .and_then(|t| t.get(key))
                    .copied()
                    .unwrap_or(0);
                let skip = match change {
                    Change::Write | Change::Spare => 0,
                    Change::Learned => TOLD,
                    Change::Expiry => FORGOT,
                };
                if told & skip != 0 {
                    continue;
                }
                let sends = wanted(*id, &g.clients);
                let learned = change == Change::Learned;
                let how = match (learned, sends) {
                    (false, true) => TOLD | SENT,
                    (false, false) => TOLD,
                    (true, true) => SENT,
                    (true, false) => 0,
                };
                if how != 0 {
                    mark_told(&mut g.told, *id, key, how);
                }
                if sends {
                    g.held.push((origin.unwrap_or(0), *id, p, key.clone()));
                }
            }
        }
        if !g.held.is_empty() {
            self.holding.store(true, Ordering::Release);
        }
    }

    /// Sends the BCAST clients' keys held for writes of client `origin`
    /// (its batch ended; 0: changes learned from upstream) and for writes
    /// of no client: one message per client and prefix, each key once, in
    /// byte order. A batch's keys are held under its client's id, so a
    /// release from elsewhere never splits them.
    #[inline]
    pub fn release(&self, origin: u64) {
        if self.holding.load(Ordering::Acquire) {
            let mut g = self.lock();
            let (now, later) = std::mem::take(&mut g.held)
                .into_iter()
                .partition(|h| h.0 == origin || h.0 == 0);
            g.held = later;
            self.send_held(&mut g, now);
        }
    }

    fn send_held(&self, g: &mut Inner, held: Vec<(u64, u64, usize, Bytes)>) {
        self.holding.store(!g.held.is_empty(), Ordering::Release);
        let mut groups: SmallVec<[((u64, usize), Keys); 4]> = SmallVec::new();
        for (_, id, p, key) in held {
            match groups.iter_mut().find(|(to, _)| *to == (id, p)) {
                Some((_, keys)) => {
                    if !keys.contains(&key) {
                        keys.push(key);
                    }
                }
                None => groups.push(((id, p), smallvec::smallvec![key])),
            }
        }
        self.messages
            .fetch_add(groups.len() as u64, Ordering::Relaxed);
        for ((id, _), mut keys) in groups {
            // In byte order, as Redis sends them (its radix tree's).
            keys.sort_unstable();
            deliver(g, id, Delivery::Invalidate(Some(keys)));
        }
    }

    /// Client `id` only: `keys` may change unseen (read where sidecache
    /// follows no change), so it must not keep them. Called when the
    /// batch holding the reads is answered (for a BCAST client, in place
    /// of the [`Tracked::touch`] that ends them). A key the client
    /// was sent a message of since the reads were dispatched gets no
    /// second one (that message reaches it after the
    /// reply, from its own outbox; a REDIRECT target may hear it sooner,
    /// while the read is in flight, which is what Redis's REDIRECT does
    /// too and what a client's cache guards against: a message for a key
    /// being read means the reply is not kept).
    pub fn forget(&self, id: u64, keys: &[Bytes]) {
        let mut g = self.lock();
        let g = &mut *g;
        let bcast = g.clients.get(&id).is_some_and(|s| s.bcast);
        // BCAST: the touch that ends the batch's reads, keeping what the
        // client heard while they were in flight for the check below.
        let heard = if bcast {
            if let Some(s) = g.clients.get_mut(&id) {
                s.quiet = false;
            }
            g.told.remove(&id).unwrap_or_default()
        } else {
            HashMap::new()
        };
        for key in keys {
            if bcast {
                if heard.get(key).is_some_and(|f| f & SENT != 0) {
                    continue;
                }
                mark_told(&mut g.told, id, key, FORGOT);
            }
            let mut registered = false;
            if let Some(ids) = g.keys.get_mut(key) {
                let before = ids.len();
                ids.retain(|i| *i != id);
                registered = ids.len() != before;
                if ids.is_empty() {
                    g.keys.remove(key);
                }
            }
            // A default-mode client gets one message per registration (a
            // change it was told of already took the registration).
            if registered || bcast {
                let n = send(g, std::iter::once(id), key);
                self.messages.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// `key`, written through sidecache, expires in Redis at `at`. Redis
    /// tells its tracking clients when it expires a key; sidecache hears
    /// of it only for keys it follows upstream, which a written key is not
    /// (see `sidecache_pool::coherence::tracking`), so it tells its own
    /// clients at `at`: a BCAST client whose prefixes cover the key, or a
    /// default-mode client that read it. At most `max_keys` are waiting;
    /// past that none is added (the message is Redis's courtesy, not a
    /// guard: a client that read the key since made sidecache follow it,
    /// so Redis reports its expiry, or was told to drop it right after
    /// its reply, see `Client::end_tracked_reads`).
    pub fn expire_at(&self, key: &Bytes, at: Instant) {
        if !self.active() {
            return;
        }
        let mut g = self.lock();
        let followed = g.keys.contains_key(key)
            || g.clients
                .values()
                .any(|s| s.bcast && s.prefix_of(key).is_some());
        if !followed || g.expiring.len() >= self.max_keys {
            return;
        }
        let sooner = g.expiring.peek().is_none_or(|Reverse((t, _))| at < *t);
        g.expiring.push(Reverse((at, owned(key))));
        if sooner {
            self.expiry_wake.notify_one();
        }
    }

    /// Tells the clients of every key due to expire by `now`; when the
    /// next one is due.
    fn expire_due(&self, now: Instant) -> Option<Instant> {
        let mut due = Vec::new();
        let next = {
            let mut g = self.lock();
            while let Some(Reverse((t, _))) = g.expiring.peek() {
                if *t > now {
                    break;
                }
                if let Some(Reverse((_, k))) = g.expiring.pop() {
                    due.push(k);
                }
            }
            g.expiring.peek().map(|Reverse((t, _))| *t)
        };
        if !due.is_empty() {
            if self.active() {
                self.invalidate_with(&due, None, Change::Expiry);
            }
            self.release(0);
        }
        next
    }

    /// Sends the expiry messages [`Tracked::expire_at`] scheduled, as
    /// they fall due, while `owner` lives (`get` finds the table in it).
    pub async fn report_expiries<T: Send + Sync + 'static>(
        owner: std::sync::Weak<T>,
        get: fn(&T) -> &Tracked,
    ) {
        let Some(wake) = owner.upgrade().map(|o| Arc::clone(&get(&o).expiry_wake)) else {
            return;
        };
        loop {
            let next = match owner.upgrade() {
                Some(o) => get(&o).expire_due(Instant::now()),
                None => return,
            };
            // Wakes at least every second to notice that `owner` is gone.
            let cap = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
            let until = next.map_or(cap, |t| tokio::time::Instant::from_std(t).min(cap));
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Everything may have changed (FLUSHALL, FLUSHDB, a lost channel):
    /// every tracking client gets a message with no keys.
    pub fn flush(&self) {
        let mut g = self.lock();
        if !self.active() {
            // Nobody to tell, but what clients that stopped tracking read
            // is forgotten, as Redis empties its table (INFO counts it).
            g.keys.clear();
            return;
        }
        if !g.held.is_empty() {
            let held = std::mem::take(&mut g.held);
            self.send_held(&mut g, held);
        }
        g.keys.clear();
        let mut ids = Vec::new();
        for (id, s) in g.clients.iter_mut() {
            if !std::mem::replace(&mut s.quiet, true) {
                ids.push(*id);
            }
        }
        self.messages.fetch_add(ids.len() as u64, Ordering::Relaxed);
        for id in ids {
            deliver(&g, id, Delivery::Invalidate(None));
        }
    }
}

/// Records what BCAST client `id` heard of `key` (`how`: [`TOLD`],
/// [`SENT`]; past [`MAX_TOLD`] keys, its record starts again: an echo or a
/// read's own message is then sent rather than withheld).
fn mark_told(told: &mut HashMap<u64, HashMap<Bytes, u8>>, id: u64, key: &Bytes, how: u8) {
    let set = told.entry(id).or_default();
    if set.len() >= MAX_TOLD && !set.contains_key(key) {
        set.clear();
    }
    match set.get_mut(key) {
        Some(bits) => *bits |= how,
        None => {
            set.insert(owned(key), how);
        }
    }
}

/// A key to keep in the table: a copy, not a slice of the request it came
/// in, which would hold that whole read buffer for as long as the key is
/// kept.
fn owned(key: &Bytes) -> Bytes {
    Bytes::copy_from_slice(key)
}

/// Sends `key`'s invalidation to each tracking client of `ids`; how many.
fn send(g: &Inner, ids: impl Iterator<Item = u64>, key: &Bytes) -> u64 {
    let mut n = 0;
    for id in ids {
        deliver(
            g,
            id,
            Delivery::Invalidate(Some(smallvec::smallvec![key.clone()])),
        );
        n += 1;
    }
    n
}

/// Puts `d` in the outbox of tracking client `id`'s target (itself or its
/// REDIRECT); a redirect target that left gets its client a
/// `tracking-redir-broken` instead.
fn deliver(g: &Inner, id: u64, d: Delivery) {
    let Some(sink) = g.clients.get(&id) else {
        return;
    };
    let to = if sink.redirect != 0 {
        sink.redirect
    } else {
        id
    };
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

#[cfg(test)]
mod tests;
