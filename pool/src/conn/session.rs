//! Held session connections: an upstream connection one client has to
//! itself while it carries state Redis keeps per connection (WATCHed keys,
//! an open MULTI), from a bounded pool.
//!
//! ```text
//!  client ──hold(node, session)──▶ [permit: --max-session-connections] ──▶ idle list (node, session) ─┐
//!                                                                       └─ none idle: connect ───────┤
//!  client ◀── SessionConn (exclusive: request → replies, in order) ◀────────────────────────────────┘
//!  client ──release(conn, clean)──▶ clean: back to the idle list · state left: closed
//! ```
//!
//! Unlike the multiplexed connections, a held connection never reconnects
//! by itself: a reconnect would silently drop the WATCHes or the MULTI it
//! carries, so a broken one fails its client's command and is closed.
//! A connection goes back to the idle list only when its client left it
//! clean (no MULTI open, nothing watched, every reply read); anything else
//! is closed, so no client ever inherits another's state.
//!
//! With a rotating secret (IAM), a held connection is never sent `AUTH`
//! (it may sit inside a client's MULTI, where AUTH would be queued); one
//! authenticated longer ago than `--upstream-reauth-interval` is closed
//! instead of being given out again. One client holding a connection
//! longer than the server allows (ElastiCache: 12 hours for IAM) sees it
//! close, as with the server's `timeout`. Spliced connections
//! (subscriptions, MONITOR) are their client's for good, likewise.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{NodeAddr, Session};
use crate::conn::connect::{Connector, ReadHalf, WriteHalf};
use crate::conn::mux::Replies;
use crate::error::{Error, Result};

/// Idle held connections kept per (node, session); more are closed.
const IDLE_PER_KEY: usize = 8;
/// An idle connection older than this is closed rather than reused (the
/// server's `timeout` may have closed it meanwhile).
const IDLE_MAX_AGE: Duration = Duration::from_secs(60);

/// Counters of the held-connection pool.
#[derive(Debug, Default)]
pub struct SessionStats {
    /// Connections held by clients now.
    pub in_use: AtomicUsize,
    /// Checkouts that had to wait for a connection to be released.
    pub waits: AtomicU64,
    /// Checkouts refused: the bound stayed reached.
    pub refusals: AtomicU64,
    /// Connections opened.
    pub opened: AtomicU64,
}

/// The bounded pool of held connections (one per upstream).
pub struct SessionPool {
    connector: Arc<Connector>,
    permits: Arc<Semaphore>,
    max: usize,
    /// The ACL user whose pool this is (`None`: the upstream's own user,
    /// `--max-session-connections`): names the bound in its error.
    user: Option<String>,
    idle: Mutex<HashMap<(NodeAddr, Session), Vec<Idle>>>,
    /// Counters.
    pub stats: SessionStats,
}

impl std::fmt::Debug for SessionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionPool")
            .field("max", &self.max)
            .finish()
    }
}

/// An idle connection and since when.
type Idle = (SessionConnInner, Instant);

/// The connection itself, without its permit.
struct SessionConnInner {
    addr: NodeAddr,
    session: Session,
    rd: ReadHalf,
    wr: WriteHalf,
    buf: BytesMut,
    /// When it authenticated (at connect).
    opened: Instant,
}

/// A connection held by one client. Dropped, it is closed and its room in
/// the pool freed; give it back with [`SessionPool::release`] to reuse it.
pub struct SessionConn {
    /// `None` only while being given back.
    inner: Option<SessionConnInner>,
    /// Whether a reply is missing (a call timed out or broke): the
    /// connection can never be reused.
    broken: bool,
    _permit: OwnedSemaphorePermit,
    pool: Arc<SessionPool>,
}

impl std::fmt::Debug for SessionConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionConn")
            .field("addr", &self.inner.as_ref().map(|c| &c.addr))
            .field("broken", &self.broken)
            .finish()
    }
}

impl Drop for SessionConn {
    fn drop(&mut self) {
        self.pool.stats.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SessionPool {
    /// A pool of at most `max` held connections in all.
    pub(crate) fn new(connector: Arc<Connector>, max: usize) -> SessionPool {
        SessionPool {
            connector,
            permits: Arc::new(Semaphore::new(max.max(1))),
            max: max.max(1),
            user: None,
            idle: Mutex::new(HashMap::new()),
            stats: SessionStats::default(),
        }
    }

    /// A pool of at most `max` connections authenticated as the ACL user
    /// `user` (`connector` authenticates as that user).
    pub(crate) fn for_user(connector: Arc<Connector>, max: usize, user: String) -> SessionPool {
        SessionPool {
            user: Some(user),
            ..SessionPool::new(connector, max)
        }
    }

    /// The bound (`--max-session-connections`, or `--acl-user-connections`
    /// for an ACL user's pool).
    pub fn max(&self) -> usize {
        self.max
    }

    /// The ACL user its connections authenticate as (`None`: the
    /// upstream's own).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Takes a connection to `addr` for `session`, waiting at most `wait`
    /// for room, and sends it `payload` (`n` commands) as its first request.
    /// An idle connection that turns out closed is replaced once, which is
    /// safe because nothing had been sent on it.
    ///
    /// # Errors
    /// [`Error::SessionsExhausted`] when the bound stayed reached; connect
    /// and connection errors; [`Error::Timeout`] after `timeout`.
    pub async fn hold(
        self: &Arc<Self>,
        addr: &NodeAddr,
        session: Session,
        wait: Duration,
        payload: &[u8],
        n: usize,
        timeout: Option<Duration>,
    ) -> Result<(SessionConn, Replies)> {
        let permit = self.permit(wait).await?;
        let idle = self.take_idle(addr, session);
        let reused = idle.is_some();
        let inner = match idle {
            Some(c) => c,
            None => self.open(addr, session).await?,
        };
        self.stats.in_use.fetch_add(1, Ordering::Relaxed);
        let mut conn = SessionConn {
            inner: Some(inner),
            broken: false,
            _permit: permit,
            pool: Arc::clone(self),
        };
        match conn.call(payload, n, timeout).await {
            Ok(r) => Ok((conn, r)),
            Err(Error::ConnectionLost { .. }) if reused => {
                // A stale idle connection: nothing ran on it.
                conn.inner = Some(self.open(addr, session).await?);
                conn.broken = false;
                let r = conn.call(payload, n, timeout).await?;
                Ok((conn, r))
            }
            Err(e) => Err(e),
        }
    }

    /// Takes a fresh connection to `addr` for a client that keeps it for
    /// the rest of its life (subscriptions, MONITOR: the two are spliced),
    /// waiting at most `wait` for room in the pool. Its room is freed when
    /// the returned halves are dropped.
    ///
    /// # Errors
    /// As [`SessionPool::hold`].
    pub async fn splice(
        self: &Arc<Self>,
        addr: &NodeAddr,
        session: Session,
        wait: Duration,
    ) -> Result<Spliced> {
        let permit = self.permit(wait).await?;
        let inner = self.open(addr, session).await?;
        self.stats.in_use.fetch_add(1, Ordering::Relaxed);
        Ok(Spliced {
            rd: inner.rd,
            wr: inner.wr,
            _guard: SpliceGuard {
                _permit: permit,
                pool: Arc::clone(self),
            },
        })
    }

    /// Opens a fresh connection to `addr` (its handshake authenticates
    /// with this pool's credentials, checking them) and keeps it idle for
    /// the next [`SessionPool::hold`]; it takes no room until held.
    ///
    /// # Errors
    /// [`Error::Handshake`] with the server's refusal; connect errors.
    pub async fn verify(&self, addr: &NodeAddr) -> Result<()> {
        let session = Session::default();
        let inner = self.open(addr, session).await?;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry((addr.clone(), session)).or_default();
        if list.len() < IDLE_PER_KEY {
            list.push((inner, Instant::now()));
        }
        Ok(())
    }

    /// Room for one more held connection, waiting at most `wait`.
    async fn permit(self: &Arc<Self>, wait: Duration) -> Result<OwnedSemaphorePermit> {
        if let Ok(p) = Arc::clone(&self.permits).try_acquire_owned() {
            return Ok(p);
        }
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(wait, Arc::clone(&self.permits).acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                self.stats.refusals.fetch_add(1, Ordering::Relaxed);
                Err(match &self.user {
                    Some(user) => Error::UserConnectionsExhausted {
                        user: user.clone(),
                        max: self.max,
                    },
                    None => Error::SessionsExhausted { max: self.max },
                })
            }
        }
    }

    async fn open(&self, addr: &NodeAddr, session: Session) -> Result<SessionConnInner> {
        let (rd, wr) = self.connector.connect(addr, session).await?;
        self.stats.opened.fetch_add(1, Ordering::Relaxed);
        Ok(SessionConnInner {
            addr: addr.clone(),
            session,
            rd,
            wr,
            buf: BytesMut::with_capacity(4 * 1024),
            opened: Instant::now(),
        })
    }

    fn take_idle(&self, addr: &NodeAddr, session: Session) -> Option<SessionConnInner> {
        // With a rotating secret, a connection authenticated longer ago
        // than the re-authentication interval is not given out again (it
        // is never sent AUTH itself: it may carry a client's MULTI).
        let reauth = self.connector.auth().reauth_interval();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.get_mut(&(addr.clone(), session))?;
        while let Some((c, since)) = list.pop() {
            let fresh = reauth.is_none_or(|r| c.opened.elapsed() < r);
            if since.elapsed() < IDLE_MAX_AGE && fresh {
                return Some(c);
            }
        }
        None
    }

    /// Gives a connection back. `clean`: its client left no state on it
    /// (no MULTI open, nothing watched); otherwise, or if a reply is
    /// missing, it is closed.
    ///
    /// It goes back to the pool it came from, whichever pool this is
    /// called on: a connection authenticated as one ACL user never joins
    /// another's idle list.
    pub fn release(&self, mut conn: SessionConn, clean: bool) {
        if !clean || conn.broken {
            return;
        }
        let Some(inner) = conn.inner.take() else {
            return;
        };
        if !inner.buf.is_empty() {
            return;
        }
        let pool = Arc::clone(&conn.pool);
        drop(conn);
        let mut idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner());
        let list = idle.entry((inner.addr.clone(), inner.session)).or_default();
        if list.len() < IDLE_PER_KEY {
            list.push((inner, Instant::now()));
        }
    }
}

/// A held connection given whole to one client (see [`SessionPool::splice`]).
pub struct Spliced {
    /// Read half.
    pub rd: ReadHalf,
    /// Write half.
    pub wr: WriteHalf,
    _guard: SpliceGuard,
}

impl std::fmt::Debug for Spliced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spliced").finish()
    }
}

struct SpliceGuard {
    _permit: OwnedSemaphorePermit,
    pool: Arc<SessionPool>,
}

impl Drop for SpliceGuard {
    fn drop(&mut self) {
        self.pool.stats.in_use.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SessionConn {
    /// The node it is connected to.
    pub fn addr(&self) -> Option<&NodeAddr> {
        self.inner.as_ref().map(|c| &c.addr)
    }

    /// Sends `payload` (`n` commands) and reads their `n` replies; with an
    /// empty `payload`, reads `n` replies of commands sent earlier (a
    /// caller that sent more commands than it read replies for).
    ///
    /// # Errors
    /// [`Error::ConnectionLost`]; [`Error::Timeout`] after `timeout` (the
    /// connection is then unusable: its replies would come late).
    pub async fn call(
        &mut self,
        payload: &[u8],
        n: usize,
        timeout: Option<Duration>,
    ) -> Result<Replies> {
        if self.broken {
            return Err(self.lost("an earlier reply is missing"));
        }
        let fut = self.exchange(payload, n);
        let r = match timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(r) => r,
                Err(_) => {
                    self.broken = true;
                    return Err(Error::Timeout {
                        addr: self.addr().map(ToString::to_string).unwrap_or_default(),
                    });
                }
            },
            None => fut.await,
        };
        if r.is_err() {
            self.broken = true;
        }
        r
    }

    async fn exchange(&mut self, payload: &[u8], n: usize) -> Result<Replies> {
        let Some(c) = self.inner.as_mut() else {
            return Err(Error::Closed);
        };
        let addr = c.addr.to_string();
        let lost = |reason: String| Error::ConnectionLost {
            addr: addr.clone(),
            reason,
        };
        // An empty payload reads the replies of commands sent before.
        if !payload.is_empty() {
            c.wr.write_all(payload)
                .await
                .map_err(|e| lost(e.to_string()))?;
            c.wr.flush().await.map_err(|e| lost(e.to_string()))?;
        }
        let mut replies = Vec::with_capacity(n);
        let mut sc = Scanner::new();
        while replies.len() < n {
            match sc.scan(&c.buf) {
                Ok(Some(len)) => {
                    let f: Bytes = c.buf.split_to(len).freeze();
                    // Out-of-band pushes (RESP3) are not replies.
                    if f.first() != Some(&b'>') {
                        replies.push(f);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(Error::Protocol(e)),
            }
            if c.buf.capacity() - c.buf.len() < 4 * 1024 {
                c.buf.reserve(16 * 1024);
            }
            match c.rd.read_buf(&mut c.buf).await {
                Ok(0) => return Err(lost("closed by server".into())),
                Ok(_) => {}
                Err(e) => return Err(lost(e.to_string())),
            }
        }
        Ok(replies)
    }

    fn lost(&self, reason: &str) -> Error {
        Error::ConnectionLost {
            addr: self.addr().map(ToString::to_string).unwrap_or_default(),
            reason: reason.to_owned(),
        }
    }
}
