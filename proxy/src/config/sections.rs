//! Validating the options one section at a time: where the proxy listens,
//! the upstream (with write-behind and coherence), request limits, the
//! runtime and observability, the L1, and who may connect. Each returns
//! the first bad option as a [`ConfigError`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sidecache_l1::L1Config;
use sidecache_pool::config as pool;
use sidecache_pool::write_behind::journal;
use sidecache_pool::{Mode, Seed, UpstreamConfig};

use super::{
    default_threads, err, secs, size, ConfigError, FsyncArg, ModeArg, Options, TrackingArg, YesNo,
    DEFAULT_LISTEN, DEFAULT_MAX_MULTIBULK_LEN, DEFAULT_METRICS_LISTEN, DEFAULT_PROTO_MAX_BULK_LEN,
    DEFAULT_UNIX_SOCKET_MODE,
};

/// `--listen` and `--unix-socket` with its mode.
pub(super) fn listen(o: &Options) -> Result<(SocketAddr, Option<(PathBuf, u32)>), ConfigError> {
    let listen = o.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen.parse().map_err(|_| {
        err(
            "--listen",
            format!("{listen:?} is not an address like 127.0.0.1:6380"),
        )
    })?;
    let mode_bits = match &o.unix_socket_mode {
        Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
            .ok()
            .filter(|b| *b <= 0o777)
            .ok_or_else(|| {
                err(
                    "--unix-socket-mode",
                    format!("{m:?} is not octal permission bits like 0660"),
                )
            })?,
        None => DEFAULT_UNIX_SOCKET_MODE,
    };
    Ok((listen, o.unix_socket.clone().map(|p| (p, mode_bits))))
}

/// `--upstream` and everything the pool is given: connections, timeouts,
/// write-behind ([`write`]) and coherence ([`coherence`]).
pub(super) fn upstream(o: &Options) -> Result<UpstreamConfig, ConfigError> {
    if o.upstream.is_empty() {
        return Err(err(
            "--upstream",
            "required (e.g. --upstream redis://127.0.0.1:6379)",
        ));
    }
    let seeds = o
        .upstream
        .iter()
        .map(|u| Seed::parse(u.trim()).map_err(|e| err("--upstream", e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let pool_size = o.pool_size.unwrap_or(pool::DEFAULT_POOL_SIZE);
    if pool_size == 0 || pool_size > 64 {
        return Err(err("--pool-size", "must be between 1 and 64"));
    }
    let fill_connections = o.fill_connections.unwrap_or(pool::DEFAULT_FILL_CONNECTIONS);
    if fill_connections == 0 || fill_connections > 16 {
        return Err(err("--fill-connections", "must be between 1 and 16"));
    }
    let write = write(o)?;
    Ok(UpstreamConfig {
        write,
        seeds,
        mode: match o.mode.unwrap_or(ModeArg::Auto) {
            ModeArg::Auto => Mode::Auto,
            ModeArg::Standalone => Mode::Standalone,
            ModeArg::Cluster => Mode::Cluster,
        },
        pool_size,
        fill_connections,
        connect_timeout: secs(
            "--connect-timeout",
            o.connect_timeout,
            pool::DEFAULT_CONNECT_TIMEOUT.as_secs_f64(),
        )?,
        max_session_connections: match o
            .max_session_connections
            .unwrap_or(pool::DEFAULT_MAX_SESSION_CONNECTIONS)
        {
            n @ 1..=100_000 => n,
            _ => {
                return Err(err(
                    "--max-session-connections",
                    "must be between 1 and 100000",
                ))
            }
        },
        command_timeout: match o.upstream_timeout {
            Some(0.0) => None,
            v => Some(secs(
                "--upstream-timeout",
                v,
                pool::DEFAULT_COMMAND_TIMEOUT.as_secs_f64(),
            )?),
        },
        refresh_interval: secs(
            "--refresh-interval",
            o.refresh_interval,
            pool::DEFAULT_REFRESH_INTERVAL.as_secs_f64(),
        )?,
        tls_ca_file: o.tls_ca_file.clone(),
        coherence: coherence(o)?,
        ..UpstreamConfig::default()
    })
}

/// The write-behind batching and queue bounds (`--write-*`).
fn write(o: &Options) -> Result<pool::WriteConfig, ConfigError> {
    let batch = o.write_batch.unwrap_or(pool::DEFAULT_WRITE_BATCH);
    if batch == 0 || batch > 100_000 {
        return Err(err("--write-batch", "must be between 1 and 100000"));
    }
    let pipeline = o.write_pipeline.unwrap_or(pool::DEFAULT_WRITE_PIPELINE);
    if pipeline == 0 || pipeline > 64 {
        return Err(err("--write-pipeline", "must be between 1 and 64"));
    }
    let queue_max = o.write_queue_max.unwrap_or(pool::DEFAULT_WRITE_QUEUE_MAX);
    if queue_max == 0 || queue_max > 100_000_000 {
        return Err(err("--write-queue-max", "must be between 1 and 100000000"));
    }
    let flush_interval = match o.write_flush_interval {
        Some(0.0) => Duration::ZERO,
        Some(v) => secs("--write-flush-interval", Some(v), 0.0)?,
        None => Duration::ZERO,
    };
    let queue_max_bytes = size(
        "--write-queue-max-bytes",
        o.write_queue_max_bytes.as_deref(),
        pool::DEFAULT_WRITE_QUEUE_MAX_BYTES as u64,
    )?;
    if !(1024..=1 << 40).contains(&queue_max_bytes) {
        return Err(err(
            "--write-queue-max-bytes",
            "must be between 1kb and 1024gb",
        ));
    }
    Ok(pool::WriteConfig {
        batch,
        pipeline,
        flush_interval,
        queue_max,
        queue_max_bytes: usize::try_from(queue_max_bytes).unwrap_or(usize::MAX),
        queue_timeout: secs(
            "--write-queue-timeout",
            o.write_queue_timeout,
            pool::DEFAULT_WRITE_QUEUE_TIMEOUT.as_secs_f64(),
        )?,
    })
}

/// `--write-journal` and `--write-journal-fsync` (its segments sized
/// from `--write-queue-max-bytes`).
pub(super) fn journal(
    o: &Options,
    queue_max_bytes: usize,
) -> Result<Option<journal::JournalConfig>, ConfigError> {
    let Some(path) = &o.write_journal else {
        if o.write_journal_fsync.is_some() {
            return Err(err(
                "--write-journal-fsync",
                "needs --write-journal (a directory for the journal)",
            ));
        }
        return Ok(None);
    };
    if path.as_os_str().is_empty() {
        return Err(err("--write-journal", "must be a directory path"));
    }
    let fsync = match o.write_journal_fsync.unwrap_or(FsyncArg::Everysec) {
        FsyncArg::Always => journal::Fsync::Always,
        FsyncArg::Everysec => journal::Fsync::EverySec,
        FsyncArg::No => journal::Fsync::No,
    };
    Ok(Some(journal::JournalConfig {
        path: path.clone(),
        fsync,
        segment_bytes: journal::segment_bytes_for(queue_max_bytes),
    }))
}

/// `--tracking` and `--peer-invalidation-channel`.
fn coherence(o: &Options) -> Result<pool::Coherence, ConfigError> {
    let mode = match o.tracking.unwrap_or(TrackingArg::Optin) {
        TrackingArg::Off => return Ok(pool::Coherence::Off),
        TrackingArg::Bcast => pool::TrackingMode::Bcast,
        TrackingArg::Optin => pool::TrackingMode::Optin,
    };
    let peer_channel = match o.peer_invalidation_channel.as_deref() {
        Some("off") => None,
        Some("") => {
            return Err(err(
                "--peer-invalidation-channel",
                "must be a channel name or off",
            ))
        }
        Some(name) => Some(name.as_bytes().to_vec()),
        None => Some(pool::DEFAULT_PEER_CHANNEL.as_bytes().to_vec()),
    };
    Ok(pool::Coherence::Tracking {
        mode,
        prefixes: bytes_of(&o.l1_include_prefix),
        peer_channel,
    })
}

/// `--proto-max-bulk-len` and `--max-multibulk-len`.
pub(super) fn request_limits(o: &Options) -> Result<(u64, u64), ConfigError> {
    let proto_max_bulk_len = size(
        "--proto-max-bulk-len",
        o.proto_max_bulk_len.as_deref(),
        DEFAULT_PROTO_MAX_BULK_LEN,
    )?;
    if proto_max_bulk_len < 1024 * 1024 {
        return Err(err(
            "--proto-max-bulk-len",
            "must be at least 1mb (as Redis)",
        ));
    }
    let max_multibulk_len = o.max_multibulk_len.unwrap_or(DEFAULT_MAX_MULTIBULK_LEN);
    if max_multibulk_len == 0 || max_multibulk_len > i32::MAX as u64 {
        return Err(err(
            "--max-multibulk-len",
            "must be between 1 and 2147483647",
        ));
    }
    Ok((proto_max_bulk_len, max_multibulk_len))
}

/// `--metrics-listen`, `--upstream-wait` and `--threads`.
pub(super) fn runtime(o: &Options) -> Result<(Option<SocketAddr>, Duration, usize), ConfigError> {
    let metrics_listen = match o.metrics_listen.as_deref().map(str::trim) {
        Some(v) if v.eq_ignore_ascii_case("off") => None,
        v => {
            let v = v.unwrap_or(DEFAULT_METRICS_LISTEN);
            Some(v.parse::<SocketAddr>().map_err(|_| {
                err(
                    "--metrics-listen",
                    format!("{v:?} is not an address like 127.0.0.1:9121 or off"),
                )
            })?)
        }
    };
    let upstream_wait = match o.upstream_wait {
        None => Duration::ZERO,
        Some(v) => Duration::try_from_secs_f64(v)
            .map_err(|_| err("--upstream-wait", format!("{v} is not a number of seconds")))?,
    };
    let threads = o.threads.unwrap_or_else(default_threads);
    if threads == 0 || threads > 1024 {
        return Err(err("--threads", "must be between 1 and 1024"));
    }
    Ok((metrics_listen, upstream_wait, threads))
}

/// A duration flag: `30s`, `500ms`, `2m`, `1h`, or seconds (`1.5`); `0`
/// and unset are off.
pub(super) fn duration(
    flag: &'static str,
    v: Option<&str>,
) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = v.map(str::trim) else {
        return Ok(None);
    };
    let (num, unit) = match v.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => v.split_at(i),
        None => (v, "s"),
    };
    let scale = match unit.to_ascii_lowercase().as_str() {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => f64::NAN,
    };
    let secs = num.trim().parse::<f64>().map(|n| n * scale);
    match secs {
        Ok(0.0) => Ok(None),
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(err(
            flag,
            format!("{v:?}: expected a duration up to 24h, e.g. 30s, 500ms, 2m"),
        )),
    }
}

/// The L1 (`--l1-*`).
pub(super) fn l1(o: &Options) -> Result<L1Config, ConfigError> {
    Ok(L1Config {
        max_bytes: size(
            "--l1-max-bytes",
            o.l1_max_bytes.as_deref(),
            sidecache_l1::config::DEFAULT_MAX_BYTES,
        )?,
        max_value_bytes: size(
            "--l1-max-value-bytes",
            o.l1_max_value_bytes.as_deref(),
            sidecache_l1::config::DEFAULT_MAX_VALUE_BYTES,
        )?,
        ttl_cap: secs(
            "--l1-ttl-cap",
            o.l1_ttl_cap,
            // With tracking off the cap alone bounds other writers' changes.
            if matches!(o.tracking, Some(TrackingArg::Off)) {
                sidecache_l1::config::UNTRACKED_TTL_CAP
            } else {
                sidecache_l1::config::DEFAULT_TTL_CAP
            }
            .as_secs_f64(),
        )?,
        cache_nil: match o.l1_cache_nil {
            Some(v) => Some(secs("--l1-cache-nil", Some(v), 0.0)?),
            None => None,
        },
        include_prefixes: bytes_of(&o.l1_include_prefix),
        exclude_prefixes: bytes_of(&o.l1_exclude_prefix),
        // Only optin tracking re-reads what the proxy writes.
        read_marks: matches!(o.tracking.unwrap_or(TrackingArg::Optin), TrackingArg::Optin),
    })
}

/// `--requirepass`, and protected mode: a non-loopback `--listen` without
/// a password refuses to start unless `--protected-mode no`.
pub(super) fn requirepass(o: &Options, listen: SocketAddr) -> Result<Option<String>, ConfigError> {
    let requirepass = o.requirepass.clone().filter(|p| !p.is_empty());
    if o.protected_mode != Some(YesNo::No) && requirepass.is_none() && !listen.ip().is_loopback() {
        return Err(err(
            "--listen",
            format!(
                "{listen} is not a loopback address and no --requirepass is set: \
                 anyone who reaches it could use the upstream (protected mode). \
                 Set --requirepass, or --protected-mode no to serve it anyway"
            ),
        ));
    }
    Ok(requirepass)
}

/// Key prefixes as given, as bytes.
fn bytes_of(prefixes: &[String]) -> Vec<Vec<u8>> {
    prefixes.iter().map(|p| p.as_bytes().to_vec()).collect()
}

/// `--hotkeys-capacity`, `--hotkeys-sample` and `--prefix-stats`.
pub(super) fn hotkeys(o: &Options) -> Result<(usize, u32, Vec<Vec<u8>>), ConfigError> {
    use super::hotkeys_bounds::{DEFAULT_CAPACITY, DEFAULT_SAMPLE, MAX_CAPACITY, MAX_SAMPLE};
    let capacity = o.hotkeys_capacity.unwrap_or(DEFAULT_CAPACITY);
    if capacity > MAX_CAPACITY {
        return Err(err(
            "--hotkeys-capacity",
            format!("must be between 0 (off) and {MAX_CAPACITY}"),
        ));
    }
    let sample = o.hotkeys_sample.unwrap_or(DEFAULT_SAMPLE);
    if sample == 0 || sample > MAX_SAMPLE {
        return Err(err(
            "--hotkeys-sample",
            format!("must be between 1 (every read and write) and {MAX_SAMPLE}"),
        ));
    }
    let prefixes = bytes_of(&o.prefix_stats);
    if prefixes.len() > super::MAX_PREFIX_STATS {
        return Err(err(
            "--prefix-stats",
            format!(
                "{} prefixes given; at most {}",
                prefixes.len(),
                super::MAX_PREFIX_STATS
            ),
        ));
    }
    if let Some(bad) = o
        .prefix_stats
        .iter()
        .find(|p| p.is_empty() || p.as_str() == "other")
    {
        return Err(err(
            "--prefix-stats",
            format!("{bad:?} is not a prefix (empty, or the label of everything else)"),
        ));
    }
    Ok((capacity, sample, prefixes))
}

/// `--prefix-stats-separator`: one byte, and not with `--prefix-stats`.
pub(super) fn prefix_separator(o: &Options) -> Result<Option<u8>, ConfigError> {
    let Some(sep) = &o.prefix_stats_separator else {
        return Ok(None);
    };
    if !o.prefix_stats.is_empty() {
        return Err(err(
            "--prefix-stats-separator",
            "give either --prefix-stats or --prefix-stats-separator, not both",
        ));
    }
    match sep.as_bytes() {
        [b] => Ok(Some(*b)),
        _ => Err(err(
            "--prefix-stats-separator",
            format!("{sep:?} is not one byte (e.g. ':')"),
        )),
    }
}
