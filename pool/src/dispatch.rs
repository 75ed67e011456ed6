//! What the write-behind batchers and the peer channel's subscriber
//! (`tasks/`) need of the upstream, as a narrow interface the upstream
//! router implements: they sit below it (`upstream.rs` starts them) and
//! reach it only through [`Dispatch`], so no module below the router
//! depends on it.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;

use crate::cluster::topology::Topology;
use crate::coherence::tracking::CoherenceListener;
use crate::config::{NodeAddr, Session};
use crate::conn::connect::Connector;
use crate::conn::mux::MuxConn;
use crate::error::Result;
use crate::slot::Slot;
use crate::write_behind::WriteBehind;

/// Where a command goes.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// The node owning this slot.
    Slot(Slot),
    /// A node by index in the topology snapshot used.
    Node(usize),
    /// Any node (keyless commands).
    Any,
}

/// The upstream as the batchers and the peer channel use it.
pub(crate) trait Dispatch: Clone + Send + Sync + 'static {
    /// The current topology snapshot.
    fn topology(&self) -> Arc<Topology>;
    /// Asks for a prompt slot-map refresh.
    fn request_refresh(&self);
    /// Whether `addr` is a master of the current slot map.
    fn serves(&self, addr: &NodeAddr) -> bool;
    /// Write-behind state and counters.
    fn write_behind(&self) -> &WriteBehind;
    /// Whether optin tracking is in force.
    fn optin_tracking(&self) -> bool;
    /// Invalidation channel counters (`None` without tracking).
    fn coherence_stats(&self) -> Option<&crate::coherence::tracking::CoherenceStats>;
    /// A connection of `addr`'s own, not shared with clients.
    fn dedicated_conn(&self, addr: &NodeAddr, session: Session) -> MuxConn;
    /// Whether the peer channel is the coherence mode in force.
    fn has_peer(&self) -> bool;
    /// Tells the other sidecaches (peer mode) of writes applied upstream.
    fn publish_written(&self, keys: Option<&[Bytes]>) -> impl Future<Output = ()> + Send;
    /// Runs one command on its target, following redirects.
    fn execute(
        &self,
        session: Session,
        hint: usize,
        target: Target,
        cmd: Bytes,
    ) -> impl Future<Output = Result<Bytes>> + Send;
    /// Follows MOVED/ASK/TRYAGAIN from a first reply to a final one.
    fn follow(
        &self,
        session: Session,
        hint: usize,
        slot: Option<Slot>,
        cmd: &Bytes,
        reply: Bytes,
    ) -> impl Future<Output = Result<Bytes>> + Send;
    /// The connector every connection uses.
    fn connector(&self) -> &Connector;
    /// Who is told about invalidations, once set.
    fn coherence_listener(&self) -> Option<&Arc<dyn CoherenceListener>>;
}
