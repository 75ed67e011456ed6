//! The upstream's shape: one node (standalone) or a slot → node map
//! (cluster), parsed from `CLUSTER SLOTS`, with each master's replicas
//! when replica reads are on. Immutable; replaced whole on refresh.
//!
//! Nodes are numbered masters first (`0..nodes().len()`, what slots
//! point at), then replicas: [`Topology::node`] takes either.

use std::sync::Arc;

use sidecache_resp::frame::Value;

use crate::config::NodeAddr;
use crate::conn::node::Node;
use crate::error::{Error, Result};
use crate::slot::{Slot, SLOT_COUNT};

/// Marks a slot no node serves.
const UNASSIGNED: u16 = u16::MAX;

/// A snapshot of the topology.
#[derive(Debug)]
pub struct Topology {
    nodes: Vec<Arc<Node>>,
    /// Index into `nodes` per slot (cluster); empty for standalone.
    slots: Vec<u16>,
    /// Replicas of all masters (numbered after the masters).
    replicas: Vec<Arc<Node>>,
    /// Per master: its replicas' range in `replicas`.
    replica_of: Vec<std::ops::Range<usize>>,
}

impl Topology {
    /// No node at all (before the first slot map is read).
    pub fn empty() -> Topology {
        Topology {
            nodes: Vec::new(),
            slots: Vec::new(),
            replicas: Vec::new(),
            replica_of: Vec::new(),
        }
    }

    /// A single node serving everything.
    pub fn standalone(node: Arc<Node>) -> Topology {
        Topology {
            nodes: vec![node],
            slots: Vec::new(),
            replicas: Vec::new(),
            replica_of: Vec::new(),
        }
    }

    /// A standalone master with its replicas (replica reads).
    pub fn standalone_with(node: Arc<Node>, replicas: Vec<Arc<Node>>) -> Topology {
        let n = replicas.len();
        Topology {
            nodes: vec![node],
            slots: Vec::new(),
            replicas,
            replica_of: std::iter::once(0..n).collect(),
        }
    }

    /// A cluster map: `ranges` of (first, last, master address), and
    /// `replicas` as (master, replica) addresses; nodes are obtained
    /// (reused or created) through `node_for`.
    pub fn cluster(
        ranges: &[(u16, u16, NodeAddr)],
        replicas: &[(NodeAddr, NodeAddr)],
        mut node_for: impl FnMut(&NodeAddr) -> Arc<Node>,
    ) -> Topology {
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        let mut slots = vec![UNASSIGNED; SLOT_COUNT as usize];
        let mut sorted: Vec<&NodeAddr> = ranges.iter().map(|r| &r.2).collect();
        sorted.sort();
        sorted.dedup();
        for addr in &sorted {
            nodes.push(node_for(addr));
        }
        for (first, last, addr) in ranges {
            let idx = sorted.binary_search(&addr).unwrap_or(0) as u16;
            for s in *first..=(*last).min(SLOT_COUNT - 1) {
                slots[s as usize] = idx;
            }
        }
        let mut all = Vec::new();
        let mut replica_of = Vec::with_capacity(sorted.len());
        for m in &sorted {
            let start = all.len();
            let mut of: Vec<&NodeAddr> = replicas
                .iter()
                .filter(|(mm, r)| mm == *m && !sorted.contains(&r))
                .map(|(_, r)| r)
                .collect();
            of.sort();
            of.dedup();
            all.extend(of.into_iter().map(&mut node_for));
            replica_of.push(start..all.len());
        }
        Topology {
            nodes,
            slots,
            replicas: all,
            replica_of,
        }
    }

    /// Whether this is a cluster map.
    pub fn is_cluster(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Every master, in a stable order (sorted by address).
    pub fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// Node `i`: a master below `nodes().len()`, else a replica.
    #[inline]
    pub fn node(&self, i: usize) -> Option<&Arc<Node>> {
        match self.nodes.get(i) {
            Some(n) => Some(n),
            None => self.replicas.get(i - self.nodes.len()),
        }
    }

    /// Every replica (numbered from `nodes().len()`).
    pub fn replicas(&self) -> &[Arc<Node>] {
        &self.replicas
    }

    /// The replicas of master `i`, and the number of the first.
    pub fn replicas_of(&self, i: usize) -> (&[Arc<Node>], usize) {
        match self.replica_of.get(i) {
            Some(r) => (&self.replicas[r.clone()], self.nodes.len() + r.start),
            None => (&[], 0),
        }
    }

    /// The master (index) of replica number `i` (as [`Topology::node`]).
    pub fn master_of(&self, i: usize) -> Option<usize> {
        let j = i.checked_sub(self.nodes.len())?;
        self.replica_of.iter().position(|r| r.contains(&j))
    }

    /// The master (index) whose replica `addr` is.
    pub fn master_of_replica(&self, addr: &NodeAddr) -> Option<usize> {
        let j = self.replicas.iter().position(|n| n.addr() == addr)?;
        self.replica_of.iter().position(|r| r.contains(&j))
    }

    /// Whether `addr` is a master or a replica here.
    pub fn knows(&self, addr: &NodeAddr) -> bool {
        self.index_of(addr).is_some() || self.replicas.iter().any(|n| n.addr() == addr)
    }

    /// Index (into [`Topology::nodes`]) of the node serving `slot`.
    ///
    /// # Errors
    /// [`Error::SlotUnassigned`] when no node serves it.
    pub fn node_index(&self, slot: Slot) -> Result<usize> {
        if self.slots.is_empty() {
            return Ok(0);
        }
        match self.slots[slot.get() as usize] {
            UNASSIGNED => Err(Error::SlotUnassigned(slot.get())),
            i => Ok(i as usize),
        }
    }

    /// Index of the node with this address, if it is a master here.
    pub fn index_of(&self, addr: &NodeAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr() == addr)
    }

    /// A copy with one slot pointed at another node (after MOVED). The
    /// replicas are left out until the next refresh (which a MOVED asks for).
    pub fn with_slot(&self, slot: Slot, node: Arc<Node>) -> Topology {
        let mut nodes = self.nodes.clone();
        let idx = match nodes.iter().position(|n| n.addr() == node.addr()) {
            Some(i) => i,
            None => {
                nodes.push(node);
                nodes.len() - 1
            }
        };
        let mut slots = self.slots.clone();
        if !slots.is_empty() {
            slots[slot.get() as usize] = idx as u16;
        }
        // Drop nodes that no longer own a slot, keeping indexes consistent.
        Topology::compact(nodes, slots)
    }

    fn compact(nodes: Vec<Arc<Node>>, slots: Vec<u16>) -> Topology {
        let mut used = vec![false; nodes.len()];
        for &s in &slots {
            if s != UNASSIGNED {
                used[s as usize] = true;
            }
        }
        if used.iter().all(|u| *u) {
            return Topology {
                nodes,
                slots,
                replicas: Vec::new(),
                replica_of: Vec::new(),
            };
        }
        let mut remap = vec![UNASSIGNED; nodes.len()];
        let mut kept = Vec::new();
        for (i, n) in nodes.into_iter().enumerate() {
            if used[i] {
                remap[i] = kept.len() as u16;
                kept.push(n);
            }
        }
        let slots = slots
            .into_iter()
            .map(|s| {
                if s == UNASSIGNED {
                    s
                } else {
                    remap[s as usize]
                }
            })
            .collect();
        Topology {
            nodes: kept,
            slots,
            replicas: Vec::new(),
            replica_of: Vec::new(),
        }
    }
}

/// The (master, replica) pairs of a `CLUSTER SLOTS` reply (entries past
/// the third; Redis leaves failed replicas out). Host rules as in
/// [`parse_cluster_slots`]; malformed entries are skipped.
pub fn parse_cluster_replicas(reply: &Value, asked: &NodeAddr) -> Vec<(NodeAddr, NodeAddr)> {
    let addr = |v: &Value| -> Option<NodeAddr> {
        let Value::Array(node) = v else { return None };
        let host = match node.first()?.as_bytes() {
            Some(h) if !h.is_empty() && h.as_ref() != b"?" => {
                String::from_utf8_lossy(h).into_owned()
            }
            _ => asked.host.clone(),
        };
        let port = u16::try_from(node.get(1)?.as_int()?).ok()?;
        Some(NodeAddr { host, port })
    };
    let mut out = Vec::new();
    let Value::Array(entries) = reply else {
        return out;
    };
    for e in entries {
        let Value::Array(items) = e else { continue };
        let Some(master) = items.get(2).and_then(addr) else {
            continue;
        };
        for r in items.iter().skip(3).filter_map(addr) {
            out.push((master.clone(), r));
        }
    }
    out
}

/// Parses a `CLUSTER SLOTS` reply into (first, last, master) ranges. An
/// empty or `?` host means "the address you asked", i.e. `asked`.
///
/// # Errors
/// [`Error::Topology`] when the reply has not the documented shape.
pub fn parse_cluster_slots(reply: Value, asked: &NodeAddr) -> Result<Vec<(u16, u16, NodeAddr)>> {
    let bad = |what: &str| Error::Topology(format!("unexpected CLUSTER SLOTS reply: {what}"));
    let mut out = Vec::new();
    for entry in reply.into_items().ok_or_else(|| bad("not an array"))? {
        let items = entry
            .into_items()
            .ok_or_else(|| bad("entry not an array"))?;
        if items.len() < 3 {
            return Err(bad("short entry"));
        }
        let first = items[0].as_int().ok_or_else(|| bad("start slot"))?;
        let last = items[1].as_int().ok_or_else(|| bad("end slot"))?;
        let master = items[2].clone().into_items().ok_or_else(|| bad("master"))?;
        if master.len() < 2 {
            return Err(bad("master entry"));
        }
        let host = match master[0].as_bytes() {
            Some(h) if !h.is_empty() && h.as_ref() != b"?" => {
                String::from_utf8_lossy(h).into_owned()
            }
            _ => asked.host.clone(),
        };
        let port = master[1].as_int().ok_or_else(|| bad("port"))?;
        let (Ok(first), Ok(last), Ok(port)) = (
            u16::try_from(first),
            u16::try_from(last),
            u16::try_from(port),
        ) else {
            return Err(bad("out of range"));
        };
        if first > last || last >= SLOT_COUNT {
            return Err(bad("slot range"));
        }
        out.push((first, last, NodeAddr { host, port }));
    }
    if out.is_empty() {
        return Err(Error::Topology("cluster has no slots assigned".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn parses_slots() {
        let raw = Bytes::from_static(
            b"*2\r\n*3\r\n:0\r\n:8191\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n\
              *4\r\n:8192\r\n:16383\r\n*4\r\n$0\r\n\r\n:7001\r\n$2\r\nid\r\n*0\r\n*3\r\n$1\r\nx\r\n:1\r\n$1\r\ny\r\n",
        );
        let v = Value::decode(&raw).expect("valid");
        let asked = NodeAddr {
            host: "seed.example".into(),
            port: 7001,
        };
        let replicas = parse_cluster_replicas(&v, &asked);
        assert_eq!(
            replicas,
            vec![(
                NodeAddr {
                    host: "seed.example".into(),
                    port: 7001
                },
                NodeAddr {
                    host: "x".into(),
                    port: 1
                }
            )]
        );
        let r = parse_cluster_slots(v, &asked).expect("valid");
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            (
                0,
                8191,
                NodeAddr {
                    host: "127.0.0.1".into(),
                    port: 7000
                }
            )
        );
        assert_eq!(r[1].2.host, "seed.example");
    }
}
