//! A TCP relay that adds a fixed one-way delay (and optional jitter) in each
//! direction: a network round trip, on loopback, for the network benchmark
//! (`bench/net.sh`). It accepts TCP and connects to TCP or to a Unix socket
//! ([`Upstream`]). It owns the relaying and its timing; it knows nothing
//! of RESP.
//!
//! ```text
//!  client ◀──▶ ┌ one thread: epoll (ns timeout) ───────────────────┐ ◀──▶ upstream
//!              │ read what is ready, stamp due = now + delay;      │
//!              │ heap of each direction's next deadline;           │
//!              │ sleep to due − spin, yield/spin to due,           │
//!              │ write everything due (one write per destination)  │
//!              └───────────────────────────────────────────────────┘
//! ```
//!
//! One thread reads, times and writes: no hand-off (and no wake-up of
//! another thread) per chunk, and everything due at one wake goes out in
//! that wake. Tokio's timer and `epoll_wait` are millisecond-grained, so
//! it waits in `epoll_pwait2` (a nanosecond timeout) with its timer slack
//! set to 1 ns (`/proc/TID/timerslack_ns`; the default 50 µs would make
//! every sleep overshoot): it sleeps until a spin window before the next
//! deadline (at least `spin`, wider while its sleeps end late), or until a
//! socket is ready; through the window it polls the sockets and yields the
//! CPU (`sched_yield`: on a machine whose cores the benchmarked processes
//! share, a spinning relay must not take the core they need), and it spins
//! (still polling) the last 20 µs.
//!
//! Order: a direction's deadlines never decrease (a jittered deadline
//! earlier than the one before it is raised to it), and a direction's
//! chunks leave in arrival order, so bytes leave in the order they came.
//! A FIN is relayed like data, after the bytes before it.
//!
//! Bounds: each direction holds at most [`IN_FLIGHT_BYTES`] in the relay
//! (its source is not read until bytes are out); a destination that does
//! not take bytes keeps them in that budget.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use rustix::event::{epoll, eventfd, EventfdFlags, Timespec};

mod sock;
pub mod thread;
use sock::connect_nonblocking;
pub use sock::Upstream;
use socket2::Socket;
use thread::{set_timer_slack_1ns, thread_id};

/// Bytes one direction of one connection may hold in the relay.
pub const IN_FLIGHT_BYTES: usize = 4 << 20;
/// Most the spin window grows to (see [`DelayConfig::spin`]).
const MARGIN_MAX: Duration = Duration::from_micros(400);
/// Added to a measured sleep overshoot for the spin window.
const MARGIN_PAD: Duration = Duration::from_micros(10);
/// Within this of a deadline the thread spins (polling) without yielding.
const SPIN_ONLY: Duration = Duration::from_micros(20);
/// Largest read (and so largest chunk).
const READ_SIZE: usize = 64 * 1024;
/// Events taken from one `epoll_pwait2`.
const EVENTS: usize = 256;
/// Token of the stop eventfd.
const WAKER: u64 = u64::MAX;
/// Tokens of the listeners: this bit and the route's index.
const LISTENER: u64 = 1 << 62;

/// How the relay delays.
#[derive(Debug, Clone, Copy)]
pub struct DelayConfig {
    /// One-way delay from the accepting side (client) to the connected side.
    pub forward: Duration,
    /// One-way delay back.
    pub back: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per chunk (order kept).
    pub jitter: Duration,
    /// How long before a deadline the relay stops sleeping and spins at
    /// least (it spins longer while its sleeps end late, up to 400 µs).
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
    /// Whether the relay thread's timer slack could be set to 1 ns.
    pub slack_set: AtomicBool,
    /// The relay thread's id (0 until it runs, or where it is unknown).
    pub tid: AtomicU64,
}

/// A running relay.
pub struct Relay {
    /// The addresses it listens on, one per route, in order.
    pub listen: Vec<SocketAddr>,
    /// Its counters.
    pub stats: Arc<RelayStats>,
    stop: Option<File>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// Starts a relay for each `(listen, connect)` route, all with `cfg`,
    /// on one thread of its own.
    ///
    /// # Errors
    /// When a listen address cannot be bound (or epoll cannot be set up).
    pub fn start(routes: &[(SocketAddr, Upstream)], cfg: DelayConfig) -> io::Result<Relay> {
        let stats = Arc::new(RelayStats::default());
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(
            &ep,
            &stop,
            epoll::EventData::new_u64(WAKER),
            epoll::EventFlags::IN,
        )?;
        let mut listeners = Vec::new();
        let mut listen = Vec::new();
        for (i, (l, c)) in routes.iter().enumerate() {
            let l = TcpListener::bind(l)?;
            l.set_nonblocking(true)?;
            listen.push(l.local_addr()?);
            epoll::add(
                &ep,
                &l,
                epoll::EventData::new_u64(LISTENER | i as u64),
                epoll::EventFlags::IN | epoll::EventFlags::ET,
            )?;
            listeners.push((l, c.clone()));
        }
        let st = Arc::clone(&stats);
        // The thread says when it has set itself up (its id known, its
        // timer slack set), so the counters are complete once this returns.
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || {
                let tid = thread_id();
                if let Some(tid) = tid {
                    st.tid.store(tid, Ordering::Relaxed);
                }
                if tid.is_some_and(set_timer_slack_1ns) {
                    st.slack_set.store(true, Ordering::Relaxed);
                }
                let _ = ready.send(());
                let mut lp = Loop {
                    ep,
                    cfg,
                    stats: st,
                    listeners,
                    conns: Vec::new(),
                    free: Vec::new(),
                    heap: BinaryHeap::new(),
                    seq: 0,
                    to_read: Vec::new(),
                    to_flush: Vec::new(),
                    scratch: vec![0u8; READ_SIZE],
                };
                lp.run();
            })?;
        let _ = started.recv();
        Ok(Relay {
            listen,
            stats,
            stop: Some(File::from(stop)),
            thread: Some(thread),
        })
    }
}

impl Drop for Relay {
    /// Stops accepting and relaying: connections are dropped.
    fn drop(&mut self) {
        // The eventfd stays open until the thread is gone: closing it would
        // take it out of the epoll set before the thread saw it.
        let stop = self.stop.take();
        if let Some(mut s) = stop.as_ref() {
            let _ = s.write_all(&1u64.to_ne_bytes());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        drop(stop);
    }
}

/// One direction of a connection: what was read from one socket and is to
/// be written to the other.
struct Dir {
    delay: Duration,
    /// Bytes read and not yet written: the first `due_len` are due.
    buf: BytesMut,
    due_len: usize,
    /// Chunks not yet due, in order: deadline and length (`None`: the FIN).
    pending: VecDeque<(Instant, Option<usize>)>,
    last_due: Option<Instant>,
    rng: u64,
    /// The source has ended (its FIN, or an error): nothing more to read.
    eof: bool,
    /// The FIN is due (after the `due_len` bytes).
    fin_due: bool,
    /// FIN written or destination gone: this direction is over.
    done: bool,
    /// The destination took less than offered: wait for it to be writable.
    blocked: bool,
    /// Listed in `Loop::to_flush`.
    flushing: bool,
}

impl Dir {
    fn new(delay: Duration, rng: u64) -> Dir {
        Dir {
            delay,
            buf: BytesMut::new(),
            due_len: 0,
            pending: VecDeque::new(),
            last_due: None,
            rng,
            eof: false,
            fin_due: false,
            done: false,
            blocked: false,
            flushing: false,
        }
    }
}

/// A relayed connection: socket 0 the client (accepted), 1 upstream;
/// direction `d` reads socket `d` and writes socket `1 - d`.
struct Conn {
    gen: u32,
    socks: [Socket; 2],
    dirs: [Dir; 2],
    /// Socket `i` may have bytes to read (an edge seen, not read dry).
    readable: [bool; 2],
    /// Listed in `Loop::to_read`.
    reading: [bool; 2],
    /// Socket `i`'s peer has closed (RDHUP, HUP or ERR seen): a short read
    /// does not mean read dry, the end of the stream is still to be read.
    closed: [bool; 2],
}

/// A direction of a connection: slot, generation, direction.
type DirRef = (u32, u32, u8);

struct Loop {
    ep: OwnedFd,
    cfg: DelayConfig,
    stats: Arc<RelayStats>,
    listeners: Vec<(TcpListener, Upstream)>,
    conns: Vec<Option<Conn>>,
    free: Vec<u32>,
    /// Each direction with chunks not yet due: its next deadline (one entry
    /// per such direction; `seq` keeps equal deadlines in arrival order).
    heap: BinaryHeap<Reverse<(Instant, u64, DirRef)>>,
    seq: u64,
    /// Sockets to read: slot, generation, socket.
    to_read: Vec<DirRef>,
    /// Directions with due bytes to write.
    to_flush: Vec<DirRef>,
    scratch: Vec<u8>,
}

fn token(slot: u32, gen: u32, side: u8) -> u64 {
    (u64::from(gen & 0x3fff_ffff) << 32) | (u64::from(slot) << 1) | u64::from(side)
}

impl Loop {
    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(EVENTS);
        // Spin window: at least `spin`, more while sleeps overshoot.
        let mut margin = self.cfg.spin;
        loop {
            let now = Instant::now();
            self.due(now);
            self.flush();
            let now = Instant::now();
            let wait = self
                .heap
                .peek()
                .map(|Reverse((due, _, _))| due.saturating_duration_since(now));
            // How long to wait in epoll, and whether to yield first.
            let (timeout, nap) = match wait {
                None => (None, false),
                Some(w) if w > margin => (Some(w - margin), true),
                Some(w) if w > SPIN_ONLY => {
                    // Yielding, not sleeping, through the window: under
                    // load (1 CPU, 50 connections, 250 µs) chunks were
                    // written 39–41 µs late on average this way and 71–88
                    // µs late sleeping to 20 µs before the deadline.
                    std::thread::yield_now();
                    (Some(Duration::ZERO), false)
                }
                Some(_) => {
                    std::hint::spin_loop();
                    (Some(Duration::ZERO), false)
                }
            };
            let ts = timeout.map(|t| Timespec {
                tv_sec: t.as_secs() as _,
                tv_nsec: t.subsec_nanos() as _,
            });
            events.clear();
            let r = epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                ts.as_ref(),
            );
            let woke = Instant::now();
            match r {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            if nap && events.is_empty() {
                if let Some(t) = timeout {
                    // How late the sleep ended: the margin follows the
                    // worst recent overshoot (a decaying maximum), so a
                    // machine that wakes late spins longer, not writes late.
                    let over = woke.saturating_duration_since(now + t) + MARGIN_PAD;
                    margin = over
                        .max(margin.mul_f64(0.99))
                        .clamp(self.cfg.spin, MARGIN_MAX);
                }
            }
            for ev in events.iter() {
                let (data, flags) = (ev.data.u64(), ev.flags);
                if data == WAKER {
                    return;
                }
                if data & LISTENER != 0 {
                    self.accept((data & !LISTENER) as usize);
                    continue;
                }
                let (slot, gen, side) = (
                    ((data & 0xffff_ffff) >> 1) as u32,
                    (data >> 32) as u32,
                    (data & 1) as u8,
                );
                let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                    continue;
                };
                if c.gen & 0x3fff_ffff != gen {
                    continue;
                }
                let s = usize::from(side);
                if flags.intersects(
                    epoll::EventFlags::IN | epoll::EventFlags::HUP | epoll::EventFlags::ERR,
                ) {
                    c.readable[s] = true;
                    if flags.intersects(
                        epoll::EventFlags::RDHUP | epoll::EventFlags::HUP | epoll::EventFlags::ERR,
                    ) {
                        c.closed[s] = true;
                    }
                    if !c.reading[s] {
                        c.reading[s] = true;
                        self.to_read.push((slot, c.gen, side));
                    }
                }
                if flags.intersects(
                    epoll::EventFlags::OUT | epoll::EventFlags::HUP | epoll::EventFlags::ERR,
                ) {
                    // The direction writing to this socket.
                    let d = &mut c.dirs[1 - s];
                    if d.blocked && !d.flushing {
                        d.flushing = true;
                        self.to_flush.push((slot, c.gen, 1 - side));
                    }
                }
            }
            // Stamp with the time the readiness was seen.
            self.read_ready(woke);
        }
    }

    fn accept(&mut self, route: usize) {
        loop {
            let Some((l, connect)) = self.listeners.get(route) else {
                return;
            };
            let client = match l.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // WouldBlock (or a failed accept)
            };
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            let Ok(upstream) = connect_nonblocking(connect) else {
                continue; // dropping `client` closes it
            };
            let _ = self.add_conn(client, upstream);
        }
    }

    fn add_conn(&mut self, client: TcpStream, upstream: Socket) -> io::Result<()> {
        client.set_nonblocking(true)?;
        client.set_nodelay(true)?;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as u32
            }
        };
        let gen = self.seq as u32 & 0x3fff_ffff;
        self.seq += 1;
        let seed = (u64::from(slot) << 32 | u64::from(gen)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let flags = epoll::EventFlags::IN
            | epoll::EventFlags::OUT
            | epoll::EventFlags::RDHUP
            | epoll::EventFlags::ET;
        for (side, fd) in [(0u8, client.as_fd()), (1, upstream.as_fd())] {
            if let Err(e) = epoll::add(
                &self.ep,
                fd,
                epoll::EventData::new_u64(token(slot, gen, side)),
                flags,
            ) {
                self.free.push(slot);
                return Err(e.into());
            }
        }
        self.conns[slot as usize] = Some(Conn {
            gen,
            socks: [Socket::from(client), upstream],
            dirs: [
                Dir::new(self.cfg.forward, seed),
                Dir::new(self.cfg.back, seed ^ 0xABCD),
            ],
            // The client may have sent already; the first edge may be gone.
            readable: [true, false],
            reading: [true, false],
            closed: [false, false],
        });
        self.to_read.push((slot, gen, 0));
        Ok(())
    }

    /// Reads every socket listed readable (within its direction's budget),
    /// stamping each chunk `now + delay (+ jitter)`.
    fn read_ready(&mut self, now: Instant) {
        let jitter_ns = self.cfg.jitter.as_nanos() as u64;
        let mut i = 0;
        while i < self.to_read.len() {
            let (slot, gen, side) = self.to_read[i];
            i += 1;
            let Some(c) = live(&mut self.conns, slot, gen) else {
                continue;
            };
            let s = usize::from(side);
            c.reading[s] = false;
            let d = &mut c.dirs[s];
            if d.eof || d.done {
                c.readable[s] = false;
                continue;
            }
            let room = IN_FLIGHT_BYTES.saturating_sub(d.buf.len());
            if !c.readable[s] || room == 0 {
                continue; // full: read again when bytes go out
            }
            let want = room.min(READ_SIZE);
            let r = (&c.socks[s]).read(&mut self.scratch[..want]);
            let n = match r {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.readable[s] = false;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    c.reading[s] = true;
                    self.to_read.push((slot, gen, side));
                    continue;
                }
                Err(_) => 0, // reset: relayed as the end of the stream
            };
            let mut due = now + d.delay;
            if jitter_ns > 0 {
                // xorshift64: enough randomness for a delay, no dependency.
                d.rng ^= d.rng << 13;
                d.rng ^= d.rng >> 7;
                d.rng ^= d.rng << 17;
                due += Duration::from_nanos(d.rng % (jitter_ns + 1));
            }
            if let Some(last) = d.last_due {
                due = due.max(last);
            }
            d.last_due = Some(due);
            if n == 0 {
                d.eof = true;
                c.readable[s] = false;
                d.pending.push_back((due, None));
            } else {
                d.buf.extend_from_slice(&self.scratch[..n]);
                d.pending.push_back((due, Some(n)));
                if n < want && !c.closed[s] {
                    // Read dry: the next bytes (or the FIN) bring a new edge.
                    c.readable[s] = false;
                } else {
                    c.reading[s] = true;
                    self.to_read.push((slot, gen, side));
                }
            }
            if d.pending.len() == 1 {
                self.seq += 1;
                self.heap.push(Reverse((due, self.seq, (slot, gen, side))));
            }
        }
        self.to_read.clear();
    }

    /// Moves every chunk due by `now` to its direction's bytes to write.
    fn due(&mut self, now: Instant) {
        while let Some(&Reverse((due, _, (slot, gen, side)))) = self.heap.peek() {
            if due > now {
                break;
            }
            self.heap.pop();
            let Some(c) = live(&mut self.conns, slot, gen) else {
                continue;
            };
            let d = &mut c.dirs[usize::from(side)];
            let (mut n, mut late_sum, mut late_max) = (0u64, 0u64, 0u64);
            while let Some(&(t, len)) = d.pending.front() {
                if t > now {
                    self.seq += 1;
                    self.heap.push(Reverse((t, self.seq, (slot, gen, side))));
                    break;
                }
                d.pending.pop_front();
                match len {
                    Some(len) => d.due_len += len,
                    None => d.fin_due = true,
                }
                let late = now.duration_since(t).as_nanos() as u64;
                late_sum += late;
                late_max = late_max.max(late);
                n += 1;
            }
            if n > 0 {
                self.stats.chunks.fetch_add(n, Ordering::Relaxed);
                self.stats
                    .late_ns_sum
                    .fetch_add(late_sum, Ordering::Relaxed);
                self.stats
                    .late_ns_max
                    .fetch_max(late_max, Ordering::Relaxed);
            }
            if !d.flushing {
                d.flushing = true;
                self.to_flush.push((slot, gen, side));
            }
        }
    }

    /// Writes each listed direction's due bytes (one write each), its FIN
    /// after them; closes connections that are over both ways.
    fn flush(&mut self) {
        let mut i = 0;
        while i < self.to_flush.len() {
            let (slot, gen, side) = self.to_flush[i];
            i += 1;
            let Some(c) = live(&mut self.conns, slot, gen) else {
                continue;
            };
            let s = usize::from(side);
            let mut dest = &c.socks[1 - s];
            let d = &mut c.dirs[s];
            d.flushing = false;
            let mut freed = false;
            while d.due_len > 0 && !d.done {
                match dest.write(&d.buf[..d.due_len]) {
                    Ok(n) => {
                        d.buf.advance(n);
                        d.due_len -= n;
                        freed = true;
                        self.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                        // A short write: the next one says whether it is
                        // full (WouldBlock, then an EPOLLOUT edge follows).
                        d.blocked = false;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        d.blocked = true;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // The peer is gone: so is the connection, both
                        // ways (reading this socket now ends, which ends
                        // the other direction).
                        let _ = dest.shutdown(Shutdown::Both);
                        d.buf.clear();
                        d.due_len = 0;
                        d.pending.clear();
                        d.done = true;
                        d.eof = true;
                        freed = true;
                        let o = 1 - s;
                        c.readable[o] = true;
                        if !c.reading[o] {
                            c.reading[o] = true;
                            self.to_read.push((slot, gen, 1 - side));
                        }
                    }
                }
            }
            if d.due_len == 0 && d.fin_due && !d.done {
                // A FIN: the bytes before it are out.
                let _ = dest.shutdown(Shutdown::Write);
                d.done = true;
            }
            if freed && c.readable[s] && !c.reading[s] && !d.eof {
                // Room again in the budget of a reader that had stopped.
                c.reading[s] = true;
                self.to_read.push((slot, gen, side));
            }
            if c.dirs[0].done && c.dirs[1].done {
                // Both ways over: close (dropping the sockets leaves epoll).
                self.conns[slot as usize] = None;
                self.free.push(slot);
            }
        }
        self.to_flush.clear();
        if !self.to_read.is_empty() {
            // Readers freed by this flush (or ended by a dead peer).
            self.read_ready(Instant::now());
            self.due(Instant::now());
            if !self.to_flush.is_empty() {
                self.flush();
            }
        }
    }
}

/// The connection in `slot`, if it is still the one of generation `gen`
/// (a slot is reused once its connection closes).
fn live(conns: &mut [Option<Conn>], slot: u32, gen: u32) -> Option<&mut Conn> {
    conns
        .get_mut(slot as usize)?
        .as_mut()
        .filter(|c| c.gen == gen)
}
