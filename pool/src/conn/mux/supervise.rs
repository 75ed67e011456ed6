//! A connection's supervisor: connects, runs the connection until it
//! breaks, and reconnects with backoff; while it cannot connect, requests
//! fail fast.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::{run_connected, Request};
use crate::backoff::Backoff;
use crate::coherence::tracking::Channel;
use crate::config::{NodeAddr, Session};
use crate::conn::connect::Connector;
use crate::conn::health::Health;
use crate::error::Error;

/// What a connection is to client tracking.
#[derive(Clone)]
pub(super) enum Role {
    /// Any other connection.
    Plain,
    /// The invalidation channel's own connection.
    Channel(Arc<Channel>),
}

/// Keeps the connection to `addr` up for the requests on `rx`, until every
/// handle is dropped.
pub(super) async fn supervise(
    connector: Arc<Connector>,
    addr: NodeAddr,
    session: Session,
    mut rx: mpsc::Receiver<Request>,
    role: Role,
    health: Option<Arc<Health>>,
) {
    let channel = match &role {
        Role::Channel(ch) => Some(Arc::clone(ch)),
        Role::Plain => None,
    };
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    // Before reconnecting after a READONLY: none the first time.
    let mut demoted_pause = Duration::ZERO;
    loop {
        match connector.connect(&addr, session).await {
            Ok((rd, wr)) => {
                debug!(%addr, "upstream connected");
                backoff.reset();
                let since = std::time::Instant::now();
                let reason = run_connected(
                    &addr,
                    rd,
                    wr,
                    &mut rx,
                    channel.as_ref(),
                    health.as_ref(),
                    connector.auth(),
                )
                .await;
                if let Some(ch) = &channel {
                    let why = reason
                        .as_ref()
                        .map_or("closed".to_owned(), |e| e.to_string());
                    ch.set_down(&why);
                }
                match reason {
                    None => return,
                    Some(e @ Error::Demoted { .. }) => {
                        warn!(%addr, error = %e, "upstream demoted");
                        if let Some(h) = &health {
                            h.note_readonly_reconnect();
                        }
                        if since.elapsed() > Duration::from_secs(2) {
                            demoted_pause = Duration::ZERO;
                        }
                        // Requests wait in the queue meanwhile (bounded):
                        // they are for the new connection.
                        tokio::time::sleep(demoted_pause).await;
                        demoted_pause = (demoted_pause * 2)
                            .clamp(Duration::from_millis(20), Duration::from_secs(1));
                    }
                    Some(e) => warn!(%addr, error = %e, "upstream connection lost"),
                }
            }
            Err(e) => {
                warn!(%addr, error = %e, "upstream connect failed");
                // Fail fast whatever waits, and whatever arrives during the
                // backoff, so clients get an error instead of a hang.
                let deadline = tokio::time::sleep(backoff.next_wait());
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => break,
                        r = rx.recv() => match r {
                            Some(req) => { let _ = req.reply.send(Err(e.clone())); }
                            None => return,
                        },
                    }
                }
            }
        }
    }
}
