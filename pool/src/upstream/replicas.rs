//! Replica reads, the I/O side (the rules and the race argument are in
//! [`crate::replica`]): the probe task that keeps each replica's state
//! (healthy, zone, caught-up instant), the discovery of a standalone
//! master's replicas, and [`Upstream::read_target`], the choice of a
//! read's node.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sidecache_resp::frame::Value;
use smallvec::SmallVec;
use tokio::task::JoinSet;
use tracing::{debug, info};

use super::{Inner, Upstream};
use crate::cluster::topology::Topology;
use crate::config::{NodeAddr, Session};
use crate::conn::node::Node;
use crate::replica::{self, info as rinfo, Candidate, Choice, ReplicaReads, HISTORY};
use crate::slot::Slot;

/// `INFO replication`, encoded.
const INFO_REPLICATION: &[u8] = b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n";

/// How often the slot map is re-read while it looks incomplete for
/// replica reads (see `monitor`).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Per master: the (instant, `master_repl_offset`) of its last probes.
type History = VecDeque<(u64, u64)>;

impl Upstream {
    /// Replica reads' shared state (`None` with `--read-from primary`).
    pub fn replica_reads(&self) -> Option<&Arc<ReplicaReads>> {
        self.inner.reads.as_ref()
    }

    /// The node (numbered as [`Topology::node`]) a read of `slot` goes to,
    /// given the master `master` that serves it: one of its replicas when
    /// `--read-from` and the rule of [`crate::replica`] allow, else
    /// `master`. `spread` spreads clients over equally good replicas.
    pub fn read_target(
        &self,
        topo: &Topology,
        master: usize,
        slot: Option<Slot>,
        spread: usize,
    ) -> usize {
        let Some(rr) = &self.inner.reads else {
            return master;
        };
        let (replicas, first) = topo.replicas_of(master);
        if replicas.is_empty() {
            replica::count(&rr.stats, Choice::Primary, false);
            return master;
        }
        let fresh = rr.stamps.fresh_after(slot);
        let now = rr.now();
        let max_lag = rr.cfg.max_lag.as_nanos() as u64;
        let cands: SmallVec<[Candidate; 4]> = replicas
            .iter()
            .map(|n| {
                let st = n.replica_state();
                let caught_up = st.caught_up();
                Candidate {
                    usable: st.healthy()
                        && n.is_healthy()
                        && caught_up > 0
                        && now.saturating_sub(caught_up) <= max_lag,
                    same_az: st.same_az(),
                    caught_up,
                }
            })
            .collect();
        let master_same_az = topo
            .nodes()
            .get(master)
            .is_some_and(|m| m.replica_state().same_az());
        let choice = replica::choose(rr.cfg.read_from, &cands, fresh, master_same_az, spread);
        let same = match choice {
            Choice::Replica(i) => cands[i].same_az,
            _ => false,
        };
        replica::count(&rr.stats, choice, same);
        match choice {
            Choice::Replica(i) => first + i,
            _ => master,
        }
    }

    /// A forwarded write of `slot` (`None`: of any slot) was answered:
    /// reads of it avoid replicas until they are proven to hold it.
    pub fn note_written(&self, slot: Option<Option<Slot>>) {
        if let Some(rr) = &self.inner.reads {
            match slot {
                Some(s) => rr.stamps.touched(s),
                None => rr.stamps.touched_all(),
            }
        }
    }

    /// A read sent to a replica failed there and goes to the master.
    pub fn note_read_fallback(&self) {
        if let Some(rr) = &self.inner.reads {
            rr.stats
                .fallbacks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Probe rounds before sidecache reports ready, at most.
const FIRST_ROUNDS: usize = 5;

/// What the probes keep between rounds: per master, its recent offsets.
type Histories = HashMap<NodeAddr, History>;

/// The first probes, before sidecache reports ready (`/readyz`, the first
/// client accepted), so reads use replicas from the start: rounds until
/// every replica is healthy and caught up with an offset the master
/// reported (on a standalone upstream the first round finds them in the
/// master's `INFO replication`), at most [`FIRST_ROUNDS`] and `limit` in
/// all. Logs which replicas are usable. Returns what the monitor goes on
/// with.
pub(super) async fn first_probes(
    up: &Upstream,
    rr: &Arc<ReplicaReads>,
    limit: Duration,
) -> Histories {
    let mut history = Histories::new();
    let ready = |up: &Upstream| {
        let topo = up.topology();
        !topo.replicas().is_empty()
            && topo
                .replicas()
                .iter()
                .all(|r| r.replica_state().healthy() && r.replica_state().caught_up() > 0)
    };
    let _ = tokio::time::timeout(limit, async {
        // A replica still behind the master's offset, or (standalone) one
        // found by this round, is probed again; a few rounds at most.
        for _ in 0..FIRST_ROUNDS {
            round(up, rr, &mut history).await;
            if ready(up) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let topo = up.topology();
    let usable: Vec<String> = topo
        .replicas()
        .iter()
        .filter(|r| r.replica_state().healthy() && r.replica_state().caught_up() > 0)
        .map(|r| r.addr().to_string())
        .collect();
    info!(
        usable = ?usable,
        replicas = topo.replicas().len(),
        "replica reads: replicas probed before accepting clients"
    );
    history
}

/// Probes every replica every `--replica-check-interval` until the
/// upstream closes (see [`crate::replica`]), going on from `history`.
pub(super) async fn monitor(inner: Arc<Inner>, rr: Arc<ReplicaReads>, mut history: Histories) {
    let every = rr.cfg.check_interval;
    let mut last_refresh = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = inner.closed.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let up = Upstream {
            inner: Arc::clone(&inner),
        };
        let topo = up.topology();
        // A master without replicas in the map, or a replica that does not
        // answer: the map may be behind (replicas added, failed, or not yet
        // gossiped to the node asked); re-read it, at most once a second.
        let incomplete = (0..topo.nodes().len()).any(|i| topo.replicas_of(i).0.is_empty())
            || topo.replicas().iter().any(|r| !r.replica_state().healthy());
        if incomplete && last_refresh.elapsed() >= REFRESH_EVERY {
            last_refresh = tokio::time::Instant::now();
            up.request_refresh();
        }
        round(&up, &rr, &mut history).await;
    }
}

/// One probe of every master and its replicas (on a standalone upstream
/// the master's `INFO replication` also finds its replicas).
async fn round(up: &Upstream, rr: &Arc<ReplicaReads>, history: &mut Histories) {
    // A probe slower than this marks its node unusable for the round.
    let limit = rr.cfg.max_lag.max(Duration::from_millis(100));
    let topo = up.topology();
    let mut shards = JoinSet::new();
    for (i, master) in topo.nodes().iter().enumerate() {
        let (replicas, _) = topo.replicas_of(i);
        let hist = history.remove(master.addr()).unwrap_or_default();
        shards.spawn(probe_shard(
            up.clone(),
            Arc::clone(master),
            replicas.to_vec(),
            Arc::clone(rr),
            hist,
            limit,
        ));
    }
    while let Some(r) = shards.join_next().await {
        if let Ok((addr, hist)) = r {
            history.insert(addr, hist);
        }
    }
}

/// One master and its replicas: the master's offset, then each replica's.
async fn probe_shard(
    up: Upstream,
    master: Arc<Node>,
    replicas: Vec<Arc<Node>>,
    rr: Arc<ReplicaReads>,
    mut hist: History,
    limit: Duration,
) -> (NodeAddr, History) {
    zone(&up, &master, &rr).await;
    // The instant first, then the INFO (see `crate::replica`).
    let t = rr.now();
    if let Some(info) = info_of(&master, limit).await {
        if let Some(m) = rinfo::master_offset(&info) {
            hist.push_back((t, m));
            while hist.len() > HISTORY {
                hist.pop_front();
            }
        }
        if !up.is_cluster() {
            discover(&up, &info);
        }
    }
    let mut probes = JoinSet::new();
    for r in replicas {
        let (up, rr, hist) = (up.clone(), Arc::clone(&rr), hist.clone());
        probes.spawn(async move {
            zone(&up, &r, &rr).await;
            probe_replica(&r, &rr, &hist, limit).await;
        });
    }
    while probes.join_next().await.is_some() {}
    (master.addr().clone(), hist)
}

/// One replica's `INFO replication`: healthy or not, and how far it is
/// proven caught up.
async fn probe_replica(node: &Node, rr: &ReplicaReads, hist: &History, limit: Duration) {
    let st = node.replica_state();
    let parsed = info_of(node, limit).await.and_then(|i| rinfo::replica(&i));
    let Some(ri) = parsed.filter(|r| r.link_up) else {
        if st.healthy() {
            debug!(replica = %node.addr(), "replica not usable for reads (down, loading or link down)");
        }
        st.set_healthy(false);
        return;
    };
    st.offset
        .store(ri.offset, std::sync::atomic::Ordering::Relaxed);
    // The latest probe instant whose master offset it has reached.
    if let Some(&(t, _)) = hist.iter().rev().find(|(_, m)| *m <= ri.offset) {
        st.advance(t);
    }
    let caught_up = st.caught_up();
    if caught_up > 0 {
        st.lag_ns.store(
            rr.now().saturating_sub(caught_up),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    st.set_healthy(true);
}

/// A node's `INFO replication` text, or `None` (error, or no answer
/// within `limit`).
async fn info_of(node: &Node, limit: Duration) -> Option<Bytes> {
    let reply = tokio::time::timeout(
        limit,
        node.control_call(Bytes::from_static(INFO_REPLICATION)),
    )
    .await
    .ok()?
    .ok()?;
    Value::decode(&reply).ok()?.as_bytes().cloned()
}

/// Learns `node`'s zone once: `--replica-az`, else the node's own
/// (`HELLO`'s `availability_zone`, Valkey 8.1 and later; else its
/// `availability-zone` config, Valkey 8.0).
async fn zone(up: &Upstream, node: &Node, rr: &ReplicaReads) {
    let st = node.replica_state();
    if st.az_known() {
        return;
    }
    if let Some(az) = rr.configured_az(node.addr()) {
        st.set_az(az, rr.same_az(Some(az)));
        return;
    }
    if st.az_asked.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    // Valkey 8.1+ names it in HELLO; 8.0 has the config only (CONFIG may
    // be refused, as ElastiCache does: then the zone stays unknown).
    let asked = up
        .connector()
        .oneshot(
            node.addr(),
            Session::default(),
            &[
                &[b"HELLO", b"2"],
                &[b"CONFIG", b"GET", b"availability-zone"],
            ],
        )
        .await;
    let az = asked.ok().and_then(|r| {
        r.first()
            .and_then(rinfo::hello_az)
            .or_else(|| r.get(1).and_then(rinfo::hello_az))
    });
    if let Some(az) = az {
        info!(node = %node.addr(), az, "availability zone from the node");
        st.set_az(&az, rr.same_az(Some(&az)));
    }
}

/// Standalone: installs the replicas the master's `INFO replication`
/// lists (online ones) when they changed.
fn discover(up: &Upstream, info: &[u8]) {
    let found = rinfo::standalone_replicas(info);
    let topo = up.topology();
    let Some(master) = topo.nodes().first() else {
        return;
    };
    let mut known: Vec<NodeAddr> = topo.replicas().iter().map(|n| n.addr().clone()).collect();
    known.sort();
    let mut wanted = found;
    wanted.sort();
    wanted.dedup();
    if wanted == known {
        return;
    }
    info!(replicas = ?wanted, "standalone replicas");
    let nodes = wanted.iter().map(|a| up.node(a)).collect();
    let next = Topology::standalone_with(Arc::clone(master), nodes);
    up.inner.topo.store(Arc::new(next));
}
