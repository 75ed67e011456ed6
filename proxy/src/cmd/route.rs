//! Where a command goes, as a pure function of the command's table entry,
//! its arguments and the slot map: no sockets, no client state, so the
//! rules are unit-tested here (the connection code only acts on the
//! [`Route`]).
//!
//! Rules, as Redis Cluster applies them and sidecache presents them:
//! - standalone: everything goes to the one node;
//! - a keyed command goes to its first key's slot owner; keys in more than
//!   one slot are `-CROSSSLOT` where the command must run on one node
//!   (blocking commands, a transaction's commands, which are pinned to the
//!   slot of the first keyed one, and shard channels);
//! - a slot no master serves is `-CLUSTERDOWN` (the caller also asks for a
//!   fresh slot map);
//! - a keyless command goes to any node.

use bytes::Bytes;
use sidecache_pool::Slot;

use super::table::CommandInfo;

/// Redis Cluster's error for keys in more than one slot.
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// The slot map as routing needs it (implemented by the pool's topology).
pub trait SlotMap {
    /// Whether the upstream is a cluster.
    fn is_cluster(&self) -> bool;
    /// The index of the master serving `slot`.
    ///
    /// # Errors
    /// When no master serves it.
    fn node_index(&self, slot: Slot) -> sidecache_pool::Result<usize>;
}

impl SlotMap for sidecache_pool::cluster::topology::Topology {
    fn is_cluster(&self) -> bool {
        sidecache_pool::cluster::topology::Topology::is_cluster(self)
    }
    fn node_index(&self, slot: Slot) -> sidecache_pool::Result<usize> {
        sidecache_pool::cluster::topology::Topology::node_index(self, slot)
    }
}

/// Where a command goes.
#[derive(Debug)]
pub enum Route {
    /// To this node (index in the topology), for this slot (`None`: any
    /// node, or standalone).
    Node {
        /// The master's index.
        node: usize,
        /// Its keys' slot.
        slot: Option<Slot>,
    },
    /// Keys in more than one slot where one is required.
    CrossSlot,
    /// No master serves the slot.
    Unserved(sidecache_pool::Error),
}

/// How many slots a command's keys may span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// The first key decides (Redis Cluster itself refuses a cross-slot
    /// command that reaches it).
    First,
    /// Every key in one slot, and in `pinned` if set (a transaction's
    /// slot): else [`Route::CrossSlot`].
    One {
        /// The slot already bound (a transaction's), if any.
        pinned: Option<Slot>,
    },
}

/// Keys in more than one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossSlot;

/// The slot shared by the keys at `positions` of `args` (with `pinned`),
/// `Ok(None)` without keys, [`CrossSlot`] when they span several.
pub fn one_slot(
    args: &[Bytes],
    positions: &[usize],
    pinned: Option<Slot>,
) -> Result<Option<Slot>, CrossSlot> {
    let mut slot = pinned;
    for &i in positions {
        let s = Slot::for_key(&args[i]);
        match slot {
            None => slot = Some(s),
            Some(t) if t != s => return Err(CrossSlot),
            Some(_) => {}
        }
    }
    Ok(slot)
}

/// Where `args` (a command of `info`) goes on `map`; `keys` is scratch
/// space for the key positions (left holding them).
pub fn route(
    info: &CommandInfo,
    args: &[Bytes],
    map: &impl SlotMap,
    span: Span,
    keys: &mut Vec<usize>,
) -> Route {
    if !map.is_cluster() {
        return Route::Node {
            node: 0,
            slot: None,
        };
    }
    keys.clear();
    let slot = match (info.keys(args, keys), span) {
        (Err(_), Span::One { pinned }) => pinned,
        (Err(_), Span::First) => None,
        (Ok(_), Span::First) => keys.first().map(|&i| Slot::for_key(&args[i])),
        (Ok(_), Span::One { pinned }) => match one_slot(args, keys, pinned) {
            Ok(s) => s,
            Err(CrossSlot) => return Route::CrossSlot,
        },
    };
    to_slot(slot, map)
}

/// The node of `slot` (`None`: node 0).
pub fn to_slot(slot: Option<Slot>, map: &impl SlotMap) -> Route {
    match slot {
        None => Route::Node {
            node: 0,
            slot: None,
        },
        Some(s) => match map.node_index(s) {
            Ok(node) => Route::Node {
                node,
                slot: Some(s),
            },
            Err(e) => Route::Unserved(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::table::CommandTable;

    /// Two masters: slots below 8192 on node 0, the rest on node 1; slot
    /// 100 served by nobody.
    struct Two;
    impl SlotMap for Two {
        fn is_cluster(&self) -> bool {
            true
        }
        fn node_index(&self, slot: Slot) -> sidecache_pool::Result<usize> {
            match slot.get() {
                100 => Err(sidecache_pool::Error::SlotUnassigned(100)),
                s if s < 8192 => Ok(0),
                _ => Ok(1),
            }
        }
    }
    struct Standalone;
    impl SlotMap for Standalone {
        fn is_cluster(&self) -> bool {
            false
        }
        fn node_index(&self, _: Slot) -> sidecache_pool::Result<usize> {
            Ok(0)
        }
    }

    /// A table as `COMMAND` (RESP2, legacy key positions) would give it.
    fn table() -> CommandTable {
        use sidecache_resp::frame::Value;
        let entry = |name: &str, arity: i64, first: i64, last: i64, step: i64| {
            Value::Array(vec![
                Value::Bulk(Bytes::copy_from_slice(name.as_bytes())),
                Value::Int(arity),
                Value::Array(vec![]),
                Value::Int(first),
                Value::Int(last),
                Value::Int(step),
            ])
        };
        CommandTable::from_command_reply(Value::Array(vec![
            entry("get", 2, 1, 1, 1),
            entry("mget", -2, 1, -1, 1),
            entry("ping", -1, 0, 0, 0),
        ]))
        .expect("table")
    }

    fn args(a: &[&str]) -> Vec<Bytes> {
        a.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    fn node_of(r: Route) -> Option<(usize, Option<u16>)> {
        match r {
            Route::Node { node, slot } => Some((node, slot.map(|s| s.get()))),
            _ => None,
        }
    }

    #[test]
    fn standalone_goes_to_the_one_node() {
        let t = table();
        let a = args(&["mget", "a", "b"]);
        let info = t.lookup(&a).expect("mget");
        let r = route(
            info,
            &a,
            &Standalone,
            Span::One { pinned: None },
            &mut Vec::new(),
        );
        assert_eq!(node_of(r), Some((0, None)));
    }

    #[test]
    fn a_key_goes_to_its_slot_owner() {
        let t = table();
        // "foo" is slot 12182, "bar" 5061 (Redis's CLUSTER KEYSLOT).
        for (key, node, slot) in [("foo", 1, 12182), ("bar", 0, 5061)] {
            let a = args(&["get", key]);
            let info = t.lookup(&a).expect("get");
            let r = route(info, &a, &Two, Span::First, &mut Vec::new());
            assert_eq!(node_of(r), Some((node, Some(slot))), "{key}");
        }
    }

    #[test]
    fn keyless_goes_to_any_node() {
        let t = table();
        let a = args(&["ping"]);
        let info = t.lookup(&a).expect("ping");
        let r = route(info, &a, &Two, Span::One { pinned: None }, &mut Vec::new());
        assert_eq!(node_of(r), Some((0, None)));
    }

    #[test]
    fn cross_slot_where_one_slot_is_required() {
        let t = table();
        let a = args(&["mget", "foo", "bar"]);
        let info = t.lookup(&a).expect("mget");
        let r = route(info, &a, &Two, Span::One { pinned: None }, &mut Vec::new());
        assert!(matches!(r, Route::CrossSlot));
        // The first key decides where a cross-slot command may go as is.
        let r = route(info, &a, &Two, Span::First, &mut Vec::new());
        assert_eq!(node_of(r), Some((1, Some(12182))));
        // Hash tags keep keys together.
        let a = args(&["mget", "{u}a", "{u}b"]);
        let r = route(info, &a, &Two, Span::One { pinned: None }, &mut Vec::new());
        assert!(node_of(r).is_some());
    }

    #[test]
    fn a_pinned_slot_binds_later_commands() {
        let t = table();
        let a = args(&["get", "foo"]);
        let info = t.lookup(&a).expect("get");
        let foo = Slot::for_key(b"foo");
        let bar = Slot::for_key(b"bar");
        let span = |pinned| Span::One {
            pinned: Some(pinned),
        };
        let r = route(info, &a, &Two, span(foo), &mut Vec::new());
        assert_eq!(node_of(r), Some((1, Some(12182))));
        let r = route(info, &a, &Two, span(bar), &mut Vec::new());
        assert!(matches!(r, Route::CrossSlot));
        // A keyless command in a pinned transaction goes to the pin.
        let p = args(&["ping"]);
        let info = t.lookup(&p).expect("ping");
        let r = route(info, &p, &Two, span(bar), &mut Vec::new());
        assert_eq!(node_of(r), Some((0, Some(5061))));
    }

    #[test]
    fn an_unserved_slot_is_reported() {
        let r = to_slot(Slot::new(100), &Two);
        assert!(matches!(
            r,
            Route::Unserved(sidecache_pool::Error::SlotUnassigned(100))
        ));
        assert!(one_slot(&args(&["x", "a"]), &[1], None)
            .expect("one")
            .is_some());
    }
}
