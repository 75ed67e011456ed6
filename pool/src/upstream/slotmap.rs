//! Following the cluster's slot map: reading it (every known node at once),
//! installing it, refreshing it promptly while failures or failover
//! replies come, and keeping the masters that left it while writes queued
//! for them are on their way to the slots' new owners.

use std::sync::Arc;
use std::time::Duration;

use sidecache_resp::frame;
use tracing::{info, warn};

use super::{Inner, Upstream};

use crate::cluster::redirect;
use crate::cluster::topology::{self, Topology};
use crate::config::{NodeAddr, Session};
use crate::conn::connect::expect_ok;
use crate::conn::node::Node;
use crate::error::{Error, Result};
use crate::slot::Slot;

impl Upstream {
    /// When the slot's previous write-behind write was queued on another
    /// node (the slot moved), a barrier on that node's queue: writes to a key
    /// must not overtake earlier ones still queued for its old owner.
    ///
    /// # Race window
    /// Records `node` as the slot's owner before the caller queues the
    /// write; a concurrent write to the same slot on the old node queued
    /// after this check is a write the new owner will MOVED-redirect in order.
    pub(crate) fn reroute_barrier(
        &self,
        slot: Slot,
        node: &Arc<Node>,
        db: u16,
    ) -> Option<crate::write_behind::Barrier> {
        let me = Arc::as_ptr(node) as usize;
        let prev = self
            .inner
            .slot_last
            .get(usize::from(slot.get()))?
            .swap(me, std::sync::atomic::Ordering::AcqRel);
        if prev == 0 || prev == me {
            return None;
        }
        let old = {
            let nodes = self.inner.nodes.lock().unwrap_or_else(|p| p.into_inner());
            nodes
                .values()
                .find(|n| Arc::as_ptr(n) as usize == prev)
                .cloned()
        };
        // A node that left the map with writes queued is kept in `retired`;
        // one found in neither has nothing queued (it was dropped).
        let old = old.or_else(|| {
            let retired = self.inner.retired.lock().unwrap_or_else(|p| p.into_inner());
            retired
                .iter()
                .find(|n| Arc::as_ptr(n) as usize == prev)
                .cloned()
        })?;
        old.write_queue(db)?.barrier()
    }
    /// Barriers on the write-behind queues of nodes that left the slot map
    /// with writes still queued (their writes are on their way to the
    /// slots' new owners), and on the writes that were queued for a master
    /// when one of its slots moved away (resharding: those to the moved
    /// slot will reach its new owner by MOVED). A command sent to any
    /// master waits for them too, so it cannot overtake an earlier write to
    /// its keys. Empty, and no lock taken, in the common case of no such
    /// node.
    pub(crate) fn retired_barriers(&self) -> Vec<crate::write_behind::Barrier> {
        if !self
            .inner
            .has_retired
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Vec::new();
        }
        let mut retired = self.inner.retired.lock().unwrap_or_else(|p| p.into_inner());
        let mut moved = self.inner.moved.lock().unwrap_or_else(|p| p.into_inner());
        retired.retain(|n| n.has_pending_writes());
        moved.retain(|b| !b.is_done());
        if retired.is_empty() && moved.is_empty() {
            self.inner
                .has_retired
                .store(false, std::sync::atomic::Ordering::Release);
        }
        retired
            .iter()
            .flat_map(|n| n.write_barriers())
            .chain(moved.iter().cloned())
            .collect()
    }

    /// Masters of `old` that lost a slot to another master of `new` and
    /// stay in it: the barriers on what they had queued then.
    fn moved_away(old: &Topology, new: &Topology) -> Vec<crate::write_behind::Barrier> {
        if !old.is_cluster() || old.nodes().is_empty() {
            return Vec::new();
        }
        let mut losers = vec![false; old.nodes().len()];
        for slot in (0..crate::slot::SLOT_COUNT).filter_map(Slot::new) {
            let (Ok(a), Ok(b)) = (old.node_index(slot), new.node_index(slot)) else {
                continue;
            };
            if let (Some(na), Some(nb)) = (old.nodes().get(a), new.nodes().get(b)) {
                if na.addr() != nb.addr() {
                    losers[a] = true;
                }
            }
        }
        old.nodes()
            .iter()
            .zip(losers)
            .filter(|(n, lost)| *lost && new.index_of(n.addr()).is_some())
            .flat_map(|(n, _)| n.write_barriers().collect::<Vec<_>>())
            .collect()
    }
    /// Whether `addr` is a master of the current slot map (always, for a
    /// standalone upstream). A write-behind batcher whose node is not sends
    /// its writes to their slots' owners instead.
    pub(crate) fn serves(&self, addr: &NodeAddr) -> bool {
        let topo = self.topology();
        !topo.is_cluster() || topo.index_of(addr).is_some()
    }
    /// Asks for a prompt slot-map refresh when `reply` says the cluster is
    /// changing under it (a master down, a failover under way, a node
    /// loading or demoted): the map is re-read every 100–250 ms while such
    /// replies and connection failures keep coming.
    pub fn note_reply(&self, reply: &[u8]) {
        if !self.inner.info.cluster {
            return;
        }
        if let Some(text) = frame::error_text(reply) {
            if redirect::signals_failover(text) {
                self.request_refresh();
            }
        }
    }
    /// Asks for a prompt slot-map refresh after a failure to reach a
    /// master (cluster only).
    pub fn note_failure(&self, e: &Error) {
        if matches!(
            e,
            Error::Connect { .. } | Error::ConnectionLost { .. } | Error::Timeout { .. }
        ) {
            self.request_refresh();
        }
    }
    /// The node a redirect names; a MOVED (`moved`) also updates the slot
    /// map for `slot`.
    pub fn redirect_node(&self, addr: &NodeAddr, slot: Option<Slot>, moved: bool) -> Arc<Node> {
        if let (true, Some(s)) = (moved, slot) {
            self.note_moved(s, addr);
        }
        self.node(addr)
    }
    pub(super) fn note_moved(&self, slot: Slot, addr: &NodeAddr) {
        let node = self.node(addr);
        self.inner
            .topo
            .rcu(|t| t.with_slot(slot, Arc::clone(&node)));
        self.request_refresh();
    }
    /// The slot map `addr` gives, with the (master, replica) pairs when
    /// replicas are read from (else none).
    pub(super) async fn read_slots(&self, addr: &NodeAddr) -> Result<SlotMap> {
        let r = self
            .inner
            .connector
            .oneshot(addr, Session::default(), &[&[b"CLUSTER", b"SLOTS"]])
            .await?;
        let v = expect_ok(&r[0])?;
        let replicas = match &self.inner.reads {
            Some(_) => topology::parse_cluster_replicas(&v, addr),
            None => Vec::new(),
        };
        Ok((topology::parse_cluster_slots(v, addr)?, replicas))
    }
    /// Installs a slot map; returns whether the set of masters changed.
    pub(super) fn install(&self, (ranges, replicas): &SlotMap) -> bool {
        let topo = Topology::cluster(ranges, replicas, |a| self.node(a));
        let old = self.inner.topo.swap(Arc::new(topo));
        let new = self.inner.topo.load();
        let changed = old.nodes().len() != new.nodes().len()
            || old
                .nodes()
                .iter()
                .zip(new.nodes())
                .any(|(a, b)| a.addr() != b.addr());
        if changed {
            let masters: Vec<String> = new.nodes().iter().map(|n| n.addr().to_string()).collect();
            info!(masters = ?masters, "cluster topology");
            // A new master's writes before its channel registered were seen
            // by no channel: drop everything cached.
            if let Some(l) = self.inner.hub.as_ref().and_then(|h| h.listener()) {
                l.reset_all();
            }
        }
        // A master that lost slots and stays: what it has queued now goes
        // first (see `retired_barriers`).
        let moved = Self::moved_away(&old, &new);
        if !moved.is_empty() {
            self.inner
                .moved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(moved);
            self.inner
                .has_retired
                .store(true, std::sync::atomic::Ordering::Release);
        }
        // Forget nodes that serve nothing any more; keep those with writes
        // still queued until their batchers re-routed them.
        let mut gone = Vec::new();
        {
            let mut nodes = self.inner.nodes.lock().unwrap_or_else(|p| p.into_inner());
            nodes.retain(|a, n| {
                let keep = new.knows(a);
                if !keep {
                    gone.push(Arc::clone(n));
                }
                keep
            });
        }
        // A master that is none now (gone, or a replica after a failover);
        // a replica that left is no failover.
        if old.nodes().iter().any(|n| new.index_of(n.addr()).is_none()) {
            self.inner
                .failover
                .masters_replaced
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // A master demoted to a replica of the new map stays known, and
        // its queued writes are re-routed like a departed master's.
        gone.extend(
            old.nodes()
                .iter()
                .filter(|n| new.index_of(n.addr()).is_none() && new.knows(n.addr()))
                .cloned(),
        );
        if !gone.is_empty() {
            let mut retired = self.inner.retired.lock().unwrap_or_else(|p| p.into_inner());
            retired.extend(gone.into_iter().filter(|n| n.has_pending_writes()));
            retired.retain(|n| n.has_pending_writes());
            self.inner
                .has_retired
                .store(!retired.is_empty(), std::sync::atomic::Ordering::Release);
        }
        changed
    }
    /// Re-reads the slot map, asking every known master and seed at once
    /// and taking the first answer: a dead master (whose connect may take
    /// the whole connect timeout on a real network) delays nothing.
    /// Returns whether the set of masters changed.
    async fn refresh(&self) -> Result<bool> {
        let mut candidates: Vec<NodeAddr> = self
            .topology()
            .nodes()
            .iter()
            .map(|n| n.addr().clone())
            .collect();
        candidates.extend(self.inner.cfg.seeds.iter().map(|s| s.addr.clone()));
        candidates.sort();
        candidates.dedup();
        self.inner
            .failover
            .refreshes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut asks: tokio::task::JoinSet<Result<SlotMap>> = tokio::task::JoinSet::new();
        for addr in candidates {
            let up = self.clone();
            asks.spawn(async move { up.read_slots(&addr).await });
        }
        let mut last = None;
        while let Some(r) = asks.join_next().await {
            match r {
                Ok(Ok(ranges)) => {
                    asks.abort_all();
                    return Ok(self.install(&ranges));
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {}
            }
        }
        Err(last.unwrap_or_else(|| Error::Topology("no node to ask".into())))
    }
}

/// Slot ranges (first, last, master) and (master, replica) pairs.
pub(super) type SlotMap = (Vec<(u16, u16, NodeAddr)>, Vec<(NodeAddr, NodeAddr)>);

/// Shortest gap between two slot-map refreshes, however many are asked for.
const REFRESH_GAP_MIN: Duration = Duration::from_millis(100);
/// Longest gap while refreshes keep being asked for and the map does not
/// change (a master down, its replica not promoted yet).
const REFRESH_GAP_MAX: Duration = Duration::from_millis(250);

pub(super) async fn refresher(inner: Arc<Inner>, every: Duration) {
    let mut gap = REFRESH_GAP_MIN;
    loop {
        let asked = tokio::time::timeout(every, inner.refresh.notified())
            .await
            .is_ok();
        if inner.closed.is_cancelled() {
            return;
        }
        let up = Upstream {
            inner: Arc::clone(&inner),
        };
        match up.refresh().await {
            Ok(true) => gap = REFRESH_GAP_MIN,
            Ok(false) if asked => gap = (gap * 3 / 2).min(REFRESH_GAP_MAX),
            Ok(false) => gap = REFRESH_GAP_MIN,
            Err(e) => {
                warn!(error = %e, "refreshing slot map failed");
                gap = (gap * 3 / 2).min(REFRESH_GAP_MAX);
            }
        }
        // Rate limit: a failover is followed within a few hundred
        // milliseconds of its promotion, however many callers ask.
        tokio::time::sleep(gap).await;
    }
}
