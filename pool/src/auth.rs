//! Upstream credentials: a fixed password from the `--upstream` URL, or a
//! secret that changes while sidecache runs (an ElastiCache IAM token, a
//! password file that a Kubernetes Secret rotates), fetched from a
//! [`SecretSource`], cached, and refreshed before it expires.
//!
//! This file owns *what* AUTH / HELLO AUTH sends and when the secret is
//! renewed. It does not own where a secret comes from: the binary
//! implements [`SecretSource`] (it may read files, the environment and the
//! AWS credential chain; this crate never does). Nor does it own the
//! connections: each kind of long-lived connection re-authenticates itself
//! every [`Auth::reauth_interval`] with the cached secret (`conn/mux.rs`:
//! every multiplexed connection, so the shared, control, tracking and
//! write-behind ones; `tasks/peer_subscriber.rs`: the peer channel), or is not
//! reused past it (`conn/session.rs`: held connections).
//!
//! ```text
//!  SecretSource::fetch ──every `refresh` (or at once after a refused
//!        │                 handshake)──▶ Auth::current (ArcSwap) ──▶ handshake of every new connection
//!        └─ failure: counted, logged, retried; the cached secret stays  └──▶ AUTH on live connections every `reauth`
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::BytesMut;
use sidecache_resp::encode;
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::error::{Error, Result};

/// Credentials sent with AUTH / HELLO AUTH.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// ACL user; `None` means the default user (`AUTH password`).
    pub username: Option<String>,
    /// The password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The future a [`SecretSource`] returns: the secret, or why not.
pub type SecretFuture<'a> = Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>>;

/// Where a rotating secret comes from (implemented by the binary).
pub trait SecretSource: Send + Sync + fmt::Debug {
    /// Produces the secret to use from now on (a fresh IAM token, the
    /// password file's content). Called at start, every refresh period,
    /// and after a handshake was refused.
    fn fetch(&self) -> SecretFuture<'_>;
}

/// A secret that changes while sidecache runs.
#[derive(Clone, Debug)]
pub struct RotatingSecret {
    /// Where it comes from.
    pub source: Arc<dyn SecretSource>,
    /// The ACL user it authenticates (`None`: the default user).
    pub username: Option<String>,
    /// How often it is fetched again (an IAM token lives 15 minutes).
    pub refresh: Duration,
}

/// The default `--upstream-auth-refresh`: well inside an IAM token's 15
/// minutes, so a new connection never uses a token older than this.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);
/// The default `--upstream-reauth-interval`: well inside the 12 hours after
/// which ElastiCache drops an IAM-authenticated connection.
pub const DEFAULT_REAUTH_INTERVAL: Duration = Duration::from_secs(3600);
/// After a failed fetch, the next try comes this soon (or at the refresh
/// period, if shorter).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// Least time between two fetches asked for by refused handshakes.
const WAKE_GAP: Duration = Duration::from_secs(1);

/// Counters of credential refreshes and re-authentications.
#[derive(Debug, Default)]
pub struct AuthStats {
    /// Secrets fetched (at start and on refresh).
    pub refreshes: AtomicU64,
    /// Fetches that failed (the cached secret stayed in use).
    pub refresh_failures: AtomicU64,
    /// AUTH on a live connection that the server accepted.
    pub reauths: AtomicU64,
    /// AUTH on a live connection that failed (the connection is replaced).
    pub reauth_failures: AtomicU64,
}

/// What every connection of one upstream authenticates with.
pub struct Auth {
    username: Option<String>,
    current: ArcSwapOption<Credentials>,
    rotating: Option<(Arc<dyn SecretSource>, Duration)>,
    reauth: Option<Duration>,
    wake: Notify,
    /// Counters.
    pub stats: AuthStats,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .field("rotating", &self.rotating.as_ref().map(|(s, r)| (s, r)))
            .field("reauth", &self.reauth)
            .finish()
    }
}

impl Auth {
    /// Fixed credentials (`None`: no AUTH), never renewed.
    pub fn fixed(credentials: Option<Credentials>) -> Auth {
        Auth {
            username: credentials.as_ref().and_then(|c| c.username.clone()),
            current: ArcSwapOption::from(credentials.map(Arc::new)),
            rotating: None,
            reauth: None,
            wake: Notify::new(),
            stats: AuthStats::default(),
        }
    }

    /// A rotating secret, re-sent on live connections every `reauth`
    /// (`None`: never). Nothing is fetched until [`Auth::start`].
    pub fn rotating(secret: &RotatingSecret, reauth: Option<Duration>) -> Auth {
        Auth {
            username: secret.username.clone(),
            current: ArcSwapOption::empty(),
            rotating: Some((Arc::clone(&secret.source), secret.refresh)),
            reauth,
            wake: Notify::new(),
            stats: AuthStats::default(),
        }
    }

    /// The ACL user connections authenticate as (`None`: `default`).
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// Whether the secret changes while sidecache runs.
    pub fn is_rotating(&self) -> bool {
        self.rotating.is_some()
    }

    /// The credentials a new connection sends now.
    pub fn current(&self) -> Option<Arc<Credentials>> {
        self.current.load_full()
    }

    /// How often a live connection sends AUTH again (`None`: never; always
    /// `None` for fixed credentials, which cannot change).
    pub fn reauth_interval(&self) -> Option<Duration> {
        self.rotating.as_ref().and(self.reauth)
    }

    /// Encodes `AUTH [user] secret` with the current credentials into
    /// `out`; false (nothing written) without credentials.
    pub fn encode_auth(&self, out: &mut BytesMut) -> bool {
        let Some(c) = self.current() else {
            return false;
        };
        match &c.username {
            Some(u) => encode::encode_command(out, &[b"AUTH", u.as_bytes(), c.password.as_bytes()]),
            None => encode::encode_command(out, &[b"AUTH", c.password.as_bytes()]),
        }
        true
    }

    /// Records the outcome of an AUTH sent on a live connection.
    pub fn note_reauth(&self, addr: &dyn fmt::Display, reply: std::result::Result<(), &str>) {
        match reply {
            Ok(()) => {
                self.stats.reauths.fetch_add(1, Ordering::Relaxed);
                debug!(%addr, "upstream connection re-authenticated");
            }
            Err(e) => {
                self.stats.reauth_failures.fetch_add(1, Ordering::Relaxed);
                warn!(%addr, error = %e, "upstream re-authentication failed; replacing the connection");
                self.request_refresh();
            }
        }
    }

    /// Asks for a fetch now (a handshake or a re-authentication was
    /// refused: the secret may have rotated); at most one a second.
    pub fn request_refresh(&self) {
        if self.rotating.is_some() {
            self.wake.notify_one();
        }
    }

    /// Fetches the first secret and starts refreshing it in the background
    /// for as long as `self` lives. Nothing to do for fixed credentials.
    ///
    /// # Errors
    /// [`Error::Credentials`] when the first fetch fails.
    pub async fn start(self: &Arc<Self>) -> Result<()> {
        let Some((_, period)) = &self.rotating else {
            return Ok(());
        };
        let period = *period;
        self.refresh().await?;
        tokio::spawn(refresher(Arc::downgrade(self), period));
        Ok(())
    }

    /// Fetches the secret once and installs it.
    ///
    /// # Errors
    /// [`Error::Credentials`]; the cached secret stays in use.
    pub async fn refresh(&self) -> Result<()> {
        let Some((source, _)) = &self.rotating else {
            return Ok(());
        };
        match source.fetch().await {
            Ok(password) => {
                self.current.store(Some(Arc::new(Credentials {
                    username: self.username.clone(),
                    password,
                })));
                self.stats.refreshes.fetch_add(1, Ordering::Relaxed);
                debug!("upstream credentials refreshed");
                Ok(())
            }
            Err(e) => {
                self.stats.refresh_failures.fetch_add(1, Ordering::Relaxed);
                warn!(error = %e, "refreshing upstream credentials failed; keeping the current ones");
                Err(Error::Credentials(e))
            }
        }
    }
}

/// Refreshes every `period` (sooner after a failure or when woken) until
/// the [`Auth`] is dropped.
async fn refresher(auth: Weak<Auth>, period: Duration) {
    let mut wait = period;
    loop {
        let woken = {
            let Some(a) = auth.upgrade() else { return };
            let notified = a.wake.notified();
            tokio::select! {
                () = tokio::time::sleep(wait) => false,
                () = notified => true,
            }
        };
        let Some(a) = auth.upgrade() else { return };
        wait = match a.refresh().await {
            Ok(()) => period,
            Err(_) => period.min(RETRY_AFTER_FAILURE),
        };
        drop(a);
        if woken {
            tokio::time::sleep(WAKE_GAP).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[derive(Debug, Default)]
    struct Counter(AtomicUsize);

    impl SecretSource for Counter {
        fn fetch(&self) -> SecretFuture<'_> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if n == 2 {
                    Err("unavailable".to_owned())
                } else {
                    Ok(format!("secret-{n}"))
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_on_schedule_and_keeps_the_secret_on_failure() {
        let secret = RotatingSecret {
            source: Arc::new(Counter::default()),
            username: Some("app".into()),
            refresh: Duration::from_secs(60),
        };
        let auth = Arc::new(Auth::rotating(&secret, Some(Duration::from_secs(600))));
        assert!(auth.current().is_none());
        auth.start().await.unwrap();
        assert_eq!(auth.current().unwrap().password, "secret-0");
        assert_eq!(auth.current().unwrap().username.as_deref(), Some("app"));
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(auth.current().unwrap().password, "secret-1");
        // The third fetch fails: the second secret stays, and the next
        // try comes after RETRY_AFTER_FAILURE, not a whole period.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(auth.current().unwrap().password, "secret-1");
        assert_eq!(auth.stats.refresh_failures.load(Ordering::Relaxed), 1);
        tokio::time::sleep(RETRY_AFTER_FAILURE + Duration::from_secs(1)).await;
        assert_eq!(auth.current().unwrap().password, "secret-3");
        assert_eq!(auth.stats.refreshes.load(Ordering::Relaxed), 3);
        let mut out = BytesMut::new();
        assert!(auth.encode_auth(&mut out));
        assert_eq!(
            &out[..],
            b"*3\r\n$4\r\nAUTH\r\n$3\r\napp\r\n$8\r\nsecret-3\r\n"
        );
        assert_eq!(auth.reauth_interval(), Some(Duration::from_secs(600)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_handshake_fetches_at_once() {
        let secret = RotatingSecret {
            source: Arc::new(Counter::default()),
            username: None,
            refresh: Duration::from_secs(300),
        };
        let auth = Arc::new(Auth::rotating(&secret, None));
        auth.start().await.unwrap();
        tokio::task::yield_now().await;
        auth.request_refresh();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(auth.current().unwrap().password, "secret-1");
        assert_eq!(auth.reauth_interval(), None);
    }

    #[test]
    fn fixed_credentials_never_reauthenticate() {
        let auth = Auth::fixed(Some(Credentials {
            username: None,
            password: "pw".into(),
        }));
        assert_eq!(auth.reauth_interval(), None);
        let mut out = BytesMut::new();
        assert!(auth.encode_auth(&mut out));
        assert_eq!(&out[..], b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n");
        assert!(!Auth::fixed(None).encode_auth(&mut out));
    }
}
