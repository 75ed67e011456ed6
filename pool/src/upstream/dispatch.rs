//! The upstream as the batchers and the peer channel see it: the
//! [`Dispatch`] interface, implemented by delegating to [`Upstream`]'s own
//! methods.

use std::sync::Arc;

use bytes::Bytes;

use super::Upstream;
use crate::cluster::topology::Topology;
use crate::coherence::tracking::CoherenceListener;
use crate::config::{NodeAddr, Session};
use crate::conn::connect::Connector;
use crate::conn::mux::MuxConn;
use crate::dispatch::{Dispatch, Target};
use crate::error::Result;
use crate::slot::Slot;
use crate::write_behind::WriteBehind;

impl Dispatch for Upstream {
    fn topology(&self) -> Arc<Topology> {
        Upstream::topology(self)
    }
    fn request_refresh(&self) {
        Upstream::request_refresh(self);
    }
    fn serves(&self, addr: &NodeAddr) -> bool {
        Upstream::serves(self, addr)
    }
    fn write_behind(&self) -> &WriteBehind {
        Upstream::write_behind(self)
    }
    fn optin_tracking(&self) -> bool {
        Upstream::optin_tracking(self)
    }
    fn coherence_stats(&self) -> Option<&crate::coherence::tracking::CoherenceStats> {
        Upstream::coherence_stats(self)
    }
    fn dedicated_conn(&self, addr: &NodeAddr, session: Session) -> MuxConn {
        Upstream::dedicated_conn(self, addr, session)
    }
    fn has_peer(&self) -> bool {
        self.inner.peer.is_some()
    }
    async fn publish_written(&self, keys: Option<&[Bytes]>) {
        Upstream::publish_written(self, keys).await;
    }
    async fn execute(
        &self,
        session: Session,
        hint: usize,
        target: Target,
        cmd: Bytes,
    ) -> Result<Bytes> {
        Upstream::execute(self, session, hint, target, cmd).await
    }
    async fn follow(
        &self,
        session: Session,
        hint: usize,
        slot: Option<Slot>,
        cmd: &Bytes,
        reply: Bytes,
    ) -> Result<Bytes> {
        Upstream::follow(self, session, hint, slot, cmd, reply).await
    }
    fn connector(&self) -> &Connector {
        Upstream::connector(self)
    }
    fn coherence_listener(&self) -> Option<&Arc<dyn CoherenceListener>> {
        Upstream::coherence_listener(self)
    }
}
