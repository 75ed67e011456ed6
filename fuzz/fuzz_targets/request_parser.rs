//! The client request parser (multibulk and inline), with its limits.
//!
//! Input: byte 0 picks the limits (bit 0: before AUTH; bits 1-2: the bulk
//! limit; bits 3-4: the element limit), byte 1 seeds the chunking, the rest
//! is the client's byte stream. Checked:
//! - every multibulk request's `raw` is exactly the bytes consumed for it and
//!   re-encodes from its `args` (up to the CRLFs Redis does not look at);
//!   an inline request's `raw` is the encoding of its line's `split_args`;
//! - arguments respect the limits (and the pre-AUTH ones);
//! - the stream fed in arbitrary pieces gives the same requests, the same
//!   error and the same leftover as fed whole.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use sidecache_fuzz::{chunks, same_modulo_terminators};
use sidecache_resp::request::{
    split_args, InlineQuotes, Limits, Parser, ProtocolError, Request, INLINE_MAX,
};

#[derive(Debug, PartialEq)]
struct Outcome {
    requests: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    error: Option<ProtocolError>,
    leftover: Vec<u8>,
}

fn check(input: &[u8], limits: Limits, unauth: bool, req: &Request, before: usize, after: usize) {
    let args = &req.args;
    assert!(!args.is_empty(), "a request has a command name");
    for a in args {
        // Every argument is a zero-copy slice of `raw`.
        let r = req.raw.as_ptr() as usize..req.raw.as_ptr() as usize + req.raw.len();
        assert!(
            a.is_empty()
                || (r.contains(&(a.as_ptr() as usize)) && a.as_ptr() as usize + a.len() <= r.end)
        );
    }
    let consumed = &input[before..after];
    // An inline line's re-encoding contains a newline inside its first
    // line, so it can never be the tail of what consumed it.
    if consumed.ends_with(&req.raw) {
        // Multibulk: `raw` is the tail of what this call consumed (empty
        // requests before it are dropped silently).
        assert!(
            same_modulo_terminators(&req.raw, args),
            "raw {:?} args {:?}",
            req.raw,
            args
        );
        assert!(args.len() as u64 <= limits.max_multibulk);
        for a in args {
            assert!(a.len() as u64 <= limits.max_bulk);
            if unauth {
                assert!(a.len() <= 16384);
            }
        }
        if unauth {
            assert!(args.len() <= 10);
        }
    } else {
        // Inline: the last line consumed, split as Redis does. (Where it
        // starts is not always after a newline: `*0\r` swallows the byte
        // after its `\r`, as in Redis; so some suffix of the line.)
        assert_eq!(consumed.last(), Some(&b'\n'), "inline ends with a newline");
        let body = &consumed[..consumed.len() - 1];
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let from = body.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        let got: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        assert!(
            (from..body.len()).any(|s| split_args(&body[s..]).as_ref() == Some(&got)),
            "inline args {got:?} from {consumed:?}"
        );
        let want = got;
        let mut enc = BytesMut::new();
        sidecache_resp::encode::encode_command(&mut enc, &want);
        assert_eq!(&enc[..], &req.raw[..]);
    }
}

fn run(input: &[u8], limits: Limits, unauth: bool, pieces: Option<&[usize]>) -> Outcome {
    let mut p = Parser::new(limits);
    p.unauthenticated = unauth;
    let mut buf = BytesMut::new();
    let mut out = Request::default();
    let mut requests = Vec::new();
    let whole = [input.len()];
    let pieces = pieces.unwrap_or(&whole);
    let mut fed = 0;
    for &n in pieces {
        buf.extend_from_slice(&input[fed..fed + n]);
        fed += n;
        loop {
            let _ = p.wanted();
            let before = fed - buf.len();
            match p.parse(&mut buf, &mut out) {
                Ok(Some(())) => {
                    let after = fed - buf.len();
                    check(input, limits, unauth, &out, before, after);
                    requests.push((
                        out.raw.to_vec(),
                        out.args.iter().map(|a| a.to_vec()).collect(),
                    ));
                }
                Ok(None) => break,
                Err(e) => {
                    return Outcome {
                        requests,
                        error: Some(e),
                        leftover: buf.to_vec(),
                    };
                }
            }
        }
    }
    Outcome {
        requests,
        error: None,
        leftover: buf.to_vec(),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (cfg, seed, input) = (data[0], data[1], &data[2..]);
    let limits = Limits {
        max_bulk: [512 * 1024 * 1024, 16, 1, 0][usize::from((cfg >> 1) & 3)],
        max_multibulk: [i32::MAX as u64, 8, 1, 0][usize::from((cfg >> 3) & 3)],
        inline_quotes: InlineQuotes::Strict,
    };
    let unauth = cfg & 1 == 1;
    let whole = run(input, limits, unauth, None);
    if input.len() <= INLINE_MAX {
        // (Past INLINE_MAX, "too big" depends on where reads end, in Redis too.)
        let pieces = chunks(u64::from(seed) | u64::from(cfg) << 8, input.len());
        let split = run(input, limits, unauth, Some(&pieces));
        if whole.error.is_some() {
            // Pieces may stop at the error sooner, never later or elsewhere.
            assert_eq!(whole.requests, split.requests);
            assert_eq!(whole.error, split.error);
        } else {
            assert_eq!(whole, split);
        }
    }
});
