//! One upstream node and its multiplexed connections, opened lazily per
//! (database, protocol) because both are connection state in Redis.

use std::sync::{Arc, OnceLock};

use crate::coherence::tracking::{Channel, Hub};
use crate::config::{NodeAddr, Proto, Session};
use crate::conn::connect::Connector;
use crate::conn::control::Control;
use crate::conn::health::Health;
use crate::conn::mux::MuxConn;
use crate::write_behind::WriteQueue;

/// An upstream node (a master). Outside this crate, a handle that names
/// the node and says how it is; a client's pipelines reach it through
/// [`crate::Upstream::submit`].
#[derive(Debug)]
pub struct Node {
    addr: NodeAddr,
    connector: Arc<Connector>,
    pool_size: usize,
    /// Index `db * 2 + proto`.
    pools: Box<[OnceLock<Box<[MuxConn]>>]>,
    /// Write-behind queue per database, started on first write.
    writers: Box<[OnceLock<WriteQueue>]>,
    /// The invalidation channel (client tracking on).
    channel: Option<Arc<Channel>>,
    /// Its connection, which also carries the write-behind batches of
    /// `tracked_db` (so `NOLOOP` hides the proxy's own writes from it).
    tracker: Option<MuxConn>,
    /// Optin: further tracking connections that carry L1 fills (fill
    /// lanes 1, 2, …; lane 0 is `tracker`), each with a channel of its
    /// own: its loss clears the node's keys like the main channel's.
    fillers: Box<[(Arc<Channel>, MuxConn)]>,
    /// What decides whether this node's values may be cached: its own
    /// channel, or the peer channel shared by all nodes.
    gate: Option<Arc<Channel>>,
    /// The database the tracking connection has selected (clients' default).
    tracked_db: u16,
    /// What the node's replies say of it; shared by its connections.
    health: Arc<Health>,
    /// The node's control connection (and its prober).
    control: Arc<Control>,
    /// What the replica probes last said of it (replica reads).
    replica: crate::replica::ReplicaState,
}

impl Node {
    /// A node whose connections open on first use; `health` names it and
    /// holds the connector its connections use.
    pub(crate) fn new(
        health: Arc<Health>,
        pool_size: usize,
        databases: u16,
        hub: Option<&Arc<Hub>>,
        peer_gate: Option<&Arc<Channel>>,
        tracked_db: u16,
        fill_connections: usize,
    ) -> Node {
        let addr = health.addr().clone();
        let connector = Arc::clone(health.connector());
        let tracked = |ch: &Arc<Channel>| {
            MuxConn::spawn_tracked(
                Arc::clone(&connector),
                addr.clone(),
                Session {
                    db: tracked_db,
                    proto: Proto::Resp3,
                },
                Arc::clone(ch),
                Arc::clone(&health),
            )
        };
        // Optin: the channel and `fill_connections - 1` fillers, each its
        // own place (echo waits are per connection).
        let optin = hub.is_some_and(|h| h.mode == crate::config::TrackingMode::Optin);
        let count = if optin { fill_connections.max(1) } else { 1 };
        let channel = hub.map(|h| {
            Arc::new(Channel::new(addr.clone(), tracked_db, Arc::clone(h)).placed(0, count))
        });
        let tracker = channel.as_ref().map(tracked);
        let fillers = match hub {
            Some(h) if optin => (1..fill_connections)
                .map(|i| {
                    let ch = Arc::new(
                        Channel::new(addr.clone(), tracked_db, Arc::clone(h)).placed(i, count),
                    );
                    let conn = tracked(&ch);
                    (ch, conn)
                })
                .collect(),
            _ => Box::default(),
        };
        let pools = (0..usize::from(databases.max(1)) * 2)
            .map(|_| OnceLock::new())
            .collect();
        let writers = (0..usize::from(databases.max(1)))
            .map(|_| OnceLock::new())
            .collect();
        Node {
            addr,
            connector,
            pool_size: pool_size.max(1),
            pools,
            writers,
            gate: channel.clone().or_else(|| peer_gate.cloned()),
            tracked_db,
            channel,
            tracker,
            fillers,
            control: Control::new(Arc::clone(&health)),
            health,
            replica: crate::replica::ReplicaState::default(),
        }
    }

    /// The node's health, as its replies show it.
    pub(crate) fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The node's control connection.
    pub(crate) fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Whether values read from this node may be cached now: its
    /// invalidation channel is up, or there is none (tracking off: the L1
    /// TTL cap bounds staleness). Read the fill epoch before calling this.
    pub fn coherent(&self) -> bool {
        self.gate.as_ref().is_none_or(|c| c.is_up()) && self.fillers_up()
    }

    /// Whether every further fill connection's channel is up (none: true).
    fn fillers_up(&self) -> bool {
        self.fillers.iter().all(|f| f.0.is_up())
    }

    /// The connection database `db`'s write-behind batches use when it is
    /// not a dedicated one: the tracking connection, for the database
    /// clients start in (the upstream URL's, usually 0).
    pub(crate) fn write_conn(&self, db: u16) -> Option<MuxConn> {
        (db == self.tracked_db)
            .then(|| self.tracker.clone())
            .flatten()
    }

    /// Fill lane `lane`'s tracking connection: the invalidation channel's
    /// own for lane 0, one of `fillers` for the others.
    pub(crate) fn filler(&self, lane: usize) -> Option<MuxConn> {
        match lane.checked_sub(1) {
            None => self.tracker.clone(),
            Some(i) => self.fillers.get(i).map(|f| f.1.clone()),
        }
    }

    /// The invalidation channel when it is an optin one: its connection
    /// also fills the L1 (every database: a fill selects its own and puts
    /// the connection back).
    pub(crate) fn optin(&self) -> Option<&Arc<Channel>> {
        self.channel
            .as_ref()
            .filter(|c| c.mode() == crate::config::TrackingMode::Optin)
    }

    /// A connection of its own for `session` (a write-behind batcher's):
    /// it reports to (and reconnects with) the node's health like the
    /// node's own connections.
    pub(crate) fn dedicated_conn(&self, session: Session) -> MuxConn {
        MuxConn::spawn_watched(
            Arc::clone(&self.connector),
            self.addr.clone(),
            session,
            Arc::clone(&self.health),
        )
    }

    /// What the replica probes last said of it (replica reads).
    pub fn replica_state(&self) -> &crate::replica::ReplicaState {
        &self.replica
    }

    /// The node's address.
    pub fn addr(&self) -> &NodeAddr {
        &self.addr
    }

    /// Whether the node answers as a healthy master (see
    /// `conn::health`).
    pub fn is_healthy(&self) -> bool {
        self.health.is_healthy()
    }

    /// Whether its invalidation channel is up; `None` when tracking is off.
    pub fn tracking_up(&self) -> Option<bool> {
        self.channel
            .as_ref()
            .map(|c| c.is_up() && self.fillers_up())
    }

    /// Sends one encoded command on the node's control connection (not
    /// shared with clients' commands, so it is not queued behind them:
    /// `CLIENT UNBLOCK`, `CLIENT KILL`, probes) and waits for its reply.
    ///
    /// # Errors
    /// The connection's error, or a timeout (`--connect-timeout`).
    pub async fn control_call(&self, cmd: bytes::Bytes) -> crate::error::Result<bytes::Bytes> {
        self.control.call(cmd).await
    }

    /// [`Node::control_call`], its error (a timeout, a broken connection)
    /// written as the reply a client gets for it.
    pub async fn control_reply(&self, cmd: bytes::Bytes) -> bytes::Bytes {
        match self.control.call(cmd).await {
            Ok(f) => f,
            Err(e) => {
                let mut b = bytes::BytesMut::new();
                e.write_reply(&mut b);
                b.freeze()
            }
        }
    }

    /// Barriers on every database's write-behind queue that has writes
    /// pending (FLUSHALL, SWAPDB, MOVE and COPY … DB reach across databases).
    pub(crate) fn write_barriers(&self) -> impl Iterator<Item = crate::write_behind::Barrier> + '_ {
        self.writers
            .iter()
            .filter_map(|w| w.get())
            .filter_map(WriteQueue::barrier)
    }

    /// Whether any database's write-behind queue has writes not yet flushed.
    pub(crate) fn has_pending_writes(&self) -> bool {
        self.writers
            .iter()
            .filter_map(|w| w.get())
            .any(|q| q.barrier().is_some())
    }

    /// The write-behind queue of `db`, if writes were ever queued there.
    pub(crate) fn write_queue(&self, db: u16) -> Option<&WriteQueue> {
        self.writers.get(usize::from(db))?.get()
    }

    /// The write-behind queue of `db`, started with `start` on first use.
    pub(crate) fn write_queue_or(
        &self,
        db: u16,
        start: impl FnOnce() -> WriteQueue,
    ) -> Option<&WriteQueue> {
        Some(self.writers.get(usize::from(db))?.get_or_init(start))
    }

    /// The connection for `session`; `hint` spreads clients over the pool
    /// and keeps one client on one connection (its commands stay in order).
    /// `None` when the database is out of range.
    pub(crate) fn conn(&self, session: Session, hint: usize) -> Option<&MuxConn> {
        let idx = usize::from(session.db) * 2 + usize::from(session.proto == Proto::Resp3);
        let pool = self.pools.get(idx)?.get_or_init(|| {
            (0..self.pool_size)
                .map(|_| {
                    MuxConn::spawn_watched(
                        Arc::clone(&self.connector),
                        self.addr.clone(),
                        session,
                        Arc::clone(&self.health),
                    )
                })
                .collect()
        });
        pool.get(hint % pool.len())
    }
}
