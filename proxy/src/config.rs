//! Configuration: command-line flags, `SIDECACHE_*` environment variables
//! and an optional TOML file, merged with precedence flag > env > file >
//! default, validated once into [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use serde::Deserialize;
use sidecache_l1::L1Config;
use sidecache_pool::config as pool;
use sidecache_pool::{Mode, Seed, UpstreamConfig};

mod options;

pub use options::Options;

/// Default TCP listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6380";
/// Default permission bits of the Unix socket.
pub const DEFAULT_UNIX_SOCKET_MODE: u32 = 0o660;
/// Default largest bulk string a client may send (Redis's default).
pub const DEFAULT_PROTO_MAX_BULK_LEN: u64 = 512 * 1024 * 1024;
/// Default largest number of elements in one request.
pub const DEFAULT_MAX_MULTIBULK_LEN: u64 = 4 * 1024 * 1024;
/// Default largest unparsed request held for one client (Redis's default).
pub const DEFAULT_CLIENT_QUERY_BUFFER_LIMIT: u64 = 1024 * 1024 * 1024;
/// Default maximum simultaneous clients (Redis's default).
pub const DEFAULT_MAXCLIENTS: usize = 10_000;

/// Upstream deployment mode, as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeArg {
    /// Ask the server (`INFO cluster`).
    Auto,
    /// One server.
    Standalone,
    /// Redis Cluster.
    Cluster,
}

/// How SETs are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteMode {
    /// `+OK` once the value is in the L1 and the write is queued.
    WriteBehind,
    /// `+OK` once upstream acknowledged the write.
    WriteThrough,
}

/// Whether the L1 follows other clients' writes with Redis client tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrackingArg {
    /// Default-mode tracking with `OPTIN`: Redis tracks only the keys this
    /// sidecache cached and tells only it about them.
    Optin,
    /// `CLIENT TRACKING ON BCAST NOLOOP` on every master: every written key
    /// is sent to every sidecache (the default; `on` is an alias).
    #[value(alias = "on")]
    #[serde(alias = "on")]
    Bcast,
    /// No invalidation channel: the L1 TTL cap alone bounds staleness.
    Off,
}

/// A Redis-style yes/no setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum YesNo {
    /// On.
    Yes,
    /// Off.
    No,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Default address of the metrics and health endpoint.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9121";

/// A configuration error naming the option.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigError {
    /// The option, as its long flag.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

fn err(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key,
        message: message.into(),
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// TCP listen address.
    pub listen: SocketAddr,
    /// Unix socket path and mode.
    pub unix_socket: Option<(PathBuf, u32)>,
    /// Upstream settings for the pool.
    pub upstream: UpstreamConfig,
    /// Largest client bulk.
    pub proto_max_bulk_len: u64,
    /// Largest client multibulk.
    pub max_multibulk_len: u64,
    /// Largest buffered request.
    pub client_query_buffer_limit: u64,
    /// Maximum clients.
    pub maxclients: usize,
    /// Client password.
    pub requirepass: Option<String>,
    /// Drain budget.
    pub shutdown_timeout: Duration,
    /// Log filter.
    pub log_level: String,
    /// Log line format.
    pub log_format: LogFormat,
    /// Address of the metrics/health endpoint; `None` when `off` (which
    /// also stops per-command metrics on the hot path).
    pub metrics_listen: Option<SocketAddr>,
    /// Whether `metrics_listen` was given (flag, environment or file)
    /// rather than defaulted: a default address already taken is not fatal.
    pub metrics_listen_given: bool,
    /// How long to retry an unreachable upstream at start (zero: fail at once).
    pub upstream_wait: Duration,
    /// Runtime worker threads.
    pub threads: usize,
    /// L1 cache settings.
    pub l1: L1Config,
    /// How SETs are acknowledged.
    pub write_mode: WriteMode,
    /// The output limit of subscribers and MONITOR clients.
    pub output_limit_pubsub: crate::pubsub::OutputLimit,
    /// A normal client's pending replies past which its requests are not
    /// read (0: no bound).
    pub output_limit_normal: u64,
    /// Idle clients are closed after this long (`None`: never).
    pub timeout: Option<Duration>,
    /// TCP keepalive idle time of client sockets (`None`: off).
    pub tcp_keepalive: Option<Duration>,
}

impl Config {
    /// Merges flags/env with the `--config` file and validates.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad option.
    pub fn load(cli: Options) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file(path)?,
            None => Options::default(),
        };
        Config::from_options(cli.or(file))
    }

    /// Validates merged options and applies defaults.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad option.
    pub fn from_options(o: Options) -> Result<Config, ConfigError> {
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
        let secs =
            |key: &'static str, v: Option<f64>, default: f64| -> Result<Duration, ConfigError> {
                let v = v.unwrap_or(default);
                Duration::try_from_secs_f64(v)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| err(key, format!("{v} is not a positive number of seconds")))
            };
        let pool_size = o.pool_size.unwrap_or(pool::DEFAULT_POOL_SIZE);
        if pool_size == 0 || pool_size > 64 {
            return Err(err("--pool-size", "must be between 1 and 64"));
        }
        let write_batch = o.write_batch.unwrap_or(pool::DEFAULT_WRITE_BATCH);
        if write_batch == 0 || write_batch > 100_000 {
            return Err(err("--write-batch", "must be between 1 and 100000"));
        }
        let write_pipeline = o.write_pipeline.unwrap_or(pool::DEFAULT_WRITE_PIPELINE);
        if write_pipeline == 0 || write_pipeline > 64 {
            return Err(err("--write-pipeline", "must be between 1 and 64"));
        }
        let write_queue_max = o.write_queue_max.unwrap_or(pool::DEFAULT_WRITE_QUEUE_MAX);
        if write_queue_max == 0 || write_queue_max > 100_000_000 {
            return Err(err("--write-queue-max", "must be between 1 and 100000000"));
        }
        let write_flush_interval = match o.write_flush_interval {
            Some(0.0) => Duration::ZERO,
            Some(v) => secs("--write-flush-interval", Some(v), 0.0)?,
            None => Duration::ZERO,
        };
        let write_queue_max_bytes = size(
            "--write-queue-max-bytes",
            o.write_queue_max_bytes.as_deref(),
            pool::DEFAULT_WRITE_QUEUE_MAX_BYTES as u64,
        )?;
        if !(1024..=1 << 40).contains(&write_queue_max_bytes) {
            return Err(err(
                "--write-queue-max-bytes",
                "must be between 1kb and 1024gb",
            ));
        }
        let write = sidecache_pool::WriteConfig {
            batch: write_batch,
            pipeline: write_pipeline,
            flush_interval: write_flush_interval,
            queue_max: write_queue_max,
            queue_max_bytes: usize::try_from(write_queue_max_bytes).unwrap_or(usize::MAX),
            queue_timeout: secs(
                "--write-queue-timeout",
                o.write_queue_timeout,
                pool::DEFAULT_WRITE_QUEUE_TIMEOUT.as_secs_f64(),
            )?,
        };
        let upstream = UpstreamConfig {
            write,
            seeds,
            mode: match o.mode.unwrap_or(ModeArg::Auto) {
                ModeArg::Auto => Mode::Auto,
                ModeArg::Standalone => Mode::Standalone,
                ModeArg::Cluster => Mode::Cluster,
            },
            pool_size,
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
            tls_ca_file: o.tls_ca_file,
            coherence: match o.tracking.unwrap_or(TrackingArg::Bcast) {
                mode @ (TrackingArg::Optin | TrackingArg::Bcast) => {
                    sidecache_pool::config::Coherence::Tracking {
                        mode: if mode == TrackingArg::Bcast {
                            sidecache_pool::config::TrackingMode::Bcast
                        } else {
                            sidecache_pool::config::TrackingMode::Optin
                        },
                        prefixes: o
                            .l1_include_prefix
                            .iter()
                            .map(|p| p.as_bytes().to_vec())
                            .collect(),
                        peer_channel: match o.peer_invalidation_channel.as_deref() {
                            Some("off") => None,
                            Some("") => {
                                return Err(err(
                                    "--peer-invalidation-channel",
                                    "must be a channel name or off",
                                ))
                            }
                            Some(name) => Some(name.as_bytes().to_vec()),
                            None => Some(
                                sidecache_pool::config::DEFAULT_PEER_CHANNEL
                                    .as_bytes()
                                    .to_vec(),
                            ),
                        },
                    }
                }
                TrackingArg::Off => sidecache_pool::config::Coherence::Off,
            },
            ..UpstreamConfig::default()
        };
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
        let maxclients = o.maxclients.unwrap_or(DEFAULT_MAXCLIENTS);
        if maxclients == 0 {
            return Err(err("--maxclients", "must be at least 1"));
        }
        let l1_max_bytes = size(
            "--l1-max-bytes",
            o.l1_max_bytes.as_deref(),
            sidecache_l1::config::DEFAULT_MAX_BYTES,
        )?;
        let l1_max_value_bytes = size(
            "--l1-max-value-bytes",
            o.l1_max_value_bytes.as_deref(),
            sidecache_l1::config::DEFAULT_MAX_VALUE_BYTES,
        )?;
        let l1 = L1Config {
            max_bytes: l1_max_bytes,
            max_value_bytes: l1_max_value_bytes,
            ttl_cap: secs(
                "--l1-ttl-cap",
                o.l1_ttl_cap,
                sidecache_l1::config::DEFAULT_TTL_CAP.as_secs_f64(),
            )?,
            cache_nil: match o.l1_cache_nil {
                Some(v) => Some(secs("--l1-cache-nil", Some(v), 0.0)?),
                None => None,
            },
            include_prefixes: o
                .l1_include_prefix
                .iter()
                .map(|p| p.as_bytes().to_vec())
                .collect(),
            exclude_prefixes: o
                .l1_exclude_prefix
                .iter()
                .map(|p| p.as_bytes().to_vec())
                .collect(),
        };
        let (output_limit_pubsub, output_limit_normal) =
            output_limits(&o.client_output_buffer_limit)?;
        let requirepass = o.requirepass.filter(|p| !p.is_empty());
        if o.protected_mode != Some(YesNo::No)
            && requirepass.is_none()
            && !listen.ip().is_loopback()
        {
            return Err(err(
                "--listen",
                format!(
                    "{listen} is not a loopback address and no --requirepass is set: \
                     anyone who reaches it could use the upstream (protected mode). \
                     Set --requirepass, or --protected-mode no to serve it anyway"
                ),
            ));
        }
        let tcp_keepalive = match o
            .tcp_keepalive
            .unwrap_or(pool::DEFAULT_TCP_KEEPALIVE.as_secs())
        {
            0 => None,
            s => Some(Duration::from_secs(s)),
        };
        let mut upstream = upstream;
        upstream.tcp_keepalive = tcp_keepalive;
        Ok(Config {
            l1,
            output_limit_pubsub,
            output_limit_normal,
            write_mode: o.write_mode.unwrap_or(WriteMode::WriteBehind),
            listen,
            unix_socket: o.unix_socket.map(|p| (p, mode_bits)),
            upstream,
            proto_max_bulk_len,
            max_multibulk_len,
            client_query_buffer_limit: size(
                "--client-query-buffer-limit",
                o.client_query_buffer_limit.as_deref(),
                DEFAULT_CLIENT_QUERY_BUFFER_LIMIT,
            )?,
            maxclients,
            requirepass,
            timeout: o.timeout.filter(|&s| s > 0).map(Duration::from_secs),
            tcp_keepalive,
            shutdown_timeout: secs("--shutdown-timeout", o.shutdown_timeout, 30.0)?,
            log_level: o.log_level.unwrap_or_else(|| "info".into()),
            log_format: o.log_format.unwrap_or(LogFormat::Text),
            metrics_listen_given: o.metrics_listen.is_some(),
            metrics_listen,
            upstream_wait,
            threads,
        })
    }

    /// A one-line summary for the start-up log, secrets redacted.
    pub fn redacted(&self) -> String {
        let ups: Vec<String> = self
            .upstream
            .seeds
            .iter()
            .map(|s| {
                format!(
                    "{}://{}{}",
                    if s.tls { "rediss" } else { "redis" },
                    if s.credentials.is_some() {
                        "<auth>@"
                    } else {
                        ""
                    },
                    s.addr
                )
            })
            .collect();
        format!(
            "listen={} unix_socket={:?} upstream={:?} mode={:?} pool_size={} max_session_connections={} connect_timeout={:?} upstream_timeout={:?} refresh_interval={:?} tls_ca_file={:?} maxclients={} requirepass={} l1_max_bytes={} l1_max_value_bytes={} l1_ttl_cap={:?} l1_cache_nil={:?} l1_include_prefixes={} l1_exclude_prefixes={} write_mode={:?} write_batch={} write_pipeline={} write_flush_interval={:?} write_queue_max={} write_queue_max_bytes={} write_queue_timeout={:?} coherence={} shutdown_timeout={:?} metrics_listen={} upstream_wait={:?} threads={} log_level={} log_format={:?}",
            self.listen,
            self.unix_socket.as_ref().map(|u| &u.0),
            ups,
            self.upstream.mode,
            self.upstream.pool_size,
            self.upstream.max_session_connections,
            self.upstream.connect_timeout,
            self.upstream.command_timeout,
            self.upstream.refresh_interval,
            self.upstream.tls_ca_file,
            self.maxclients,
            if self.requirepass.is_some() { "<set>" } else { "<none>" },
            self.l1.max_bytes,
            self.l1.max_value_bytes,
            self.l1.ttl_cap,
            self.l1.cache_nil,
            self.l1.include_prefixes.len(),
            self.l1.exclude_prefixes.len(),
            self.write_mode,
            self.upstream.write.batch,
            self.upstream.write.pipeline,
            self.upstream.write.flush_interval,
            self.upstream.write.queue_max,
            self.upstream.write.queue_max_bytes,
            self.upstream.write.queue_timeout,
            match &self.upstream.coherence {
                sidecache_pool::config::Coherence::Off => "tracking off".to_owned(),
                sidecache_pool::config::Coherence::Tracking {
                    mode, peer_channel, ..
                } => format!(
                    "tracking {} (peer fallback channel: {})",
                    mode.as_str(),
                    peer_channel
                        .as_deref()
                        .map_or_else(|| "off".into(), String::from_utf8_lossy)
                ),
            },
            self.shutdown_timeout,
            self.metrics_listen
                .map_or_else(|| "off".to_owned(), |a| a.to_string()),
            self.upstream_wait,
            self.threads,
            self.log_level,
            self.log_format,
        )
    }
}

/// The default worker threads: one per CPU this process may use (cgroup
/// quotas count), less one left to the application it runs beside, at
/// least one. On 2 CPUs that is one thread, which measured faster at
/// `-P 1` for GET hits and SET than two (`bench/ab.sh`, README).
fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

fn read_file(path: &Path) -> Result<Options, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err("--config", format!("{}: {e}", path.display())))?;
    toml::from_str(&text)
        .map_err(|e| err("--config", format!("{}: {}", path.display(), e.message())))
}

/// Parses `--client-output-buffer-limit` values: groups of
/// `CLASS HARD SOFT SECS`, as Redis's `client-output-buffer-limit` line.
/// Only the pubsub class applies to sidecache (subscribers and MONITOR).
fn output_limits(values: &[String]) -> Result<(crate::pubsub::OutputLimit, u64), ConfigError> {
    const KEY: &str = "--client-output-buffer-limit";
    let mut limit = crate::pubsub::OutputLimit::PUBSUB_DEFAULT;
    let mut normal = DEFAULT_NORMAL_OUTPUT_LIMIT;
    for v in values {
        let words: Vec<&str> = v.split_whitespace().collect();
        if words.is_empty() || words.len() % 4 != 0 {
            return Err(err(
                KEY,
                format!("{v:?}: expected CLASS HARD SOFT SECS, e.g. \"pubsub 32mb 8mb 60\""),
            ));
        }
        for g in words.chunks(4) {
            if g[0].eq_ignore_ascii_case("normal") {
                // Normal clients are paced, never disconnected: a soft
                // limit (a disconnect after a while) has no meaning here.
                if size(KEY, Some(g[2]), 0)? != 0 || g[3] != "0" {
                    return Err(err(
                        KEY,
                        format!("{v:?}: normal clients are paced, not disconnected: give SOFT and SECS as 0"),
                    ));
                }
                normal = size(KEY, Some(g[1]), 0)?;
                continue;
            }
            if !g[0].eq_ignore_ascii_case("pubsub") {
                return Err(err(
                    KEY,
                    format!("{:?}: the classes are normal and pubsub", g[0]),
                ));
            }
            limit = crate::pubsub::OutputLimit {
                hard: size(KEY, Some(g[1]), 0)?,
                soft: size(KEY, Some(g[2]), 0)?,
                soft_time: Duration::from_secs(
                    g[3].parse::<u64>()
                        .map_err(|_| err(KEY, format!("{:?} is not a number of seconds", g[3])))?,
                ),
            };
        }
    }
    Ok((limit, normal))
}

/// Default output bound of a normal client: past it, its requests are not
/// read until its replies are written.
pub const DEFAULT_NORMAL_OUTPUT_LIMIT: u64 = 16 << 20;

/// Parses `512mb`, `1gb`, `64k`, `1048576` as Redis does (k = 1000, kb = 1024).
fn size(key: &'static str, v: Option<&str>, default: u64) -> Result<u64, ConfigError> {
    let Some(v) = v else { return Ok(default) };
    let s = v.trim().to_ascii_lowercase();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return Err(err(key, format!("{v:?}: unknown unit (use b, kb, mb, gb)"))),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| err(key, format!("{v:?} is not a size")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
