//! One upstream connection holding the hub's subscriptions for a node.
//!
//! The hub sends it (un)subscribe commands, one name each; it writes them
//! and reads what Redis sends: confirmations and errors (one per command,
//! in order, matched against the commands sent), and messages, handed to
//! the hub. It ends when the hub drops its sender (no subscription left,
//! the last UNSUBSCRIBE written first) or the connection breaks (the hub
//! is told, and ends the subscriptions on it).

use std::collections::VecDeque;
use std::sync::Weak;

use bytes::{Bytes, BytesMut};
use sidecache_pool::config::NodeAddr;
use sidecache_pool::SessionPool;
use sidecache_pool::{Proto, Session};
use sidecache_resp::encode;
use sidecache_resp::frame::{self, Scanner, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tracing::debug;

use super::{Hub, Kind, Msg};

/// A subscription change for the link to send.
#[derive(Debug)]
pub(super) struct Cmd {
    pub kind: Kind,
    pub name: Bytes,
    /// SUBSCRIBE (true) or UNSUBSCRIBE.
    pub sub: bool,
}

fn command(kind: Kind, sub: bool) -> &'static [u8] {
    match (kind, sub) {
        (Kind::Channel, true) => b"SUBSCRIBE",
        (Kind::Pattern, true) => b"PSUBSCRIBE",
        (Kind::Shard, true) => b"SSUBSCRIBE",
        (Kind::Channel, false) => b"UNSUBSCRIBE",
        (Kind::Pattern, false) => b"PUNSUBSCRIBE",
        (Kind::Shard, false) => b"SUNSUBSCRIBE",
    }
}

pub(super) async fn run(
    hub: Weak<Hub>,
    id: u64,
    addr: NodeAddr,
    sessions: std::sync::Arc<SessionPool>,
    mut rx: mpsc::Receiver<Cmd>,
) {
    let wait = match hub.upgrade() {
        Some(h) => h.wait,
        None => return,
    };
    let session = Session {
        db: 0,
        proto: Proto::Resp2,
    };
    let conn = match sessions.splice(&addr, session, wait).await {
        Ok(c) => c,
        Err(e) => {
            if let Some(h) = hub.upgrade() {
                h.lost(id, &e.to_string());
            }
            return;
        }
    };
    let why = serve(&hub, id, conn, &mut rx).await;
    debug!(link = id, %addr, why, "subscription link closed");
    if let Some(h) = hub.upgrade() {
        h.lost(id, why);
    }
}

async fn serve(
    hub: &Weak<Hub>,
    id: u64,
    conn: sidecache_pool::Spliced,
    rx: &mut mpsc::Receiver<Cmd>,
) -> &'static str {
    let mut rd = conn.rd;
    let mut wr = conn.wr;
    let mut sent: VecDeque<(Kind, Bytes, bool)> = VecDeque::new();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::new();
    let mut scanner = Scanner::new();
    loop {
        tokio::select! {
            cmd = rx.recv() => {
                let Some(first) = cmd else {
                    // Every UNSUBSCRIBE confirmed before the connection
                    // closes: until then upstream counts them (PUBLISH).
                    return drain(hub, id, &mut rd, &mut buf, &mut scanner, &mut sent).await;
                };
                let mut next = Some(first);
                while let Some(c) = next {
                    encode::encode_command(&mut out, &[command(c.kind, c.sub), &c.name[..]]);
                    sent.push_back((c.kind, c.name, c.sub));
                    next = rx.try_recv().ok();
                }
                if wr.write_all(&out).await.is_err() {
                    return "write failed";
                }
                out.clear();
            }
            r = rd.read_buf(&mut buf) => {
                match r {
                    Ok(0) | Err(_) => return "connection closed",
                    Ok(_) => {}
                }
                loop {
                    let n = match scanner.scan(&buf) {
                        Ok(Some(n)) => n,
                        Ok(None) => break,
                        Err(_) => return "protocol error",
                    };
                    let frame = buf.split_to(n).freeze();
                    let Some(h) = hub.upgrade() else {
                        return "proxy stopping";
                    };
                    handle(&h, id, &frame, &mut sent);
                }
                if buf.capacity() > 1 << 20 && buf.is_empty() {
                    buf = BytesMut::with_capacity(16 * 1024);
                }
                buf.reserve(16 * 1024);
            }
        }
    }
}

/// Reads until every command sent is answered (bounded by the hub's wait).
async fn drain(
    hub: &Weak<Hub>,
    id: u64,
    rd: &mut sidecache_pool::ReadHalf,
    buf: &mut BytesMut,
    scanner: &mut Scanner,
    sent: &mut VecDeque<(Kind, Bytes, bool)>,
) -> &'static str {
    let wait = match hub.upgrade() {
        Some(h) => h.wait,
        None => return "proxy stopping",
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        loop {
            let n = match scanner.scan(buf) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(_) => return "protocol error",
            };
            let frame = buf.split_to(n).freeze();
            let Some(h) = hub.upgrade() else {
                return "proxy stopping";
            };
            handle(&h, id, &frame, sent);
        }
        if sent.is_empty() {
            return "no subscriptions left";
        }
        buf.reserve(4096);
        match tokio::time::timeout_at(deadline, rd.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return "no subscriptions left (unconfirmed)",
        }
    }
}

fn handle(hub: &Hub, id: u64, frame: &Bytes, sent: &mut VecDeque<(Kind, Bytes, bool)>) {
    if let Some(text) = frame::error_text(frame) {
        // An error answers the oldest command not yet answered.
        if let Some((kind, name, true)) = sent.pop_front() {
            hub.refused(id, kind, &name, String::from_utf8_lossy(text).into_owned());
        }
        return;
    }
    let Ok(Value::Array(items)) = Value::decode(frame) else {
        return;
    };
    let mut it = items.into_iter().map(|v| match v {
        Value::Bulk(b) | Value::Status(b) => b,
        _ => Bytes::new(),
    });
    let Some(head) = it.next() else {
        return;
    };
    match &head[..] {
        b"message" | b"smessage" => {
            let (Some(channel), Some(payload)) = (it.next(), it.next()) else {
                return;
            };
            let kind = if &head[..] == b"message" {
                Kind::Channel
            } else {
                Kind::Shard
            };
            hub.deliver(
                id,
                Msg {
                    kind,
                    pattern: Bytes::new(),
                    channel,
                    payload,
                },
            );
        }
        b"pmessage" => {
            let (Some(pattern), Some(channel), Some(payload)) = (it.next(), it.next(), it.next())
            else {
                return;
            };
            hub.deliver(
                id,
                Msg {
                    kind: Kind::Pattern,
                    pattern,
                    channel,
                    payload,
                },
            );
        }
        other => {
            let Some((kind, sub)) = Kind::from_reply(other) else {
                return;
            };
            let name = it.next().unwrap_or_default();
            let ours = sent
                .front()
                .is_some_and(|(k, n, s)| *k == kind && *s == sub && *n == name);
            if ours {
                sent.pop_front();
                if sub {
                    hub.confirmed(id, kind, &name);
                } else {
                    hub.unsubscribed(id, kind, &name);
                }
            } else if kind == Kind::Shard && !sub {
                // Redis ended it by itself: the slot moved.
                hub.shard_dropped(id, &name);
            }
        }
    }
}
