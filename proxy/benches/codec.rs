//! Request-parsing micro-benchmark: our `sidecache_resp::request::Parser`
//! against the `redis-protocol` crate's RESP2 decoder
//! (`resp2::decode::decode_bytes_mut`), to decide which one parses client
//! requests.
//!
//! Each case fills one `BytesMut` with pipelined requests (built outside the
//! timed section) and parses it to the end. Both sides end in the same
//! place: the request's arguments available as zero-copy `Bytes` slices in a
//! reused `Vec<Bytes>`, plus the request's raw bytes (our `Request::raw`, the
//! `Bytes` that `decode_bytes_mut` splits off). For redis-protocol that means
//! decoding a `BytesFrame::Array` and moving its `BulkString`s out.
//!
//! Cases (throughput in elements: requests, or key/value pairs for MSET):
//! - `get_x1000`: 1,000 pipelined `GET key:NNNNNN`;
//! - `set64_x1000`: 1,000 pipelined `SET key:NNNNNN <64-byte value>`;
//! - `mset_1000_pairs`: one `MSET` with 1,000 key/value pairs (64-byte values);
//! - `set16k_x100`: 100 pipelined `SET` with 16 KiB values.
//!
//! Before measuring, both parsers are run once on every input and must
//! produce identical arguments.
//!
//! Run it with `cargo bench -p sidecache --bench codec`; for a quick run add
//! `-- --warm-up-time 1 --measurement-time 3`, and a name filter after `--`
//! to pick cases (e.g. `-- mset`).

use std::hint::black_box;

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput};
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;
use sidecache_resp::request::{InlineQuotes, Limits, Parser, Request};

/// Limits well above every input (512 MiB is Redis's default
/// `proto-max-bulk-len`).
const LIMITS: Limits = Limits {
    max_bulk: 512 * 1024 * 1024,
    max_multibulk: 1024 * 1024,
    inline_quotes: InlineQuotes::Strict,
};

/// Appends one RESP array of bulk strings.
fn encode(buf: &mut BytesMut, args: &[&[u8]]) {
    buf.put_u8(b'*');
    buf.put_slice(args.len().to_string().as_bytes());
    buf.put_slice(b"\r\n");
    for a in args {
        buf.put_u8(b'$');
        buf.put_slice(a.len().to_string().as_bytes());
        buf.put_slice(b"\r\n");
        buf.put_slice(a);
        buf.put_slice(b"\r\n");
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("key:{i:06}").into_bytes()
}

/// A value of `len` bytes that varies with `i`.
fn value(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| b'a' + ((i + j) % 26) as u8).collect()
}

fn pipelined_gets(n: usize) -> BytesMut {
    let mut buf = BytesMut::new();
    for i in 0..n {
        encode(&mut buf, &[b"GET", &key(i)]);
    }
    buf
}

fn pipelined_sets(n: usize, value_len: usize) -> BytesMut {
    let mut buf = BytesMut::new();
    for i in 0..n {
        encode(&mut buf, &[b"SET", &key(i), &value(i, value_len)]);
    }
    buf
}

fn one_mset(pairs: usize, value_len: usize) -> BytesMut {
    let owned: Vec<Vec<u8>> = (0..pairs)
        .flat_map(|i| [key(i), value(i, value_len)])
        .collect();
    let mut args: Vec<&[u8]> = vec![b"MSET"];
    args.extend(owned.iter().map(Vec::as_slice));
    let mut buf = BytesMut::new();
    encode(&mut buf, &args);
    buf
}

/// Parses every request in `buf` with our parser; `on_request` sees each
/// request's arguments. Returns the number of requests.
fn parse_ours(
    buf: &mut BytesMut,
    parser: &mut Parser,
    req: &mut Request,
    mut on_request: impl FnMut(&[Bytes]),
) -> usize {
    let mut n = 0;
    while parser
        .parse(buf, req)
        .expect("benchmark input is valid RESP")
        .is_some()
    {
        on_request(&req.args);
        black_box(&req.raw);
        n += 1;
    }
    n
}

/// Parses every request in `buf` with redis-protocol, moving the bulk
/// strings out of each array frame into `args`. Returns the number of
/// requests.
fn parse_theirs(
    buf: &mut BytesMut,
    args: &mut Vec<Bytes>,
    mut on_request: impl FnMut(&[Bytes]),
) -> usize {
    let mut n = 0;
    while let Some((frame, _len, raw)) =
        decode_bytes_mut(buf).expect("benchmark input is valid RESP")
    {
        let BytesFrame::Array(items) = frame else {
            panic!("benchmark requests are arrays")
        };
        args.clear();
        args.extend(items.into_iter().map(|f| match f {
            BytesFrame::BulkString(b) => b,
            other => panic!("benchmark arguments are bulk strings, got {other:?}"),
        }));
        on_request(args);
        black_box(&raw);
        n += 1;
    }
    n
}

/// Checks that both parsers see the same requests in `input`.
fn check_same(name: &str, input: &BytesMut, requests: usize) {
    let mut ours = Vec::new();
    let mut buf = input.clone();
    let n = parse_ours(
        &mut buf,
        &mut Parser::new(LIMITS),
        &mut Request::default(),
        |a| ours.push(a.to_vec()),
    );
    assert!(
        buf.is_empty(),
        "{name}: our parser left {} bytes",
        buf.len()
    );
    assert_eq!(n, requests, "{name}: our parser request count");

    let mut theirs = Vec::new();
    let mut buf = input.clone();
    let n = parse_theirs(&mut buf, &mut Vec::new(), |a| theirs.push(a.to_vec()));
    assert!(
        buf.is_empty(),
        "{name}: redis-protocol left {} bytes",
        buf.len()
    );
    assert_eq!(n, requests, "{name}: redis-protocol request count");

    assert!(ours == theirs, "{name}: parsers disagree on the arguments");
}

/// One benchmark group: `requests` requests in `input`, throughput counted
/// as `elements`.
fn bench_case(c: &mut Criterion, name: &str, input: &BytesMut, requests: usize, elements: u64) {
    check_same(name, input, requests);
    // Large inputs: fewer pre-built copies per batch keeps memory bounded.
    let batch = if input.len() > 256 * 1024 {
        BatchSize::LargeInput
    } else {
        BatchSize::SmallInput
    };

    let mut group = c.benchmark_group(format!("codec/{name}"));
    group.throughput(Throughput::Elements(elements));

    let mut parser = Parser::new(LIMITS);
    let mut req = Request::default();
    group.bench_function(BenchmarkId::from_parameter("sidecache"), |b| {
        b.iter_batched_ref(
            || input.clone(),
            |buf| {
                let n = parse_ours(buf, &mut parser, &mut req, |a| {
                    black_box(a);
                });
                assert_eq!(n, requests);
            },
            batch,
        );
    });

    let mut args = Vec::new();
    group.bench_function(BenchmarkId::from_parameter("redis-protocol"), |b| {
        b.iter_batched_ref(
            || input.clone(),
            |buf| {
                let n = parse_theirs(buf, &mut args, |a| {
                    black_box(a);
                });
                assert_eq!(n, requests);
            },
            batch,
        );
    });

    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();

    bench_case(&mut c, "get_x1000", &pipelined_gets(1000), 1000, 1000);
    bench_case(&mut c, "set64_x1000", &pipelined_sets(1000, 64), 1000, 1000);
    bench_case(&mut c, "mset_1000_pairs", &one_mset(1000, 64), 1, 1000);
    bench_case(
        &mut c,
        "set16k_x100",
        &pipelined_sets(100, 16 * 1024),
        100,
        100,
    );

    c.final_summary();
}
