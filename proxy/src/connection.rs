//! One client connection: read, parse, dispatch, forward, reply in order.
//!
//! ```text
//!            read                    dispatch (per command, in order)
//!  client ─────────▶ rbuf ─parse─▶ ┬─ local ──────────────▶ scratch ─┐
//!                                  ├─ forward ─▶ builder[node] ───┐  │
//!                                  └─ split/fan-out ─▶ builder[n…]┤  │
//!                                                                 ▼  │
//!                                  one pipelined submit per node  │  │
//!                                  (multiplexed upstream conns)   │  │
//!                                                                 ▼  ▼
//!  client ◀───────── wbuf ◀──── pending[] resolved in request order ◀─┘
//!            write          (MOVED/ASK followed, split parts merged)
//! ```
//!
//! A batch is everything parsed from one read (bounded by
//! [`MAX_BATCH`]); its upstream commands go out as one pipeline per node and
//! its replies are written in one write. A command that changes the session
//! (SELECT, HELLO, AUTH, RESET) first resolves the batch so far, so later
//! commands run with the new session and earlier ones with the old.

use std::ops::Range;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::resp::{self, put_header};
use sidecache_pool::topology::Topology;
use sidecache_pool::{mux::Replies, Proto, Session, Slot};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cmd::handling::{Handling, Merge};
use crate::cmd::local::{self, ClientState, Local, Outcome};
use crate::cmd::merge::{self, PartReply};
use crate::cmd::table::lowercase;
use crate::resp::reply::Reply;
use crate::resp::request::{Limits, Parser, Request};
use crate::state::{ClientEntry, Shared};

/// Commands resolved together at most (bounds memory per client).
pub const MAX_BATCH: usize = 4096;
/// Request bytes resolved together at most.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Bits of a cluster SCAN cursor that name the master.
const SCAN_SHARD_BITS: u32 = 10;

/// A part of a split or fanned-out command.
struct Part {
    node: u32,
    idx: u32,
    slot: Option<Slot>,
    cmd: Bytes,
    positions: Vec<u32>,
}

enum Pending {
    Local(Range<usize>),
    Up {
        node: u32,
        idx: u32,
        slot: Option<Slot>,
        cmd: Bytes,
    },
    Merge {
        kind: Merge,
        parts: Vec<Part>,
        nkeys: usize,
    },
    Scan {
        node: u32,
        idx: u32,
        cmd: Bytes,
        shard: u64,
        nshards: u64,
    },
    Info {
        upstream: Option<(u32, u32)>,
        proxy: bool,
    },
}

#[derive(Default)]
struct Builder {
    buf: BytesMut,
    count: usize,
    rx: Option<oneshot::Receiver<sidecache_pool::Result<Replies>>>,
    result: Option<Result<Replies, sidecache_pool::Error>>,
}

/// One client's connection state.
pub struct Client {
    shared: Arc<Shared>,
    st: ClientState,
    topo: Arc<Topology>,
    builders: Vec<Builder>,
    pending: Vec<Pending>,
    scratch: BytesMut,
    wbuf: BytesMut,
    keys: Vec<usize>,
    batch_bytes: usize,
    commands: u64,
}

enum Flow {
    Continue,
    Close,
}

impl Client {
    fn new(shared: Arc<Shared>, addr: String, laddr: String) -> Client {
        let id = shared.next_client_id();
        let entry = ClientEntry {
            addr,
            laddr,
            name: String::new(),
            db: 0,
            resp: 2,
            created: std::time::Instant::now(),
            lib_name: String::new(),
            lib_ver: String::new(),
        };
        let db = shared.config.upstream.seeds.first().map_or(0, |s| s.db);
        let st = ClientState {
            id,
            db: if shared.upstream.is_cluster() { 0 } else { db },
            proto: Proto::Resp2,
            authenticated: shared.config.requirepass.is_none(),
            entry,
        };
        shared.with_clients(|c| {
            c.insert(id, st.entry.clone());
        });
        let topo = shared.upstream.topology();
        Client {
            shared,
            st,
            topo,
            builders: Vec::new(),
            pending: Vec::new(),
            scratch: BytesMut::with_capacity(1024),
            wbuf: BytesMut::with_capacity(16 * 1024),
            keys: Vec::new(),
            batch_bytes: 0,
            commands: 0,
        }
    }

    fn session(&self) -> Session {
        Session {
            db: self.st.db,
            proto: self.st.proto,
        }
    }

    fn hint(&self) -> usize {
        self.st.id as usize
    }

    fn local_reply(&mut self, f: impl FnOnce(&mut Reply<'_>)) {
        let start = self.scratch.len();
        f(&mut Reply {
            out: &mut self.scratch,
            proto: self.st.proto,
        });
        self.pending.push(Pending::Local(start..self.scratch.len()));
    }

    fn enqueue(&mut self, node: usize, cmd: &[u8]) -> (u32, u32) {
        if self.builders.len() <= node {
            self.builders.resize_with(node + 1, Builder::default);
        }
        let b = &mut self.builders[node];
        b.buf.extend_from_slice(cmd);
        b.count += 1;
        (node as u32, (b.count - 1) as u32)
    }

    fn forward(&mut self, node: usize, slot: Option<Slot>, cmd: &Bytes) {
        let (node, idx) = self.enqueue(node, cmd);
        self.pending.push(Pending::Up {
            node,
            idx,
            slot,
            cmd: cmd.clone(),
        });
    }

    /// Dispatches one parsed request.
    async fn dispatch(&mut self, req: &Request) -> Flow {
        self.commands += 1;
        self.batch_bytes += req.raw.len();
        let args = &req.args;
        let mut lower = [0u8; 64];
        let lname: &[u8] = lowercase(&args[0], &mut lower).unwrap_or(b"");
        if let Some(cmd) = Local::lookup(lname) {
            if !self.st.authenticated && !cmd.allowed_unauthenticated() {
                self.local_reply(|r| r.error("NOAUTH Authentication required."));
                return Flow::Continue;
            }
            if cmd.changes_session() {
                self.flush().await;
            }
            let start = self.scratch.len();
            let outcome = local::run(cmd, args, &mut self.st, &self.shared, &mut self.scratch);
            self.pending.push(Pending::Local(start..self.scratch.len()));
            return match outcome {
                Outcome::Continue => Flow::Continue,
                Outcome::Close => Flow::Close,
            };
        }
        if !self.st.authenticated {
            self.local_reply(|r| r.error("NOAUTH Authentication required."));
            return Flow::Continue;
        }
        let shared = Arc::clone(&self.shared);
        let Some(info) = shared.table.lookup(args) else {
            // Unknown to upstream's table: let upstream word the error.
            self.forward(0, None, &req.raw);
            return Flow::Continue;
        };
        let cluster = self.topo.is_cluster();
        match info.handling {
            Handling::Unsupported(why) => {
                self.local_reply(|r| r.error(&format!("ERR {why}")));
            }
            Handling::MaybeBlocking if args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK")) => {
                self.local_reply(|r| {
                    r.error("ERR blocking commands are not supported by sidecache yet")
                });
            }
            Handling::Info => self.info(req),
            Handling::Scan if cluster => self.scan(req),
            Handling::FanOut(kind) if cluster => {
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
            Handling::Split(kind)
                if cluster
                    && info.arity_ok(args.len())
                    && (kind != Merge::AllOk || args.len() % 2 == 1) =>
            {
                self.split(kind, req);
            }
            _ if !cluster => self.forward(0, None, &req.raw),
            _ => {
                self.keys.clear();
                let slot = match info.keys(args, &mut self.keys) {
                    Ok(_) => self.keys.first().map(|&i| Slot::for_key(&args[i])),
                    Err(_) => None,
                };
                match slot {
                    Some(s) => match self.topo.node_index(s) {
                        Ok(n) => self.forward(n, Some(s), &req.raw),
                        Err(e) => {
                            self.shared.upstream.request_refresh();
                            self.local_reply(|r| {
                                r.error(&format!("CLUSTERDOWN Hash slot not served ({e})"))
                            });
                        }
                    },
                    None => self.forward(0, None, &req.raw),
                }
            }
        }
        Flow::Continue
    }

    fn split(&mut self, kind: Merge, req: &Request) {
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
                Err(e) => self
                    .local_reply(|r| r.error(&format!("CLUSTERDOWN Hash slot not served ({e})"))),
            }
            return;
        }
        let mut parts = Vec::with_capacity(groups.len());
        for (slot, positions) in groups {
            let node = match self.topo.node_index(slot) {
                Ok(n) => n,
                Err(e) => {
                    self.local_reply(|r| {
                        r.error(&format!("CLUSTERDOWN Hash slot not served ({e})"))
                    });
                    return;
                }
            };
            let mut cmd = BytesMut::new();
            put_header(&mut cmd, b'*', 1 + (positions.len() * step) as i64);
            resp::put_bulk(&mut cmd, &args[0]);
            for &p in &positions {
                let i = 1 + p as usize * step;
                for a in &args[i..i + step] {
                    resp::put_bulk(&mut cmd, a);
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

    fn scan(&mut self, req: &Request) {
        let args = &req.args;
        let nshards = self.topo.nodes().len() as u64;
        let cursor = args
            .get(1)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u64>().ok());
        let Some(cursor) = cursor else {
            if args.len() < 2 {
                return self.local_reply(|r| local::arity_error(r, "scan"));
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
        resp::encode_command(&mut cmd, &new_args);
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

    fn info(&mut self, req: &Request) {
        let sections: Vec<Vec<u8>> = req.args[1..]
            .iter()
            .map(|a| a.to_ascii_lowercase())
            .collect();
        let proxy = sections.is_empty()
            || sections
                .iter()
                .any(|s| matches!(&s[..], b"proxy" | b"all" | b"everything" | b"default"));
        let only_proxy = !sections.is_empty() && sections.iter().all(|s| s == b"proxy");
        let upstream = (!only_proxy).then(|| self.enqueue(0, &req.raw));
        self.pending.push(Pending::Info { upstream, proxy });
    }

    fn proxy_section(&self) -> String {
        let s = &self.shared;
        let info = s.upstream.server_info();
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        format!(
            "# Proxy\r\nsidecache_version:{}\r\nupstream_mode:{}\r\nupstream_version:{}\r\nupstream_masters:{}\r\nconnected_clients:{}\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\ntotal_commands_processed:{}\r\nupstream_errors:{}\r\nuptime_in_seconds:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            if info.cluster { "cluster" } else { "standalone" },
            info.version,
            self.topo.nodes().len(),
            s.connected_clients(),
            s.stats.connections_received.load(relaxed),
            s.stats.rejected_connections.load(relaxed),
            s.stats.commands.load(relaxed),
            s.stats.upstream_errors.load(relaxed),
            s.started.elapsed().as_secs(),
        )
    }

    /// Sends the batch's upstream work, waits for it, and writes every
    /// pending reply to `wbuf` in request order.
    async fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let session = self.session();
        let hint = self.hint();
        for (i, b) in self.builders.iter_mut().enumerate() {
            if b.count == 0 {
                continue;
            }
            let payload = b.buf.split().freeze();
            let count = std::mem::take(&mut b.count);
            let Some(node) = self.topo.nodes().get(i) else {
                b.result = Some(Err(sidecache_pool::Error::SlotUnassigned(0)));
                continue;
            };
            match node.conn(session, hint) {
                Some(conn) => match conn.submit(payload, count).await {
                    Ok(rx) => b.rx = Some(rx),
                    Err(e) => b.result = Some(Err(e)),
                },
                None => {
                    b.result = Some(Err(sidecache_pool::Error::Config(
                        "database out of range".into(),
                    )))
                }
            }
        }
        for b in self.builders.iter_mut() {
            if let Some(rx) = b.rx.take() {
                b.result = Some(rx.await.unwrap_or(Err(sidecache_pool::Error::Closed)));
            }
        }
        let pending = std::mem::take(&mut self.pending);
        let mut errors = 0u64;
        for p in pending {
            match p {
                Pending::Local(r) => self.wbuf.put_slice(&self.scratch[r]),
                Pending::Up {
                    node,
                    idx,
                    slot,
                    cmd,
                } => match self.reply_of(node, idx, slot, &cmd).await {
                    Ok(f) => self.wbuf.put_slice(&f),
                    Err(e) => {
                        errors += 1;
                        upstream_error(&mut self.wbuf, &e);
                    }
                },
                Pending::Merge { kind, parts, nkeys } => {
                    let mut replies = Vec::with_capacity(parts.len());
                    let mut failed = None;
                    for part in &parts {
                        match self
                            .reply_of(part.node, part.idx, part.slot, &part.cmd)
                            .await
                        {
                            Ok(f) => replies.push(PartReply {
                                frame: f,
                                positions: &part.positions,
                            }),
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    match failed {
                        Some(e) => {
                            errors += 1;
                            upstream_error(&mut self.wbuf, &e);
                        }
                        None => merge::merge(kind, replies, nkeys, &mut self.wbuf),
                    }
                }
                Pending::Scan {
                    node,
                    idx,
                    cmd,
                    shard,
                    nshards,
                } => match self.reply_of(node, idx, None, &cmd).await {
                    Ok(f) => rewrite_scan(&f, shard, nshards, &mut self.wbuf),
                    Err(e) => {
                        errors += 1;
                        upstream_error(&mut self.wbuf, &e);
                    }
                },
                Pending::Info { upstream, proxy } => {
                    let body = match upstream {
                        Some((node, idx)) => {
                            match self.reply_of(node, idx, None, &Bytes::new()).await {
                                Ok(f) => Ok(resp::Value::decode(&f).ok().and_then(|v| match v {
                                    resp::Value::Bulk(b) | resp::Value::Verbatim(b) => Some(b),
                                    _ => None,
                                })),
                                Err(e) => Err(e),
                            }
                        }
                        None => Ok(None),
                    };
                    match body {
                        Err(e) => upstream_error(&mut self.wbuf, &e),
                        Ok(body) => {
                            let mut text = if proxy {
                                self.proxy_section().into_bytes()
                            } else {
                                Vec::new()
                            };
                            if let Some(b) = body {
                                if proxy && !b.is_empty() {
                                    text.extend_from_slice(b"\r\n");
                                }
                                text.extend_from_slice(&b);
                            }
                            Reply {
                                out: &mut self.wbuf,
                                proto: self.st.proto,
                            }
                            .verbatim(&text);
                        }
                    }
                }
            }
        }
        self.scratch.clear();
        for b in self.builders.iter_mut() {
            b.result = None;
        }
        let stats = &self.shared.stats;
        stats.commands.fetch_add(
            std::mem::take(&mut self.commands),
            std::sync::atomic::Ordering::Relaxed,
        );
        if errors > 0 {
            stats
                .upstream_errors
                .fetch_add(errors, std::sync::atomic::Ordering::Relaxed);
        }
        self.batch_bytes = 0;
        // Pick up topology changes between batches.
        self.topo = self.shared.upstream.topology();
    }

    /// The final reply of one queued command, following cluster redirects.
    async fn reply_of(
        &mut self,
        node: u32,
        idx: u32,
        slot: Option<Slot>,
        cmd: &Bytes,
    ) -> sidecache_pool::Result<Bytes> {
        let frame = match self
            .builders
            .get_mut(node as usize)
            .and_then(|b| b.result.as_mut())
        {
            Some(Ok(frames)) => frames
                .get_mut(idx as usize)
                .map(std::mem::take)
                .unwrap_or_default(),
            Some(Err(e)) => return Err(e.clone()),
            None => return Err(sidecache_pool::Error::Closed),
        };
        if frame.is_empty() {
            return Err(sidecache_pool::Error::Closed);
        }
        if !self.topo.is_cluster() || resp::error_text(&frame).is_none() || cmd.is_empty() {
            return Ok(frame);
        }
        self.shared
            .upstream
            .follow(self.session(), self.hint(), slot, cmd, frame)
            .await
    }
}

/// Writes an upstream failure as a Redis error reply.
fn upstream_error(out: &mut BytesMut, e: &sidecache_pool::Error) {
    let text = e.to_string().replace(['\r', '\n'], " ");
    out.put_slice(b"-ERR ");
    out.put_slice(text.as_bytes());
    out.put_slice(b"\r\n");
}

/// Rewrites a SCAN reply's cursor to encode the master index.
fn rewrite_scan(frame: &Bytes, shard: u64, nshards: u64, out: &mut BytesMut) {
    let Ok(Some(els)) = resp::array_elements(frame) else {
        out.put_slice(frame);
        return;
    };
    let up = els
        .first()
        .and_then(|c| resp::Value::decode(c).ok())
        .and_then(|v| {
            v.as_bytes()
                .and_then(|b| std::str::from_utf8(b).ok()?.parse::<u64>().ok())
        });
    let (Some(up), 2) = (up, els.len()) else {
        out.put_slice(frame);
        return;
    };
    let next = if up != 0 {
        if up >> (64 - SCAN_SHARD_BITS) != 0 {
            out.put_slice(b"-ERR sidecache: upstream SCAN cursor too large to encode\r\n");
            return;
        }
        (up << SCAN_SHARD_BITS) | shard
    } else if shard + 1 < nshards {
        shard + 1
    } else {
        0
    };
    put_header(out, b'*', 2);
    resp::put_bulk(out, next.to_string().as_bytes());
    out.put_slice(&els[1]);
}

/// Serves one client until it quits, errs, or shutdown is requested.
pub async fn serve<S>(
    mut stream: S,
    shared: Arc<Shared>,
    addr: String,
    laddr: String,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limits = Limits {
        max_bulk: shared.config.proto_max_bulk_len,
        max_multibulk: shared.config.max_multibulk_len,
    };
    let query_limit = shared.config.client_query_buffer_limit as usize;
    let mut client = Client::new(Arc::clone(&shared), addr, laddr);
    let mut parser = Parser::new(limits);
    parser.unauthenticated = !client.st.authenticated;
    let mut rbuf = BytesMut::with_capacity(16 * 1024);
    let mut req = Request::default();
    'conn: loop {
        let mut close = false;
        loop {
            parser.unauthenticated = !client.st.authenticated;
            match parser.parse(&mut rbuf, &mut req) {
                Ok(Some(())) => {
                    if let Flow::Close = client.dispatch(&req).await {
                        close = true;
                        break;
                    }
                    if client.pending.len() >= MAX_BATCH || client.batch_bytes >= MAX_BATCH_BYTES {
                        client.flush().await;
                        if write_out(&mut stream, &mut client.wbuf).await.is_err() {
                            break 'conn;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let msg = format!("ERR {e}");
                    client.local_reply(|r| r.error(&msg));
                    close = true;
                    break;
                }
            }
        }
        client.flush().await;
        if write_out(&mut stream, &mut client.wbuf).await.is_err() || close {
            break;
        }
        if rbuf.len() > query_limit {
            debug!(
                id = client.st.id,
                "closing client that reached max query buffer length"
            );
            break;
        }
        let want = parser.wanted().map_or(0, |w| w.saturating_sub(rbuf.len()));
        rbuf.reserve(want.clamp(16 * 1024, 1024 * 1024));
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            r = stream.read_buf(&mut rbuf) => match r {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
        }
    }
    let _ = stream.shutdown().await;
    shared.with_clients(|c| c.remove(&client.st.id));
}

async fn write_out<S: AsyncWrite + Unpin>(
    stream: &mut S,
    wbuf: &mut BytesMut,
) -> std::io::Result<()> {
    if !wbuf.is_empty() {
        stream.write_all(wbuf).await?;
        wbuf.clear();
        if wbuf.capacity() > 4 * 1024 * 1024 {
            *wbuf = BytesMut::with_capacity(16 * 1024);
        }
    }
    Ok(())
}
