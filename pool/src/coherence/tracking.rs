//! Coherence with other writers: Redis client tracking, one channel per
//! master, in one of two modes (`--tracking optin|bcast`, optin by
//! default).
//!
//! Each master gets one connection that speaks RESP3 and registers client
//! tracking before anything else; Redis pushes `invalidate` messages on
//! it (a null one for FLUSHALL/FLUSHDB). The same connection carries the
//! write-behind batches of the database clients start in (the upstream
//! URL's, usually 0). It is pinged every [`HEARTBEAT`]; a ping unanswered
//! for [`HEARTBEAT_TIMEOUT`] takes the channel down (the connection is
//! kept: closing it could let the writes it carries run after their
//! retries on a new one), and the next answered ping brings it back.
//!
//! - **optin** (the default): default-mode tracking, in which Redis
//!   remembers the keys a connection reads (its tracking table, bounded by
//!   `tracking-table-max-keys`), sends one invalidation per key when
//!   another client changes it, then forgets the key until it is read
//!   again. Only the keys sidecache caches are registered: the reads that
//!   fill the L1 travel on this connection, `GET k; PTTL k` in one
//!   pipeline (no extra round trip), and nothing else it carries reads a
//!   key. A write to a key no sidecache cached costs Redis a table lookup,
//!   whatever the number of sidecaches attached: the fleet-safe choice.
//!   On the wire it is `CLIENT TRACKING ON OPTOUT` (see "Why OPTOUT").
//! - **bcast** (`--tracking bcast`): `CLIENT TRACKING ON BCAST NOLOOP
//!   [PREFIX …]`. Redis pushes every key any *other* connection modifies;
//!   `NOLOOP` keeps the proxy's own flushes from evicting what it just
//!   wrote. Cost on Redis: every write, cached anywhere or not, is recorded
//!   and sent to every channel (measured: 5.5–8× Redis CPU per write with
//!   50 sidecaches attached).
//!
//! ## Why OPTOUT
//! Which keys are registered is chosen by what the connection carries, not
//! by a flag per read: every read it carries is a fill or a re-read (and
//! their `PTTL`s), which is to be registered. Under Redis's `OPTIN`, each
//! would need a `CLIENT CACHING YES` before it, one more command for Redis
//! to run per miss and per re-read batch; under `OPTOUT` every read
//! registers without it (`CLIENT CACHING NO` would exempt one: never
//! sent). Measured with `bench/workload.sh matrix` (bench/results/history/
//! 2026-12-05-read-write-workloads.md): 0.06–0.37 fewer Redis commands per
//! application operation. Writes register nothing in either mode (Redis
//! registers the keys of read-only commands), so the write-behind batches
//! the connection also carries are unchanged.
//!
//! ## Why optin reads on the channel connection, without NOLOOP or REDIRECT
//! Redis offers `REDIRECT <id>` so that reads on other connections report
//! to one channel. Measured on Redis 7.0 (this crate's tests): with
//! `NOLOOP`, the invalidations of keys evicted from a full tracking table
//! are dropped when the eviction happens during the tracked connection's
//! own command (Redis skips a NOLOOP target that is the current client,
//! and evictions run at the start of every command), so cached keys would
//! silently stop being tracked; with `REDIRECT`, invalidations are
//! appended to the channel at once, so one can land *inside* a
//! multi-element reply the channel connection is writing, which no parser
//! can take apart. Hence: one tracked connection per master, reading and
//! writing, no `NOLOOP`, no `REDIRECT`: Redis writes a push on the
//! connection it concerns between two replies, never inside one. Only the database
//! it selected is cached under optin (other databases are read and written
//! through, uncached; use bcast to cache several databases).
//!
//! ## Own writes (optin): re-read when the key is being read, else released
//! A write forgets every registration of its key, ours too, and Redis
//! tells no one of a key's later changes until someone reads it again
//! on a tracking connection. A value this proxy writes is served from the
//! L1 while its write is queued or on its way, when it *is* the key's
//! value as far as any reader of this proxy may know (contract 1). Once
//! the write's reply is read:
//! - a key read lately (within the TTL cap: the L1's read marks) was registered
//!   again and read back in the write's own pipeline, after the write
//!   (`MGET k …; PTTL k`), and the written entry becomes
//!   that read's fill: the key stays cached and followed. Design, cost and
//!   race argument: [`crate::coherence::refill`];
//! - any other key is handed with its write's stamp (the instant it was
//!   acknowledged) to [`crate::WriteListener::landed`], and the entry is
//!   dropped unless a later write replaced it (`L1::release_written`). The
//!   next read of the key is a miss that registers it (`GET` on the
//!   channel connection), so a key nobody reads costs Redis what an untracked `SET`
//!   costs, plus a lookup in its tracking table (measured 1.09× of the same
//!   SETs sent directly, with `bench/scale.sh sustained`).
//!
//! When a written key was registered before the write, Redis sends its
//! invalidation to the connection that holds the registration (no
//! `NOLOOP`). On the connection that wrote it, right after the write's
//! reply, it is the write's echo (`crate::conn::mux`'s `echo`) and spares
//! the written database; elsewhere it is applied like any other, at
//! worst a lost hit.
//!
//! The channel is *up* from the moment Redis acknowledged `CLIENT TRACKING`
//! until the connection is lost or a heartbeat goes unanswered. While it is down, the master's part of the
//! L1 is empty and stays so: the loss clears it ([`CoherenceListener::reset_node`]),
//! and fills and written values for its keys are not cached
//! ([`Channel::is_up`]), so reads go upstream until tracking is back.
//! Losing the connection is also how Redis forgets what it tracked for us
//! (optin): the same clearing covers it.
//!
//! # Why no stale value is cached after its invalidation arrived
//! Let a client write key `k` at time `W` on the master, and let the proxy
//! cache a value of `k` it fetched with a GET executed at time `G`.
//! - `G` after `W`: the GET read the new value; nothing is stale.
//! - `G` before `W`: the GET read the old value. Redis sends the
//!   invalidation of `k` after `W`, so after `G`, and the proxy began the
//!   fill (read the key's epoch, [`sidecache_l1`'s `begin_fill`]) before it
//!   sent the GET. So the invalidation is applied after the fill began:
//!   either before the fill completes (the epoch moved: the fill is
//!   discarded) or after it (the invalidation removes the entry).
//!   Optin: Redis sends it because the GET ran on the channel connection
//!   (tracking on since its first command, the handshake, or the channel
//!   is not up and nothing is cached), registering `k` at `G` for that
//!   connection; a write on *any* other connection (another client, another
//!   sidecache, this proxy's own forwarded writes on its pool connections)
//!   finds the registration. The registration lasts until the first write after
//!   `G` (which sends the invalidation) or until the connection is lost
//!   (which clears, below); a `tracking-table-max-keys` eviction sends an
//!   invalidation as a write would (no `NOLOOP`, so none is skipped).
//! - Own writes (optin). A written value `v` of `k`, acknowledged at `A`,
//!   inserted at `A` (bumping the epoch, so fills begun before are
//!   discarded) and queued; the write runs upstream at `L` and its reply is
//!   read at `R`, when the entry is released. Before `L`, a foreign write
//!   is overwritten by ours at `L`: `v` is the key's value from `L` on.
//!   Between `L` and `R`, a foreign write `F` makes `v` old, and the entry
//!   goes at `R`: it was served at most `R − F < R − L` past the change,
//!   the time the reply takes to come back, which is the same delay an
//!   invalidation push has (on the start database the write travels on the
//!   channel connection itself, in order with its pushes; a reply held up
//!   past [`HEARTBEAT_TIMEOUT`] takes the channel down, which clears the
//!   master's part of the L1, as for a late push; other databases'
//!   batches travel on connections of their own, whose replies are held
//!   up only with the server, which the heartbeat notices, or with that
//!   one TCP connection, which its keepalive ends and `--l1-ttl-cap`
//!   bounds meanwhile). A later write of `k`
//!   acknowledged before `R` replaces the entry with its own stamp, so the
//!   release keeps it; that write overwrites `F` when it lands, and is
//!   released in turn. Releasing never keeps a value: a stamp that does
//!   not match only spares a *later* write's value, which its own landing
//!   releases. A re-read after the write keeps the key instead, by the
//!   argument in [`crate::coherence::refill`]. A read after the release misses; it waits for the writes
//!   queued before it (`Upstream::submit`), so its `GET` runs after `L`,
//!   registers `k`, and any later write by anyone is pushed. Our own
//!   forwarded writes travel on other connections and are invalidated like
//!   any other client's (and by the proxy itself at dispatch and
//!   acknowledgement). A fill never overtakes a write of its own batch: a
//!   fill of a node goes on the channel connection only while no command
//!   that may write is bound for that node on the client's connection in
//!   the batch, and a command that may write waits until the batch's fills
//!   were answered.
//! - Back up after an unanswered heartbeat: the connection never broke, so
//!   no invalidation was lost, only delayed; the L1 was cleared when the
//!   channel went down and nothing was cached while it was down, so every
//!   entry is from a fill begun after it came back, covered above.
//! - The channel was not up at `W` (not yet registered, or lost): the fill
//!   must have checked the channel *after* reading the epoch and found it
//!   up, so it began after the registration — then `W` predates `G`. If the
//!   channel was lost during the fill, the loss clears the master's part of
//!   the L1 and bumps every epoch after marking the channel down, so the
//!   fill is discarded or removed, and no later fill passes the check.
//!   Optin: a reconnected channel is a new client to Redis with an empty
//!   tracking table; it registers before anything else is written on it,
//!   and every key is tracked again by the fill or batch that caches it.
//!
//! Invalidations name keys, not databases: a key is dropped from every
//! database.
//!
//! [`sidecache_l1`'s `begin_fill`]: https://docs.rs/sidecache-l1

use due::Due;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame;
use smallvec::SmallVec;
use tracing::{info, warn};

use crate::config::{NodeAddr, TrackingMode};

/// How often an idle tracking channel is pinged.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A ping unanswered this long breaks the channel.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

/// The mode in force, as INFO and the metrics report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoherenceMode {
    /// Client tracking on every master.
    Tracking,
    /// Off by configuration: the TTL cap alone.
    Off,
    /// The upstream refused `CLIENT TRACKING`: sidecache instances publish
    /// their writes to each other; the TTL cap bounds everything else.
    Peer,
    /// The upstream refused `CLIENT TRACKING` and the peer channel is off:
    /// the TTL cap alone.
    Unsupported,
}

impl CoherenceMode {
    /// The name shown in INFO.
    pub fn as_str(self) -> &'static str {
        match self {
            CoherenceMode::Tracking => "tracking",
            CoherenceMode::Off => "off",
            CoherenceMode::Peer => "peer (upstream refused CLIENT TRACKING)",
            CoherenceMode::Unsupported => "ttl-only (upstream refused CLIENT TRACKING)",
        }
    }
}

/// Told what the invalidation channels report; implemented by the proxy,
/// which owns the L1.
pub trait CoherenceListener: Send + Sync {
    /// Another client changed these keys (in some database).
    fn invalidate(&self, keys: &[Bytes]);
    /// `keys` were reported back for this sidecache's own write of them
    /// (see `crate::conn::mux`'s `echo`): nothing changed that was not
    /// told of at the write's acknowledgement, but Redis no longer follows
    /// them on that connection (in any database). `written_db`: the write
    /// was of that database and its report came right after it on the
    /// connection that wrote it, so what is cached there for these keys is
    /// that write's value or newer, and stays (`crate::coherence::refill`).
    fn invalidate_echo(&self, keys: &[Bytes], written_db: Option<u16>) {
        let _ = written_db;
        self.invalidate(keys);
    }
    /// Anything `node` holds may have changed unseen (its channel was lost,
    /// or it was flushed): drop what was cached from it.
    fn reset_node(&self, node: &NodeAddr);
    /// The topology changed: drop everything.
    fn reset_all(&self);
    /// A channel was lost (`node`; `None`: the peer channel, covering
    /// every master): nothing it covered is followed from now on. By
    /// default what it covered is dropped ([`CoherenceListener::reset_node`],
    /// [`CoherenceListener::reset_all`]); the proxy may keep serving it
    /// for a bounded time (`--l1-stale-if-error`).
    fn lost(&self, node: Option<&NodeAddr>) {
        match node {
            Some(n) => self.reset_node(n),
            None => self.reset_all(),
        }
    }
    /// A lost channel is back, about to be marked up (`node`; `None`: the
    /// peer channel): whatever [`CoherenceListener::lost`] kept must go
    /// now, before anything is filled or served under the new channel.
    fn resumed(&self, node: Option<&NodeAddr>) {
        let _ = node;
    }
}

/// Counters of the invalidation channels.
#[derive(Debug, Default)]
pub struct CoherenceStats {
    /// Keys named by invalidation messages.
    pub invalidated_keys: AtomicU64,
    /// Invalidation messages received.
    pub messages: AtomicU64,
    /// Null invalidations (a flush upstream).
    pub flushes: AtomicU64,
    /// Channels lost (connection broken or heartbeat timed out).
    pub channel_losses: AtomicU64,
    /// Channels (re-)established.
    pub channel_ups: AtomicU64,
    /// Optin: reads sent on a channel connection (each registers its key
    /// for this sidecache).
    pub registered_reads: AtomicU64,
    /// Keys reported back for this sidecache's own writes
    /// (see `crate::conn::mux`'s `echo`): not passed on to tracking
    /// clients.
    pub echoes: AtomicU64,
}

/// What all channels share.
pub(crate) struct Hub {
    pub(crate) mode: TrackingMode,
    /// What a channel connection sends first: `CLIENT TRACKING ON BCAST
    /// NOLOOP …` (bcast) or `CLIENT TRACKING ON OPTOUT` (optin), encoded.
    pub(crate) handshake: Bytes,
    pub(crate) listener: OnceLock<Arc<dyn CoherenceListener>>,
    pub(crate) stats: CoherenceStats,
    /// Some client of the proxy tracked keys (CLIENT TRACKING): the echoes
    /// of our own writes are told apart from then on (see
    /// `crate::conn::mux`'s `echo`; it costs each write-behind batch a
    /// reference to its payload until answered).
    pub(crate) echo_wanted: AtomicBool,
    /// Keys of writes made through this proxy whose report Redis may
    /// still send on another connection than the write's (see
    /// `crate::conn::mux`'s `echo`, "Echoes elsewhere"); at most
    /// [`ECHOES_DUE_MAX`].
    due: Mutex<Due>,
}

/// Bound of the keys whose echo is awaited elsewhere; past it they are all
/// forgotten (an echo not recognised is only a message too many).
pub const ECHOES_DUE_MAX: usize = 65_536;

/// Whether a command (its name) runs code: a script or a function, which
/// may read keys it does not name, and whose error replies may be its own.
pub(crate) fn runs_code(name: Option<&[u8]>) -> bool {
    name.is_some_and(|n| RUN_CODE.iter().any(|c| n.eq_ignore_ascii_case(c)))
}

/// Whether a command (its name) may answer an error of the caller's own
/// making, whatever its text: a script or a function (after writes, maybe)
/// and `DEBUG` (`DEBUG ERROR`). Such a reply says nothing of the node.
pub(crate) fn answers_any_error(name: Option<&[u8]>) -> bool {
    runs_code(name) || name.is_some_and(|n| n.eq_ignore_ascii_case(b"debug"))
}

/// Commands that run code.
const RUN_CODE: [&[u8]; 6] = [
    b"eval",
    b"evalsha",
    b"eval_ro",
    b"evalsha_ro",
    b"fcall",
    b"fcall_ro",
];

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("stats", &self.stats).finish()
    }
}

impl Hub {
    pub(crate) fn new(mode: TrackingMode, prefixes: &[Vec<u8>]) -> Hub {
        let handshake = match mode {
            TrackingMode::Bcast => handshake(prefixes),
            TrackingMode::Optin => {
                let mut out = BytesMut::new();
                encode::encode_command(&mut out, &probe_args(mode, &[]));
                out.freeze()
            }
        };
        Hub {
            mode,
            handshake,
            listener: OnceLock::new(),
            stats: CoherenceStats::default(),
            echo_wanted: AtomicBool::new(false),
            due: Mutex::default(),
        }
    }

    fn due(&self) -> std::sync::MutexGuard<'_, Due> {
        self.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Optin, with a client of the proxy tracking: this proxy is about to
    /// send a write of `keys` (acknowledged write-behind writes, forwarded
    /// writes at dispatch), so the next report of each is taken
    /// as this write's echo, on each of its node's tracking connections,
    /// unless a read of the key is answered first on that connection (see
    /// `crate::conn::mux`'s `echo`).
    pub(crate) fn expect_echoes(&self, keys: &[Bytes]) {
        if self.mode != TrackingMode::Optin || !self.echo_wanted.load(Ordering::Relaxed) {
            return;
        }
        let mut due = self.due();
        if due.hashes.len() + keys.len() > ECHOES_DUE_MAX {
            due.hashes.clear();
        }
        for k in keys {
            due.insert(k);
        }
    }

    pub(crate) fn listener(&self) -> Option<&Arc<dyn CoherenceListener>> {
        self.listener.get()
    }
}

/// `CLIENT TRACKING ON BCAST NOLOOP` with one `PREFIX` per include prefix.
/// Redis refuses overlapping prefixes, so a prefix that extends another
/// one is left out (the shorter one covers it).
pub(crate) fn handshake(prefixes: &[Vec<u8>]) -> Bytes {
    let mut out = BytesMut::new();
    encode::encode_command(&mut out, &handshake_args(prefixes));
    out.freeze()
}

/// The arguments of [`handshake`].
pub(crate) fn handshake_args(prefixes: &[Vec<u8>]) -> Vec<&[u8]> {
    let mut args: Vec<&[u8]> = vec![b"CLIENT", b"TRACKING", b"ON", b"BCAST", b"NOLOOP"];
    let mut sorted: Vec<&Vec<u8>> = prefixes.iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut kept: Vec<&[u8]> = Vec::new();
    for p in sorted {
        if !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    for p in kept {
        args.push(b"PREFIX");
        args.push(p);
    }
    args
}

/// What the start-up probe sends to learn whether the upstream accepts
/// client tracking in `mode`.
pub(crate) fn probe_args(mode: TrackingMode, prefixes: &[Vec<u8>]) -> Vec<&[u8]> {
    match mode {
        TrackingMode::Bcast => handshake_args(prefixes),
        // Not NOLOOP: Redis skips a NOLOOP client's invalidations while it
        // runs a command, tracking-table evictions included (they happen at
        // the start of any command), so they would be lost.
        // OPTOUT: every read on the connection is one to register (see
        // "Why OPTOUT").
        TrackingMode::Optin => vec![b"CLIENT", b"TRACKING", b"ON", b"OPTOUT"],
    }
}

/// One master's invalidation channel.
#[derive(Debug)]
pub struct Channel {
    addr: NodeAddr,
    /// The database its connection writes (write-behind batches of the
    /// database clients start in).
    db: u16,
    up: AtomicBool,
    hub: Arc<Hub>,
    /// Covers every master (the peer channel): its loss clears everything.
    all: bool,
    /// Its bit among its node's tracking connections, and all their bits
    /// (echo waits are per connection: [`Due`]).
    bit: u64,
    node_bits: u64,
}

impl Channel {
    pub(crate) fn new(addr: NodeAddr, db: u16, hub: Arc<Hub>) -> Channel {
        Channel {
            addr,
            db,
            up: AtomicBool::new(false),
            hub,
            all: false,
            bit: 1,
            node_bits: 1,
        }
    }

    /// The channel of its node's tracking connection `index` of `count`
    /// (past 64, connections share bits: a read answered on one then ends
    /// the other's wait too, which costs at most a message too many).
    pub(crate) fn placed(self, index: usize, count: usize) -> Channel {
        let bit = 1u64 << (index % 64);
        let node_bits = if count >= 64 {
            u64::MAX
        } else {
            (1u64 << count.max(1)) - 1
        };
        Channel {
            bit,
            node_bits,
            ..self
        }
    }

    /// A channel covering every master (the peer channel).
    pub(crate) fn for_all(addr: NodeAddr, hub: Arc<Hub>) -> Channel {
        Channel {
            all: true,
            ..Channel::new(addr, 0, hub)
        }
    }

    /// Whether the channel is registered and connected: values read from
    /// this master may be cached. Check it *after* reading the fill epoch.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    pub(crate) fn handshake(&self) -> &Bytes {
        &self.hub.handshake
    }

    /// Whether this connection's write-behind echoes are to be told apart
    /// (optin, and a client of the proxy tracks keys).
    pub(crate) fn wants_echoes(&self) -> bool {
        self.is_optin() && self.hub.echo_wanted.load(Ordering::Relaxed)
    }

    /// Whether some key's echo is awaited ([`Channel::answered`] has work).
    pub(crate) fn awaits_echoes(&self) -> bool {
        !self.hub.due().is_empty()
    }

    /// This channel's connection answered a command other than a
    /// write-behind write, whose arguments were `args` (name first): a read
    /// that may have registered its keys here. Redis reports a change of a
    /// key registered from now on after this reply, on this connection, so
    /// the key's next report *here* is no longer taken for our write's
    /// echo; on the node's other connections it still is (a registration
    /// there made before our write reports that write). A script or
    /// function may read keys it does not name: it ends every wait here.
    pub(crate) fn answered(&self, args: &[Bytes]) {
        let mut due = self.hub.due();
        if due.is_empty() {
            return;
        }
        if runs_code(args.first().map(|n| &n[..])) {
            due.end_all(self.bit, self.node_bits);
            return;
        }
        for a in args.iter().skip(1) {
            due.end(a, self.bit, self.node_bits);
        }
    }

    /// The kind of tracking this channel serves.
    pub fn mode(&self) -> TrackingMode {
        self.hub.mode
    }

    /// Whether it is an optin channel.
    pub(crate) fn is_optin(&self) -> bool {
        self.hub.mode == TrackingMode::Optin
    }

    /// Redis acknowledged `CLIENT TRACKING` on a fresh connection.
    pub(crate) fn set_up(&self) {
        if self.up.load(Ordering::SeqCst) {
            return;
        }
        // What was kept while it was down goes before it is up.
        if let Some(l) = self.hub.listener() {
            l.resumed((!self.all).then_some(&self.addr));
        }
        if !self.up.swap(true, Ordering::SeqCst) {
            self.hub.stats.channel_ups.fetch_add(1, Ordering::Relaxed);
            info!(node = %self.addr, "invalidation channel up");
        }
    }

    /// Redis refused `CLIENT TRACKING` on a fresh connection.
    pub(crate) fn refused(&self, reply: &str) {
        warn!(node = %self.addr, reply, "CLIENT TRACKING refused; not caching this master's keys");
    }

    /// Redis answered the channel's handshake on a fresh connection;
    /// whether it took it.
    pub(crate) fn registered(&self, frame: &Bytes) -> bool {
        if let Some(e) = frame::error_text(frame) {
            self.refused(&String::from_utf8_lossy(e));
            return false;
        }
        self.set_up();
        true
    }

    /// The connection is gone: down first, then clear (see the module doc).
    pub(crate) fn set_down(&self, reason: &str) {
        if self.up.swap(false, Ordering::SeqCst) {
            if let Some(l) = self.hub.listener() {
                l.lost((!self.all).then_some(&self.addr));
            }
            // Counted once the L1 is cleared: whoever sees the count sees
            // the cleared L1.
            self.hub
                .stats
                .channel_losses
                .fetch_add(1, Ordering::Release);
            warn!(node = %self.addr, reason, "invalidation channel lost; its keys were cleared from the L1");
        }
    }

    /// An out-of-band RESP3 push arrived on the channel; `own`: keys of
    /// this connection's write just answered, whose report is that
    /// write's echo and is left out (see `crate::conn::mux`'s `echo`).
    pub(crate) fn on_push(&self, frame: &Bytes, own: &[Bytes]) {
        let keys = match invalidated_keys(frame) {
            Some(keys) => Some(keys),
            None => match decode_invalidation(frame) {
                Some(keys) => keys,
                None => return,
            },
        };
        let stats = &self.hub.stats;
        stats.messages.fetch_add(1, Ordering::Relaxed);
        let Some(keys) = keys else {
            // A null: the master was flushed.
            stats.flushes.fetch_add(1, Ordering::Relaxed);
            if let Some(l) = self.hub.listener() {
                l.reset_node(&self.addr);
            }
            return;
        };
        stats
            .invalidated_keys
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        let Some(l) = self.hub.listener() else {
            return;
        };
        if own.is_empty() && !self.wants_echoes() {
            l.invalidate(&keys);
            return;
        }
        // Echoes of the write just answered on this connection (by
        // position), echoes awaited elsewhere, news.
        type Some2 = SmallVec<[Bytes; 2]>;
        let (mut here, mut elsewhere, mut news) = (Some2::new(), Some2::new(), Some2::new());
        {
            let mut due = self.hub.due();
            for k in keys {
                let awaited = !due.is_empty() && due.end(&k, self.bit, self.node_bits);
                if own.contains(&k) {
                    here.push(k);
                } else if awaited {
                    elsewhere.push(k);
                } else {
                    news.push(k);
                }
            }
        }
        stats
            .echoes
            .fetch_add((here.len() + elsewhere.len()) as u64, Ordering::Relaxed);
        if !here.is_empty() {
            l.invalidate_echo(&here, Some(self.db));
        }
        if !elsewhere.is_empty() {
            l.invalidate_echo(&elsewhere, None);
        }
        if !news.is_empty() {
            l.invalidate(&news);
        }
    }
}

mod due;
mod push;
use push::{decode_invalidation, invalidated_keys};
#[cfg(test)]
mod tests;
