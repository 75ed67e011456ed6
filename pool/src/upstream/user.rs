//! Clients authenticated as an ACL user of their own (issue #32): their
//! commands run on connections authenticated as that user, so Redis applies
//! that user's ACL and its errors (`-NOPERM …`) reach them unchanged.
//!
//! Owns the per-user connections' API: a bounded [`SessionPool`] per user
//! (made by [`Upstream::user_pool`]; the proxy keeps one per user and
//! password, and bounds how many), the check of a client's credentials
//! ([`Upstream::authenticate`]: a fresh connection's handshake), a
//! pipeline sent on one of the user's connections ([`Upstream::submit_as`],
//! after the same write-behind waits as [`Upstream::submit`]) and redirects
//! followed on them ([`Via::User`]). It does not own which clients use
//! them, nor the L1 (the proxy never serves such clients from it).
//!
//! ```text
//!  client (AUTH bob) ──submit_as──▶ wait_writes(node) ──▶ bob's pool: hold ─▶ pipeline ─▶ replies ─▶ release (clean: idle, reused)
//!                                                          └ bound reached for --write-queue-timeout: UserConnectionsExhausted
//! ```

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::submit::Pending;
use super::{Submitted, Upstream};
use crate::config::{Credentials, Session};
use crate::conn::mux::Replies;
use crate::conn::node::Node;
use crate::conn::session::SessionPool;
use crate::error::{Error, Result};

/// Whose connection a command (or a redirect's retry) travels on.
#[derive(Debug, Clone, Copy)]
pub enum Via<'a> {
    /// The shared multiplexed connections, authenticated as the
    /// `--upstream` user; `hint` keeps one client on one connection.
    Shared {
        /// Spreads clients over the pool.
        hint: usize,
    },
    /// A connection of one ACL user's pool.
    User(&'a Arc<SessionPool>),
}

impl Upstream {
    /// A pool of at most `max` connections authenticated as `credentials`
    /// (TLS and timeouts as every upstream connection). Nothing connects
    /// until it is used.
    pub fn user_pool(&self, credentials: Credentials, max: usize) -> Arc<SessionPool> {
        let user = credentials
            .username
            .clone()
            .unwrap_or_else(|| "default".into());
        let connector = Arc::new(self.connector().with_credentials(credentials));
        Arc::new(SessionPool::for_user(connector, max, user))
    }

    /// Checks a client's credentials: opens a connection of `pool` to the
    /// first master, whose handshake authenticates as the pool's user, and
    /// keeps it for the pool's next use.
    ///
    /// # Errors
    /// [`Error::Handshake`] with the server's refusal (`WRONGPASS …`) as
    /// its `reply`; connection errors.
    pub async fn authenticate(&self, pool: &Arc<SessionPool>) -> Result<()> {
        let topo = self.topology();
        let node = topo.nodes().first().ok_or(Error::SlotUnassigned(0))?;
        pool.verify(node.addr()).await
    }

    /// [`Upstream::submit`] on a connection of an ACL user's `pool`: waits
    /// for the write-behind writes the pipeline must not overtake, then
    /// sends it on a connection held from `pool` for this pipeline alone
    /// (released clean once its replies are in). The replies are awaited
    /// in a task of their own, so the pipelines of a batch's nodes travel
    /// at once.
    pub async fn submit_as(
        &self,
        pool: &Arc<SessionPool>,
        node: &Arc<Node>,
        session: Session,
        payload: Bytes,
        count: usize,
        deadline: Option<Instant>,
    ) -> Submitted {
        let waited = match self.wait_writes_first(node).await {
            Ok(waited) => waited,
            Err(failed) => return failed,
        };
        let (tx, rx) = oneshot::channel();
        let pool = Arc::clone(pool);
        let addr = node.addr().clone();
        let wait = self.write_behind().config().queue_timeout;
        let timeout = self.command_timeout();
        tokio::spawn(async move {
            let r = match pool
                .hold(&addr, session, wait, &payload, count, timeout)
                .await
            {
                Ok((conn, replies)) => {
                    pool.release(conn, true);
                    Ok(replies)
                }
                Err(e) => Err(e),
            };
            let _ = tx.send(r);
        });
        Submitted {
            waited,
            replies: Ok(Pending::new(rx, Arc::clone(node), deadline)),
        }
    }

    /// Sends `count` commands to `node` on the connection `via` names and
    /// waits for their replies (`--upstream-timeout`).
    ///
    /// # Errors
    /// Connection errors, [`Error::Timeout`], a full user pool.
    pub(super) async fn call_via(
        &self,
        via: Via<'_>,
        node: &Node,
        session: Session,
        payload: Bytes,
        count: usize,
    ) -> Result<Replies> {
        match via {
            Via::Shared { hint } => self.call(node, session, hint, payload, count).await,
            Via::User(pool) => {
                let wait = self.write_behind().config().queue_timeout;
                let (conn, replies) = pool
                    .hold(
                        node.addr(),
                        session,
                        wait,
                        &payload,
                        count,
                        self.command_timeout(),
                    )
                    .await?;
                pool.release(conn, true);
                Ok(replies)
            }
        }
    }
}
