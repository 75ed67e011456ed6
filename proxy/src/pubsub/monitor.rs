//! MONITOR lines, in Redis's format:
//! `+1339518083.107412 [0 127.0.0.1:60866] "keys" "*"`.
//!
//! sidecache's MONITOR shows every command this proxy receives, including
//! those it answers from the L1 or acknowledges from memory, which Redis's
//! own MONITOR never sees. As in Redis, administrative commands are not
//! shown (the `admin` and `skip_monitor` flags of `COMMAND`), and the
//! arguments of AUTH and of HELLO's AUTH are shown as `(redacted)`.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};

/// Encodes one MONITOR line for a command `args` from client `addr` in
/// database `db`, as a RESP status reply.
pub fn line(db: u16, addr: &str, args: &[Bytes]) -> Bytes {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut out = BytesMut::with_capacity(48 + args.iter().map(|a| a.len() + 3).sum::<usize>());
    out.put_u8(b'+');
    let head = format!("{}.{:06} [{db} {addr}]", now.as_secs(), now.subsec_micros());
    out.extend_from_slice(head.as_bytes());
    let redacted = redaction(args);
    for (i, a) in args.iter().enumerate() {
        out.put_u8(b' ');
        if redacted.contains(&i) {
            out.extend_from_slice(b"\"(redacted)\"");
        } else {
            repr(&mut out, a);
        }
    }
    out.extend_from_slice(b"\r\n");
    out.freeze()
}

/// Which arguments are secrets: AUTH's, and the two after HELLO's AUTH.
fn redaction(args: &[Bytes]) -> std::ops::Range<usize> {
    let Some(name) = args.first() else {
        return 0..0;
    };
    if name.eq_ignore_ascii_case(b"auth") {
        return 1..args.len();
    }
    if name.eq_ignore_ascii_case(b"hello") {
        if let Some(p) = args.iter().position(|a| a.eq_ignore_ascii_case(b"auth")) {
            return p + 1..p + 3;
        }
    }
    0..0
}

/// Redis's `sdscatrepr`: quoted, with `\\`, `\"`, `\n`, `\r`, `\t`, `\a`,
/// `\b` and `\xHH` for other unprintable bytes.
fn repr(out: &mut BytesMut, s: &[u8]) {
    out.put_u8(b'"');
    for &c in s {
        match c {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            7 => out.extend_from_slice(b"\\a"),
            8 => out.extend_from_slice(b"\\b"),
            0x20..=0x7e => out.put_u8(c),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'\\',
                    b'x',
                    HEX[usize::from(c >> 4)],
                    HEX[usize::from(c & 15)],
                ]);
            }
        }
    }
    out.put_u8(b'"');
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(a: &[&[u8]]) -> Vec<Bytes> {
        a.iter().map(|s| Bytes::copy_from_slice(s)).collect()
    }

    #[test]
    fn redis_format() {
        let l = line(
            3,
            "127.0.0.1:5000",
            &args(&[b"set", b"k\"1", b"a\r\n\x01 b"]),
        );
        let s = std::str::from_utf8(&l).unwrap();
        assert!(s.starts_with('+'));
        assert!(
            s.ends_with(" [3 127.0.0.1:5000] \"set\" \"k\\\"1\" \"a\\r\\n\\x01 b\"\r\n"),
            "{s}"
        );
        let (ts, _) = s[1..].split_once(' ').unwrap();
        let (secs, micros) = ts.split_once('.').unwrap();
        assert!(secs.parse::<u64>().unwrap() > 1_600_000_000);
        assert_eq!(micros.len(), 6);
    }

    #[test]
    fn secrets_redacted() {
        let l = line(0, "a", &args(&[b"auth", b"user", b"pw"]));
        assert!(l.ends_with(b"\"auth\" \"(redacted)\" \"(redacted)\"\r\n"));
        let l = line(
            0,
            "a",
            &args(&[b"hello", b"3", b"AUTH", b"u", b"p", b"SETNAME", b"n"]),
        );
        assert!(l.ends_with(
            b"\"hello\" \"3\" \"AUTH\" \"(redacted)\" \"(redacted)\" \"SETNAME\" \"n\"\r\n"
        ));
    }
}
