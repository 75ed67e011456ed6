//! The upstream reply scanner (`Scanner::scan`) against the decoder
//! (`Value::decode`).
//!
//! Input: byte 0 seeds the chunking, the rest is what an upstream sent.
//! Checked, frame by frame:
//! - `Value::decode` of a scanned frame consumes exactly the scanned length
//!   (it succeeds on the frame and fails on every shorter prefix), or fails
//!   only where the scanner does not look (an integer's digits, nesting
//!   deeper than `MAX_DECODE_DEPTH`);
//! - the decoded value re-encodes to a frame that scans whole and decodes
//!   to the same value;
//! - `array_elements` splits an aggregate into frames that add up to it;
//! - scanning the stream as it arrives in pieces (the scanner resuming)
//!   finds the same frames and the same error as scanning it whole.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use sidecache_fuzz::chunks;
use sidecache_resp::frame::{array_elements, error_text, ProtocolError, Scanner, Value};

fn check_frame(frame: &Bytes) {
    let _ = error_text(frame);
    match Value::decode(frame) {
        Ok(v) => {
            let short = frame.slice(..frame.len() - 1);
            assert!(
                Value::decode(&short).is_err(),
                "decode stops before the frame's end"
            );
            let mut enc = BytesMut::new();
            v.encode(&mut enc);
            let enc = enc.freeze();
            assert_eq!(Scanner::new().scan(&enc), Ok(Some(enc.len())), "{enc:?}");
            assert_eq!(Value::decode(&enc).as_ref(), Ok(&v), "{enc:?}");
            let _ = v.as_int();
            let _ = v.as_bytes();
            let _ = v.into_items();
        }
        Err(e) => assert!(
            matches!(e, ProtocolError::BadNumber | ProtocolError::TooDeep),
            "scanned but does not decode: {e:?} {frame:?}"
        ),
    }
    match array_elements(frame) {
        Ok(Some(els)) => {
            let header = frame.iter().position(|&c| c == b'\n').map_or(0, |i| i + 1);
            let total: usize = els.iter().map(Bytes::len).sum();
            assert_eq!(header + total, frame.len());
            let mut at = header;
            for e in &els {
                assert_eq!(&frame[at..at + e.len()], &e[..]);
                at += e.len();
            }
        }
        Ok(None) => {}
        Err(e) => panic!("scanned but array_elements fails: {e:?}"),
    }
}

/// Frame lengths found, and the error that stopped the scan.
fn scan(input: &[u8], pieces: &[usize]) -> (Vec<usize>, Option<ProtocolError>) {
    let mut frames = Vec::new();
    let mut sc = Scanner::new();
    let mut start = 0;
    let mut fed = 0;
    for &n in pieces {
        fed += n;
        loop {
            match sc.scan(&input[start..fed]) {
                Ok(Some(len)) => {
                    assert!(len > 0 && start + len <= fed);
                    frames.push(len);
                    start += len;
                }
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
    }
    (frames, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, input)) = data.split_first() else {
        return;
    };
    let input = Bytes::copy_from_slice(input);
    let whole = scan(&input, &[input.len()]);
    let mut at = 0;
    for &len in &whole.0 {
        check_frame(&input.slice(at..at + len));
        at += len;
    }
    // (Past 64 KiB, "line too long" depends on where reads end.)
    if input.len() < 60_000 {
        let pieces = chunks(u64::from(seed), input.len());
        assert_eq!(whole, scan(&input, &pieces));
    }
});
