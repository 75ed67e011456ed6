//! MONITOR lines, in Redis's format:
//! `+1339518083.107412 [0 127.0.0.1:60866] "keys" "*"`.
//!
//! sidecache's MONITOR shows every command this proxy receives, including
//! those it answers from the L1 or acknowledges from memory, which Redis's
//! own MONITOR never sees. As in Redis, administrative commands are not
//! shown (the `admin` flag of `COMMAND`), and the
//! arguments of AUTH and of HELLO's AUTH are shown as `(redacted)`.

use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::config::NodeAddr;
use sidecache_pool::SessionPool;
use sidecache_pool::{Proto, Session};
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::Hub;

/// Follows Redis's own MONITOR on one node while sidecache has MONITOR
/// clients, passing on only the lines of commands that scripts and
/// functions ran (`[0 lua] …`): sidecache's own feed already shows every
/// command a client sent.
pub(super) async fn follow_scripts(
    hub: Weak<Hub>,
    addr: NodeAddr,
    sessions: Arc<SessionPool>,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let Some(wait) = hub.upgrade().map(|h| h.wait) else {
        return;
    };
    let session = Session {
        db: 0,
        proto: Proto::Resp2,
    };
    let conn = tokio::select! {
        c = sessions.splice(&addr, session, wait) => c,
        () = stop.cancelled() => return,
    };
    let Ok(conn) = conn else {
        return;
    };
    let mut rd = conn.rd;
    let mut wr = conn.wr;
    if wr.write_all(b"MONITOR\r\n").await.is_err() {
        return;
    }
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut scanner = Scanner::new();
    // Its `+OK` first: from then on every script's commands show.
    let mut ready = Some(ready);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
        }
        while let Ok(Some(n)) = scanner.scan(&buf) {
            let frame = buf.split_to(n).freeze();
            if let Some(r) = ready.take() {
                let _ = r.send(());
                continue;
            }
            if frame.first() == Some(&b'+') && frame.windows(6).any(|w| w == b" lua] ") {
                let Some(h) = hub.upgrade() else {
                    return;
                };
                h.feed(frame);
            }
        }
        buf.reserve(16 * 1024);
    }
}

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

/// Which arguments are secrets: AUTH's, the two after HELLO's AUTH, and
/// MIGRATE's AUTH password or AUTH2 username and password.
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
    if name.eq_ignore_ascii_case(b"migrate") {
        // MIGRATE … AUTH password | AUTH2 username password
        for (i, a) in args.iter().enumerate().skip(6) {
            if a.eq_ignore_ascii_case(b"auth") {
                return i + 1..i + 2;
            }
            if a.eq_ignore_ascii_case(b"auth2") {
                return i + 1..i + 3;
            }
            if a.eq_ignore_ascii_case(b"keys") {
                break;
            }
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
    fn migrate_secrets_redacted() {
        let l = line(
            0,
            "a",
            &args(&[
                b"migrate", b"h", b"1", b"key", b"9", b"5000", b"AUTH2", b"u", b"p",
            ]),
        );
        assert!(l.ends_with(b"\"5000\" \"AUTH2\" \"(redacted)\" \"(redacted)\"\r\n"));
        let l = line(
            0,
            "a",
            &args(&[b"migrate", b"h", b"1", b"key", b"9", b"5000", b"AUTH", b"p"]),
        );
        assert!(l.ends_with(b"\"AUTH\" \"(redacted)\"\r\n"));
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
