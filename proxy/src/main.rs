//! The `sidecache` binary: parse configuration, start, run until SIGTERM or
//! SIGINT.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use sidecache::config::LogFormat;
use sidecache::metrics::export::Exporter;
use sidecache::{Config, Listeners, Options};
use tokio_util::sync::CancellationToken;

fn main() -> std::process::ExitCode {
    let options = Options::parse();
    let config = match Config::load(options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sidecache: invalid configuration: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_target(false)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_target(false)
            .init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.threads)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sidecache: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(start(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sidecache: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn start(config: Config) -> anyhow::Result<()> {
    tracing::info!(config = %config.redacted(), "starting");
    let listeners = Listeners::bind(&config).await.context("cannot listen")?;
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    let exporter = Arc::new(Exporter::new());
    let http_stop = CancellationToken::new();
    if let Some(addr) = config.metrics_listen {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(metrics = %addr, "serving /metrics, /healthz, /readyz");
                tokio::spawn(sidecache::metrics::http::serve(
                    listener,
                    Arc::clone(&exporter),
                    http_stop.clone(),
                ));
            }
            // The default address taken (another sidecache on this host):
            // serve Redis anyway, and say how to get the endpoint back.
            Err(e) if !config.metrics_listen_given => tracing::warn!(
                metrics = %addr,
                error = %e,
                "default metrics address unavailable; running without /metrics, /healthz, /readyz (set --metrics-listen)"
            ),
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot listen: --metrics-listen {addr}")))
            }
        }
    }
    let wait_until = tokio::time::Instant::now() + config.upstream_wait;
    let shared = loop {
        match sidecache::prepare(config.clone()).await {
            Ok(shared) => break shared,
            Err(e) if tokio::time::Instant::now() < wait_until => {
                exporter.waiting(&e.to_string());
                tracing::warn!(error = %e, "upstream not usable yet; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
            Err(e) => return Err(anyhow::Error::new(e).context("cannot use upstream")),
        }
    };
    exporter.attach(&shared);
    let report = sidecache::run(listeners, shared, stop.cancelled_owned()).await;
    http_stop.cancel();
    if report.unflushed > 0 {
        anyhow::bail!(
            "{} acknowledged writes could not be flushed before the shutdown timeout",
            report.unflushed
        );
    }
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops sidecache");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
