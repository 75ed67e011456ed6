//! The router: which node a command goes to, following MOVED/ASK, and
//! keeping the cluster slot map fresh (periodically and on redirects).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::cluster::redirect::{self, Action};
use crate::cluster::topology::Topology;
use crate::coherence::peer::Peer;
use crate::coherence::tracking::{CoherenceListener, CoherenceMode, CoherenceStats, Hub};
use crate::config::{NodeAddr, Session, UpstreamConfig};
use crate::conn::connect::Connector;
use crate::conn::health::HealthStats;
use crate::conn::mux::MuxConn;
use crate::conn::mux::Replies;
use crate::conn::node::Node;
use crate::error::{Error, Result};
use crate::slot::Slot;
use crate::tasks::write_batcher;
use crate::write_behind::{Write, WriteBehind};

/// Facts about the upstream read at start-up.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `redis_version` of the first seed.
    pub version: String,
    /// Databases a client may SELECT (1 on a cluster).
    pub databases: u16,
    /// Whether the upstream is a cluster.
    pub cluster: bool,
    /// The seed's own `HELLO 3` reply, field by field in its order:
    /// `server`, `version`, `proto`, `id`, `mode`, `role`, `modules`, and
    /// what else the engine adds (Valkey: `availability_zone` when set).
    /// Valkey answers `server` `valkey` and its own version (its INFO keeps
    /// `redis_version:7.2.4`). Empty when the seed refused HELLO (Redis
    /// before 6).
    pub hello: Vec<(Bytes, Value)>,
}

impl ServerInfo {
    /// A text field of the seed's HELLO (`server`: `redis` or `valkey`;
    /// `version`: the engine's own version).
    pub fn hello_text(&self, field: &str) -> Option<&str> {
        self.hello
            .iter()
            .find(|(f, _)| f.as_ref() == field.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v.as_bytes()?).ok())
    }

    /// The engine, as its HELLO names it (`redis`, `valkey`); `redis`
    /// when it has no HELLO.
    pub fn engine(&self) -> &str {
        self.hello_text("server").unwrap_or("redis")
    }

    /// The engine's own version (Valkey's, not the `redis_version` it
    /// reports for compatibility, which [`ServerInfo::version`] keeps for
    /// feature checks).
    pub fn engine_version(&self) -> &str {
        self.hello_text("version").unwrap_or(&self.version)
    }

    /// Whether the engine is `engine` (`redis`, `valkey`) at `major.minor`
    /// or later, by its own version: where commands' dialects part.
    pub fn is_at_least(&self, engine: &str, major: u32, minor: u32) -> bool {
        let mut v = self
            .engine_version()
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let have = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        self.engine() == engine && have >= (major, minor)
    }
}

pub use crate::dispatch::Target;
pub use absorb::{Absorbed, FailoverStats, Hold, HOLD_BUCKETS_MS};

mod absorb;
mod dispatch;
mod health;
mod replay;
mod replicas;
mod slotmap;
mod startup;
mod submit;
mod user;

pub use replay::ReplayReport;
pub use submit::{Lane, Pending, Submitted};
pub use user::Via;

struct Inner {
    cfg: UpstreamConfig,
    connector: Arc<Connector>,
    topo: ArcSwap<Topology>,
    info: ServerInfo,
    nodes: Mutex<HashMap<NodeAddr, Arc<Node>>>,
    refresh: Notify,
    closed: CancellationToken,
    wb: WriteBehind,
    /// Shared by the invalidation channels (client tracking or peer).
    hub: Option<Arc<Hub>>,
    /// The peer channel (tracking refused by the upstream).
    peer: Option<Arc<Peer>>,
    coherence: CoherenceMode,
    /// Per slot: the node (as `Arc::as_ptr`) its last write-behind write was
    /// queued on; 0 for none. Detects a slot that moved between writes.
    slot_last: Box<[std::sync::atomic::AtomicUsize]>,
    /// Nodes that left the slot map (failed over, resharded away) while
    /// write-behind writes were still queued for them: kept until those
    /// writes reached the slots' new owners, so later commands to those
    /// slots can wait for them ([`Upstream::retired_barriers`]).
    retired: Mutex<Vec<Arc<Node>>>,
    /// Barriers on the writes queued for masters that lost slots but stay
    /// in the map (resharding), taken when the new map was installed:
    /// writes to a moved slot still queued there reach its new owner (by
    /// MOVED) after them, and later commands to that slot wait for them
    /// ([`Upstream::retired_barriers`]). Dropped once done.
    moved: Mutex<Vec<crate::write_behind::Barrier>>,
    /// Whether `retired` or `moved` is non-empty (read without the lock).
    has_retired: std::sync::atomic::AtomicBool,
    /// Failover and re-routing counters.
    pub(crate) failover: FailoverStats,
    /// Shared by every node's health.
    health: Arc<HealthStats>,
    /// Connections held by one client (WATCH, MULTI across requests).
    sessions: Arc<crate::conn::session::SessionPool>,
    /// Replica reads (`None` with `--read-from primary`).
    reads: Option<Arc<crate::replica::ReplicaReads>>,
}

/// Handle to the upstream; cheap to clone.
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("info", &self.inner.info)
            .finish()
    }
}

impl Upstream {
    /// Connects to the first reachable seed, detects the mode, reads the
    /// slot map, and starts the background refresher (cluster).
    ///
    /// # Errors
    /// Any configuration or connection error; nothing is left running.
    pub async fn connect(cfg: UpstreamConfig) -> Result<Upstream> {
        let connector = Arc::new(Connector::new(&cfg)?);
        // A rotating secret's first fetch: nothing connects without it.
        connector.auth().start().await?;
        let (seed_addr, replies) = startup::probe_seeds(&connector, &cfg).await?;
        let info = startup::server_info(&cfg, &seed_addr, &replies)?;
        let tracking_mode = startup::tracking_mode(&cfg, &info);
        let coherence =
            startup::coherence_mode(&cfg, &connector, &seed_addr, tracking_mode).await?;
        let (hub, peer) = startup::channels(&cfg, coherence, tracking_mode, &seed_addr);
        let reads = crate::replica::ReplicaReads::new(cfg.reads.clone()).map(Arc::new);
        if reads.is_some() && info.cluster {
            // Before any node's connection opens.
            connector.set_readonly();
        }
        let wb = WriteBehind::new(cfg.write.clone());
        if let Some(rr) = &reads {
            wb.set_stamps(Arc::clone(&rr.stamps));
        }
        let inner = Arc::new(Inner {
            topo: ArcSwap::from_pointee(Topology::empty()),
            connector: Arc::clone(&connector),
            info,
            nodes: Mutex::new(HashMap::new()),
            refresh: Notify::new(),
            closed: CancellationToken::new(),
            wb,
            reads,
            hub,
            peer,
            coherence,
            slot_last: (0..crate::slot::SLOT_COUNT)
                .map(|_| std::sync::atomic::AtomicUsize::new(0))
                .collect(),
            retired: Mutex::new(Vec::new()),
            moved: Mutex::new(Vec::new()),
            has_retired: std::sync::atomic::AtomicBool::new(false),
            failover: FailoverStats::default(),
            health: Arc::default(),
            sessions: Arc::new(crate::conn::session::SessionPool::new(
                Arc::clone(&connector),
                cfg.max_session_connections,
            )),
            cfg,
        });
        let up = Upstream { inner };
        up.start(&seed_addr).await?;
        Ok(up)
    }

    /// What every connection authenticates with, and its counters
    /// (refreshes, re-authentications).
    pub fn auth(&self) -> &Arc<crate::auth::Auth> {
        self.inner.connector.auth()
    }

    /// The connector every connection of this upstream uses.
    pub(crate) fn connector(&self) -> &Connector {
        &self.inner.connector
    }

    /// Who is told about invalidations, once set.
    pub(crate) fn coherence_listener(&self) -> Option<&Arc<dyn CoherenceListener>> {
        self.inner.hub.as_ref().and_then(|h| h.listener())
    }

    /// The peer channel, when it is the coherence mode in force.
    pub fn peer(&self) -> Option<&Arc<Peer>> {
        self.inner.peer.as_ref()
    }

    /// Tells other sidecache instances (peer mode) that this one applied
    /// writes to `keys` upstream, or (`None`) that anything may have
    /// changed. Sent after the write's reply; does not wait. A no-op
    /// unless the peer channel is in force.
    pub async fn publish_written(&self, keys: Option<&[Bytes]>) {
        let Some(peer) = &self.inner.peer else { return };
        let msg = match keys {
            Some([]) => return,
            Some(k) => crate::coherence::peer::Message::Keys(k.to_vec()),
            None => crate::coherence::peer::Message::Flush,
        };
        let topo = self.topology();
        let Some(conn) = topo
            .nodes()
            .first()
            .and_then(|n| n.conn(Session::default(), 0))
        else {
            return;
        };
        // The reply is not awaited: dropping the receiver is fine.
        let _ = conn.submit(peer.publish_cmd(&msg), 1).await;
    }

    /// Waits (at most `limit`) until every master's invalidation channel is
    /// up, so the L1 caches from the first request; logs the ones that are not.
    async fn await_channels(&self, limit: Duration) {
        if self.inner.hub.is_none() {
            return;
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let ready = match &self.inner.peer {
                Some(p) => p.is_up(),
                None => {
                    let (up, all) = self.channels_up();
                    up == all
                }
            };
            if ready {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let (up, all) = self.channels_up();
                warn!(up, masters = all, "invalidation channels not all up yet; their keys are not cached until they are");
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The kind of client tracking in force (`None`: no per-master
    /// tracking channels).
    pub fn tracking_mode(&self) -> Option<crate::config::TrackingMode> {
        self.tracking_hub().map(|h| h.mode)
    }

    /// Whether optin tracking is in force.
    pub(crate) fn optin_tracking(&self) -> bool {
        self.tracking_mode() == Some(crate::config::TrackingMode::Optin)
    }

    /// How the L1 is kept coherent with other writers.
    pub fn coherence_mode(&self) -> CoherenceMode {
        self.inner.coherence
    }

    /// Invalidation channel counters (`None` without tracking).
    pub fn coherence_stats(&self) -> Option<&CoherenceStats> {
        self.inner.hub.as_deref().map(|h| &h.stats)
    }

    /// A client of the proxy tracks keys: Redis's reports of the proxy's
    /// own write-behind writes are told apart from then on, so they do
    /// not reach such clients as changes (see `crate::conn::mux`'s
    /// `echo`). Never turned off again.
    pub fn filter_echoes(&self) {
        if let Some(h) = &self.inner.hub {
            h.echo_wanted
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// This proxy is about to send a write of `keys` (a write-behind write
    /// acknowledged, a forwarded write dispatched; never later than the
    /// send, see `crate::conn::mux`'s `echo`): under optin, once a
    /// client of the proxy tracks keys, Redis's next report of each is
    /// taken for this write's echo unless a read of the key is answered
    /// on a tracking connection first (see `crate::conn::mux`'s `echo`).
    pub fn expect_echoes(&self, keys: &[Bytes]) {
        if let Some(h) = self.tracking_hub() {
            h.expect_echoes(keys);
        }
    }

    /// The hub of per-master tracking channels (none in peer mode, where
    /// the hub serves the one peer channel).
    fn tracking_hub(&self) -> Option<&Arc<Hub>> {
        self.inner
            .hub
            .as_ref()
            .filter(|_| self.inner.peer.is_none())
    }

    /// The database clients start in: the first seed URL's `/db`, always 0
    /// on a cluster.
    pub fn default_db(&self) -> u16 {
        if self.inner.info.cluster {
            0
        } else {
            self.inner.cfg.seeds.first().map_or(0, |s| s.db)
        }
    }

    /// Masters whose invalidation channel is up, and all masters.
    pub(crate) fn channels_up(&self) -> (usize, usize) {
        let topo = self.topology();
        let up = topo
            .nodes()
            .iter()
            .filter(|n| n.tracking_up() == Some(true))
            .count();
        (up, topo.nodes().len())
    }

    /// Who is told about invalidations (the proxy's L1). Set once, before
    /// the first value is cached; later calls are ignored.
    pub fn set_coherence_listener(&self, l: Arc<dyn CoherenceListener>) {
        if let Some(h) = &self.inner.hub {
            let _ = h.listener.set(l);
        }
    }

    /// Facts read at start-up.
    pub fn server_info(&self) -> &ServerInfo {
        &self.inner.info
    }

    /// Whether commands are routed by slot.
    pub fn is_cluster(&self) -> bool {
        self.inner.info.cluster
    }

    /// The current topology snapshot.
    pub fn topology(&self) -> Arc<Topology> {
        self.inner.topo.load_full()
    }

    /// Asks the refresher to re-read the slot map soon (rate-limited).
    pub fn request_refresh(&self) {
        if self.inner.info.cluster {
            self.inner.refresh.notify_one();
        }
    }

    /// Counters shared by every node's health (see [`crate::conn::health`]).
    pub(crate) fn health_stats(&self) -> &HealthStats {
        &self.inner.health
    }

    /// Write-behind state and counters.
    pub fn write_behind(&self) -> &WriteBehind {
        &self.inner.wb
    }

    /// A connection of its own (not shared with clients), e.g. for a
    /// write-behind batcher.
    pub(crate) fn dedicated_conn(&self, addr: &NodeAddr, session: Session) -> MuxConn {
        // A connection of the node: it reports to (and reconnects with)
        // the node's health like the node's own connections.
        self.node(addr).dedicated_conn(session)
    }

    /// Optin tracking: the connection that fills the L1 with values of
    /// `node`: the invalidation channel's own connection, which also
    /// carries the write-behind batches of the database clients start in
    /// (see [`crate::coherence::tracking`]). `None` without an optin channel.
    pub(crate) fn fill_conn(&self, node: &Node, lane: usize) -> Option<MuxConn> {
        node.optin()?;
        node.filler(lane)
    }

    /// Optin tracking: the tracking connections per master that carry
    /// fills (`--fill-connections`); 1 otherwise. A key's fills go on
    /// lane `hash(key) % fill_connections()`, so each key is registered
    /// on one of them.
    pub fn fill_connections(&self) -> usize {
        if self.optin_tracking() {
            self.inner.cfg.fill_connections.clamp(1, 16)
        } else {
            1
        }
    }

    /// Queues an acknowledged write for `node` (after a permit from
    /// [`WriteBehind::reserve`]).
    ///
    /// Returns the write's journal sequence number (0 without
    /// `--write-journal`): its acknowledgement waits until
    /// [`crate::write_behind::journal::Durable::wait`] passes it.
    ///
    /// # Errors
    /// [`Error::Config`] for a database out of range, [`Error::Closed`]
    /// when shutting down, [`Error::Journal`] when the journal failed.
    pub fn queue_write(
        &self,
        node: &Node,
        write: Write,
        room: crate::write_behind::Reservation<'_>,
        at: std::time::Instant,
    ) -> Result<u64> {
        let db = write.db;
        let q = node
            .write_queue_or(db, || {
                write_batcher::spawn(self.clone(), node.addr().clone(), db, node.write_conn(db))
            })
            .ok_or_else(|| Error::Config(format!("database {db} out of range")))?;
        q.push(&self.inner.wb, write, room, at)
    }

    /// Longest wait for a forwarded command's reply (`--upstream-timeout`).
    pub fn command_timeout(&self) -> Option<Duration> {
        self.inner.cfg.command_timeout
    }

    /// The pool of held session connections.
    pub fn sessions(&self) -> &Arc<crate::conn::session::SessionPool> {
        &self.inner.sessions
    }

    /// Failover counters.
    pub fn failover_stats(&self) -> &FailoverStats {
        &self.inner.failover
    }

    /// Stops the background refresher.
    pub fn close(&self) {
        self.inner.closed.cancel();
        self.inner.refresh.notify_one();
    }

    /// Sends `count` encoded commands to one node as a unit and waits for
    /// the replies (`--upstream-timeout`), without waiting for queued
    /// writes: for redirects and the batchers' own retries.
    ///
    /// # Errors
    /// Connection errors; [`Error::Config`] for a database out of range.
    pub(crate) async fn call(
        &self,
        node: &Node,
        session: Session,
        hint: usize,
        payload: Bytes,
        count: usize,
    ) -> Result<Replies> {
        let conn = node
            .conn(session, hint)
            .ok_or_else(|| Error::Config(format!("database {} out of range", session.db)))?;
        let r = match self.inner.cfg.command_timeout {
            Some(t) => tokio::time::timeout(t, conn.call(payload, count))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout {
                        addr: node.addr().to_string(),
                    })
                }),
            None => conn.call(payload, count).await,
        };
        if let Err(e) = &r {
            if matches!(e, Error::Connect { .. } | Error::ConnectionLost { .. }) {
                self.request_refresh();
            }
        }
        r
    }

    /// Runs one command on its target, following redirects.
    ///
    /// # Errors
    /// Connection and routing errors.
    pub async fn execute(
        &self,
        session: Session,
        hint: usize,
        target: Target,
        cmd: Bytes,
    ) -> Result<Bytes> {
        let topo = self.topology();
        let idx = match target {
            Target::Slot(s) => topo.node_index(s).inspect_err(|_| self.request_refresh())?,
            Target::Node(i) => i,
            Target::Any => 0,
        };
        let node = topo.nodes().get(idx).ok_or(Error::SlotUnassigned(0))?;
        let reply = first(self.call(node, session, hint, cmd.clone(), 1).await?)?;
        let slot = match target {
            Target::Slot(s) => Some(s),
            _ => None,
        };
        self.follow(session, hint, slot, &cmd, reply).await
    }

    /// Given the first reply to `cmd`, follows MOVED/ASK and waits out
    /// CLUSTERDOWN/TRYAGAIN/LOADING until a final reply.
    ///
    /// # Errors
    /// Connection errors on the redirected node.
    pub async fn follow(
        &self,
        session: Session,
        hint: usize,
        slot: Option<Slot>,
        cmd: &Bytes,
        reply: Bytes,
    ) -> Result<Bytes> {
        self.follow_via(Via::Shared { hint }, session, slot, cmd, reply, None)
            .await
    }

    /// [`Upstream::follow`] on the connections `via` names (an ACL user's
    /// own, for its clients). A passing error (`CLUSTERDOWN`, `TRYAGAIN`,
    /// `LOADING`; standalone: `LOADING`) is waited out and the command sent
    /// again to its slot's node, as a cluster client does, for at most
    /// `deadline` (`None`: `--upstream-timeout` from the first wait;
    /// [`Upstream::hold`]); never a script's or function's, whose error
    /// may be its own and whose writes may have run.
    ///
    /// # Errors
    /// Connection errors on the redirected node; a full user pool.
    pub async fn follow_via(
        &self,
        via: Via<'_>,
        session: Session,
        slot: Option<Slot>,
        cmd: &Bytes,
        mut reply: Bytes,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Bytes> {
        let cluster = self.inner.info.cluster;
        let mut hold = absorb::Hold::default();
        // Every way out (a final reply, time up, an error) counts the hold.
        let result = async {
            let mut attempt = 0;
            loop {
                match redirect::decide(&reply, attempt) {
                    Action::Moved { slot, addr } if cluster => {
                        self.note_moved(slot, &addr);
                        let node = self.node(&addr);
                        reply = first(self.call_via(via, &node, session, cmd.clone(), 1).await?)?;
                    }
                    Action::Ask { addr } if cluster => {
                        let node = self.node(&addr);
                        let mut p = BytesMut::with_capacity(cmd.len() + 20);
                        encode::encode_command(&mut p, &[b"ASKING"]);
                        p.extend_from_slice(cmd);
                        let mut r = self.call_via(via, &node, session, p.freeze(), 2).await?;
                        reply = r
                            .pop()
                            .ok_or_else(|| Error::Topology("missing reply after ASKING".into()))?;
                    }
                    Action::Retry(kind)
                        if (cluster || kind == redirect::Transient::Loading)
                            && !absorb::answers_any_error(
                                sidecache_resp::request::command_name(cmd, 0),
                            )
                            && self.hold(&mut hold, kind.into(), deadline).await =>
                    {
                        let topo = self.topology();
                        let idx = match slot {
                            Some(s) if cluster => topo.node_index(s)?,
                            _ => 0,
                        };
                        let node = topo.nodes().get(idx).ok_or(Error::SlotUnassigned(0))?;
                        match self.call_via(via, node, session, cmd.clone(), 1).await {
                            Ok(r) => reply = first(r)?,
                            // Not sent: the node is still out of reach.
                            Err(Error::Connect { .. }) => {}
                            Err(e) => return Err(e),
                        }
                        continue;
                    }
                    _ => return Ok(reply),
                }
                attempt += 1;
            }
        }
        .await;
        self.held(hold);
        if let Ok(reply) = &result {
            self.note_reply(reply);
        }
        result
    }

    /// The node for an address, reusing its connections if known.
    fn node(&self, addr: &NodeAddr) -> Arc<Node> {
        let mut nodes = self.inner.nodes.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(nodes.entry(addr.clone()).or_insert_with(|| {
            Arc::new(Node::new(
                Arc::new(crate::conn::health::Health::new(
                    addr.clone(),
                    Arc::clone(&self.inner.connector),
                    Arc::clone(&self.inner.health),
                    !self.inner.info.cluster,
                )),
                self.inner.cfg.pool_size,
                self.inner.info.databases,
                self.tracking_hub(),
                self.inner.peer.as_ref().map(|p| p.gate()),
                self.default_db(),
                self.fill_connections(),
            ))
        }))
    }
}

fn first(mut r: Replies) -> Result<Bytes> {
    r.pop()
        .ok_or_else(|| Error::Topology("missing reply".into()))
}

/// A field of an INFO text.
pub fn info_field(info: &[u8], field: &str) -> Option<String> {
    let text = String::from_utf8_lossy(info);
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim().to_owned())
    })
}
