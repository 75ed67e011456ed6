//! The `sidecache` binary: parse configuration, start, run until SIGTERM or
//! SIGINT.

use anyhow::Context as _;
use clap::Parser as _;
use sidecache::{Config, Listeners, Options};

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
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
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
    let shared = sidecache::prepare(config)
        .await
        .context("cannot use upstream")?;
    let report = sidecache::run(listeners, shared, shutdown_signal()).await;
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
