//! Helpers shared by the fuzz targets: chunking a stream, re-encoding
//! decoded replies, and the wire layout of an encoded request.

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_resp::encode::{put_bulk, put_header};
use sidecache_resp::frame::Value;

/// Chunk lengths (each ≥ 1) covering `len` bytes, derived from `seed`
/// (a splitmix64 stream), so a crash replays from the input alone.
pub fn chunks(seed: u64, len: usize) -> Vec<usize> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let r = next();
        // Mostly tiny pieces (cuts inside headers and CRLFs), sometimes big.
        let c = if r % 8 == 0 {
            1 + (r >> 8) as usize % 512
        } else {
            1 + (r >> 8) as usize % 4
        };
        let c = c.min(left);
        out.push(c);
        left -= c;
    }
    out
}

/// Encodes a decoded reply back to RESP (RESP3 types as RESP3).
pub fn encode_value(out: &mut BytesMut, v: &Value) {
    let line = |out: &mut BytesMut, kind: u8, b: &[u8]| {
        out.put_u8(kind);
        out.put_slice(b);
        out.put_slice(b"\r\n");
    };
    match v {
        Value::Nil => out.put_slice(b"_\r\n"),
        Value::Status(b) => line(out, b'+', b),
        Value::Error(b) => {
            if b.contains(&b'\r') || b.contains(&b'\n') {
                put_header(out, b'!', b.len() as i64);
                out.put_slice(b);
                out.put_slice(b"\r\n");
            } else {
                line(out, b'-', b);
            }
        }
        Value::Int(i) => line(out, b':', i.to_string().as_bytes()),
        Value::Bulk(b) => put_bulk(out, b),
        Value::Double(b) => line(out, b',', b),
        Value::BigNumber(b) => line(out, b'(', b),
        Value::Bool(t) => out.put_slice(if *t { b"#t\r\n" } else { b"#f\r\n" }),
        Value::Verbatim(b) => {
            put_header(out, b'=', b.len() as i64);
            out.put_slice(b);
            out.put_slice(b"\r\n");
        }
        Value::Array(items) | Value::Set(items) | Value::Push(items) => {
            let kind = match v {
                Value::Array(_) => b'*',
                Value::Set(_) => b'~',
                _ => b'>',
            };
            put_header(out, kind, items.len() as i64);
            for i in items {
                encode_value(out, i);
            }
        }
        Value::Map(kv) => {
            put_header(out, b'%', kv.len() as i64);
            for (k, v) in kv {
                encode_value(out, k);
                encode_value(out, v);
            }
        }
    }
}

/// Whether `raw` (a multibulk request as the parser consumed it) is the
/// canonical encoding of `args` except for the two bytes ending each header
/// line and each payload: like Redis, the parser skips those without
/// looking at them.
pub fn same_modulo_terminators(raw: &[u8], args: &[Bytes]) -> bool {
    let mut enc = BytesMut::new();
    sidecache_resp::encode::encode_command(&mut enc, args);
    if enc.len() != raw.len() {
        return false;
    }
    let mut skip = vec![false; enc.len()];
    let mut mark = |at: usize| {
        skip[at] = true;
        skip[at + 1] = true;
    };
    let header = |pos: usize| pos + memchr_cr(&enc[pos..]);
    let mut pos = header(0);
    mark(pos);
    pos += 2;
    for a in args {
        pos = header(pos);
        mark(pos);
        pos += 2 + a.len();
        mark(pos);
        pos += 2;
    }
    enc.iter()
        .zip(raw)
        .zip(&skip)
        .all(|((e, r), s)| *s || e == r)
}

fn memchr_cr(b: &[u8]) -> usize {
    b.iter().position(|&c| c == b'\r').unwrap_or(b.len())
}
