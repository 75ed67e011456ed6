//! Listeners (TCP and Unix socket), the accept loops with the client limit,
//! and graceful shutdown: stop accepting, let connections finish the batch
//! in hand, close the pools, all under `--shutdown-timeout`.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sidecache_pool::DrainReport;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::connection;
use crate::state::Shared;

/// Why a listener could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// Binding the TCP address failed.
    #[error("--listen {addr}: {source}")]
    Tcp {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Setting up the Unix socket failed.
    #[error("--unix-socket {path}: {message}")]
    Unix {
        /// The path.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

/// Bound listeners.
#[derive(Debug)]
pub struct Listeners {
    tcp: TcpListener,
    unix: Option<(UnixListener, PathBuf)>,
}

impl Listeners {
    /// Binds the TCP address and, if configured, the Unix socket (replacing
    /// a stale socket file, refusing to replace a live one or a non-socket).
    ///
    /// # Errors
    /// [`ListenError`] naming the listener.
    pub async fn bind(config: &Config) -> Result<Listeners, ListenError> {
        let tcp = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ListenError::Tcp {
                addr: config.listen,
                source,
            })?;
        let unix = match &config.unix_socket {
            Some((path, mode)) => Some((bind_unix(path, *mode).await?, path.clone())),
            None => None,
        };
        Ok(Listeners { tcp, unix })
    }

    /// The bound TCP address (useful with port 0).
    ///
    /// # Errors
    /// The OS error.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

async fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener, ListenError> {
    let fail = |message: String| ListenError::Unix {
        path: path.to_owned(),
        message,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).await.is_ok() {
                return Err(fail("another process is listening on it".into()));
            }
            std::fs::remove_file(path).map_err(|e| fail(format!("removing stale socket: {e}")))?;
        }
        Ok(_) => {
            return Err(fail(
                "exists and is not a socket; refusing to replace it".into(),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let listener = UnixListener::bind(path).map_err(|e| fail(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| fail(format!("chmod: {e}")))?;
    Ok(listener)
}

/// Serves clients until `shutdown` completes, then drains: in-flight
/// requests first, then the write-behind queue, all within
/// `--shutdown-timeout`. Returns what the write-behind drain achieved.
pub async fn run(
    listeners: Listeners,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) -> DrainReport {
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let slots = Arc::new(Semaphore::new(shared.config.maxclients));
    let laddr = listeners
        .tcp
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    info!(listen = %laddr, unix = ?listeners.unix.as_ref().map(|u| &u.1), "sidecache ready");
    let watch = tokio::spawn(crate::report::watch::run(
        Arc::clone(&shared),
        cancel.clone(),
    ));

    let tcp = spawn_tcp_accept(listeners.tcp, &shared, &cancel, &tracker, &slots);
    let unix_path = listeners.unix.as_ref().map(|u| u.1.clone());
    let unix = listeners.unix.map(|(listener, path)| {
        spawn_unix_accept(listener, path, &shared, &cancel, &tracker, &slots)
    });

    shutdown.await;
    let deadline = tokio::time::Instant::now() + shared.config.shutdown_timeout;
    info!("shutting down: no longer accepting");
    shared.metrics.shutting_down.store(true, Ordering::Relaxed);
    cancel.cancel();
    // Every client's own token (CLIENT KILL's), after the shared one: a
    // client registered before this sees it here, one registered after
    // saw the shared one cancelled (`connection::serve`).
    shared.with_clients(|c| c.values().for_each(|e| e.kill.cancel()));
    let _ = watch.await;
    let _ = tcp.await;
    if let Some(u) = unix {
        let _ = u.await;
    }
    finish_connections(&shared, &tracker, deadline).await;
    let report = drain_write_behind(&shared, deadline).await;
    if let Some(p) = unix_path {
        let _ = std::fs::remove_file(p);
    }
    shared.upstream.close();
    info!("sidecache stopped");
    report
}

/// Spawns the TCP accept loop (until `cancel`): each client's socket gets
/// TCP_NODELAY and, with `--tcp-keepalive`, keepalive, then its task.
fn spawn_tcp_accept(
    listener: TcpListener,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    slots: &Arc<Semaphore>,
) -> JoinHandle<()> {
    let (shared, cancel, tracker, slots) = (
        Arc::clone(shared),
        cancel.clone(),
        tracker.clone(),
        Arc::clone(slots),
    );
    tokio::spawn(async move {
        while let Some((stream, peer)) = accept(&cancel, || listener.accept()).await {
            let _ = stream.set_nodelay(true);
            if let Some(idle) = shared.config.tcp_keepalive {
                let _ = sidecache_pool::set_keepalive(&stream, idle);
            }
            let laddr = stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            spawn_client(
                stream,
                peer.to_string(),
                laddr,
                &shared,
                &cancel,
                &tracker,
                &slots,
            );
        }
    })
}

/// Spawns the Unix-socket accept loop (until `cancel`); a client's address
/// is the socket path.
fn spawn_unix_accept(
    listener: UnixListener,
    path: PathBuf,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    slots: &Arc<Semaphore>,
) -> JoinHandle<()> {
    let (shared, cancel, tracker, slots) = (
        Arc::clone(shared),
        cancel.clone(),
        tracker.clone(),
        Arc::clone(slots),
    );
    tokio::spawn(async move {
        let laddr = path.display().to_string();
        while let Some((stream, _)) = accept(&cancel, || listener.accept()).await {
            spawn_client(
                stream,
                format!("{laddr}:0"),
                laddr.clone(),
                &shared,
                &cancel,
                &tracker,
                &slots,
            );
        }
    })
}

/// The next connection `accept` gives, or `None` once `cancel` fired; a
/// failed accept (out of file descriptors, …) is logged and tried again
/// after 50 ms.
async fn accept<S, A, F, Fut>(cancel: &CancellationToken, mut accept: F) -> Option<(S, A)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<(S, A)>>,
{
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return None,
            r = accept() => r,
        };
        match accepted {
            Ok(c) => return Some(c),
            Err(e) => {
                warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Lets the client tasks finish the batch in hand, until `deadline`; the
/// ones still running then are left to close.
async fn finish_connections(
    shared: &Shared,
    tracker: &TaskTracker,
    deadline: tokio::time::Instant,
) {
    tracker.close();
    if tokio::time::timeout_at(deadline, tracker.wait())
        .await
        .is_err()
    {
        warn!(timeout = ?shared.config.shutdown_timeout, "shutdown timeout: closing remaining connections");
    }
}

/// Drains the write-behind queue in the time left until `deadline`,
/// records the outcome in the shutdown metrics, and logs it.
async fn drain_write_behind(shared: &Shared, deadline: tokio::time::Instant) -> DrainReport {
    let wb = shared.upstream.write_behind();
    let queued = wb.depth();
    let flushed_before = wb.stats.flushed.load(Ordering::Relaxed);
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let report = wb.drain(left).await;
    let m = &shared.metrics;
    m.shutdown_flushed.fetch_add(
        report.flushed.saturating_sub(flushed_before),
        Ordering::Relaxed,
    );
    m.shutdown_unflushed
        .store(report.unflushed, Ordering::Relaxed);
    if report.unflushed == 0 {
        info!(
            queued_at_shutdown = queued,
            flushed_total = report.flushed,
            failed_total = report.failed,
            "write-behind queue drained"
        );
    } else {
        error!(
            unflushed = report.unflushed,
            flushed_total = report.flushed,
            failed_total = report.failed,
            "shutdown timeout: write-behind writes NOT flushed"
        );
    }
    report
}

fn spawn_client<S>(
    mut stream: S,
    peer: String,
    laddr: String,
    shared: &Arc<Shared>,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    slots: &Arc<Semaphore>,
) where
    S: connection::ClientStream + Send + 'static,
{
    shared
        .stats
        .connections_received
        .fetch_add(1, Ordering::Relaxed);
    let Ok(permit) = Arc::clone(slots).try_acquire_owned() else {
        shared
            .stats
            .rejected_connections
            .fetch_add(1, Ordering::Relaxed);
        tracker.spawn(async move {
            let _ = stream
                .write_all(b"-ERR max number of clients reached\r\n")
                .await;
            let _ = stream.shutdown().await;
        });
        return;
    };
    let (shared, cancel) = (Arc::clone(shared), cancel.clone());
    tracker.spawn(async move {
        let id_hint = peer.clone();
        let counters = Arc::clone(&shared);
        // A panic in one client's task closes that client only: its
        // connection state unwinds (Client's Drop), the write-behind queue
        // and every other client are untouched.
        if CatchPanic(Box::pin(connection::serve(
            stream, shared, peer, laddr, cancel,
        )))
        .await
        .is_err()
        {
            counters.stats.client_panics.fetch_add(1, Ordering::Relaxed);
            error!(client = %id_hint, "client task panicked; its connection was closed");
        }
        drop(permit);
    });
}

/// Polls a future, turning a panic in it into `Err` (the panic message
/// was already printed by the panic hook).
struct CatchPanic<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for CatchPanic<F> {
    type Output = Result<F::Output, ()>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let fut = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(_) => std::task::Poll::Ready(Err(())),
        }
    }
}
