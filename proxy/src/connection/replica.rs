//! Replica reads, the client side (`--read-from`; the rule and its race
//! argument are in `sidecache_pool::replica`): which node a read goes
//! to, the write stamps of forwarded writes, and the fall-back of a
//! replica's failed pipeline to its master.

use sidecache_pool::{Lane, Slot};

use super::{Client, Inval};

impl Client {
    /// Whether this batch holds reads bound for a replica (on the
    /// client's lane; fill lanes count in `has_fills`): a command that
    /// may write is sent only once they were answered, so the replica
    /// cannot show them what the write changed (the pipeline's order).
    pub(super) fn has_replica_reads(&self) -> bool {
        self.replica_reads
            && self
                .builders
                .iter()
                .skip(self.topo.nodes().len())
                .any(|b| b.count > 0)
    }

    /// Whether reads of this batch are bound for a replica of master
    /// `node` (a write-behind write queued for `node` must not overtake
    /// them: they are sent first).
    pub(super) fn replicas_bound(&self, node: usize) -> bool {
        if !self.replica_reads {
            return false;
        }
        let (replicas, first) = self.topo.replicas_of(node);
        (first..first + replicas.len()).any(|i| {
            self.builders.get(i).is_some_and(|b| b.count > 0)
                || self
                    .fills
                    .iter()
                    .skip(i * self.fill_lanes)
                    .take(self.fill_lanes)
                    .any(|b| b.count > 0)
        })
    }

    /// Replica reads: the node (as `Topology::node`) a read of `slot`,
    /// served by master `node`, goes to: a replica when
    /// `Upstream::read_target` allows (the rule and its race argument:
    /// `sidecache_pool::replica`), the master while a command of this
    /// batch before it may write (its reply is not in yet). With
    /// `--read-from primary` one branch on a field.
    #[inline]
    pub(super) fn read_node(&self, node: usize, slot: Option<Slot>) -> usize {
        if !self.replica_reads || self.batch_writes || self.forwarded_write {
            return node;
        }
        self.shared
            .upstream
            .read_target(&self.topo, node, slot, self.hint())
    }

    /// Replica reads: a write of what `inval` names was (or is about to
    /// be) answered.
    pub(super) fn stamp_written(&self, inval: &Inval) {
        let up = &self.shared.upstream;
        match inval {
            Inval::Keys(keys) => {
                for k in keys {
                    let slot = self.topo.is_cluster().then(|| Slot::for_key(k));
                    up.note_written(Some(slot));
                }
            }
            Inval::All => up.note_written(None),
        }
    }

    /// Replica reads: a replica's pipeline that failed (connection lost
    /// or refused, no answer in time) is sent again to its master, with
    /// the same lane (its replies keep their places). It holds reads
    /// only, so sending it twice changes nothing. A fill lane goes to
    /// the master's fill lane only while the master's channel is up:
    /// the fills' tickets were taken before this check (the order the
    /// race argument of `sidecache_pool::coherence::tracking` needs);
    /// otherwise its error stands.
    pub(super) async fn fall_back(&mut self) {
        let masters = self.topo.nodes().len();
        let per_node = self.fill_lanes;
        let session = self.session();
        let hint = self.hint();
        let deadline = self.batch_deadline();
        for fill in [false, true] {
            let lanes = if fill {
                &mut self.fills
            } else {
                &mut self.builders
            };
            for (i, b) in lanes.iter_mut().enumerate() {
                let node = if fill { i / per_node } else { i };
                // A master's: `absorb` may send it again.
                if node < masters {
                    continue;
                }
                let Some((payload, count)) = b.sent.take() else {
                    continue;
                };
                if !matches!(b.result, Some(Err(_))) {
                    continue;
                }
                let Some(master) = self.topo.master_of(node).and_then(|m| self.topo.node(m)) else {
                    continue;
                };
                let lane = if fill {
                    if !master.coherent() {
                        continue;
                    }
                    Lane::Fill {
                        lane: i % per_node,
                        reads: 0,
                    }
                } else {
                    Lane::Client { session, hint }
                };
                self.shared.upstream.note_read_fallback();
                let sent = self
                    .shared
                    .upstream
                    .submit(master, lane, payload, count, deadline)
                    .await;
                b.result = Some(match sent.replies {
                    Ok(rx) => rx.replies().await,
                    Err(e) => Err(e),
                });
            }
        }
    }
}
