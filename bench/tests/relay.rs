//! The relay keeps every byte and their order, both ways, with jitter (whose
//! deadlines could reorder chunks if they were not kept monotonic), and
//! relays a FIN after the bytes before it. No timing is asserted here: the
//! delay's precision is benchmark output (`relay --self-test`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use sidecache_bench::relay::{DelayConfig, Relay};

/// An echo server on a free loopback port (a thread per connection; it
/// closes its side when the client's FIN arrives).
fn echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let addr = l.local_addr().expect("echo addr");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
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
    let upstream = echo();
    let cfg = DelayConfig {
        forward: Duration::from_micros(200),
        back: Duration::from_micros(100),
        jitter: Duration::from_micros(300),
        spin: Duration::from_micros(50),
    };
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let relay = Relay::start(&[(any, upstream)], cfg).expect("relay");
    let addr = relay.listen[0];
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
}
