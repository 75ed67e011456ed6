//! Reads beyond GET (`crate::cmd::reads`: HGETALL, STRLEN, ZRANGE …)
//! answered from the L1 or fetched and filled, as GET is.
//!
//! A miss is fetched with the key's PTTL in the same pipeline, on the same
//! connection as a GET miss would be (the client's, or under optin the
//! node's fill connection), with the same fill
//! ticket taken before the node's channel is checked: the race argument of
//! GET (`sidecache_pool::coherence::tracking`) holds unchanged, since the
//! read is cached in the key's entry and every invalidation of the key
//! drops the entry. The reply is cached as the client will be answered, in
//! its protocol (tagged with it); a client of the other protocol gets it
//! converted (`sidecache_resp::shape`). Misses are not coalesced.

use bytes::{Bytes, BytesMut};
use sidecache_l1::{FillTicket, ReadLookup};
use sidecache_pool::{Proto, Slot};
use sidecache_resp::frame;
use sidecache_resp::request::Request;
use sidecache_resp::shape::{self, Shape};

use super::super::{Client, Pending};
use crate::cmd::reads;

/// A read beyond GET being fetched (the command and PTTL pipelined at
/// `idx`, `idx + 1`, on the client's connection or the fill connection).
pub(in crate::connection) struct ReadFetch {
    /// Its builder: the node's, or (`fill`) its fill lane's.
    node: u32,
    idx: u32,
    fill: bool,
    slot: Option<Slot>,
    key: Bytes,
    /// The read's signature (`cmd::reads::signature`); empty when not
    /// cached.
    sig: Bytes,
    /// `None`: not cacheable, fetch only.
    ticket: Option<FillTicket>,
    shape: Shape,
    /// The command as sent, for a redirect to follow.
    cmd: Bytes,
    /// The reply in the client's protocol, set by the publish pass.
    pub(in crate::connection) result: Option<sidecache_pool::Result<Bytes>>,
}

/// The tag a cached reply carries: the protocol it is in.
fn tag(proto: Proto) -> u8 {
    u8::from(proto == Proto::Resp3)
}

fn proto_of(tag: u8) -> Proto {
    if tag == 1 {
        Proto::Resp3
    } else {
        Proto::Resp2
    }
}

/// Writes a cached reply (`from` its protocol) in `to`.
pub(in crate::connection) fn write_read(
    out: &mut BytesMut,
    reply: &Bytes,
    shape: Shape,
    from: Proto,
    to: Proto,
) {
    if from == to || shape::convert(reply, shape, from, to, out).is_err() {
        out.extend_from_slice(reply);
    }
}

impl ReadFetch {
    /// Fetched on fill lane `lane`: it no longer fills the L1.
    pub(in crate::connection) fn forget_ticket_on(&mut self, lane: u32) {
        if self.fill && self.node == lane {
            self.ticket = None;
        }
    }
}

impl Client {
    /// A cacheable read (table id `id`, reply `shape`) with the L1 on.
    pub(in crate::connection) fn read(&mut self, id: u16, shape: Shape, req: &Request) {
        let key = &req.args[1];
        let db = self.st.db;
        let now = self.now();
        let mut lookup =
            self.shared
                .l1
                .read_at(db, key, |sig| reads::matches(sig, id, &req.args), now);
        if self.shared.stale.active()
            && matches!(lookup, ReadLookup::Hit(..))
            && self.shared.stale.check(key, now) == crate::state::stale::Serve::Expired
        {
            lookup = ReadLookup::Miss;
        }
        let hit = match &lookup {
            ReadLookup::Hit(reply, _) => Some(reply.len()),
            _ => None,
        };
        self.observe_read(db, key, hit);
        if let ReadLookup::Hit(reply, tag) = lookup {
            self.out_known += reply.len();
            self.pending.push(Pending::Read {
                reply,
                from: proto_of(tag),
                shape,
            });
            return;
        }
        let (node, slot) = match self.route_key(key) {
            Ok(r) => r,
            Err(e) => return self.slot_error(&e),
        };
        let node = self.read_node(node, slot);
        if lookup == ReadLookup::Bypass {
            return self.forward(node, slot, &req.raw);
        }
        let mut ticket = self.fill_ticket(node, db, key);
        let fill = ticket.is_some() && self.fills_on_fill_conn(node);
        if self.optin && !fill {
            ticket = None;
        }
        let (at, idx) = self.enqueue_fetch(node, key, fill, Some(&req.raw));
        let sig = match ticket {
            Some(_) => reads::signature(id, &req.args),
            None => Bytes::new(),
        };
        self.pending.push(Pending::ReadFetch(Box::new(ReadFetch {
            node: at,
            idx,
            fill,
            slot,
            key: key.clone(),
            sig,
            ticket,
            shape,
            cmd: req.raw.clone(),
            result: None,
        })));
    }

    /// Hot keys and prefix figures of one read's lookup (`hit`: the
    /// reply's length).
    #[inline]
    fn observe_read(&mut self, db: u16, key: &[u8], hit: Option<usize>) {
        if self.hot.read() {
            self.note_hot_read(db, key, hit.is_none());
        }
        if self.metrics.prefix.on() {
            self.metrics
                .prefix
                .lookup(&self.shared.metrics.prefixes, key, hit);
        }
    }

    /// Takes a read's reply and PTTL, fills the L1 when allowed, and
    /// keeps the reply, in the client's protocol, for the reply pass.
    pub(in crate::connection) async fn finish_read(&mut self, f: &mut ReadFetch) {
        let (got, pttl) = self.take_fetched(f.fill, f.node, f.idx);
        let proto = self.st.proto;
        // Fill connections speak RESP3 (their invalidations are pushes).
        let from = if f.fill { Proto::Resp3 } else { proto };
        f.result = Some(match got {
            Err(e) => Err(e),
            Ok(frame) if frame::error_text(&frame).is_some() => {
                if self.followed(&frame) {
                    // A redirect (or another error): followed for the read
                    // alone, not cached; the next read fills.
                    self.shared.metrics.note_redirect(&frame);
                    self.shared
                        .upstream
                        .follow_via(
                            self.via(),
                            self.session(),
                            f.slot,
                            &f.cmd,
                            frame,
                            self.deadline,
                        )
                        .await
                } else {
                    Ok(frame)
                }
            }
            Ok(frame) => {
                let reply = if from == proto {
                    frame
                } else {
                    let mut out = BytesMut::with_capacity(frame.len());
                    match shape::convert(&frame, f.shape, from, proto, &mut out) {
                        Ok(()) => out.freeze(),
                        Err(_) => {
                            f.ticket = None;
                            frame
                        }
                    }
                };
                if let (Some(ticket), Some(pttl)) = (f.ticket, pttl) {
                    self.shared.l1.complete_read(
                        ticket,
                        self.st.db,
                        &f.key,
                        std::mem::take(&mut f.sig),
                        &reply,
                        tag(proto),
                        pttl,
                    );
                }
                Ok(reply)
            }
        });
    }
}
