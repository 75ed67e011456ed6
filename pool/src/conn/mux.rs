//! A multiplexed, pipelined upstream connection.
//!
//! ```text
//!  callers ──Request{payload, count}──▶ [bounded queue] ──▶ writer ──bytes──▶ upstream
//!                                                              │
//!                                                  Inflight{count, reply}  (bounded, in write order)
//!                                                              ▼
//!  callers ◀──────── Vec<frame> per request ──────────────── reader ◀──replies── upstream
//! ```
//!
//! Many client connections share one upstream connection; the writer
//! coalesces whatever is queued into one write (with fewer than
//! `GATHER_BELOW` commands in hand, it first lets the runtime serve its
//! ready connections, at most twice, so that requests already read join
//! the write: one upstream write and one upstream read for many unpipelined
//! clients; while those turns bring nothing, as with one client, it takes
//! them only now and then, see [`Gather`]), the reader hands each
//! request's replies back in order (Redis answers in order on a connection).
//! A supervisor reconnects with backoff; while disconnected, requests fail
//! fast instead of piling up.
//!
//! A connection of a node ([`MuxConn::spawn_watched`]) also reports to the
//! node's [`Health`]: every reply is observed (BUSY, LOADING, MASTERDOWN),
//! and the writer arms a timer ([`SUSPECT_AFTER`]) when it writes; a
//! request written before the timer was armed and still unanswered when
//! it fires makes the node suspect. One timer per connection at a time,
//! none while idle.
//!
//! # Endpoint moves (standalone)
//! A managed primary endpoint (ElastiCache) moves by DNS: the old primary
//! becomes a replica and answers writes with `-READONLY` on connections
//! that still work. When a watched connection of a standalone node reads
//! `-READONLY`, it stops taking requests (they wait in the queue), lets
//! the replies in flight arrive (at most [`DRAIN_LIMIT`]), closes, and
//! reconnects, resolving the name again; requests queued meanwhile go to
//! the new connection. Repeated READONLY reconnects (the name has not
//! moved yet) back off from 20 ms to 1 s.
//!
//! # Re-authentication
//! With a rotating secret (`--upstream-iam`, `--upstream-password-file`),
//! the writer sends `AUTH` with the current secret every
//! `--upstream-reauth-interval`, between two requests, never inside one (a
//! MULTI…EXEC block a client sends on a shared connection is one request),
//! and the reader counts its answer. A `PING` follows it, since a server
//! may send no reply to a refused `AUTH` (`mux/reauth.rs`). A refused one
//! ends the connection as a `-READONLY` does (above), and the supervisor
//! reconnects with a freshly fetched secret: no request fails for it.
//!
//! # Race window
//! The writer queues the `Inflight` entry *before* writing the bytes, so the
//! reader always finds the sink for a reply it reads. If the connection
//! breaks, everything in flight fails with [`Error::ConnectionLost`]: those
//! commands may or may not have run upstream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::auth::Auth;
use crate::coherence::tracking::{Channel, HEARTBEAT, HEARTBEAT_TIMEOUT};
use crate::config::{NodeAddr, Session};
use crate::conn::connect::{Connector, ReadHalf, WriteHalf};
use crate::conn::health::{Health, SUSPECT_AFTER};
use crate::error::{Error, Result};

mod echo;
mod gather;
mod reauth;
mod supervise;

use gather::Gather;
use sidecache_resp::encode;
use sidecache_resp::frame::Scanner;
use supervise::{supervise, Role};

/// Requests queued per connection before callers wait (backpressure).
const QUEUE: usize = 1024;
/// Requests written but not yet answered, per connection.
const INFLIGHT: usize = 8192;
/// Stop coalescing queued requests into one write past this many bytes.
const MAX_WRITE: usize = 256 * 1024;
/// Commands in hand below which the writer lets the runtime serve other
/// tasks before writing, so that requests of other clients already read
/// share the write (measured with `bench/ab.sh`, requests per second:
/// INCR `-P 1` +29%, LPUSH `-P 1` +21%; `-P 16` +5% and +8%).
const GATHER_BELOW: usize = 16;
/// At most this many such passes before a write (also the write-behind
/// batcher's, before it takes a small batch).
pub(crate) const GATHER_TURNS: usize = 2;

/// How long a connection that read `-READONLY` waits for the replies
/// still in flight before it closes anyway (they fail as
/// [`Error::Demoted`]: may or may not have run).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// The replies of one request, one frame per command, in order.
pub type Replies = Vec<Bytes>;

struct Request {
    payload: Bytes,
    count: usize,
    /// Already a batch its sender gathered (write-behind): written without
    /// waiting for other requests to join it.
    gathered: bool,
    reply: oneshot::Sender<Result<Replies>>,
}

/// Where the replies of a request go.
enum Sink {
    /// A caller waiting on its request.
    Caller(oneshot::Sender<Result<Replies>>),
    /// The connection's own `CLIENT TRACKING` registration.
    Tracking,
    /// The connection's own heartbeat.
    Ping,
    /// The connection's own AUTH with a renewed secret.
    Reauth,
}

impl Sink {
    fn fail(self, e: Error) {
        if let Sink::Caller(tx) = self {
            let _ = tx.send(Err(e));
        }
    }
}

struct Inflight {
    count: usize,
    frames: Replies,
    sink: Sink,
    /// A request on an optin tracking connection, once a client of the
    /// proxy tracks keys: what was sent, to know Redis's reports of its
    /// writes and the reads that may register keys (`echo`).
    payload: Option<Bytes>,
    /// It is a write-behind batch.
    writes: bool,
    /// What a caller sent (empty for the connection's own commands): a
    /// reply that would tell of the node's state is checked against its
    /// command (`own_state`).
    sent: Bytes,
}

/// Handle to one multiplexed connection; cheap to clone.
#[derive(Clone, Debug)]
pub struct MuxConn {
    tx: mpsc::Sender<Request>,
}

impl MuxConn {
    /// Starts the connection's supervisor; it connects in the background.
    pub fn spawn(connector: Arc<Connector>, addr: NodeAddr, session: Session) -> MuxConn {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(supervise(connector, addr, session, rx, Role::Plain, None));
        MuxConn { tx }
    }

    /// Like [`MuxConn::spawn`], for a connection of a node: it reports to
    /// the node's `health` (and, standalone, reconnects on `-READONLY`).
    pub(crate) fn spawn_watched(
        connector: Arc<Connector>,
        addr: NodeAddr,
        session: Session,
        health: Arc<Health>,
    ) -> MuxConn {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(supervise(
            connector,
            addr,
            session,
            rx,
            Role::Plain,
            Some(health),
        ));
        MuxConn { tx }
    }

    /// Like [`MuxConn::spawn`], and the connection is `channel`'s
    /// invalidation channel: on every (re)connect it registers
    /// `CLIENT TRACKING` (before any request), hands pushes to the channel,
    /// pings itself, and marks the channel down when it breaks.
    /// `session.proto` must be RESP3.
    pub(crate) fn spawn_tracked(
        connector: Arc<Connector>,
        addr: NodeAddr,
        session: Session,
        channel: Arc<Channel>,
        health: Arc<Health>,
    ) -> MuxConn {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(supervise(
            connector,
            addr,
            session,
            rx,
            Role::Channel(channel),
            Some(health),
        ));
        MuxConn { tx }
    }

    /// Queues `count` encoded commands as one unit; the receiver yields their
    /// replies.
    ///
    /// # Errors
    /// [`Error::Closed`] if the connection task is gone.
    pub async fn submit(
        &self,
        payload: Bytes,
        count: usize,
    ) -> Result<oneshot::Receiver<Result<Replies>>> {
        self.enqueue(payload, count, false).await
    }

    /// Like [`MuxConn::submit`], for a batch the caller already gathered:
    /// the writer sends it without waiting for other requests to join.
    ///
    /// # Errors
    /// [`Error::Closed`] if the connection task is gone.
    pub async fn submit_gathered(
        &self,
        payload: Bytes,
        count: usize,
    ) -> Result<oneshot::Receiver<Result<Replies>>> {
        self.enqueue(payload, count, true).await
    }

    async fn enqueue(
        &self,
        payload: Bytes,
        count: usize,
        gathered: bool,
    ) -> Result<oneshot::Receiver<Result<Replies>>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request {
                payload,
                count,
                gathered,
                reply,
            })
            .await
            .map_err(|_| Error::Closed)?;
        Ok(rx)
    }

    /// Submits and waits.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn call(&self, payload: Bytes, count: usize) -> Result<Replies> {
        self.submit(payload, count)
            .await?
            .await
            .map_err(|_| Error::Closed)?
    }
}

/// Runs until the connection breaks (`Some(error)`) or every handle is
/// dropped (`None`). With `auth` (a rotating secret), it sends `AUTH` with
/// the current secret every [`Auth::reauth_interval`]; a refused one
/// replaces the connection as a `-READONLY` does (queued requests wait,
/// those in flight are answered first), so no request fails for it.
async fn run_connected(
    addr: &NodeAddr,
    rd: ReadHalf,
    mut wr: WriteHalf,
    rx: &mut mpsc::Receiver<Request>,
    channel: Option<&Arc<Channel>>,
    health: Option<&Arc<Health>>,
    auth: &Arc<Auth>,
) -> Option<Error> {
    let (inflight_tx, inflight_rx) = mpsc::channel::<Inflight>(INFLIGHT);
    let pongs = Arc::new(AtomicU64::new(0));
    // Requests answered (by the reader), against `sent` (by the writer).
    let done = Arc::new(AtomicU64::new(0));
    // A oneshot, not a Notify: the writer polls it in every turn of its
    // loop, and a `Notify::notified()` made anew each turn takes the
    // waiter-list lock twice per upstream write.
    let (demoted_tx, mut demoted) = oneshot::channel::<()>();
    let mut demoted_seen = false;
    let mut reader = tokio::spawn(read_loop(
        addr.clone(),
        rd,
        inflight_rx,
        channel.cloned(),
        Arc::clone(&pongs),
        Watch {
            health: health.cloned(),
            done: Arc::clone(&done),
            demoted: Some(demoted_tx),
            auth: Arc::clone(auth),
        },
    ));
    let mut sent: u64 = 0;
    // The watchdog: armed at a write while disarmed; `armed_at` is `sent`
    // then. Never armed on an unwatched connection.
    let watchdog = tokio::time::sleep(SUSPECT_AFTER);
    tokio::pin!(watchdog);
    let mut armed = false;
    let mut armed_at: u64 = 0;
    let mut wbuf = BytesMut::with_capacity(16 * 1024);
    // An optin tracking connection: its write-behind batches are kept
    // until answered, to know Redis's reports of them (`echo`), once a
    // client of the proxy tracks keys.
    let lost = |reason: String| Error::ConnectionLost {
        addr: addr.to_string(),
        reason,
    };
    // A tracking channel registers before anything else is written, so no
    // write this connection carries can predate the registration.
    let mut heartbeat = None;
    if let Some(ch) = channel {
        let entry = Inflight {
            count: 1,
            frames: Vec::with_capacity(1),
            sink: Sink::Tracking,
            payload: None,
            writes: false,
            sent: Bytes::new(),
        };
        if inflight_tx.send(entry).await.is_err() || wr.write_all(ch.handshake()).await.is_err() {
            return Some(lost("registering CLIENT TRACKING failed".into()));
        }
        sent += 1;
        let mut t = tokio::time::interval(HEARTBEAT);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat = Some(t);
    }
    let mut reauth = auth.reauth_interval().map(|every| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut pings: u64 = 0;
    let mut ping_sent = std::time::Instant::now();
    let mut gather = Gather::default();
    loop {
        let first = tokio::select! {
            biased;
            r = &mut reader => {
                return Some(match r {
                    Ok(e) => e,
                    Err(e) => lost(e.to_string()),
                });
            }
            r = &mut demoted, if !demoted_seen => {
                // Polled at most once to completion (a finished oneshot
                // must not be polled again).
                demoted_seen = true;
                if r.is_err() {
                    // The reader ended without a READONLY: the branch
                    // above reports why.
                    continue;
                }
                // Take nothing more; the reader ends once every reply in
                // flight is in (or after DRAIN_LIMIT).
                drop(inflight_tx);
                return Some(match reader.await {
                    Ok(e) => e,
                    Err(e) => lost(e.to_string()),
                });
            }
            () = &mut watchdog, if armed => {
                armed = false;
                let answered = done.load(Ordering::Acquire);
                if answered < armed_at {
                    if let Some(h) = health {
                        h.suspect();
                    }
                }
                if answered < sent {
                    watchdog.as_mut().reset(tokio::time::Instant::now() + SUSPECT_AFTER);
                    armed = true;
                    armed_at = sent;
                }
                continue;
            }
            r = rx.recv() => r,
            _ = tick(&mut reauth) => {
                let mut p = BytesMut::with_capacity(64);
                if !reauth::encode(auth, &mut p) {
                    continue;
                }
                let entry = Inflight { count: reauth::COMMANDS, frames: Vec::with_capacity(reauth::COMMANDS), sink: Sink::Reauth, payload: None, writes: false, sent: Bytes::new() };
                if inflight_tx.send(entry).await.is_err() {
                    continue;
                }
                sent += 1;
                if let Err(e) = wr.write_all(&p).await {
                    drop(inflight_tx);
                    let _ = reader.await;
                    return Some(lost(e.to_string()));
                }
                continue;
            }
            _ = tick(&mut heartbeat) => {
                if pongs.load(Ordering::Acquire) < pings {
                    // The connection is kept (closing it could let writes
                    // it carries run after their retries on a new one);
                    // the channel is down until the ping is answered.
                    if ping_sent.elapsed() >= HEARTBEAT_TIMEOUT {
                        if let Some(ch) = channel {
                            ch.set_down("heartbeat unanswered");
                        }
                    }
                    continue;
                }
                let entry = Inflight { count: 1, frames: Vec::with_capacity(1), sink: Sink::Ping, payload: None, writes: false, sent: Bytes::new() };
                if inflight_tx.send(entry).await.is_err() {
                    continue;
                }
                let mut p = BytesMut::with_capacity(16);
                encode::encode_command(&mut p, &[b"PING"]);
                pings += 1;
                sent += 1;
                ping_sent = std::time::Instant::now();
                if let Err(e) = wr.write_all(&p).await {
                    drop(inflight_tx);
                    let _ = reader.await;
                    return Some(lost(e.to_string()));
                }
                continue;
            }
        };
        let Some(first) = first else {
            drop(inflight_tx);
            let _ = wr.shutdown().await;
            let _ = reader.await;
            return None;
        };
        let mut next = Some(first);
        let mut taken = 0usize;
        let mut requests = 0usize;
        let mut before_turns = 0usize;
        let mut turns = 0usize;
        let mut gathered = false;
        loop {
            while let Some(req) = next.take() {
                wbuf.extend_from_slice(&req.payload);
                taken += req.count;
                requests += 1;
                gathered |= req.gathered;
                sent += 1;
                let entry = Inflight {
                    count: req.count,
                    frames: Vec::with_capacity(req.count),
                    sink: Sink::Caller(req.reply),
                    // Optin write-behind batches always: their echoes
                    // spare the written database (`coherence::refill`).
                    payload: channel
                        .is_some_and(|c| c.wants_echoes() || req.gathered && c.is_optin())
                        .then(|| req.payload.clone()),
                    writes: req.gathered,
                    sent: req.payload.clone(),
                };
                if let Err(mpsc::error::SendError(entry)) = inflight_tx.send(entry).await {
                    entry.sink.fail(lost("reader stopped".into()));
                }
                if wbuf.len() < MAX_WRITE {
                    next = rx.try_recv().ok();
                }
            }
            // Few commands in hand: let the runtime serve its ready
            // connections first (no timer), so requests already read from
            // other clients share this write.
            let enough = gathered || taken >= GATHER_BELOW || wbuf.len() >= MAX_WRITE;
            if enough || turns == GATHER_TURNS {
                break;
            }
            if turns == 0 {
                if !gather.turns(requests) {
                    break;
                }
                before_turns = requests;
            }
            turns += 1;
            tokio::task::yield_now().await;
            next = rx.try_recv().ok();
        }
        if turns > 0 {
            gather.brought(requests > before_turns);
        }
        if let Err(e) = wr.write_all(&wbuf).await {
            drop(inflight_tx);
            let _ = reader.await;
            return Some(lost(e.to_string()));
        }
        if !armed && health.is_some() {
            watchdog
                .as_mut()
                .reset(tokio::time::Instant::now() + SUSPECT_AFTER);
            armed = true;
            armed_at = sent;
        }
        wbuf.clear();
        if wbuf.capacity() > 4 * MAX_WRITE {
            wbuf = BytesMut::with_capacity(16 * 1024);
        }
    }
}

/// What the reader shares with the writer and the node.
struct Watch {
    health: Option<Arc<Health>>,
    /// Requests answered.
    done: Arc<AtomicU64>,
    /// Told once when the connection must reconnect (READONLY, or a
    /// refused re-authentication).
    demoted: Option<oneshot::Sender<()>>,
    /// Told how each re-authentication went.
    auth: Arc<Auth>,
}

async fn read_loop(
    addr: NodeAddr,
    mut rd: ReadHalf,
    mut inflight: mpsc::Receiver<Inflight>,
    channel: Option<Arc<Channel>>,
    pongs: Arc<AtomicU64>,
    mut watch: Watch,
) -> Error {
    let readonly_reconnects = watch
        .health
        .as_ref()
        .is_some_and(|h| h.reconnects_on_readonly());
    // Set once READONLY was read (or a re-authentication refused): the
    // end of this connection.
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut reauth_refused = false;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut scanner = Scanner::new();
    let mut current: Option<Inflight> = None;
    // Our own writes as Redis reports them back (`echo`).
    let mut echoes = echo::Echoes::new(channel.as_deref());
    // `CLIENT TRACKING` acknowledged on this connection.
    let mut registered = false;
    let lost = |reason: String| Error::ConnectionLost {
        addr: addr.to_string(),
        reason,
    };
    let err = 'outer: loop {
        loop {
            match scanner.scan(&buf) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    if frame.first() == Some(&b'>') {
                        // Out-of-band push (RESP3); not a reply.
                        if let Some(ch) = &channel {
                            ch.on_push(&frame, &echoes.own(current.as_ref()));
                        }
                        continue;
                    }
                    let mut cur = match current.take() {
                        Some(c) => c,
                        None => match inflight.try_recv() {
                            Ok(c) => c,
                            Err(_) => break 'outer lost("reply without a request".into()),
                        },
                    };
                    if crate::conn::health::node_state(&frame, &cur.sent, cur.frames.len()) {
                        if let Some(h) = &watch.health {
                            h.observe(&frame);
                        }
                        if readonly_reconnects
                            && drain_until.is_none()
                            && frame.starts_with(b"-READONLY")
                        {
                            drain_until = Some(tokio::time::Instant::now() + DRAIN_LIMIT);
                            if let Some(tx) = watch.demoted.take() {
                                let _ = tx.send(());
                            }
                        }
                    }
                    if let (Sink::Reauth, true) = (&cur.sink, cur.frames.is_empty()) {
                        // The AUTH's reply withheld: a refusal (`reauth`).
                        cur.frames.extend(reauth::withheld(&frame));
                    }
                    cur.frames.push(frame);
                    echoes.replied(&cur);
                    if cur.frames.len() >= cur.count {
                        echoes.done(&mut cur);
                        watch.done.fetch_add(1, Ordering::Release);
                        match cur.sink {
                            Sink::Caller(tx) => {
                                let _ = tx.send(Ok(cur.frames));
                            }
                            Sink::Reauth => {
                                let refused = reauth::refusal(&cur.frames);
                                watch
                                    .auth
                                    .note_reauth(&addr, refused.as_deref().map_or(Ok(()), Err));
                                if refused.is_some() && drain_until.is_none() {
                                    // Replaced as after a READONLY: nothing
                                    // more is written, what is in flight is
                                    // answered, queued requests wait.
                                    reauth_refused = true;
                                    drain_until = Some(tokio::time::Instant::now() + DRAIN_LIMIT);
                                    if let Some(tx) = watch.demoted.take() {
                                        let _ = tx.send(());
                                    }
                                }
                            }
                            Sink::Ping => {
                                pongs.fetch_add(1, Ordering::AcqRel);
                                // Back after a heartbeat timeout: nothing was
                                // lost on this connection (pushes arrive in
                                // order), and the L1 was cleared when it went
                                // down with nothing cached since.
                                if let (Some(ch), true) = (&channel, registered) {
                                    ch.set_up();
                                }
                            }
                            Sink::Tracking => {
                                let (Some(ch), Some(f)) = (&channel, cur.frames.first()) else {
                                    continue;
                                };
                                registered = ch.registered(f);
                            }
                        }
                    } else {
                        current = Some(cur);
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer Error::Protocol(e),
            }
        }
        if buf.capacity() - buf.len() < 8 * 1024 {
            buf.reserve(64 * 1024);
        }
        let read = match drain_until {
            None => rd.read_buf(&mut buf).await,
            Some(until) => {
                let demoted = || {
                    if reauth_refused {
                        lost("re-authentication refused; replaced".into())
                    } else {
                        Error::Demoted {
                            addr: addr.to_string(),
                        }
                    }
                };
                if current.is_none() {
                    match inflight.try_recv() {
                        Ok(c) => current = Some(c),
                        // The writer stopped and everything is answered.
                        Err(mpsc::error::TryRecvError::Disconnected) => break demoted(),
                        Err(mpsc::error::TryRecvError::Empty) => {}
                    }
                }
                // `read_buf` is cancel safe: bytes are only taken when read.
                tokio::select! {
                    r = rd.read_buf(&mut buf) => r,
                    c = inflight.recv(), if current.is_none() => match c {
                        Some(c) => {
                            current = Some(c);
                            continue;
                        }
                        None => break demoted(),
                    },
                    () = tokio::time::sleep_until(until) => break demoted(),
                }
            }
        };
        match read {
            Ok(0) => break lost("closed by server".into()),
            Ok(_) => {}
            Err(e) => break lost(e.to_string()),
        }
    };
    inflight.close();
    if let Some(c) = current {
        c.sink.fail(err.clone());
    }
    while let Ok(c) = inflight.try_recv() {
        c.sink.fail(err.clone());
    }
    err
}

/// The next heartbeat tick, or never.
async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}
