//! The task that keeps this instance subscribed to the peer invalidation
//! channel (`--peer-invalidation-channel`, the fallback when the upstream
//! refuses `CLIENT TRACKING`): one connection, re-opened with a backoff,
//! kept alive by heartbeats and re-authenticated with a rotating secret.
//! What the channel's messages say, and its gate, are the
//! [`crate::coherence::peer`] layer's; this task does the I/O and reaches
//! the upstream only through [`Dispatch`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame::{self, Scanner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;

use crate::backoff::Backoff;
use crate::coherence::peer::{Message, Peer};
use crate::coherence::tracking::{HEARTBEAT, HEARTBEAT_TIMEOUT};
use crate::config::{NodeAddr, Proto, Session};
use crate::conn::connect::{ReadHalf, WriteHalf};
use crate::dispatch::Dispatch;

/// Keeps this instance subscribed, for the life of the process.
pub(crate) async fn subscribe<U: Dispatch>(up: U, peer: Arc<Peer>) {
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    loop {
        let topo = up.topology();
        let Some(node) = topo.nodes().first().cloned() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        drop(topo);
        let session = Session {
            db: 0,
            proto: Proto::Resp3,
        };
        match up.connector().connect(node.addr(), session).await {
            Ok((rd, wr)) => {
                backoff.reset();
                let why = run(&up, &peer, node.addr(), rd, wr).await;
                peer.gate().set_down(&why);
            }
            Err(e) => {
                warn!(node = %node.addr(), error = %e, "peer invalidation channel: connect failed")
            }
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// One subscribed connection; returns why it ended.
async fn run<U: Dispatch>(
    up: &U,
    peer: &Peer,
    addr: &NodeAddr,
    mut rd: ReadHalf,
    mut wr: WriteHalf,
) -> String {
    let mut out = BytesMut::new();
    encode::encode_command(&mut out, &[b"SUBSCRIBE".as_slice(), peer.name()]);
    if let Err(e) = wr.write_all(&out).await {
        return e.to_string();
    }
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut sc = Scanner::new();
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ping_sent: Option<Instant> = None;
    let ping = {
        let mut p = BytesMut::new();
        encode::encode_command(&mut p, &[b"PING"]);
        p.freeze()
    };
    // With a rotating secret, AUTH is sent again every reauth interval (a
    // RESP3 subscribed connection may run it); the AUTH replies awaited.
    let auth = up.connector().auth();
    let mut reauth = auth.reauth_interval().map(|every| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    // Non-push replies awaited, in order: `true` for an AUTH's.
    let mut awaited: std::collections::VecDeque<bool> = std::collections::VecDeque::new();
    loop {
        loop {
            match sc.scan(&buf) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len).freeze();
                    if frame.first() != Some(&b'>') {
                        if awaited.pop_front() == Some(true) {
                            // A PONG for an AUTH answers the PING sent
                            // after it: the server withheld the AUTH's
                            // refusal (replies were pending, see
                            // `conn/mux/reauth.rs`).
                            let withheld = frame[..] == *b"+PONG\r\n";
                            let refused = frame::error_text(&frame);
                            let why = refused
                                .map(|t| String::from_utf8_lossy(t).into_owned())
                                .or_else(|| withheld.then(|| "AUTH refused with no reply".into()));
                            auth.note_reauth(addr, why.as_deref().map_or(Ok(()), Err));
                            if why.is_some() {
                                // Replaced as a lost channel is (the L1
                                // was cleared when it went down).
                                return "re-authentication refused".into();
                            }
                            continue;
                        }
                        if frame::error_text(&frame).is_some() {
                            return format!("refused: {}", String::from_utf8_lossy(&frame).trim());
                        }
                        ping_sent = None;
                        continue;
                    }
                    apply(up, peer, &frame);
                }
                Ok(None) => break,
                Err(e) => return e.to_string(),
            }
        }
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) => return "closed by server".into(),
                Ok(_) => {}
                Err(e) => return e.to_string(),
            },
            _ = tick(&mut reauth) => {
                let mut p = BytesMut::with_capacity(64);
                if auth.encode_auth(&mut p) {
                    if let Err(e) = wr.write_all(&p).await {
                        return e.to_string();
                    }
                    awaited.push_back(true);
                }
            }
            _ = heartbeat.tick() => {
                match ping_sent {
                    Some(t) if t.elapsed() >= HEARTBEAT_TIMEOUT => return "heartbeat timed out".into(),
                    Some(_) => {}
                    None => {
                        if let Err(e) = wr.write_all(&ping).await {
                            return e.to_string();
                        }
                        awaited.push_back(false);
                        ping_sent = Some(Instant::now());
                    }
                }
            }
        }
    }
}

/// The next tick of an optional interval, or never.
async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Applies a pushed frame: another instance's message reaches the L1
/// through the coherence listener (what the frame means is
/// [`Peer::on_push`]'s).
fn apply<U: Dispatch>(up: &U, peer: &Peer, frame: &Bytes) {
    let Some(msg) = peer.on_push(frame) else {
        return;
    };
    let Some(l) = up.coherence_listener() else {
        return;
    };
    match msg {
        Message::Keys(keys) => l.invalidate(&keys),
        Message::Flush => l.reset_all(),
    }
}
