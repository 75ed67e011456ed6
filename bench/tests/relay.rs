//! The relay keeps every byte and their order, both ways, with jitter (whose
//! deadlines could reorder chunks if they were not kept monotonic), and
//! relays a FIN after the bytes before it, to a TCP upstream and to a Unix
//! socket one. No timing is asserted here: the delay's precision is
//! benchmark output (`relay --self-test`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use sidecache_bench::echo;
use sidecache_bench::relay::{DelayConfig, Relay, Upstream};

/// An echo on a Unix socket in a fresh directory (left for the OS's
/// temporary-file cleanup: the test process may end before the thread).
fn echo_unix() -> Upstream {
    let dir = std::env::temp_dir().join(format!("relay-test-{}", std::process::id()));
    Upstream::Unix(echo::unix(&dir).expect("unix echo"))
}

/// Deterministic bytes: `len` of them for connection `c`.
fn pattern(c: u64, len: usize) -> Vec<u8> {
    let mut x = c.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn bytes_and_order_are_kept_both_ways_with_jitter() {
    kept_both_ways(echo::tcp().expect("echo").into());
}

#[test]
fn bytes_and_order_are_kept_to_a_unix_socket_upstream() {
    kept_both_ways(echo_unix());
}

#[test]
fn upstream_parses_tcp_and_unix() {
    assert_eq!(
        "127.0.0.1:6379".parse::<Upstream>().expect("tcp"),
        Upstream::Tcp("127.0.0.1:6379".parse().expect("addr"))
    );
    assert_eq!(
        "unix:/run/redis.sock".parse::<Upstream>().expect("unix"),
        Upstream::Unix("/run/redis.sock".into())
    );
    assert!("localhost".parse::<Upstream>().is_err());
}

/// Four connections of 300,000 bytes each through a jittered relay to an
/// echo at `upstream`: every byte comes back, in order, and the relay
/// thread's CPU time is readable and has moved.
fn kept_both_ways(upstream: Upstream) {
    let cfg = DelayConfig {
        forward: Duration::from_micros(200),
        back: Duration::from_micros(100),
        jitter: Duration::from_micros(300),
        spin: Duration::from_micros(50),
    };
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let relay = Relay::start(&[(any, upstream)], cfg).expect("relay");
    let addr = relay.listen[0];
    let cpu0 = relay
        .stats
        .cpu_time()
        .expect("the relay thread's schedstat");
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            std::thread::spawn(move || {
                let data = pattern(c, 300_000);
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                let mut w = s.try_clone().expect("clone");
                // Writes of many sizes (many chunks, many deadlines) from
                // one thread while another reads the echo back.
                let send = data.clone();
                let writer = std::thread::spawn(move || {
                    let mut off = 0;
                    let mut step = 1;
                    while off < send.len() {
                        let end = (off + step).min(send.len());
                        w.write_all(&send[off..end]).expect("write");
                        off = end;
                        step = step * 7 % 5000 + 1;
                    }
                    w.shutdown(Shutdown::Write).expect("fin");
                });
                let mut back = Vec::new();
                s.read_to_end(&mut back).expect("read to the relayed FIN");
                writer.join().expect("writer");
                assert_eq!(back.len(), data.len(), "connection {c}: every byte back");
                assert!(back == data, "connection {c}: bytes in order");
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    assert_eq!(
        relay
            .stats
            .connections
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
    let cpu1 = relay
        .stats
        .cpu_time()
        .expect("the relay thread's schedstat");
    assert!(
        cpu1 > cpu0,
        "relaying 2.4 MB took CPU time: {cpu0:?} -> {cpu1:?}"
    );
}
