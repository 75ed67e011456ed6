//! A node's control connection: what must not queue behind a blocked
//! shared connection (PING while the node is in doubt, SCRIPT KILL,
//! FUNCTION KILL), and the prober that pings a node not known healthy
//! until a reply says it is (see [`crate::conn::health`]).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::config::Session;
use crate::conn::health::{Health, PROBE_EVERY};
use crate::conn::mux::MuxConn;
use crate::error::{Error, Result};

/// One node's control connection, opened on first use; never carries
/// client session state.
#[derive(Debug)]
pub struct Control {
    health: Arc<Health>,
    conn: OnceLock<MuxConn>,
}

impl Control {
    /// The control connection of `health`'s node; from now on the node's
    /// prober runs on it.
    pub(crate) fn new(health: Arc<Health>) -> Arc<Control> {
        let control = Arc::new(Control {
            health,
            conn: OnceLock::new(),
        });
        let weak = Arc::downgrade(&control);
        control.health.set_prober(Box::new(move || {
            if let Some(c) = weak.upgrade() {
                tokio::spawn(probe(c));
            }
        }));
        control
    }

    fn conn(&self) -> &MuxConn {
        self.conn.get_or_init(|| {
            MuxConn::spawn(
                Arc::clone(self.health.connector()),
                self.health.addr().clone(),
                Session::default(),
            )
        })
    }

    /// Runs one command on the control connection and takes note of its
    /// reply; waits at most the connect timeout (a node that answers
    /// nothing, e.g. in `DEBUG SLEEP`, gets no more).
    ///
    /// # Errors
    /// [`Error::Timeout`] without a reply in time; connection errors.
    pub async fn call(&self, cmd: Bytes) -> Result<Bytes> {
        let wait = self.health.connector().connect_timeout();
        let call = self.conn().call(cmd, 1);
        let mut r = tokio::time::timeout(wait, call)
            .await
            .map_err(|_| Error::Timeout {
                addr: self.health.addr().to_string(),
            })??;
        let frame = r.pop().ok_or(Error::Closed)?;
        self.health.observe(&frame);
        Ok(frame)
    }
}

/// Pings the node until a reply says it is healthy.
async fn probe(c: Arc<Control>) {
    let ping = Bytes::from_static(b"*1\r\n$4\r\nPING\r\n");
    loop {
        while !c.health.is_healthy() {
            if let Err(e) = c.call(ping.clone()).await {
                tracing::debug!(node = %c.health.addr(), error = %e, "health probe");
            }
            if c.health.is_healthy() {
                break;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
        // Became unhealthy again after the last check: go on probing.
        if !c.health.probe_ended() {
            return;
        }
    }
}
