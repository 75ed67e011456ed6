//! Dispatch beyond one command to one node: multi-key commands split per
//! slot, SCAN across masters, INFO, UNSUBSCRIBE without subscriptions,
//! and where a blocking command goes.

use bytes::BytesMut;
use sidecache_pool::Slot;
use sidecache_resp::encode::{self, put_header};
use sidecache_resp::request::Request;

use super::{Client, Flow, Inval, Part, Pending, SCAN_SHARD_BITS};
use crate::answer;
use crate::cmd::handling::Merge;
use crate::cmd::route::{self, Route};

impl Client {
    /// A blocking command: its node (its keys' slot, which all must share
    /// on a cluster; WAIT: the master of this client's last write), then
    /// [`Flow::Block`] so that the connection loop runs it.
    pub(super) fn dispatch_blocking(
        &mut self,
        info: &crate::cmd::table::CommandInfo,
        lname: &[u8],
        req: &Request,
        inval: Option<Inval>,
    ) -> Flow {
        let to = if self.topo.is_cluster() && (lname == b"wait" || lname == b"waitaof") {
            route::to_slot(self.last_write_slot, &*self.topo)
        } else {
            let span = route::Span::One { pinned: None };
            route::route(info, &req.args, &*self.topo, span, &mut self.keys)
        };
        let (node, slot) = match to {
            Route::Node { node, slot } => (node, slot),
            Route::CrossSlot => {
                self.local_reply(|r| r.error(route::CROSSSLOT));
                return Flow::Continue;
            }
            Route::Unserved(e) => {
                self.slot_error(&e);
                return Flow::Continue;
            }
        };
        if inval.is_some() {
            self.last_write_slot = slot.or(self.last_write_slot);
        }
        self.block(req.raw.clone(), lname, node, slot, inval);
        Flow::Block
    }

    /// A fanned-out command: sent to every master, the replies merged.
    pub(super) fn fan_out(&mut self, kind: Merge, req: &Request) {
        let parts = (0..self.topo.nodes().len())
            .map(|n| {
                let (node, idx) = self.enqueue(n, &req.raw);
                Part {
                    node,
                    idx,
                    slot: None,
                    cmd: req.raw.clone(),
                    positions: Vec::new(),
                }
            })
            .collect();
        self.pending.push(Pending::Merge {
            kind,
            parts,
            nkeys: 0,
        });
    }

    pub(super) fn split(&mut self, kind: Merge, req: &Request) {
        let args = &req.args;
        let step = if kind == Merge::AllOk { 2 } else { 1 };
        // Group key positions by slot, keeping the client's order in each.
        let mut groups: Vec<(Slot, Vec<u32>)> = Vec::new();
        for (pos, i) in (1..args.len()).step_by(step).enumerate() {
            let slot = Slot::for_key(&args[i]);
            match groups.iter_mut().find(|g| g.0 == slot) {
                Some(g) => g.1.push(pos as u32),
                None => groups.push((slot, vec![pos as u32])),
            }
        }
        let nkeys = (args.len() - 1) / step;
        if groups.len() == 1 {
            let slot = groups[0].0;
            match self.topo.node_index(slot) {
                Ok(n) => self.forward(n, Some(slot), &req.raw),
                Err(e) => self.slot_error(&e),
            }
            return;
        }
        let mut parts = Vec::with_capacity(groups.len());
        for (slot, positions) in groups {
            let node = match self.topo.node_index(slot) {
                Ok(n) => n,
                Err(e) => {
                    self.slot_error(&e);
                    return;
                }
            };
            let mut cmd = BytesMut::new();
            put_header(&mut cmd, b'*', 1 + (positions.len() * step) as i64);
            encode::put_bulk(&mut cmd, &args[0]);
            for &p in &positions {
                let i = 1 + p as usize * step;
                for a in &args[i..i + step] {
                    encode::put_bulk(&mut cmd, a);
                }
            }
            let cmd = cmd.freeze();
            let (node, idx) = self.enqueue(node, &cmd);
            parts.push(Part {
                node,
                idx,
                slot: Some(slot),
                cmd,
                positions,
            });
        }
        self.pending.push(Pending::Merge { kind, parts, nkeys });
    }
    pub(super) fn scan(&mut self, req: &Request) {
        let args = &req.args;
        let nshards = self.topo.nodes().len() as u64;
        let cursor = args
            .get(1)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u64>().ok());
        let Some(cursor) = cursor else {
            if args.len() < 2 {
                return self.local_reply(|r| answer::arity_error(r, "scan"));
            }
            return self.local_reply(|r| r.error("ERR invalid cursor"));
        };
        let shard = cursor & ((1 << SCAN_SHARD_BITS) - 1);
        let up_cursor = cursor >> SCAN_SHARD_BITS;
        if shard >= nshards {
            // A cursor from another topology: start that scan over is wrong,
            // report it as Redis reports a bad cursor.
            return self.local_reply(|r| r.error("ERR invalid cursor"));
        }
        let mut cmd = BytesMut::new();
        let c = up_cursor.to_string();
        let mut new_args: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        new_args[1] = c.as_bytes();
        encode::encode_command(&mut cmd, &new_args);
        let cmd = cmd.freeze();
        let (node, idx) = self.enqueue(shard as usize, &cmd);
        self.pending.push(Pending::Scan {
            node,
            idx,
            cmd,
            shard,
            nshards,
        });
    }
    pub(super) fn info(&mut self, req: &Request) {
        let (proxy, upstream) = crate::report::info::Sections::select(&req.args[1..]);
        let upstream = upstream.then(|| self.enqueue(0, &req.raw));
        self.pending.push(Pending::Info { upstream, proxy });
    }
}
