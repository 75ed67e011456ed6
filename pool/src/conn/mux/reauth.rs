//! A live connection's re-authentication: `AUTH` and a `PING` after it.
//!
//! The `PING` is there because a refused `AUTH` may get no reply at all:
//! Valkey 8.0 and Redis 7.2 (`addAuthErrReply`, since module
//! authentication) drop the error of a refused `AUTH` when the connection
//! still has replies pending, that is, whenever the requests written
//! before it are not all answered yet, or an invalidation push waits in
//! its output buffer. That is the usual case on a busy multiplexed
//! connection. Without a marker, the reply of the request written after
//! the `AUTH` was taken for the `AUTH`'s (an `OK`, or any value: counted
//! as accepted), and from then on every request on the connection got the
//! reply of the one after it (an `INCR` answered `OK`, a GET its `PTTL`,
//! a fill caching another read's value) until the connection closed.
//!
//! So the writer sends `AUTH …` and `PING` together, as one entry of two
//! commands, with nothing between them. The `AUTH`'s reply is `+OK` or an
//! error; never `+PONG`, and never `-NOPERM` (the server checks no command
//! permission for `AUTH`), which is what `PING` answers (`-NOPERM` if the
//! user may not run it). Read first, such a reply tells that the `AUTH`'s
//! was withheld: the `AUTH` was refused, and the reply stream stays in
//! step.

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame;

use crate::auth::Auth;

/// Commands of one re-authentication: `AUTH`, then `PING`.
pub(super) const COMMANDS: usize = 2;

/// What stands for the reply of an `AUTH` the server withheld.
const WITHHELD: &[u8] = b"-WRONGPASS AUTH refused with no reply (earlier replies were pending)\r\n";

/// Encodes `AUTH` with the current secret, then `PING`, into `out`; false
/// (nothing written) without credentials.
pub(super) fn encode(auth: &Auth, out: &mut BytesMut) -> bool {
    if !auth.encode_auth(out) {
        return false;
    }
    encode::encode_command(out, &[b"PING"]);
    true
}

/// Where `frame` is the first reply read for a re-authentication and is
/// the `PING`'s: the reply the `AUTH`'s stands for (a refusal), to take
/// its place.
pub(super) fn withheld(frame: &[u8]) -> Option<Bytes> {
    (frame == b"+PONG\r\n" || frame.starts_with(b"-NOPERM")).then(|| Bytes::from_static(WITHHELD))
}

/// The refusal in a re-authentication's replies (the `AUTH`'s first);
/// `None` if it was accepted.
pub(super) fn refusal(frames: &[Bytes]) -> Option<String> {
    frames
        .first()
        .and_then(|f| frame::error_text(f))
        .map(|t| String::from_utf8_lossy(t).into_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::BytesMut;
    use sidecache_resp::frame::{Scanner, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::auth::{RotatingSecret, SecretFuture, SecretSource};
    use crate::config::{NodeAddr, Proto, Seed, Session, UpstreamConfig};
    use crate::conn::connect::Connector;
    use crate::conn::mux::MuxConn;

    #[test]
    fn a_withheld_reply_is_told_by_the_ping_after_it() {
        assert!(withheld(b"+OK\r\n").is_none());
        assert!(withheld(b"-WRONGPASS invalid username-password pair\r\n").is_none());
        assert!(withheld(b":7\r\n").is_none());
        let stand_in = withheld(b"+PONG\r\n").unwrap();
        assert!(refusal(&[stand_in, Bytes::from_static(b"+PONG\r\n")]).is_some());
        assert!(
            withheld(b"-NOPERM this user has no permissions to run the 'ping' command\r\n")
                .is_some()
        );
        assert!(refusal(&[
            Bytes::from_static(b"+OK\r\n"),
            Bytes::from_static(b"+PONG\r\n")
        ])
        .is_none());
    }

    #[derive(Debug)]
    struct Fixed;

    impl SecretSource for Fixed {
        fn fetch(&self) -> SecretFuture<'_> {
            Box::pin(async { Ok("pw".to_owned()) })
        }
    }

    /// A server that behaves as Valkey 8.0 does on a refused `AUTH`: every
    /// connection's first command (the handshake's `AUTH`) is accepted,
    /// every later `AUTH` refused, its error withheld while replies are
    /// pending. A GET's reply is held until the next `AUTH` arrives, so
    /// the `AUTH` always finds one pending.
    async fn valkey_8_0(listener: TcpListener) {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut buf, mut out) = (BytesMut::new(), BytesMut::new());
                let (mut first, mut hold) = (true, false);
                loop {
                    while let Ok(Some(len)) = Scanner::new().scan(&buf) {
                        let Ok(Value::Array(args)) = Value::decode(&buf.split_to(len).freeze())
                        else {
                            return;
                        };
                        let name = args[0].as_bytes().unwrap().to_ascii_uppercase();
                        match &name[..] {
                            b"AUTH" if first => out.extend_from_slice(b"+OK\r\n"),
                            b"AUTH" => {
                                hold = false;
                                if out.is_empty() {
                                    out.extend_from_slice(b"-WRONGPASS invalid password\r\n");
                                }
                            }
                            b"GET" => {
                                hold = true;
                                out.extend_from_slice(b"$1\r\nv\r\n");
                            }
                            b"PING" => out.extend_from_slice(b"+PONG\r\n"),
                            _ => out.extend_from_slice(b":1\r\n"),
                        }
                        first = false;
                    }
                    if !hold && !out.is_empty() && s.write_all(&out.split()).await.is_err() {
                        return;
                    }
                    if matches!(s.read_buf(&mut buf).await, Ok(0) | Err(_)) {
                        return;
                    }
                }
            });
        }
    }

    /// A refused re-authentication whose error the server withheld is
    /// seen as refused (the connection is replaced), and the next request
    /// gets its own reply, not one shifted by the missing one.
    #[tokio::test]
    async fn a_refusal_without_a_reply_keeps_replies_in_step() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(valkey_8_0(listener));
        let cfg = UpstreamConfig {
            seeds: vec![Seed::parse(&format!("redis://127.0.0.1:{port}")).unwrap()],
            secret: Some(RotatingSecret {
                source: Arc::new(Fixed),
                username: Some("app".into()),
                refresh: Duration::from_secs(600),
            }),
            reauth_interval: Some(Duration::from_millis(100)),
            ..UpstreamConfig::default()
        };
        let connector = Arc::new(Connector::new(&cfg).unwrap());
        connector.auth().start().await.unwrap();
        let addr = NodeAddr::parse(&format!("127.0.0.1:{port}")).unwrap();
        let session = Session {
            db: 0,
            proto: Proto::Resp2,
        };
        let conn = MuxConn::spawn(Arc::clone(&connector), addr, session);
        let wait = Duration::from_secs(5);
        // Answered once the re-authentication (in 100 ms) is written.
        let get = conn.call(Bytes::from_static(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"), 1);
        let get = tokio::time::timeout(wait, get).await.expect("GET answered");
        assert_eq!(get.unwrap(), [Bytes::from_static(b"$1\r\nv\r\n")]);
        let incr = conn.call(Bytes::from_static(b"*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n"), 1);
        let incr = tokio::time::timeout(wait, incr)
            .await
            .expect("INCR answered");
        assert_eq!(incr.unwrap(), [Bytes::from_static(b":1\r\n")]);
        let stats = &connector.auth().stats;
        assert!(
            stats
                .reauth_failures
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
        assert_eq!(stats.reauths.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
