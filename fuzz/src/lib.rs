//! Helpers shared by the fuzz targets: chunking a stream, and the wire
//! layout of an encoded request (decoded replies re-encode with
//! `Value::encode` of `sidecache-resp`).

use bytes::{Bytes, BytesMut};

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
