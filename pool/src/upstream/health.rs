//! What the nodes' health means for the whole upstream: whether the proxy
//! may answer PING itself, the trouble shown by `/readyz`, and the calls
//! that travel on the control connections (see [`crate::conn::health`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::Upstream;
use crate::coherence::tracking::HEARTBEAT_TIMEOUT;
use crate::error::{Error, Result};

impl Upstream {
    /// Whether every node is known healthy: the proxy may answer PING
    /// itself. One relaxed atomic load (the PING fast path).
    #[inline]
    pub fn all_healthy(&self) -> bool {
        self.health_stats().unhealthy.load(Ordering::Relaxed) == 0
    }

    /// Connections re-opened because their node answered `-READONLY`.
    pub fn readonly_reconnects(&self) -> u64 {
        self.health_stats()
            .readonly_reconnects
            .load(Ordering::Relaxed)
    }

    /// `upstream ADDR busy: BUSY …` for the first master in trouble.
    pub fn trouble(&self) -> Option<String> {
        self.topology().nodes().iter().find_map(|n| {
            let t = n.health().trouble()?;
            Some(format!("upstream {} {t}", n.addr()))
        })
    }

    /// Sends an encoded command (a PING, FUNCTION STATS) to the first
    /// master not known healthy (the first master if they all are again)
    /// on its control connection: what Redis answers (`-BUSY …`, `+PONG`,
    /// the running script's stats) is what the client gets.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no reply came within the connect timeout;
    /// connection errors.
    pub async fn control_first_troubled(&self, cmd: Bytes) -> Result<Bytes> {
        let topo = self.topology();
        let nodes = topo.nodes();
        let node = nodes
            .iter()
            .find(|n| !n.health().is_healthy())
            .or(nodes.first())
            .ok_or(Error::SlotUnassigned(0))?;
        node.control().call(cmd).await
    }

    /// Sends SCRIPT KILL / FUNCTION KILL (encoded) to every master on its
    /// control connection, concurrently; one result per master, in
    /// topology order.
    pub async fn kill(&self, cmd: Bytes) -> Vec<Result<Bytes>> {
        let topo = self.topology();
        let calls: Vec<_> = topo
            .nodes()
            .iter()
            .map(|n| {
                let c = Arc::clone(n.control());
                let cmd = cmd.clone();
                tokio::spawn(async move { c.call(cmd).await })
            })
            .collect();
        let mut out = Vec::with_capacity(calls.len());
        for c in calls {
            out.push(c.await.unwrap_or(Err(Error::Closed)));
        }
        out
    }

    /// Optin tracking: pings every master's fill connections and waits
    /// for the answers (at most [`HEARTBEAT_TIMEOUT`]). Redis applies a
    /// lowered `tracking-table-max-keys` when it next runs a command, and
    /// pushes the invalidations of the keys it so forgets on the
    /// connections that registered them before that command's reply: once
    /// this returns, those pushes have been read and applied. Without
    /// optin tracking it returns at once; a lane that fails is skipped
    /// (its loss clears the master's part of the L1 anyway).
    pub async fn settle_tracking(&self) {
        let topo = self.topology();
        let mut waits = Vec::new();
        for node in topo.nodes() {
            for lane in 0..self.fill_connections() {
                let Some(conn) = self.fill_conn(node, lane) else {
                    continue;
                };
                let ping = Bytes::from_static(b"*1\r\n$4\r\nPING\r\n");
                if let Ok(rx) = conn.submit(ping, 1).await {
                    waits.push(rx);
                }
            }
        }
        let _ = tokio::time::timeout(HEARTBEAT_TIMEOUT, async {
            for rx in waits {
                let _ = rx.await;
            }
        })
        .await;
    }
}
