//! Pipelines a passing failure took, sent again as a cluster client would
//! (see `sidecache_pool::upstream`'s `absorb` for what is held and why).
//!
//! After a batch's replies are in, a master's pipeline (the client's
//! connection or a fill lane) that failed before it was sent (its node out
//! of reach), or whose connection was lost with only reads in it, is held:
//! it waits, the slot map is refreshed, and it goes again, to the same node
//! while that is still a master in the map, else to the node that serves
//! its first key's slot now (a failover's new master); the other slots'
//! commands in it are redirected from there (the reply pass follows
//! MOVED). Its replies keep their places, so every entry of the batch finds
//! them as if the first send had worked. This repeats until the batch's
//! deadline (`--upstream-timeout`); then the error stands.
//!
//! A fill lane's pipeline goes again only to a node whose channel is up,
//! and its fetches no longer fill the L1 (their tickets are dropped: the
//! channel they were taken under is gone); the next read fills.

use bytes::{Bytes, BytesMut};
use sidecache_pool::{Absorbed, Error, Hold, Lane, Slot, Submitted};
use sidecache_resp::request::{Limits, Parser, Request};
use smallvec::SmallVec;

use crate::cmd::table::CommandTable;
use crate::connection::{Client, MgetItem, Pending};

impl Client {
    /// Holds and sends again the batch's pipelines that failed in a way a
    /// cluster client absorbs (see the module's documentation), until
    /// `deadline`.
    pub(super) async fn absorb(&mut self, deadline: Option<tokio::time::Instant>) {
        let mut hold = Hold::default();
        loop {
            let todo = self.absorbable();
            let Some(&(_, _, kind)) = todo.first() else {
                break;
            };
            if !self.shared.upstream.hold(&mut hold, kind, deadline).await {
                tracing::debug!(?kind, pipelines = todo.len(), "absorb: time is up");
                break;
            }
            for (fill, i, kind) in todo {
                self.send_again(fill, i, kind, deadline).await;
            }
        }
        self.shared.upstream.held(hold);
    }

    /// The masters' pipelines of this batch that failed in a way to absorb:
    /// (fill lane, index, why).
    fn absorbable(&self) -> SmallVec<[(bool, usize, Absorbed); 4]> {
        let masters = self.topo.nodes().len();
        let mut out = SmallVec::new();
        for fill in [false, true] {
            let lanes = if fill { &self.fills } else { &self.builders };
            for (i, b) in lanes.iter().enumerate() {
                let node = if fill { i / self.fill_lanes } else { i };
                // A replica's: `fall_back` sent it to its master.
                if node >= masters {
                    continue;
                }
                let (Some(Err(e)), Some((payload, _))) = (&b.result, &b.sent) else {
                    continue;
                };
                let kind = match e {
                    Error::Connect { .. } => Absorbed::Unreachable,
                    Error::ConnectionLost { .. }
                        if survey(&self.shared.table, payload).reads_only =>
                    {
                        Absorbed::ConnectionLost
                    }
                    _ => {
                        tracing::debug!(error = %e, fill, "absorb: not sent again (it may write, or the error is not one to wait out)");
                        continue;
                    }
                };
                out.push((fill, i, kind));
            }
        }
        out
    }

    /// Sends pipeline `i` (of the fill lanes when `fill`) again, to the
    /// node that serves it now; its result replaces the failed one.
    async fn send_again(
        &mut self,
        fill: bool,
        i: usize,
        kind: Absorbed,
        deadline: Option<tokio::time::Instant>,
    ) {
        let lanes = if fill { &self.fills } else { &self.builders };
        let Some((payload, count)) = lanes[i].sent.clone() else {
            return;
        };
        let node = if fill { i / self.fill_lanes } else { i };
        let Some(old) = self.topo.node(node).cloned() else {
            return;
        };
        let now = self.shared.upstream.topology();
        let target = if now.index_of(old.addr()).is_some() {
            old
        } else {
            let slot = survey(&self.shared.table, &payload).slot;
            let at = slot.map_or(Ok(0), |s| now.node_index(s));
            match at.ok().and_then(|n| now.nodes().get(n)) {
                Some(n) => std::sync::Arc::clone(n),
                None => return,
            }
        };
        let lane = if fill {
            if !target.coherent() {
                return;
            }
            self.forget_tickets(i as u32);
            Lane::Fill {
                lane: i % self.fill_lanes,
                reads: 0,
            }
        } else {
            Lane::Client {
                session: self.session(),
                hint: self.hint(),
            }
        };
        if kind == Absorbed::ConnectionLost {
            self.shared.upstream.note_resent_reads();
        }
        let sent = self
            .send_lane(&target, lane, payload, count, deadline)
            .await;
        let result = match sent.replies {
            Ok(rx) => rx.replies().await,
            Err(e) => Err(e),
        };
        let lanes = if fill {
            &mut self.fills
        } else {
            &mut self.builders
        };
        lanes[i].result = Some(result);
    }

    /// Sends a pipeline on `lane` of `node`: a client of another ACL user
    /// on that user's connections.
    pub(super) async fn send_lane(
        &mut self,
        node: &std::sync::Arc<sidecache_pool::Node>,
        lane: Lane,
        payload: Bytes,
        count: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Submitted {
        let up = &self.shared.upstream;
        match (&self.st.user, lane) {
            (Some(login), Lane::Client { session, .. }) => {
                up.submit_as(login.pool(), node, session, payload, count, deadline)
                    .await
            }
            _ => up.submit(node, lane, payload, count, deadline).await,
        }
    }

    /// The fetches on fill lane `lane` no longer fill the L1.
    fn forget_tickets(&mut self, lane: u32) {
        for p in &mut self.pending {
            match p {
                Pending::Fetch(f) if f.fill && f.node == lane => f.ticket = None,
                Pending::ReadFetch(f) => f.forget_ticket_on(lane),
                Pending::Mget(items) => {
                    for item in items.iter_mut() {
                        if let MgetItem::Fetch(f) = item {
                            if f.fill && f.node == lane {
                                f.ticket = None;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// What a sent pipeline holds, for sending it again.
struct Survey {
    /// Every command in it only reads (or selects a database): sending it
    /// twice changes nothing.
    reads_only: bool,
    /// The slot of its first key.
    slot: Option<Slot>,
}

/// Reads `payload`'s commands (only after a failure: a parse per failed
/// pipeline).
fn survey(table: &CommandTable, payload: &Bytes) -> Survey {
    // What the client's requests were parsed with bounds them already.
    let mut parser = Parser::new(Limits {
        max_bulk: i64::MAX as u64,
        max_multibulk: i32::MAX as u64,
        inline_quotes: Default::default(),
    });
    let mut buf = BytesMut::from(&payload[..]);
    let mut req = Request::default();
    let mut out = Survey {
        reads_only: true,
        slot: None,
    };
    let mut keys = Vec::new();
    while let Ok(Some(())) = parser.parse(&mut buf, &mut req) {
        let info = table.lookup(&req.args);
        let harmless = req.args.first().is_some_and(|n| {
            [b"select".as_slice(), b"ping", b"echo"]
                .iter()
                .any(|c| n.eq_ignore_ascii_case(c))
        });
        let reads = info.is_some_and(|i| i.flags.readonly && !i.flags.blocking);
        out.reads_only &= reads || harmless;
        if out.slot.is_none() {
            if let Some(i) = info {
                keys.clear();
                if i.keys(&req.args, &mut keys).is_ok() {
                    out.slot = keys.first().map(|&k| Slot::for_key(&req.args[k]));
                }
            }
        }
    }
    if !buf.is_empty() {
        out.reads_only = false;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecache_resp::encode::encode_command;
    use sidecache_resp::frame::Value;

    fn table() -> CommandTable {
        let entry = |name: &str, flags: &[&str], first: i64| {
            Value::Array(vec![
                Value::Bulk(Bytes::copy_from_slice(name.as_bytes())),
                Value::Int(-2),
                Value::Array(
                    flags
                        .iter()
                        .map(|f| Value::Status(Bytes::copy_from_slice(f.as_bytes())))
                        .collect(),
                ),
                Value::Int(first),
                Value::Int(first),
                Value::Int(1),
            ])
        };
        CommandTable::from_command_reply(Value::Array(vec![
            entry("get", &["readonly", "fast"], 1),
            entry("pttl", &["readonly", "fast"], 1),
            entry("set", &["write"], 1),
            entry("blpop", &["write", "blocking"], 1),
            entry("select", &["loading", "fast"], 0),
        ]))
        .expect("a table")
    }

    fn payload(cmds: &[&[&str]]) -> Bytes {
        let mut out = BytesMut::new();
        for c in cmds {
            encode_command(&mut out, c);
        }
        out.freeze()
    }

    #[test]
    fn only_pipelines_of_reads_are_sent_twice() {
        let t = table();
        let reads = survey(
            &t,
            &payload(&[
                &["SELECT", "2"],
                &["GET", "k"],
                &["PTTL", "k"],
                &["SELECT", "0"],
            ]),
        );
        assert!(reads.reads_only);
        assert_eq!(reads.slot, Some(Slot::for_key(b"k")));
        for writes in [
            payload(&[&["GET", "k"], &["SET", "k", "v"]]),
            payload(&[&["BLPOP", "q", "0"]]),
            payload(&[&["UNKNOWN", "x"]]),
        ] {
            assert!(!survey(&t, &writes).reads_only);
        }
        // A payload cut short is not trusted.
        let cut = payload(&[&["GET", "k"]]);
        assert!(!survey(&t, &cut.slice(..cut.len() - 2)).reads_only);
    }
}
