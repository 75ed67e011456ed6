//! Shared upstream subscriptions, fanned out to local subscribers; and the
//! MONITOR feed.
//!
//! ```text
//!  client A ─SUBSCRIBE news─┐                       ┌─ link: Classic ──▶ one node (any: Redis
//!  client B ─SUBSCRIBE news─┼─▶ Hub: topic (kind,   │   (one connection)   Cluster broadcasts PUBLISH)
//!  client C ─PSUBSCRIBE n*──┘   name) → subscribers ┤
//!                               refcount 0→1: ──────┤   SUBSCRIBE news, PSUBSCRIBE n* (once each)
//!                               refcount 1→0: ──────┤   UNSUBSCRIBE …
//!  client D ─SSUBSCRIBE {u}1──▶ (Shard, {u}1) ──────└─ link: Shard(node) ─▶ the slot's master
//!
//!  link ─message news hi─▶ Hub ─▶ outbox A, outbox B   (each client's own queue, bounded)
//!  client task: outbox → its socket, between its replies
//! ```
//!
//! One upstream subscription per channel, pattern or shard channel, per
//! link, however many local clients hold it: thousands of local
//! subscribers cost a handful of upstream connections (taken from the
//! held-connection pool, `--max-session-connections`). Each client keeps
//! its own subscription sets (for Redis's counts and for RESP2's
//! subscribed mode), so what a client sees is what Redis would send it.
//!
//! # Ordering
//! - A client's `subscribe` confirmation is written only once upstream has
//!   confirmed the subscription (or it already was), so a message
//!   published after the confirmation reached the client is delivered.
//! - A topic waiting for its upstream confirmation delivers nothing: a
//!   client never sees a message before its own confirmation.
//! - Messages reach a client's outbox in the link's order; the client
//!   writes them between its replies, in that order.
//!
//! # Failure
//! A link whose connection breaks ends every subscription on it, and each
//! of their clients is disconnected, as each would be if it had been
//! connected to Redis directly: client libraries reconnect and subscribe
//! again (a silent re-subscribe would hide the messages lost meanwhile).
//! Redis's own `sunsubscribe` push (a shard channel's slot moved) is passed
//! on to each of its subscribers, which then subscribe again where the slot
//! now lives.
//!
//! # Slow subscribers
//! Each outbox counts its bytes not yet written to its client. Past the
//! hard limit, or past the soft limit for longer than its seconds
//! (`--client-output-buffer-limit pubsub 32mb 8mb 60`, Redis's defaults),
//! the client is disconnected and counted, and nothing more is queued for
//! it: one slow subscriber never grows sidecache's memory beyond its limit
//! nor delays the others (fan-out only appends to queues).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sidecache_pool::config::NodeAddr;
use sidecache_pool::SessionPool;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub mod glob;
mod link;
pub mod monitor;
mod outbox;

pub use outbox::{Outbox, OutputLimit};

/// Most deliveries queued in one outbox: beyond what the byte limit lets
/// through at its defaults (32 MB of messages of at least 48 bytes).
const OUTBOX_MESSAGES: usize = 1 << 20;
/// Most subscription changes queued for one link's connection.
const LINK_COMMANDS: usize = 1 << 16;

/// A subscription's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// SUBSCRIBE.
    Channel,
    /// PSUBSCRIBE.
    Pattern,
    /// SSUBSCRIBE.
    Shard,
}

impl Kind {
    /// The confirmation's name (`subscribe`, …) or, with `sub` false, the
    /// unsubscribe reply's.
    pub fn reply_name(self, sub: bool) -> &'static [u8] {
        match (self, sub) {
            (Kind::Channel, true) => b"subscribe",
            (Kind::Pattern, true) => b"psubscribe",
            (Kind::Shard, true) => b"ssubscribe",
            (Kind::Channel, false) => b"unsubscribe",
            (Kind::Pattern, false) => b"punsubscribe",
            (Kind::Shard, false) => b"sunsubscribe",
        }
    }

    fn from_reply(name: &[u8]) -> Option<(Kind, bool)> {
        Some(match name {
            b"subscribe" => (Kind::Channel, true),
            b"psubscribe" => (Kind::Pattern, true),
            b"ssubscribe" => (Kind::Shard, true),
            b"unsubscribe" => (Kind::Channel, false),
            b"punsubscribe" => (Kind::Pattern, false),
            b"sunsubscribe" => (Kind::Shard, false),
            _ => return None,
        })
    }
}

/// A message from upstream, shared by every subscriber it goes to.
#[derive(Debug)]
pub struct Msg {
    /// Which subscription it came through.
    pub kind: Kind,
    /// The pattern (PSUBSCRIBE), else empty.
    pub pattern: Bytes,
    /// The channel.
    pub channel: Bytes,
    /// The payload.
    pub payload: Bytes,
}

impl Msg {
    /// What it costs a client's outbox: its encoded size, near enough.
    fn weight(&self) -> usize {
        self.pattern.len() + self.channel.len() + self.payload.len() + 48
    }
}

/// The keys of one invalidation message.
pub type Keys = smallvec::SmallVec<[Bytes; 1]>;

/// What a client's outbox carries.
#[derive(Debug)]
pub enum Delivery {
    /// A message on one of its subscriptions.
    Message(Arc<Msg>),
    /// Redis ended a shard channel subscription (its slot moved).
    ShardUnsubscribed(Bytes),
    /// The upstream link of one of its subscriptions broke: close.
    Lost,
    /// A MONITOR line, encoded.
    Monitor(Bytes),
    /// CLIENT TRACKING: these keys changed (`None`: every key may have).
    Invalidate(Option<Keys>),
    /// CLIENT TRACKING: the REDIRECT client (this id) left.
    RedirectBroken(u64),
}

impl Delivery {
    /// What it costs the outbox.
    pub fn weight(&self) -> usize {
        match self {
            Delivery::Message(m) => m.weight(),
            Delivery::ShardUnsubscribed(c) => c.len() + 48,
            Delivery::Lost => 0,
            Delivery::Monitor(l) => l.len(),
            Delivery::Invalidate(k) => {
                k.as_ref().map_or(0, |k| k.iter().map(Bytes::len).sum()) + 48
            }
            Delivery::RedirectBroken(_) => 48,
        }
    }
}

/// Counters of the hub.
#[derive(Debug, Default)]
pub struct HubStats {
    /// Upstream connections subscribed on behalf of local clients.
    pub links: AtomicUsize,
    /// Channels, patterns and shard channels subscribed upstream.
    pub topics: AtomicUsize,
    /// Clients subscribed to something now.
    pub subscribers: AtomicUsize,
    /// Clients in MONITOR now.
    pub monitors: AtomicUsize,
    /// Messages received from upstream.
    pub messages_in: AtomicU64,
    /// Messages queued for local clients (one per client reached).
    pub messages_out: AtomicU64,
    /// Clients disconnected for passing their output limit.
    pub output_limit_disconnects: AtomicU64,
    /// Clients disconnected because their subscription's link broke.
    pub link_losses: AtomicU64,
}

/// Why a subscription could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Upstream refused it (the error's text, without `-`).
    #[error("{0}")]
    Refused(String),
    /// The link broke or could not connect.
    #[error("upstream subscription connection lost: {0}")]
    Lost(String),
    /// No confirmation in time.
    #[error("upstream did not confirm the subscription in time")]
    Timeout,
}

/// Which upstream connection a subscription lives on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum LinkKey {
    /// SUBSCRIBE and PSUBSCRIBE: one node.
    Classic,
    /// SSUBSCRIBE: the shard channel's master.
    Shard(NodeAddr),
}

struct Link {
    id: u64,
    tx: mpsc::Sender<link::Cmd>,
    topics: usize,
}

type Waiter = (u64, Arc<Outbox>, oneshot::Sender<Result<(), HubError>>);

struct Topic {
    link: LinkKey,
    link_id: u64,
    /// Upstream confirmed it: messages flow to `subs`.
    confirmed: bool,
    subs: HashMap<u64, Arc<Outbox>>,
    /// Clients waiting for the upstream confirmation.
    waiting: Vec<Waiter>,
}

#[derive(Default)]
struct State {
    topics: HashMap<(Kind, Bytes), Topic>,
    links: HashMap<LinkKey, Link>,
    /// Upstream subscriptions being ended (UNSUBSCRIBE sent, not yet
    /// confirmed), per link: upstream still counts them as receivers.
    draining: HashMap<(Kind, Bytes, u64), usize>,
}

/// The subscription hub: one per proxy.
pub struct Hub {
    state: Mutex<State>,
    monitors: Mutex<HashMap<u64, Arc<Outbox>>>,
    /// Stops the upstream MONITOR connections that follow scripts.
    scripts: Mutex<Option<CancellationToken>>,
    /// Clients in MONITOR (read on every command: one relaxed load).
    monitoring: AtomicUsize,
    limit: OutputLimit,
    epoch: Instant,
    next_link: AtomicU64,
    /// How long a subscription waits for upstream's confirmation, and a
    /// link for room in the held-connection pool.
    pub(crate) wait: Duration,
    /// Counters.
    pub stats: Arc<HubStats>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("limit", &self.limit).finish()
    }
}

impl Hub {
    /// A hub whose clients have output limit `limit`.
    pub fn new(limit: OutputLimit, wait: Duration) -> Hub {
        Hub {
            state: Mutex::default(),
            monitors: Mutex::default(),
            scripts: Mutex::default(),
            monitoring: AtomicUsize::new(0),
            limit,
            epoch: Instant::now(),
            next_link: AtomicU64::new(1),
            wait,
            stats: Arc::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes client `client` (its outbox `outbox`) to `name`; a new
    /// upstream subscription goes to `node` (the shard channel's master,
    /// or any node for the classic kinds, when their link is new). Returns
    /// once upstream has confirmed it.
    ///
    /// # Errors
    /// [`HubError`]: refused upstream, link lost, or no confirmation within
    /// the wait.
    pub async fn subscribe(
        self: &Arc<Self>,
        kind: Kind,
        name: &Bytes,
        client: u64,
        outbox: &Arc<Outbox>,
        node: &NodeAddr,
        sessions: &Arc<SessionPool>,
    ) -> Result<(), HubError> {
        let rx = {
            let mut st = self.state();
            let key = (kind, name.clone());
            if let Some(t) = st.topics.get_mut(&key) {
                if t.confirmed {
                    t.subs.insert(client, Arc::clone(outbox));
                    return Ok(());
                }
                let (tx, rx) = oneshot::channel();
                t.waiting.push((client, Arc::clone(outbox), tx));
                rx
            } else {
                let lk = match kind {
                    Kind::Shard => LinkKey::Shard(node.clone()),
                    _ => LinkKey::Classic,
                };
                let link = match st.links.entry(lk.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(self.spawn_link(node.clone(), Arc::clone(sessions)))
                    }
                };
                let sent = link.tx.try_send(link::Cmd {
                    kind,
                    name: name.clone(),
                    sub: true,
                });
                if sent.is_err() {
                    return Err(HubError::Refused(
                        "ERR sidecache: too many subscription changes pending upstream".into(),
                    ));
                }
                link.topics += 1;
                let link_id = link.id;
                let (tx, rx) = oneshot::channel();
                st.topics.insert(
                    key,
                    Topic {
                        link: lk,
                        link_id,
                        confirmed: false,
                        subs: HashMap::new(),
                        waiting: vec![(client, Arc::clone(outbox), tx)],
                    },
                );
                self.stats.topics.fetch_add(1, Ordering::Relaxed);
                rx
            }
        };
        match tokio::time::timeout(self.wait, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(HubError::Lost("link closed".into())),
            Err(_) => Err(HubError::Timeout),
        }
    }

    fn spawn_link(self: &Arc<Self>, addr: NodeAddr, sessions: Arc<SessionPool>) -> Link {
        let id = self.next_link.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(LINK_COMMANDS);
        self.stats.links.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(link::run(Arc::downgrade(self), id, addr, sessions, rx));
        Link { id, tx, topics: 0 }
    }

    /// Ends client `client`'s subscription to `name` (and the upstream one
    /// when it was the last).
    pub fn unsubscribe(&self, kind: Kind, name: &Bytes, client: u64) {
        let mut st = self.state();
        Self::drop_sub(&mut st, &self.stats, kind, name, client);
    }

    fn drop_sub(st: &mut State, stats: &HubStats, kind: Kind, name: &Bytes, client: u64) {
        let key = (kind, name.clone());
        let Some(t) = st.topics.get_mut(&key) else {
            return;
        };
        t.subs.remove(&client);
        t.waiting.retain(|w| w.0 != client);
        if !t.subs.is_empty() || !t.waiting.is_empty() {
            return;
        }
        let Some(t) = st.topics.remove(&key) else {
            return;
        };
        stats.topics.fetch_sub(1, Ordering::Relaxed);
        if let Some(link) = st.links.get_mut(&t.link) {
            if link.id != t.link_id {
                return;
            }
            // Full: the upstream subscription stays, and its messages
            // find no local subscriber (dropped here).
            let sent = link.tx.try_send(link::Cmd {
                kind,
                name: name.clone(),
                sub: false,
            });
            if sent.is_ok() {
                *st.draining
                    .entry((kind, name.clone(), t.link_id))
                    .or_default() += 1;
            }
            link.topics -= 1;
            if link.topics == 0 {
                // Its task sends the UNSUBSCRIBE, then sees the channel
                // closed and closes the connection.
                st.links.remove(&t.link);
                stats.links.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// How many local subscriptions `PUBLISH channel` (or SPUBLISH, with
    /// `shard`) reaches, and how many of upstream's receivers are this
    /// hub's own: a PUBLISH's reply counts clients reached.
    pub fn receivers(&self, channel: &[u8], shard: bool) -> (i64, i64) {
        let st = self.state();
        let (mut local, mut ours) = (0i64, 0i64);
        for ((kind, name), t) in &st.topics {
            let hit = match kind {
                Kind::Shard => shard && name[..] == *channel,
                Kind::Channel => !shard && name[..] == *channel,
                Kind::Pattern => !shard && glob::matches(name, channel),
            };
            if hit && t.confirmed {
                local += t.subs.len() as i64;
                ours += 1;
            }
        }
        for ((kind, name, _), n) in &st.draining {
            let hit = match kind {
                Kind::Shard => shard && name[..] == *channel,
                Kind::Channel => !shard && name[..] == *channel,
                Kind::Pattern => !shard && glob::matches(name, channel),
            };
            if hit {
                ours += *n as i64;
            }
        }
        (local, ours)
    }

    /// Local subscribers of `channel` (PUBSUB NUMSUB, or SHARDNUMSUB with
    /// `shard`), and how many upstream subscriptions the hub holds on it.
    pub fn numsub(&self, channel: &Bytes, shard: bool) -> (i64, i64) {
        let kind = if shard { Kind::Shard } else { Kind::Channel };
        let st = self.state();
        let draining: usize = st
            .draining
            .iter()
            .filter(|((k, n, _), _)| *k == kind && n == channel)
            .map(|(_, c)| *c)
            .sum();
        match st.topics.get(&(kind, channel.clone())) {
            Some(t) if t.confirmed => (t.subs.len() as i64, 1 + draining as i64),
            _ => (0, draining as i64),
        }
    }

    // --- MONITOR ---

    /// Whether any client is in MONITOR.
    #[inline]
    pub fn monitoring(&self) -> bool {
        self.monitoring.load(Ordering::Relaxed) > 0
    }

    /// Adds a MONITOR client. The first one also starts following, on
    /// each of `nodes`, what scripts and functions run there (Redis's own
    /// MONITOR lines marked `lua`), which no proxy sees otherwise.
    ///
    /// Returns once those upstream MONITORs are in place (or failed, or
    /// the wait passed), so a script run after the client's `+OK` shows.
    pub async fn monitor(
        self: &Arc<Self>,
        client: u64,
        outbox: &Arc<Outbox>,
        nodes: Vec<NodeAddr>,
        sessions: &Arc<SessionPool>,
    ) {
        let mut ready = Vec::new();
        {
            let mut m = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
            if m.insert(client, Arc::clone(outbox)).is_none() {
                self.monitoring.fetch_add(1, Ordering::Relaxed);
                self.stats.monitors.fetch_add(1, Ordering::Relaxed);
            }
            let mut scripts = self.scripts.lock().unwrap_or_else(|p| p.into_inner());
            if scripts.is_none() {
                let stop = CancellationToken::new();
                for addr in nodes {
                    let (tx, rx) = oneshot::channel();
                    ready.push(rx);
                    tokio::spawn(monitor::follow_scripts(
                        Arc::downgrade(self),
                        addr,
                        Arc::clone(sessions),
                        stop.clone(),
                        tx,
                    ));
                }
                *scripts = Some(stop);
            }
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        for rx in ready {
            let _ = tokio::time::timeout_at(deadline, rx).await;
        }
    }

    /// Removes a MONITOR client.
    pub fn unmonitor(&self, client: u64) {
        let mut m = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        if m.remove(&client).is_some() {
            self.monitoring.fetch_sub(1, Ordering::Relaxed);
            self.stats.monitors.fetch_sub(1, Ordering::Relaxed);
        }
        if m.is_empty() {
            let stop = self
                .scripts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(stop) = stop {
                stop.cancel();
            }
        }
    }

    /// Sends a MONITOR line to every MONITOR client.
    pub fn feed(&self, line: Bytes) {
        let m = self.monitors.lock().unwrap_or_else(|p| p.into_inner());
        for o in m.values() {
            o.push(Delivery::Monitor(line.clone()));
        }
    }

    // --- Called by links ---

    fn unsubscribed(&self, link_id: u64, kind: Kind, name: &Bytes) {
        let mut st = self.state();
        let key = (kind, name.clone(), link_id);
        if let Some(n) = st.draining.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                st.draining.remove(&key);
            }
        }
    }

    fn confirmed(&self, link_id: u64, kind: Kind, name: &Bytes) {
        let mut st = self.state();
        let Some(t) = st.topics.get_mut(&(kind, name.clone())) else {
            return;
        };
        if t.link_id != link_id || t.confirmed {
            return;
        }
        t.confirmed = true;
        for (id, o, tx) in t.waiting.drain(..) {
            t.subs.insert(id, o);
            let _ = tx.send(Ok(()));
        }
    }

    fn refused(&self, link_id: u64, kind: Kind, name: &Bytes, why: String) {
        let mut st = self.state();
        let key = (kind, name.clone());
        let Some(t) = st.topics.get_mut(&key) else {
            return;
        };
        if t.link_id != link_id || t.confirmed {
            return;
        }
        for (_, _, tx) in t.waiting.drain(..) {
            let _ = tx.send(Err(HubError::Refused(why.clone())));
        }
        if t.subs.is_empty() {
            if let Some(t) = st.topics.remove(&key) {
                self.stats.topics.fetch_sub(1, Ordering::Relaxed);
                if let Some(link) = st.links.get_mut(&t.link) {
                    if link.id == link_id {
                        link.topics -= 1;
                    }
                }
            }
        }
    }

    fn deliver(&self, link_id: u64, msg: Msg) {
        self.stats.messages_in.fetch_add(1, Ordering::Relaxed);
        let name = match msg.kind {
            Kind::Pattern => msg.pattern.clone(),
            _ => msg.channel.clone(),
        };
        let st = self.state();
        let Some(t) = st.topics.get(&(msg.kind, name)) else {
            return;
        };
        if t.link_id != link_id || !t.confirmed {
            return;
        }
        let msg = Arc::new(msg);
        for o in t.subs.values() {
            o.push(Delivery::Message(Arc::clone(&msg)));
        }
    }

    /// Redis ended a shard subscription by itself (slot moved).
    fn shard_dropped(&self, link_id: u64, name: &Bytes) {
        let mut st = self.state();
        let key = (Kind::Shard, name.clone());
        match st.topics.get(&key) {
            Some(t) if t.link_id == link_id => {}
            _ => return,
        }
        let Some(t) = st.topics.remove(&key) else {
            return;
        };
        self.stats.topics.fetch_sub(1, Ordering::Relaxed);
        for o in t.subs.values() {
            o.push(Delivery::ShardUnsubscribed(name.clone()));
        }
        for (_, _, tx) in t.waiting {
            let _ = tx.send(Err(HubError::Refused("MOVED".into())));
        }
        if let Some(link) = st.links.get_mut(&t.link) {
            if link.id == link_id {
                link.topics -= 1;
            }
        }
    }

    /// A link broke: every subscription on it ends, and their clients are
    /// told to close.
    fn lost(&self, link_id: u64, why: &str) {
        let mut st = self.state();
        let mut gone = Vec::new();
        for (key, t) in &st.topics {
            if t.link_id == link_id {
                gone.push(key.clone());
            }
        }
        for key in gone {
            if let Some(t) = st.topics.remove(&key) {
                self.stats.topics.fetch_sub(1, Ordering::Relaxed);
                for o in t.subs.values() {
                    self.stats.link_losses.fetch_add(1, Ordering::Relaxed);
                    o.push(Delivery::Lost);
                }
                for (_, _, tx) in t.waiting {
                    let _ = tx.send(Err(HubError::Lost(why.to_string())));
                }
            }
        }
        st.draining.retain(|(_, _, l), _| *l != link_id);
        let key = st
            .links
            .iter()
            .find(|(_, l)| l.id == link_id)
            .map(|(k, _)| k.clone());
        if let Some(k) = key {
            st.links.remove(&k);
            self.stats.links.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
