//! One client connection: read, parse, dispatch, forward, reply in order.
//!
//! ```text
//!            read                    dispatch (per command, in order)
//!  client ─────────▶ rbuf ─parse─▶ ┬─ local ──────────────▶ scratch ─┐
//!                                  ├─ forward ─▶ builder[node] ───┐  │
//!                                  └─ split/fan-out ─▶ builder[n…]┤  │
//!                                                                 ▼  │
//!                                  one pipelined submit per node  │  │
//!                                  (multiplexed upstream conns)   │  │
//!                                                                 ▼  ▼
//!  client ◀───────── wbuf ◀──── pending[] resolved in request order ◀─┘
//!            write          (MOVED/ASK followed, split parts merged)
//! ```
//!
//! Parts: `dispatch` (the steps of `Client::dispatch` past its fast paths:
//! local commands, forwarded commands by handling), `cache` (L1 reads and
//! invalidation), `write` (write-behind),
//! `route` (split, fan-out, SCAN, where a blocking command goes), `flush`
//! (the pipelined submit and the reply pass), `tx` (transactions: from
//! MULTI to EXEC the commands are collected, not dispatched, and travel as
//! one block; `tx::run` runs them), `blocking` (blocking commands on a held
//! connection), `serve` (the connection loop), `subscribed` (subscriptions and MONITOR, through the
//! shared hub of [`crate::pubsub`]).
//!
//! A batch is everything parsed from one read (bounded by
//! [`MAX_BATCH`]); its upstream commands go out as one pipeline per node and
//! its replies are written in one write. A command that changes the session
//! (SELECT, HELLO, AUTH, RESET) first resolves the batch so far, so later
//! commands run with the new session and earlier ones with the old.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sidecache_pool::cluster::topology::Topology;
use sidecache_pool::Replies;
use sidecache_pool::{Proto, Session, Slot};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use sidecache_l1::FillTicket;

use crate::answer::{self, ClientState, Local};
use crate::cmd::handling::{Handling, Merge};
use crate::cmd::table::lowercase;
use crate::config::WriteMode;
use crate::metrics::{ConnMetrics, Path};
use crate::state::clients::{ClientEntry, NO_COMMAND};
use crate::state::flight::{Fetched, Flight, Joined};
use crate::state::Shared;

mod blocking;
mod cache;
mod dispatch;
mod flush;
mod replica;
mod route;
mod serve;
mod subscribed;
mod tracked;
mod tx;
mod write;

use serve::write_out;
pub use serve::{serve, ClientStream};
use sidecache_resp::encode::Reply;
use sidecache_resp::request::{InlineQuotes, Limits, Parser, Request};

/// Commands resolved together at most (bounds memory per client).
pub const MAX_BATCH: usize = 4096;
/// Request bytes resolved together at most.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Bits of a cluster SCAN cursor that name the master.
const SCAN_SHARD_BITS: u32 = 10;

/// A part of a split or fanned-out command.
struct Part {
    node: u32,
    idx: u32,
    slot: Option<Slot>,
    cmd: Bytes,
    positions: Vec<u32>,
}

/// What a write makes the L1 drop, at dispatch and again when upstream
/// acknowledged it (so no fill that raced the write survives it).
///
/// One key is held inline: a one-key write (INCR, DEL k, a forwarded SET)
/// allocates nothing for it.
#[derive(Debug)]
enum Inval {
    Keys(smallvec::SmallVec<[Bytes; 1]>),
    All,
}

/// A forwarded PUBLISH or PUBSUB NUMSUB (see [`Pending::Receivers`]).
struct Receivers {
    node: u32,
    idx: u32,
    slot: Option<Slot>,
    cmd: Bytes,
    adjust: subscribed::Adjust,
}

/// A GET miss being fetched (GET and PTTL pipelined at `idx`, `idx + 1`,
/// on the client's connection or the fill connection).
struct Fetch {
    /// Its builder: the node's, or (`fill`) its fill lane's.
    node: u32,
    idx: u32,
    /// Sent on the node's fill connection (optin tracking), not the
    /// client's.
    fill: bool,
    slot: Option<Slot>,
    key: Bytes,
    /// `None`: not cacheable (filtered key), fetch only.
    ticket: Option<FillTicket>,
    /// Set when this client leads a coalesced fetch.
    flight: Option<Arc<Flight>>,
    /// Filled in by the publish pass.
    result: Option<Fetched>,
}

enum MgetItem {
    Hit(Option<Bytes>),
    Fetch(Fetch),
}

enum Pending {
    Local(Range<usize>),
    Value(Option<Bytes>),
    Fetch(Box<Fetch>),
    /// An L1 hit of a read beyond GET: the reply as cached (in `from`).
    Read {
        reply: Bytes,
        from: Proto,
        shape: sidecache_resp::shape::Shape,
    },
    /// A read beyond GET being fetched.
    ReadFetch(Box<cache::reads::ReadFetch>),
    Join(Joined),
    Mget(Vec<MgetItem>),
    Invalidate(Inval),
    /// A followed transaction's writes ([`Client::tx_invalidated`]).
    TxInvalidate(Box<(Inval, Vec<(Bytes, bool)>)>),
    /// A held transaction's reads, read again ([`Client::tx_follow`]).
    TxFollow(Box<tracked::TxFollow>),
    /// PING while a node is not known healthy, and FUNCTION STATS:
    /// answered by that node (or the first), on its control connection
    /// (the encoded command).
    Control(Bytes),
    /// SCRIPT KILL / FUNCTION KILL, to every master's control connection.
    Kill(Bytes),
    /// After a `CONFIG SET` of `tracking-table-max-keys` (answers
    /// nothing): the keys Redis then stops following for sidecache are
    /// applied before the batch is answered (`Upstream::settle_tracking`),
    /// so a tracking client hears of them before its next reply, as Redis.
    Settle,
    /// A write-behind write recorded in the write journal as this
    /// sequence number: `+OK` once the journal holds it (`-MISCONF` if it
    /// cannot).
    Journalled(u64),
    /// A MULTI … EXEC/DISCARD block on a shared connection.
    Tx(Box<tx::TxPending>),
    /// A tracking client's script or read, run on a fill lane (`tracked`).
    LaneRead(Box<tracked::LaneRead>),
    Up {
        node: u32,
        idx: u32,
        slot: Option<Slot>,
        cmd: Bytes,
    },
    Merge {
        kind: Merge,
        parts: Vec<Part>,
        nkeys: usize,
    },
    Scan {
        node: u32,
        idx: u32,
        cmd: Bytes,
        shard: u64,
        nshards: u64,
    },
    Info {
        upstream: Option<(u32, u32)>,
        proxy: crate::report::info::Sections,
    },
    /// PUBLISH or PUBSUB NUMSUB forwarded: its counts adjusted for the
    /// hub's shared subscriptions (boxed: rare, and every pending entry
    /// is as large as the largest).
    Receivers(Box<Receivers>),
}

impl Pending {
    /// How this reply is counted in the latency split; `None` for entries
    /// that answer no command.
    fn path(&self) -> Option<Path> {
        match self {
            Pending::Invalidate(_) | Pending::Settle => None,
            Pending::Local(_) | Pending::Journalled(_) => Some(Path::Local),
            Pending::Value(_) | Pending::Read { .. } => Some(Path::L1Hit),
            Pending::Mget(items) if items.iter().all(|i| matches!(i, MgetItem::Hit(_))) => {
                Some(Path::L1Hit)
            }
            _ => Some(Path::Upstream),
        }
    }
}

#[derive(Default)]
struct Builder {
    buf: BytesMut,
    count: usize,
    /// Fill lane: the database its commands so far selected (`None`: the
    /// tracking connection's own, the one clients start in).
    selected: Option<u16>,
    /// Fill lane: the reads it registers.
    reads: usize,
    rx: Option<sidecache_pool::Pending>,
    result: Option<Result<Replies, sidecache_pool::Error>>,
    /// A replica's pipeline as sent (its reads go to the master if the
    /// replica fails them; see `flush`).
    sent: Option<(Bytes, usize)>,
}

/// One client's connection state.
pub struct Client {
    shared: Arc<Shared>,
    st: ClientState,
    topo: Arc<Topology>,
    builders: Vec<Builder>,
    /// Optin: the fill lanes (`cache`), `fill_lanes` per node (index
    /// `node * fill_lanes + lane`), each one of the node's tracking connections.
    fills: Vec<Builder>,
    /// Fill lanes per node (`--fill-connections` under optin, else 1).
    fill_lanes: usize,
    /// Whether optin tracking is in force: then only the database clients
    /// start in is cached (see `cache`).
    optin: bool,
    /// Whether reads may go to replicas (`--read-from` other than
    /// `primary`; see `Client::read_node`).
    replica_reads: bool,
    /// Whether this batch sent a command that may write on the client's
    /// connections: later fills of its nodes must not overtake it.
    forwarded_write: bool,
    /// The batch being resolved: when its forwarded commands get their
    /// error (`--upstream-timeout` from its start; `Client::flush`).
    deadline: Option<tokio::time::Instant>,
    /// Batches answered so far: a command whose dispatch had to answer
    /// the batch before it (a flush) finds its own entries from index 0.
    pub(super) answered: u64,
    pending: Vec<Pending>,
    scratch: BytesMut,
    wbuf: BytesMut,
    keys: Vec<usize>,
    /// CLIENT TRACKING: the keys of this batch's tracked reads, and
    /// whether sidecache followed each when it was registered (see
    /// `tracked`).
    tracked_reads: Vec<(u16, Bytes, bool)>,
    /// Keys this batch read on a fill lane (optin: Redis now follows them
    /// for sidecache), kept only while the client tracks.
    fill_reads: Vec<(u16, Bytes)>,
    /// CLIENT TRACKING: a CLIENT CACHING was followed by a command.
    caching_used: bool,
    /// CLIENT TRACKING: the command being dispatched goes to a fill lane.
    fill_route: tracked::FillRoute,
    /// CLIENT TRACKING: what this batch touched (`tracked::Early`).
    early: tracked::Early,
    /// CLIENT TRACKING: a CLIENT CACHING queued inside the open MULTI (it
    /// runs at EXEC, and applies to the commands queued after it).
    tx_caching: Option<bool>,
    batch_bytes: usize,
    commands: u64,
    /// The last command's name ([`crate::cmd::table::CommandInfo::name_id`];
    /// `clients::NO_COMMAND`): CLIENT LIST's `cmd`, published per batch.
    last_cmd: u32,
    /// GET's `name_id`, for the hot path.
    get_cmd: u32,
    /// Whether this batch holds a write not yet acknowledged upstream: its
    /// reads must not join other clients' fetches.
    batch_writes: bool,
    /// The clock, read once per batch for L1 deadlines.
    now: Option<std::time::Instant>,
    /// Until when this client's writes do not wait for room again: one of
    /// them waited the whole `--write-queue-timeout` and was refused, so a
    /// pipeline against a full queue is refused in one timeout, not one per
    /// write (nor one per read of a pipeline too long for one read).
    refusing: Option<std::time::Instant>,
    /// Write-behind commands are encoded here and split off (one
    /// allocation serves many writes).
    write_buf: BytesMut,
    /// `--write-journal`: waits for this client's writes to be recorded
    /// (made on its first journalled write).
    durable: Option<sidecache_pool::write_behind::journal::Durable>,
    /// This connection's metrics tally.
    metrics: ConnMetrics,
    /// Countdown to the next hot-key sample.
    hot: crate::metrics::hotkeys::Sampler,
    /// An open MULTI (its commands collected until EXEC or DISCARD).
    tx: Option<tx::TxBlock>,
    /// The upstream connection held for this client (WATCH, or a MULTI
    /// spanning batches).
    held: Option<tx::Held>,
    /// A blocking command to run next.
    blocked: Option<blocking::Blocked>,
    /// Bytes of L1 values this batch will write (known at dispatch).
    out_known: usize,
    /// `--client-output-buffer-limit normal` (`usize::MAX`: none).
    out_limit: usize,
    /// The largest reply of this client's last batch: the estimate for
    /// entries whose size is known only once answered.
    reply_estimate: usize,
    /// The command just dispatched answered with pushes (subscription
    /// confirmations), which CLIENT REPLY OFF/SKIP does not silence.
    pushed: bool,
    /// Whether GET and the other cached reads may be answered from the L1:
    /// it is on and the client runs as the `--upstream` user (a client
    /// authenticated as another ACL user never is; see
    /// [`Client::user_changed`]).
    cached: bool,
    /// Whether SETs are written behind: `--write-mode write-behind` and
    /// the client runs as the `--upstream` user.
    behind: bool,
    /// The client's ACL user no longer authenticates upstream (deleted,
    /// disabled, password removed): the connection is closed without
    /// the batch's replies, as Redis closes a deleted user's clients.
    pub(super) user_gone: bool,
    /// Subscriptions and MONITOR, with their outbox (`None` until the
    /// first SUBSCRIBE or MONITOR).
    subs: Option<Box<subscribed::Subs>>,
    /// The slot of this client's last write (cluster): where WAIT goes.
    last_write_slot: Option<Slot>,
    /// Pending entries whose replies CLIENT REPLY OFF/SKIP drops (ranges
    /// of `pending` indexes, in order).
    silent: Vec<Range<usize>>,
}

enum Flow {
    Continue,
    Close,
    /// A blocking command is set up: the connection loop answers what came
    /// before it, then runs it while watching the client socket.
    Block,
}

impl Client {
    fn new(
        shared: Arc<Shared>,
        addr: String,
        laddr: String,
        kill: crate::state::kill::Kill,
    ) -> Client {
        let id = shared.next_client_id();
        let entry = ClientEntry {
            addr,
            laddr,
            name: String::new(),
            db: 0,
            resp: 2,
            created: std::time::Instant::now(),
            lib_name: String::new(),
            lib_ver: String::new(),
            subs: [0; 3],
            user: None,
            activity: Default::default(),
            kill,
        };
        let st = ClientState {
            id,
            db: shared.upstream.default_db(),
            proto: Proto::Resp2,
            authenticated: shared.config.requirepass.is_none(),
            entry,
            reply: answer::ReplyMode::On,
            tracking: Default::default(),
            user: None,
        };
        shared.with_clients(|c| {
            c.insert(id, st.entry.clone());
        });
        let topo = shared.upstream.topology();
        let get_cmd = name_id(shared.table.lookup(&[Bytes::from_static(b"get")]));
        let shared_limit = shared.config.output_limit_normal as usize;
        let optin =
            shared.upstream.tracking_mode() == Some(sidecache_pool::config::TrackingMode::Optin);
        let metrics = ConnMetrics::new(&shared.metrics);
        let hot = crate::metrics::hotkeys::Sampler::new(&shared.hotkeys, id);
        // The prefix figures look at every L1 lookup.
        let hot = if metrics.prefix.on() {
            hot.watch_every_read()
        } else {
            hot
        };
        Client {
            cached: shared.l1.enabled(),
            user_gone: false,
            behind: shared.config.write_mode == WriteMode::WriteBehind,
            metrics,
            hot,
            fills: Vec::new(),
            fill_lanes: shared.upstream.fill_connections(),
            optin,
            replica_reads: shared.upstream.replica_reads().is_some(),
            forwarded_write: false,
            deadline: None,
            answered: 0,
            shared,
            st,
            topo,
            builders: Vec::new(),
            pending: Vec::new(),
            scratch: BytesMut::with_capacity(1024),
            wbuf: BytesMut::with_capacity(16 * 1024),
            keys: Vec::new(),
            tracked_reads: Vec::new(),
            fill_reads: Vec::new(),
            caching_used: false,
            fill_route: tracked::FillRoute::No,
            early: tracked::Early::default(),
            tx_caching: None,
            batch_bytes: 0,
            commands: 0,
            last_cmd: NO_COMMAND,
            get_cmd,
            batch_writes: false,
            now: None,
            refusing: None,
            write_buf: BytesMut::new(),
            durable: None,
            tx: None,
            held: None,
            blocked: None,
            subs: None,
            pushed: false,
            out_known: 0,
            out_limit: if shared_limit == 0 {
                usize::MAX
            } else {
                shared_limit
            },
            // Until a batch told: as if each reply were a quarter of the
            // bound, so a first pipeline of large replies holds about the
            // bound too (at the cost, for a first pipeline of more than
            // four forwarded commands, of one more round trip).
            reply_estimate: (shared_limit / 4).max(16),
            last_write_slot: None,
            silent: Vec::new(),
        }
    }

    /// Whether this batch's replies reach `--client-output-buffer-limit
    /// normal`: they are resolved and written before more requests are
    /// read (a client that does not read its replies is then not read
    /// either).
    #[inline]
    fn output_due(&self) -> bool {
        self.out_known + self.pending.len() * self.reply_estimate >= self.out_limit
    }

    fn session(&self) -> Session {
        Session {
            db: self.st.db,
            proto: self.st.proto,
        }
    }

    /// The client's user changed (AUTH, HELLO AUTH, RESET): a client of
    /// another ACL user than the `--upstream` one is never answered from
    /// the L1 (its entries were read as the `--upstream` user) and writes
    /// through (Redis's refusal, `-NOPERM`, is its reply); its reads go to
    /// masters (its connections send no `READONLY`).
    fn user_changed(&mut self) {
        let own = self.st.user.is_none();
        self.cached = own && self.shared.l1.enabled();
        self.replica_reads = own && self.shared.upstream.replica_reads().is_some();
        self.behind = own && self.shared.config.write_mode == WriteMode::WriteBehind;
        let user = self.st.user.as_ref().map(|l| l.user().to_owned());
        if self.st.entry.user != user {
            self.st.entry.user = user;
            let (id, entry) = (self.st.id, self.st.entry.clone());
            self.shared.with_clients(|c| {
                c.insert(id, entry);
            });
        }
    }

    /// The held connections this client's transactions and blocking
    /// commands take: its ACL user's, or the shared pool's.
    fn sessions(&self) -> Arc<sidecache_pool::SessionPool> {
        match &self.st.user {
            Some(login) => Arc::clone(login.pool()),
            None => Arc::clone(self.shared.upstream.sessions()),
        }
    }

    /// Whose connections a redirect is followed on.
    fn via(&self) -> sidecache_pool::upstream::Via<'_> {
        match &self.st.user {
            Some(login) => sidecache_pool::upstream::Via::User(login.pool()),
            None => sidecache_pool::upstream::Via::Shared { hint: self.hint() },
        }
    }

    fn hint(&self) -> usize {
        self.st.id as usize
    }

    fn local_reply(&mut self, f: impl FnOnce(&mut Reply<'_>)) {
        let start = self.scratch.len();
        f(&mut Reply {
            out: &mut self.scratch,
            proto: self.st.proto,
        });
        self.pending.push(Pending::Local(start..self.scratch.len()));
    }

    fn enqueue(&mut self, node: usize, cmd: &[u8]) -> (u32, u32) {
        if self.builders.len() <= node {
            self.builders.resize_with(node + 1, Builder::default);
        }
        let b = &mut self.builders[node];
        b.buf.extend_from_slice(cmd);
        b.count += 1;
        (node as u32, (b.count - 1) as u32)
    }

    /// CLIENT REPLY OFF or SKIP is in force: the replies of the command
    /// just dispatched (its pending entries from `first`) are dropped.
    fn silence_from(&mut self, first: usize) {
        let end = self.pending.len();
        // Subscription confirmations are pushes: Redis sends them even
        // with replies off.
        if first < end && !std::mem::take(&mut self.pushed) {
            self.silent.push(first..end);
        }
        if let answer::ReplyMode::Skip(n) = self.st.reply {
            self.st.reply = if n <= 1 {
                answer::ReplyMode::On
            } else {
                answer::ReplyMode::Skip(n - 1)
            };
        }
    }

    /// Appends a block of `count` commands to a node's pipeline as one unit;
    /// returns the node and the index of its first reply.
    fn enqueue_block(&mut self, node: usize, block: &[u8], count: usize) -> (u32, u32) {
        if self.builders.len() <= node {
            self.builders.resize_with(node + 1, Builder::default);
        }
        let b = &mut self.builders[node];
        b.buf.extend_from_slice(block);
        b.count += count;
        (node as u32, (b.count - count) as u32)
    }

    fn forward(&mut self, node: usize, slot: Option<Slot>, cmd: &Bytes) {
        let (node, idx) = self.enqueue(node, cmd);
        self.pending.push(Pending::Up {
            node,
            idx,
            slot,
            cmd: cmd.clone(),
        });
    }

    /// Dispatches one parsed request.
    ///
    /// A transaction open or keys watched go through [`Client::in_session`]
    /// first (nothing may be answered from the L1 or written behind inside
    /// MULTI); that check is the caller's, so this future, polled for every
    /// command, carries no state for it.
    async fn dispatch_in_session(&mut self, req: &Request) -> Flow {
        if self.st.authenticated {
            let mut lower = [0u8; 64];
            let lname = lowercase(&req.args[0], &mut lower).unwrap_or(b"");
            if let Some(flow) = self.in_session(lname, req).await {
                self.note_command(&req.args);
                self.commands += 1;
                self.batch_bytes += req.raw.len();
                return flow;
            }
        }
        self.dispatch(req).await
    }

    /// Dispatches one parsed request from a client that subscribed or
    /// monitored: RESP2's subscribed mode first.
    async fn dispatch_subscribed(&mut self, req: &Request) -> Flow {
        let mut lower = [0u8; 64];
        let lname = lowercase(&req.args[0], &mut lower).unwrap_or(b"");
        if self.st.authenticated && self.pubsub_guard(lname, req) {
            self.note_command(&req.args);
            return Flow::Continue;
        }
        self.dispatch(req).await
    }

    /// Notes `args` as the client's last command (CLIENT LIST's `cmd`), off
    /// the hot paths, which note theirs without a lookup.
    pub(super) fn note_command(&mut self, args: &[Bytes]) {
        self.last_cmd = name_id(self.shared.table.lookup(args));
    }

    /// Dispatches one parsed request outside a transaction or WATCH.
    async fn dispatch(&mut self, req: &Request) -> Flow {
        self.commands += 1;
        self.batch_bytes += req.raw.len();
        let args = &req.args;
        // The hot path: GET served from the L1 without a table lookup.
        if args.len() == 2
            && self.st.authenticated
            && self.cached
            && args[0].eq_ignore_ascii_case(b"GET")
        {
            self.metrics.command(self.shared.metrics.get_id());
            self.last_cmd = self.get_cmd;
            self.get(req);
            return Flow::Continue;
        }
        // The write-behind hot path: SET is no local command, and its table
        // entry is resolved once, so its acknowledgement costs no name
        // lowering, local-command match or hashed table lookup.
        let set = args.len() >= 3 && args[0].eq_ignore_ascii_case(b"SET");
        let mut lower = [0u8; 64];
        let lname: &[u8] = if set {
            b"set"
        } else {
            lowercase(&args[0], &mut lower).unwrap_or(b"")
        };
        let local = if set { None } else { Local::lookup(lname) };
        if let Some(cmd) = local {
            return self.dispatch_local(cmd, args).await;
        }
        let shared = Arc::clone(&self.shared);
        let found = match shared.table.set() {
            Some(info) if set => Some(info),
            _ => shared.table.lookup(args),
        };
        self.metrics
            .command(found.map_or(shared.metrics.unknown_id(), |i| i.id));
        self.last_cmd = name_id(found);
        if !self.st.authenticated || found.is_none() {
            // Refused before it runs: Redis counts it in neither
            // `total_commands_processed` nor CLIENT LIST's `tot-cmds`.
            self.commands -= 1;
        }
        if !self.st.authenticated {
            self.local_reply(|r| r.error("NOAUTH Authentication required."));
            return Flow::Continue;
        }
        let Some(info) = found else {
            if self.has_fills() || self.has_replica_reads() {
                self.flush().await;
            }
            self.forwarded_write = true;
            // Unknown to upstream's table: let upstream word the error.
            self.forward(0, None, &req.raw);
            return Flow::Continue;
        };
        let cluster = self.topo.is_cluster();
        if self.behind && info.write_behind && self.write_behind(&info.name, args, &req.raw).await {
            return Flow::Continue;
        }
        // Fills, and reads sent to replicas, travel on other connections
        // than this client's commands: a command that may write goes only
        // once they were answered, so none of them can read what it wrote.
        if cache::may_write(info) {
            if self.has_fills() || self.has_replica_reads() {
                self.flush().await;
            }
            self.forwarded_write = true;
        }
        let inval = self.write_invalidation(info, args);
        if let Some(rule) = info.read {
            if self.cached && info.arity_ok(args.len()) {
                if let Some(shape) = rule.shape(args) {
                    self.read(info.id, shape, req);
                    return Flow::Continue;
                }
            }
        }
        if info.handling == Handling::Split(Merge::Values) && self.cached && args.len() >= 2 {
            self.mget(req);
            return Flow::Continue;
        }
        self.dispatch_handled(info, lname, req, inval, cluster)
            .await
    }
}

/// What CLIENT LIST names a command by: its table entry's `name_id`, or
/// Redis's `NULL` for one the table lacks.
fn name_id(info: Option<&Arc<crate::cmd::table::CommandInfo>>) -> u32 {
    info.map_or(NO_COMMAND, |i| u32::from(i.name_id))
}
