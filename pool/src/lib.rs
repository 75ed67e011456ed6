//! Everything upstream of sidecache: topology, slot routing, multiplexed
//! per-node connections, cluster redirects, TLS and AUTH.
//!
//! This crate knows nothing of client connections: it takes encoded commands
//! (`Bytes`) and returns reply frames (`Bytes`, exactly as the server sent
//! them), so replies pass through to clients without re-encoding.
//!
//! # Layout
//! Bottom to top: a module imports only the modules listed before it
//! (the layer table in `ARCHITECTURE.md`, "Layers of pool/src", which
//! the test `pool/tests/layers.rs` holds the code to).
//! - [`error`]: what can fail upstream (the write journal too), and how a
//!   failure reaches a client.
//! - `backoff`: the doubling wait between tries (reconnects, held
//!   requests, write-behind resends).
//! - [`auth`]: what connections authenticate with: the URL's password, or
//!   a rotating secret (IAM token, password file) from a [`auth::SecretSource`]
//!   the binary supplies, refreshed in the background, with the counters of
//!   refreshes and of re-authentications of live connections.
//! - [`config`]: typed configuration (`UpstreamConfig`, seeds, sessions,
//!   write-behind and coherence settings) and its defaults.
//! - [`slot`]: hash slots (also at [`cluster::slot`]).
//! - [`coherence`]: the invalidation channels of Redis client tracking
//!   ([`coherence::tracking`]: the no-stale-read argument lives there),
//!   the peer pub/sub fallback's state and messages ([`coherence::peer`]),
//!   and the optin re-reads of written keys ([`coherence::refill`]).
//! - [`replica`]: reads from replicas (`--read-from`): the slot stamps,
//!   each replica's probed state, the pure choice of a read's target, and
//!   the read-your-writes argument; the probes run in `upstream/replicas.rs`.
//! - [`write_behind`]: acknowledged writes queued per (node, database),
//!   with their bounds, barriers and drain; its `keys` part reads a
//!   queued write's keys back, and [`write_behind::journal`] records each
//!   write on local disk before it is acknowledged (`--write-journal`).
//! - `conn` (private): opening one connection (`conn::connect`: TCP/TLS,
//!   HELLO/AUTH/SELECT); the multiplexed, pipelined connection with its
//!   reconnecting supervisor (`conn::mux`); a node's health as its
//!   replies show it (`conn::health`) and its control connection and
//!   prober (`conn::control`);
//!   a node's connections per (database, protocol) (`conn::node`: outside
//!   the crate, [`Node`] is a handle that names a node and says how it
//!   is); and connections held by one client (WATCH, a MULTI spanning
//!   requests, a blocking command, a subscription), from a bounded pool
//!   (`conn::session`: [`SessionPool`]).
//! - [`cluster`]: the slot → node map ([`cluster::topology`], replaced
//!   whole on refresh) and the pure MOVED/ASK/TRYAGAIN decision
//!   ([`cluster::redirect`]).
//! - `dispatch` (private): [`Target`], and the narrow `Dispatch` trait
//!   through which the tasks next in this list reach the router.
//! - `tasks` (private): the write-behind batchers, which send the queues
//!   in pipelined batches, in order, with retries (and, under optin
//!   tracking, tell the proxy which written values landed), and the peer
//!   channel's subscriber.
//! - [`upstream`]: the router tying it together (its `replay` part queues
//!   a previous run's journal again at start; its `absorb` part holds a
//!   request through a passing failure, as a cluster client would). [`Upstream::submit`] is
//!   the one way to send a client's pipeline to a node: it waits for the
//!   write-behind writes the pipeline must not overtake, picks the
//!   connection and owns the errors (`submit` part). Its `slotmap` part reads,
//!   installs and refreshes the cluster's slot map and keeps the masters
//!   that left it while their queued writes are re-routed (where a failover
//!   re-routes queued writes). Its `user` part serves clients authenticated
//!   as an ACL user of their own: a bounded [`SessionPool`] per user
//!   ([`Upstream::user_pool`]), the credential check, and
//!   [`Upstream::submit_as`], the same waits then one of the user's
//!   connections.
//!
//! Connections are multiplexed rather than checked out of a pool: an
//! exclusive checkout per command would cap concurrency at the pool size and
//! cost a round trip per command, where a shared pipelined connection lets
//! many clients' commands travel in one write.

pub mod auth;
mod backoff;
pub mod cluster;
pub mod coherence;
pub mod config;
pub(crate) mod conn;
mod dispatch;
pub mod error;
pub mod replica;
pub mod slot;
mod tasks;
pub mod upstream;
pub mod write_behind;

pub use auth::{Auth, AuthStats, RotatingSecret, SecretSource};
pub use config::WriteConfig;
pub use config::{Credentials, Mode, NodeAddr, Proto, Seed, Session, UpstreamConfig};
pub use conn::connect::{set_keepalive, ReadHalf, WriteHalf};
pub use conn::health::HealthStats;
pub use conn::mux::Replies;
pub use conn::node::Node;
pub use conn::session::{SessionConn, SessionPool, SessionStats, Spliced};
pub use dispatch::Target;
pub use error::{Error, Result};
pub use slot::Slot;
pub use upstream::{Absorbed, Hold, Lane, Pending, ReplayReport, ServerInfo, Submitted, Upstream};
pub use write_behind::{DrainReport, Keys, Reservation, Write, WriteListener};
