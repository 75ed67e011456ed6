//! The upstream's shape: one node (standalone) or a slot → node map
//! (cluster), parsed from `CLUSTER SLOTS`. Immutable; replaced whole on
//! refresh.

use std::sync::Arc;

use sidecache_resp::frame::Value;

use crate::cluster::slot::{Slot, SLOT_COUNT};
use crate::config::NodeAddr;
use crate::conn::node::Node;
use crate::error::{Error, Result};

/// Marks a slot no node serves.
const UNASSIGNED: u16 = u16::MAX;

/// A snapshot of the topology.
#[derive(Debug)]
pub struct Topology {
    nodes: Vec<Arc<Node>>,
    /// Index into `nodes` per slot (cluster); empty for standalone.
    slots: Vec<u16>,
}

impl Topology {
    /// No node at all (before the first slot map is read).
    pub fn empty() -> Topology {
        Topology {
            nodes: Vec::new(),
            slots: Vec::new(),
        }
    }

    /// A single node serving everything.
    pub fn standalone(node: Arc<Node>) -> Topology {
        Topology {
            nodes: vec![node],
            slots: Vec::new(),
        }
    }

    /// A cluster map: `ranges` of (first, last, master address); nodes are
    /// obtained (reused or created) through `node_for`.
    pub fn cluster(
        ranges: &[(u16, u16, NodeAddr)],
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
        Topology { nodes, slots }
    }

    /// Whether this is a cluster map.
    pub fn is_cluster(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Every master, in a stable order (sorted by address).
    pub fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
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

    /// A copy with one slot pointed at another node (after MOVED).
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
            return Topology { nodes, slots };
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
        Topology { nodes: kept, slots }
    }
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
