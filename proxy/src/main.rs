//! The `sidecache` binary: parse configuration, start, run until SIGTERM or
//! SIGINT; or, as `sidecache hotkeys`, print a running one's hot keys; as
//! `sidecache top`, watch a running one in the terminal; or, as
//! `sidecache iam-token`, print an ElastiCache IAM token.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use sidecache::config::LogFormat;
use sidecache::report::export::Exporter;
use sidecache::{Config, Listeners, Options};
use sidecache_pool::write_behind::journal::Journal;
use tokio_util::sync::CancellationToken;

fn main() -> std::process::ExitCode {
    let mut options = Options::parse();
    let subcommand = match options.command.take() {
        Some(sidecache::config::Command::Hotkeys(args)) => Some((
            "hotkeys",
            sidecache::metrics::hotkeys::cli::run(&args, &mut std::io::stdout().lock()),
        )),
        Some(sidecache::config::Command::Top(args)) => Some(("top", sidecache::top::run(&args))),
        Some(sidecache::config::Command::IamToken(args)) => Some((
            "iam-token",
            sidecache::credentials::iam::cli(
                sidecache::credentials::iam::TokenRequest {
                    cache: args.cache,
                    user: args.user,
                    serverless: args.serverless,
                },
                args.region,
            )
            .map(|token| println!("{token}"))
            .map_err(anyhow::Error::msg),
        )),
        None => None,
    };
    if let Some((name, result)) = subcommand {
        return match result {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sidecache {name}: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
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
    let runtime = match sidecache::runtime(config.threads) {
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
    // The journal first: a second sidecache on the same one stops here.
    let journal = match &config.journal {
        Some(cfg) => Some(Journal::open(cfg.clone()).context("cannot open the write journal")?),
        None => None,
    };
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
                tokio::spawn(sidecache::report::http::serve(
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
    // What the last run left in the journal reaches upstream before any
    // client is served.
    let journal = match journal {
        Some((journal, leftover)) => {
            let journal = Arc::new(journal);
            shared
                .upstream
                .write_behind()
                .set_journal(Arc::clone(&journal));
            let (records, dropped) = (leftover.records.len(), leftover.dropped_bytes);
            if records > 0 || dropped > 0 {
                tracing::info!(
                    records,
                    already_landed = leftover.settled,
                    dropped_bytes = dropped,
                    "write journal: replaying what the last run left"
                );
            }
            let report = tokio::select! {
                r = shared.upstream.replay(leftover) => r.context("replaying the write journal")?,
                _ = stop.cancelled() => return Ok(()),
            };
            journal
                .stats()
                .replayed
                .store(report.replayed, std::sync::atomic::Ordering::Relaxed);
            if records > 0 {
                tracing::info!(
                    replayed = report.replayed,
                    failed = report.failed,
                    "write journal: replayed"
                );
            }
            Some(journal)
        }
        None => None,
    };
    exporter.attach(&shared);
    let report = sidecache::run(listeners, shared, stop.cancelled_owned()).await;
    http_stop.cancel();
    if let Some(j) = journal {
        // Every write flushed: nothing is left to replay.
        let all = report.unflushed == 0;
        let _ = tokio::task::spawn_blocking(move || j.close(all)).await;
    }
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
