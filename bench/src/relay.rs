//! A TCP relay that adds a fixed one-way delay (and optional jitter) in each
//! direction: a network round trip, on loopback, for the network benchmark
//! (`bench/net.sh`). It owns the relaying and its timing; it knows nothing
//! of RESP.
//!
//! ```text
//!  client ──▶ reader task (tokio) ──stamp: due = now + delay──┐
//!                                                             ▼
//!                                   clock thread: heap by (due, seq),
//!                                   sleeps to due − spin, spins to due,
//!                                   then writes (non-blocking) ──▶ upstream
//!  client ◀── (non-blocking write) ◀── clock thread ◀── reader task ◀── upstream
//! ```
//!
//! Why a thread of its own: tokio's timer has millisecond granularity, so
//! a 100 µs delay cannot be a `tokio::time::sleep`. The clock thread sets
//! its timer slack to 1 ns (`/proc/TID/timerslack_ns`; the default 50 µs
//! would make every sleep overshoot), sleeps until a spin window before a
//! chunk is due (at least `spin`, wider while sleeps end late), then waits
//! out the window yielding the CPU (`sched_yield`: on a machine whose cores
//! the benchmarked processes share, a spinning relay must not take the
//! core they need) and spins the last 20 µs, and writes the chunk itself,
//! so no wake-up of another thread stands between the deadline and the
//! write.
//!
//! Order: a direction's deadlines never decrease (a jittered deadline
//! earlier than the one before it is raised to it), and chunks with equal
//! deadlines leave in arrival order, so bytes leave in the order they came.
//! A FIN is relayed like data, after the bytes before it.
//!
//! Bounds: each direction holds at most [`IN_FLIGHT_BYTES`] in the relay
//! (its reader stops reading until the clock thread has written them out);
//! a destination that does not take bytes keeps them in that budget.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream as StdTcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Bytes one direction of one connection may hold in the relay.
pub const IN_FLIGHT_BYTES: usize = 4 << 20;
/// Most the clock thread's spin window grows to (see [`DelayConfig::spin`]).
const MARGIN_MAX: Duration = Duration::from_micros(400);
/// Added to a measured sleep overshoot for the spin window.
const MARGIN_PAD: Duration = Duration::from_micros(10);
/// Within this of a deadline the clock thread spins without yielding.
const SPIN_ONLY: Duration = Duration::from_micros(20);
/// Largest read (and so largest chunk).
const READ_SIZE: usize = 64 * 1024;

/// How the relay delays.
#[derive(Debug, Clone, Copy)]
pub struct DelayConfig {
    /// One-way delay from the accepting side (client) to the connected side.
    pub forward: Duration,
    /// One-way delay back.
    pub back: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per chunk (order kept).
    pub jitter: Duration,
    /// How long before a deadline the clock thread stops sleeping and spins
    /// at least (it spins longer while its sleeps end late, up to 400 µs).
    pub spin: Duration,
}

impl DelayConfig {
    /// The same delay both ways, no jitter, a 50 µs spin.
    pub fn symmetric(one_way: Duration) -> DelayConfig {
        DelayConfig {
            forward: one_way,
            back: one_way,
            jitter: Duration::ZERO,
            spin: Duration::from_micros(50),
        }
    }
}

/// Counters of a relay.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Chunks written out.
    pub chunks: AtomicU64,
    /// Bytes written out.
    pub bytes: AtomicU64,
    /// Sum of how late chunks were written past their deadline, ns.
    pub late_ns_sum: AtomicU64,
    /// Latest a chunk was written past its deadline, ns.
    pub late_ns_max: AtomicU64,
    /// Whether the clock thread's timer slack could be set to 1 ns.
    pub slack_set: AtomicBool,
}

/// One direction's destination, written by the clock thread only.
struct Dest {
    id: u64,
    sock: StdTcpStream,
    /// The in-flight budget of the direction writing here.
    budget: Arc<Semaphore>,
}

/// A chunk on its way: `data` empty means "relay the FIN".
struct Chunk {
    due: Instant,
    seq: u64,
    dest: Arc<Dest>,
    data: Bytes,
}

impl PartialEq for Chunk {
    fn eq(&self, o: &Self) -> bool {
        self.due == o.due && self.seq == o.seq
    }
}
impl Eq for Chunk {}
impl PartialOrd for Chunk {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Chunk {
    /// Reversed: the heap's top is the earliest deadline, then the first sent.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        o.due.cmp(&self.due).then(o.seq.cmp(&self.seq))
    }
}

/// A running relay.
pub struct Relay {
    /// The addresses it listens on, one per route, in order.
    pub listen: Vec<SocketAddr>,
    /// Its counters.
    pub stats: Arc<RelayStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    io: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Starts a relay for each `(listen, connect)` route, all with `cfg`,
    /// on two threads of its own (tokio I/O, clock).
    ///
    /// # Errors
    /// When a listen address cannot be bound.
    pub fn start(routes: &[(SocketAddr, SocketAddr)], cfg: DelayConfig) -> io::Result<Relay> {
        let stats = Arc::new(RelayStats::default());
        let (tx, rx) = mpsc::channel::<Chunk>();
        {
            let stats = Arc::clone(&stats);
            std::thread::Builder::new()
                .name("relay-clock".into())
                .spawn(move || clock(rx, cfg.spin, &stats))?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut listeners = Vec::new();
        let mut listen = Vec::new();
        for &(l, c) in routes {
            let std_l = std::net::TcpListener::bind(l)?;
            std_l.set_nonblocking(true)?;
            listen.push(std_l.local_addr()?);
            listeners.push((std_l, c));
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = Arc::clone(&stats);
        let io = std::thread::Builder::new()
            .name("relay-io".into())
            .spawn(move || {
                rt.block_on(async move {
                    let ids = Arc::new(AtomicU64::new(0));
                    for (l, connect) in listeners {
                        let Ok(l) = TcpListener::from_std(l) else {
                            continue;
                        };
                        let (tx, st, ids) = (tx.clone(), Arc::clone(&st), Arc::clone(&ids));
                        tokio::spawn(accept_loop(l, connect, cfg, tx, st, ids));
                    }
                    drop(tx);
                    let _ = stop_rx.await;
                });
            })?;
        Ok(Relay {
            listen,
            stats,
            stop: Some(stop_tx),
            io: Some(io),
        })
    }
}

impl Drop for Relay {
    /// Stops accepting and relaying: connections are dropped.
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(io) = self.io.take() {
            let _ = io.join();
        }
    }
}

async fn accept_loop(
    l: TcpListener,
    connect: SocketAddr,
    cfg: DelayConfig,
    tx: mpsc::Sender<Chunk>,
    stats: Arc<RelayStats>,
    ids: Arc<AtomicU64>,
) {
    loop {
        let Ok((client, _)) = l.accept().await else {
            continue;
        };
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let (tx, ids) = (tx.clone(), Arc::clone(&ids));
        tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect(connect).await else {
                return; // dropping `client` closes it
            };
            let _ = pair(client, upstream, cfg, tx, &ids);
        });
    }
}

/// Starts both directions of one relayed connection.
fn pair(
    client: TcpStream,
    upstream: TcpStream,
    cfg: DelayConfig,
    tx: mpsc::Sender<Chunk>,
    ids: &AtomicU64,
) -> io::Result<()> {
    client.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    let c = client.into_std()?;
    let u = upstream.into_std()?;
    // Each socket: read by one direction's task, written (a non-blocking
    // clone) by the clock thread for the other direction.
    let to_client = Arc::new(Dest {
        id: ids.fetch_add(1, Ordering::Relaxed),
        sock: c.try_clone()?,
        budget: Arc::new(Semaphore::new(IN_FLIGHT_BYTES)),
    });
    let to_upstream = Arc::new(Dest {
        id: ids.fetch_add(1, Ordering::Relaxed),
        sock: u.try_clone()?,
        budget: Arc::new(Semaphore::new(IN_FLIGHT_BYTES)),
    });
    let (c, u) = (TcpStream::from_std(c)?, TcpStream::from_std(u)?);
    let seed = to_client.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    tokio::spawn(direction(
        c,
        to_upstream,
        cfg.forward,
        cfg.jitter,
        tx.clone(),
        seed,
    ));
    tokio::spawn(direction(
        u,
        to_client,
        cfg.back,
        cfg.jitter,
        tx,
        seed ^ 0xABCD,
    ));
    Ok(())
}

/// Reads `from` and hands each chunk to the clock thread, due after `delay`.
async fn direction(
    mut from: TcpStream,
    to: Arc<Dest>,
    delay: Duration,
    jitter: Duration,
    tx: mpsc::Sender<Chunk>,
    mut rng: u64,
) {
    let mut buf = BytesMut::with_capacity(READ_SIZE);
    let mut last_due: Option<Instant> = None;
    let mut seq_base = to.id << 40;
    let jitter_ns = jitter.as_nanos() as u64;
    loop {
        buf.reserve(READ_SIZE);
        let n = from.read_buf(&mut buf).await.unwrap_or(0);
        let now = Instant::now();
        let mut due = now + delay;
        if jitter_ns > 0 {
            // xorshift64: enough randomness for a delay, no dependency.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            due += Duration::from_nanos(rng % (jitter_ns + 1));
        }
        if let Some(last) = last_due {
            due = due.max(last);
        }
        last_due = Some(due);
        let data = buf.split().freeze();
        if n > 0 {
            // Room in the budget first: a destination that takes nothing
            // stops this reader, not the relay's memory bound.
            let Ok(p) = to.budget.acquire_many(n as u32).await else {
                return;
            };
            p.forget();
        }
        seq_base += 1;
        let chunk = Chunk {
            due,
            seq: seq_base,
            dest: Arc::clone(&to),
            data,
        };
        if tx.send(chunk).is_err() || n == 0 {
            return;
        }
    }
}

/// What a destination still has to take: its chunks' bytes in order.
type Backlog = VecDeque<Bytes>;

/// The clock thread: writes every chunk at its deadline.
fn clock(rx: mpsc::Receiver<Chunk>, spin: Duration, stats: &RelayStats) {
    if set_timer_slack_1ns() {
        stats.slack_set.store(true, Ordering::Relaxed);
    }
    let mut heap: BinaryHeap<Chunk> = BinaryHeap::new();
    let mut blocked: HashMap<u64, (Arc<Dest>, Backlog)> = HashMap::new();
    // A destination that would not take bytes is tried again this often.
    let retry = Duration::from_micros(50);
    // Spin window: at least `spin`, more while sleeps overshoot.
    let mut margin = spin;
    loop {
        loop {
            match rx.try_recv() {
                Ok(c) => heap.push(c),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) if heap.is_empty() => return,
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
        }
        if !blocked.is_empty() {
            blocked.retain(|_, (dest, backlog)| !drain(dest, backlog));
        }
        let now = Instant::now();
        while heap.peek().is_some_and(|c| c.due <= now) {
            let Some(c) = heap.pop() else { break };
            let late = now.duration_since(c.due).as_nanos() as u64;
            stats.late_ns_sum.fetch_add(late, Ordering::Relaxed);
            stats.late_ns_max.fetch_max(late, Ordering::Relaxed);
            stats.chunks.fetch_add(1, Ordering::Relaxed);
            stats
                .bytes
                .fetch_add(c.data.len() as u64, Ordering::Relaxed);
            match blocked.get_mut(&c.dest.id) {
                Some((_, backlog)) => backlog.push_back(c.data),
                None => {
                    let mut backlog = Backlog::from([c.data]);
                    if !drain(&c.dest, &mut backlog) {
                        blocked.insert(c.dest.id, (c.dest, backlog));
                    }
                }
            }
        }
        let wait = match heap.peek() {
            Some(c) => c.due.saturating_duration_since(Instant::now()),
            None if blocked.is_empty() => match rx.recv() {
                Ok(c) => {
                    heap.push(c);
                    continue;
                }
                Err(_) => return,
            },
            None => retry,
        };
        let wait = if blocked.is_empty() {
            wait
        } else {
            wait.min(retry)
        };
        if wait > margin {
            let nap = wait - margin;
            let woke = Instant::now() + nap;
            match rx.recv_timeout(nap) {
                Ok(c) => heap.push(c),
                Err(_) => {
                    // How late the sleep ended: the margin follows the
                    // worst recent overshoot (a decaying maximum), so a
                    // machine that wakes late spins longer, not writes late.
                    let over = Instant::now().saturating_duration_since(woke) + MARGIN_PAD;
                    margin = over.max(margin.mul_f64(0.99)).clamp(spin, MARGIN_MAX);
                }
            }
        } else if wait > SPIN_ONLY {
            // Runnable threads of the benchmarked processes on this core
            // go first: the relay's precision must not cost them CPU.
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Sets this thread's timer slack to 1 ns: `/proc/TID/timerslack_ns` of
/// this thread (`/proc/thread-self` names it; its own directory has no
/// `timerslack_ns`). Linux only; `false` where it fails.
fn set_timer_slack_1ns() -> bool {
    let Ok(link) = std::fs::read_link("/proc/thread-self") else {
        return false;
    };
    let Some(tid) = link.file_name().and_then(|t| t.to_str()) else {
        return false;
    };
    std::fs::write(format!("/proc/{tid}/timerslack_ns"), "1").is_ok()
}

/// Writes what it can of `backlog` to `dest` without blocking; `true` when
/// all of it went (or the destination is gone: its bytes are dropped).
fn drain(dest: &Dest, backlog: &mut Backlog) -> bool {
    while let Some(front) = backlog.front_mut() {
        if front.is_empty() {
            // A FIN: the bytes before it are out.
            let _ = dest.sock.shutdown(Shutdown::Write);
            backlog.pop_front();
            continue;
        }
        match (&dest.sock).write(front) {
            Ok(n) => {
                dest.budget.add_permits(n);
                let _ = front.split_to(n);
                if front.is_empty() {
                    backlog.pop_front();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // The peer is gone: so is the connection, both ways (the
                // reader of this socket sees it and stops).
                let _ = dest.sock.shutdown(Shutdown::Both);
                let held: usize = backlog.iter().map(Bytes::len).sum();
                dest.budget.add_permits(held);
                backlog.clear();
                return true;
            }
        }
    }
    true
}
