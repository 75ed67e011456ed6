//! The soak's load: the normal workload and each kind of abuse, one task
//! each, run until told to stop.

use super::*;

pub(super) fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

pub(super) async fn read_frame(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    scanner: &mut Scanner,
) -> std::io::Result<BytesMut> {
    loop {
        match scanner.scan(buf) {
            Ok(Some(n)) => return Ok(buf.split_to(n)),
            Ok(None) => {}
            Err(_) => return Err(bad("bad RESP")),
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        if s.read_buf(buf).await? == 0 {
            return Err(bad("closed"));
        }
    }
}

pub(super) async fn connect(addr: &str, within: Duration) -> std::io::Result<TcpStream> {
    let s = tokio::time::timeout(within, TcpStream::connect(addr))
        .await
        .map_err(|_| bad("connect timed out"))??;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Ready once the stop flag is set.
pub(super) async fn stopped(rx: &mut watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// One normal window's figures.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) hist: Histogram,
    pub(super) errors: u64,
}

pub(super) async fn normal_client(
    c: usize,
    a: Arc<Args>,
    phase: Arc<AtomicU8>,
    k: Arc<Counters>,
) -> [Stats; 4] {
    let mut rng = Rng::new(c as u64 + 1);
    let value = vec![b'v'; a.data_size];
    let mut stats: [Stats; 4] = Default::default();
    let mut out = Vec::with_capacity(256);
    // Paced: one request per `every`, on a schedule that does not slip.
    let every = (a.normal_rate > 0)
        .then(|| Duration::from_secs_f64(a.normal_clients as f64 / a.normal_rate as f64));
    let mut due = tokio::time::Instant::now();
    while phase.load(Relaxed) < DONE {
        let mut s = match connect(&a.addr, Duration::from_secs(5)).await {
            Ok(s) => s,
            Err(_) => {
                if let Some(w) = window(phase.load(Relaxed)) {
                    stats[w].errors += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let mut scanner = Scanner::new();
        loop {
            let p = phase.load(Relaxed);
            if p >= DONE {
                break;
            }
            if let Some(every) = every {
                // Behind by more than 100 ms (a stall): start afresh
                // rather than burst.
                due = (due + every).max(tokio::time::Instant::now() - Duration::from_millis(100));
                tokio::time::sleep_until(due).await;
            }
            let key = format!("soak:n:{}", rng.below(a.keyspace));
            let set = rng.below(100) < a.set_percent;
            out.clear();
            if set {
                command(&mut out, &[b"SET", key.as_bytes(), &value]);
            } else {
                command(&mut out, &[b"GET", key.as_bytes()]);
            }
            let t = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(5), async {
                s.write_all(&out).await?;
                read_frame(&mut s, &mut buf, &mut scanner).await
            })
            .await;
            let d = t.elapsed();
            let ok = match &r {
                Ok(Ok(f)) if set => &f[..] == b"+OK\r\n",
                Ok(Ok(f)) => f.starts_with(b"$"),
                _ => false,
            };
            if let Some(w) = window(p) {
                if ok {
                    k.normal_ok.fetch_add(1, Relaxed);
                    stats[w].hist.record(d);
                } else {
                    stats[w].errors += 1;
                }
            }
            k.normal_ops.fetch_add(1, Relaxed);
            if !matches!(r, Ok(Ok(_))) {
                break; // reconnect
            }
        }
    }
    stats
}

pub(super) async fn ping(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    sc: &mut Scanner,
) -> std::io::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), async {
        s.write_all(b"PING\r\n").await?;
        let f = read_frame(s, buf, sc).await?;
        if &f[..] != b"+PONG\r\n" {
            return Err(bad("not PONG"));
        }
        Ok(())
    })
    .await
    .map_err(|_| bad("PING timed out"))?
}

pub(super) async fn idle_conn(
    i: usize,
    a: Arc<Args>,
    mut stop: watch::Receiver<bool>,
    k: Arc<Counters>,
    gate: Arc<Semaphore>,
) {
    let mut rng = Rng::new(10_000 + i as u64);
    let mut buf = BytesMut::with_capacity(64);
    while !*stop.borrow() {
        let permit = gate.acquire().await;
        let mut s = match connect(&a.addr, Duration::from_secs(5)).await {
            Ok(s) => s,
            Err(_) => {
                k.idle_connect_errors.fetch_add(1, Relaxed);
                drop(permit);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        buf.clear();
        let mut scanner = Scanner::new();
        if ping(&mut s, &mut buf, &mut scanner).await.is_err() {
            k.idle_connect_errors.fetch_add(1, Relaxed);
            drop(permit);
            continue;
        }
        drop(permit);
        k.idle_open.fetch_add(1, Relaxed);
        loop {
            // Uniform in [0.2, 1.8] × the mean.
            let ms = (a.idle_ping_secs * 1000.0 * (0.2 + rng.below(1600) as f64 / 1000.0)) as u64;
            tokio::select! {
                _ = stopped(&mut stop) => {
                    k.idle_open.fetch_sub(1, Relaxed);
                    return;
                }
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            }
            if ping(&mut s, &mut buf, &mut scanner).await.is_err() {
                k.idle_dropped.fetch_add(1, Relaxed);
                k.idle_open.fetch_sub(1, Relaxed);
                break;
            }
            k.idle_pings.fetch_add(1, Relaxed);
        }
    }
}

pub(super) async fn slow_reader(
    i: usize,
    a: Arc<Args>,
    mut stop: watch::Receiver<bool>,
    k: Arc<Counters>,
) {
    let mut gets = Vec::new();
    for _ in 0..a.slow_depth {
        command(&mut gets, &[b"GET", a.slow_key.as_bytes()]);
    }
    let reads = i % 2 == 1;
    while !*stop.borrow() {
        let s = match connect(&a.addr, Duration::from_secs(5)).await {
            Ok(s) => s,
            Err(_) => {
                k.slow_errors.fetch_add(1, Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        k.slow_connected.fetch_add(1, Relaxed);
        let (mut r, mut w) = s.into_split();
        let writer = async {
            loop {
                w.write_all(&gets).await?;
                k.slow_gets_sent.fetch_add(a.slow_depth as u64, Relaxed);
            }
            #[allow(unreachable_code)]
            Ok::<(), std::io::Error>(())
        };
        let reader = async {
            if !reads {
                return std::future::pending::<std::io::Result<()>>().await;
            }
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let n = r.read(&mut buf).await?;
                if n == 0 {
                    return Err(bad("closed"));
                }
                k.slow_bytes_read.fetch_add(n as u64, Relaxed);
            }
        };
        let r: std::io::Result<()> = tokio::select! {
            _ = stopped(&mut stop) => return,
            r = writer => r,
            r = reader => r,
        };
        if r.is_err() {
            k.slow_errors.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What a garbage client of `kind` sends, and how long it waits for an
/// answer before closing.
pub(super) fn garbage_payload(kind: usize, rng: &mut Rng) -> (Vec<u8>, Duration) {
    let mut out = Vec::new();
    match kind {
        0 => {
            // Random bytes: mostly short, some past the inline limit
            // without a newline, some starting as a multibulk.
            let n = match rng.below(10) {
                0 => 64 * 1024 + rng.below(16 * 1024) as usize,
                1..=3 => 1 + rng.below(16 * 1024) as usize,
                _ => 1 + rng.below(512) as usize,
            };
            if rng.below(4) == 0 {
                out.push(b'*');
            }
            rng.fill(&mut out, n);
            (out, Duration::from_millis(200))
        }
        1 => {
            // A valid command, cut at a random byte.
            let mut full = Vec::new();
            match rng.below(4) {
                0 => {
                    let mut v = Vec::new();
                    let n = rng.below(64 * 1024) as usize;
                    rng.fill(&mut v, n);
                    command(&mut full, &[b"SET", b"soak:trunc", &v]);
                }
                1 => {
                    let keys: Vec<String> = (0..10).map(|j| format!("soak:n:{j}")).collect();
                    let mut args: Vec<&[u8]> = vec![b"MGET"];
                    args.extend(keys.iter().map(|k| k.as_bytes()));
                    command(&mut full, &args);
                }
                2 => command(&mut full, &[b"GET", b"soak:n:1"]),
                _ => command(
                    &mut full,
                    &[b"MSET", b"soak:trunc:a", b"1", b"soak:trunc:b", b"2"],
                ),
            }
            let cut = 1 + rng.below(full.len() as u64 - 1) as usize;
            full.truncate(cut);
            // Half close at once, half wait for an answer that never comes.
            let wait = if rng.below(2) == 0 { 0 } else { 300 };
            (full, Duration::from_millis(wait))
        }
        _ => {
            // 512 MB bulk headers (the default --proto-max-bulk-len, so
            // accepted), one byte more (refused), huge multibulk counts;
            // then part of the payload.
            let header: &[u8] = match rng.below(5) {
                0 => b"*1\r\n$536870912\r\n",
                1 => b"*3\r\n$3\r\nSET\r\n$9\r\nsoak:bulk\r\n$536870912\r\n",
                2 => b"*1\r\n$536870913\r\n",
                3 => b"*536870912\r\n$3\r\nGET\r\n",
                _ => b"*2\r\n$3\r\nGET\r\n$536870912\r\n",
            };
            out.extend_from_slice(header);
            let n = rng.below(256 * 1024) as usize;
            out.resize(out.len() + n, b'x');
            (out, Duration::from_millis(1000))
        }
    }
}

pub(super) async fn garbage(
    kind: usize,
    i: usize,
    a: Arc<Args>,
    mut stop: watch::Receiver<bool>,
    k: Arc<Counters>,
) {
    let mut rng = Rng::new(20_000 + (kind * 1000 + i) as u64);
    let mut buf = vec![0u8; 64 * 1024];
    while !*stop.borrow() {
        let mut s = match connect(&a.addr, Duration::from_secs(2)).await {
            Ok(s) => s,
            Err(_) => {
                k.garbage_connect_errors.fetch_add(1, Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        k.garbage_conns[kind].fetch_add(1, Relaxed);
        let (payload, quiet) = garbage_payload(kind, &mut rng);
        let sent = tokio::time::timeout(Duration::from_secs(1), s.write_all(&payload)).await;
        if matches!(sent, Ok(Ok(()))) {
            k.garbage_bytes_sent[kind].fetch_add(payload.len() as u64, Relaxed);
        }
        // Read what comes back until the server closes, or it is quiet for
        // `quiet`, or 2 s in all.
        let until = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let wait = tokio::time::Instant::now() + quiet;
            let r = tokio::select! {
                _ = stopped(&mut stop) => return,
                r = tokio::time::timeout_at(wait.min(until), s.read(&mut buf)) => r,
            };
            match r {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    k.garbage_server_closed[kind].fetch_add(1, Relaxed);
                    break;
                }
                Ok(Ok(n)) => {
                    k.garbage_bytes_received[kind].fetch_add(n as u64, Relaxed);
                }
                Err(_) => break,
            }
        }
    }
}

pub(super) async fn churn(a: Arc<Args>, mut stop: watch::Receiver<bool>, k: Arc<Counters>) {
    let gate = Arc::new(Semaphore::new(a.churn_inflight));
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut launched = 0u64;
    loop {
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tick.tick() => {}
        }
        let due = (start.elapsed().as_secs_f64() * a.churn_rate as f64) as u64;
        while launched < due {
            launched += 1;
            let Ok(permit) = Arc::clone(&gate).try_acquire_owned() else {
                k.churn_skipped.fetch_add(1, Relaxed);
                continue;
            };
            let (a, k) = (Arc::clone(&a), Arc::clone(&k));
            let with_ping = launched.is_multiple_of(10);
            tokio::spawn(async move {
                let r = async {
                    let mut s = connect(&a.addr, Duration::from_secs(2)).await?;
                    if with_ping {
                        let mut buf = BytesMut::with_capacity(64);
                        tokio::time::timeout(Duration::from_secs(2), async {
                            s.write_all(b"PING\r\n").await?;
                            read_frame(&mut s, &mut buf, &mut Scanner::new()).await
                        })
                        .await
                        .map_err(|_| bad("PING timed out"))??;
                    }
                    Ok::<_, std::io::Error>(())
                }
                .await;
                match r {
                    Ok(()) => k.churn_done.fetch_add(1, Relaxed),
                    Err(_) => k.churn_errors.fetch_add(1, Relaxed),
                };
                drop(permit);
            });
        }
    }
}
