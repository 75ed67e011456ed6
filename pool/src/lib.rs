//! Everything upstream of sidecache: topology, slot routing, multiplexed
//! per-node connections, cluster redirects, TLS and AUTH.
//!
//! This crate knows nothing of client connections: it takes encoded commands
//! (`Bytes`) and returns reply frames (`Bytes`, exactly as the server sent
//! them), so replies pass through to clients without re-encoding.
//!
//! # Layout
//! - [`config`]: typed configuration (`UpstreamConfig`, seeds, sessions).
//! - [`slot`]: CRC16 hash slots with `{hash tags}`.
//! - [`conn`]: opening one connection (TCP/TLS, HELLO/AUTH/SELECT).
//! - [`mux`]: a multiplexed, pipelined connection with a reconnecting supervisor.
//! - [`health`]: a node's health as its replies show it (BUSY, LOADING,
//!   MASTERDOWN, overdue replies), its prober and control connection.
//! - [`node`]: a node's connections per (database, protocol).
//! - [`topology`]: the slot → node map, replaced whole on refresh.
//! - [`redirect`]: the pure MOVED/ASK/TRYAGAIN decision.
//! - [`upstream`]: the router tying it together; its `slotmap` part reads,
//!   installs and refreshes the cluster's slot map and keeps the masters
//!   that left it while their queued writes are re-routed.
//! - [`session`]: connections held by one client (WATCH, a MULTI spanning
//!   requests), from a bounded pool.
//! - [`write_behind`]: acknowledged writes queued per (node, database) and
//!   flushed in pipelined batches, in order, with retries and a drain; its
//!   `batcher` part sends them.
//!
//! Connections are multiplexed rather than checked out of a pool: an
//! exclusive checkout per command would cap concurrency at the pool size and
//! cost a round trip per command, where a shared pipelined connection lets
//! many clients' commands travel in one write.

pub mod config;
pub mod conn;
pub mod error;
pub mod health;
pub mod mux;
pub mod node;
pub mod peer;
pub mod redirect;
pub mod session;
pub mod slot;
pub mod topology;
pub mod tracking;
pub mod upstream;
pub mod write_behind;

pub use config::{Credentials, Mode, NodeAddr, Proto, Seed, Session, UpstreamConfig};
pub use error::{Error, Result};
pub use slot::Slot;
pub use upstream::{ServerInfo, Target, Upstream};
pub use write_behind::{DrainReport, Keys, Reservation, Write, WriteConfig, WriteListener};
