//! Configuration: command-line flags, `SIDECACHE_*` environment variables
//! and an optional TOML file, merged with precedence flag > env > file >
//! default, validated once into [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde::Deserialize;
use sidecache_l1::L1Config;
use sidecache_pool::{Mode, Seed, UpstreamConfig};

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
/// Default multiplexed upstream connections per node.
pub const DEFAULT_POOL_SIZE: usize = 2;

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
    /// sidecache cached and tells only it about them (`on` is an alias).
    #[value(alias = "on")]
    #[serde(alias = "on")]
    Optin,
    /// `CLIENT TRACKING ON BCAST NOLOOP` on every master: every written key
    /// is sent to every sidecache.
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

/// Every option, as given (all optional so that sources can be merged).
#[derive(Debug, Default, Parser, Deserialize)]
#[command(
    name = "sidecache",
    version,
    about = "A Redis-protocol caching sidecar proxy for Redis, Redis Cluster and ElastiCache."
)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// TOML file with any of these options (keys as the long flag names, `-` as `_`).
    #[arg(long, env = "SIDECACHE_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// TCP address to listen on [default: 127.0.0.1:6380].
    #[arg(long, env = "SIDECACHE_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,

    /// Also listen on this Unix socket path (a stale socket file is replaced).
    #[arg(long, env = "SIDECACHE_UNIX_SOCKET", value_name = "PATH")]
    pub unix_socket: Option<PathBuf>,

    /// Permission bits of the Unix socket, octal [default: 0660].
    #[arg(long, env = "SIDECACHE_UNIX_SOCKET_MODE", value_name = "OCTAL")]
    pub unix_socket_mode: Option<String>,

    /// Upstream URL, `redis://[[user]:pass@]host[:port][/db]` or `rediss://…` for TLS;
    /// repeat (or comma-separate in the env var) to give several cluster seeds.
    #[arg(
        long,
        env = "SIDECACHE_UPSTREAM",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub upstream: Vec<String>,

    /// Upstream mode: auto asks the server whether cluster mode is on [default: auto].
    #[arg(long, env = "SIDECACHE_MODE", value_enum)]
    pub mode: Option<ModeArg>,

    /// Multiplexed upstream connections per node [default: 2].
    #[arg(long, env = "SIDECACHE_POOL_SIZE", value_name = "N")]
    pub pool_size: Option<usize>,

    /// Largest bulk string a client may send; accepts kb/mb/gb [default: 512mb].
    #[arg(long, env = "SIDECACHE_PROTO_MAX_BULK_LEN", value_name = "BYTES")]
    pub proto_max_bulk_len: Option<String>,

    /// Largest number of arguments in one request [default: 4194304].
    #[arg(long, env = "SIDECACHE_MAX_MULTIBULK_LEN", value_name = "N")]
    pub max_multibulk_len: Option<u64>,

    /// Largest incomplete request buffered for one client before it is
    /// disconnected; accepts kb/mb/gb [default: 1gb].
    #[arg(
        long,
        env = "SIDECACHE_CLIENT_QUERY_BUFFER_LIMIT",
        value_name = "BYTES"
    )]
    pub client_query_buffer_limit: Option<String>,

    /// Maximum simultaneous clients; more get `-ERR max number of clients reached` [default: 10000].
    #[arg(long, env = "SIDECACHE_MAXCLIENTS", value_name = "N")]
    pub maxclients: Option<usize>,

    /// Password clients must send with AUTH (none by default, as Redis).
    #[arg(
        long,
        env = "SIDECACHE_REQUIREPASS",
        value_name = "PASS",
        hide_env_values = true
    )]
    pub requirepass: Option<String>,

    /// Seconds to finish in-flight work after SIGTERM/SIGINT [default: 30].
    #[arg(long, env = "SIDECACHE_SHUTDOWN_TIMEOUT", value_name = "SECS")]
    pub shutdown_timeout: Option<f64>,

    /// Seconds allowed to connect (and authenticate) to an upstream node [default: 3].
    #[arg(long, env = "SIDECACHE_CONNECT_TIMEOUT", value_name = "SECS")]
    pub connect_timeout: Option<f64>,

    /// Seconds a forwarded command may wait for its upstream reply before
    /// the client gets `-ERR upstream … did not answer in time`; 0 waits forever [default: 10].
    #[arg(long, env = "SIDECACHE_UPSTREAM_TIMEOUT", value_name = "SECS")]
    pub upstream_timeout: Option<f64>,

    /// Most upstream connections held by single clients at once, over all
    /// masters: a client holds one from WATCH to EXEC/DISCARD/UNWATCH, or
    /// while a MULTI spans several of its requests [default: 64].
    #[arg(long, env = "SIDECACHE_MAX_SESSION_CONNECTIONS", value_name = "N")]
    pub max_session_connections: Option<usize>,

    /// Output limit of a client class, as Redis's `client-output-buffer-limit`:
    /// `pubsub HARD SOFT SECS` disconnects a subscriber or MONITOR client
    /// whose unsent output passes HARD, or SOFT for SECS seconds (0 turns
    /// a limit off) [default: pubsub 32mb 8mb 60].
    #[arg(
        long,
        env = "SIDECACHE_CLIENT_OUTPUT_BUFFER_LIMIT",
        value_name = "CLASS HARD SOFT SECS",
        value_delimiter = ','
    )]
    pub client_output_buffer_limit: Vec<String>,

    /// Close a client idle for this many seconds, as Redis's `timeout`
    /// (never one blocked in a command, subscribed, or in MONITOR); 0 never [default: 0].
    #[arg(long, env = "SIDECACHE_TIMEOUT", value_name = "SECS")]
    pub timeout: Option<u64>,

    /// TCP keepalive of client and upstream sockets: probes after this many
    /// idle seconds, as Redis's `tcp-keepalive`; 0 off [default: 300].
    #[arg(long, env = "SIDECACHE_TCP_KEEPALIVE", value_name = "SECS")]
    pub tcp_keepalive: Option<u64>,

    /// Refuse to start listening on a non-loopback address without
    /// --requirepass, as Redis's protected mode [default: yes].
    #[arg(long, env = "SIDECACHE_PROTECTED_MODE", value_enum)]
    pub protected_mode: Option<YesNo>,

    /// Seconds between cluster slot-map refreshes (also refreshed on MOVED) [default: 30].
    #[arg(long, env = "SIDECACHE_REFRESH_INTERVAL", value_name = "SECS")]
    pub refresh_interval: Option<f64>,

    /// PEM file of extra CA certificates to trust for rediss:// upstreams.
    #[arg(long, env = "SIDECACHE_TLS_CA_FILE", value_name = "PEM")]
    pub tls_ca_file: Option<PathBuf>,

    /// Log filter (tracing syntax, e.g. `info` or `sidecache=debug`) [default: info].
    #[arg(long, env = "SIDECACHE_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Log line format: text or json [default: text].
    #[arg(long, env = "SIDECACHE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// HTTP address of /metrics, /healthz and /readyz, or `off` [default: 127.0.0.1:9121].
    #[arg(long, env = "SIDECACHE_METRICS_LISTEN", value_name = "ADDR|off")]
    pub metrics_listen: Option<String>,

    /// Worker threads of the runtime [default: the CPUs available less one
    /// (left to the application beside it), at least 1].
    #[arg(long, env = "SIDECACHE_THREADS", value_name = "N")]
    pub threads: Option<usize>,

    /// Seconds to keep retrying an unreachable upstream at start (with
    /// /readyz answering 503) before giving up; 0 fails at once [default: 0].
    #[arg(long, env = "SIDECACHE_UPSTREAM_WAIT", value_name = "SECS")]
    pub upstream_wait: Option<f64>,

    /// L1 capacity in bytes (keys + values + overhead); 0 turns the L1 off; accepts kb/mb/gb [default: 256mb].
    #[arg(long, env = "SIDECACHE_L1_MAX_BYTES", value_name = "BYTES")]
    pub l1_max_bytes: Option<String>,

    /// Values larger than this are never cached; accepts kb/mb/gb [default: 1mb].
    #[arg(long, env = "SIDECACHE_L1_MAX_VALUE_BYTES", value_name = "BYTES")]
    pub l1_max_value_bytes: Option<String>,

    /// Longest life of an L1 entry in seconds, whatever the upstream TTL [default: 60].
    #[arg(long, env = "SIDECACHE_L1_TTL_CAP", value_name = "SECS")]
    pub l1_ttl_cap: Option<f64>,

    /// Also cache nil replies, for this many seconds [default: off].
    #[arg(long, env = "SIDECACHE_L1_CACHE_NIL", value_name = "SECS")]
    pub l1_cache_nil: Option<f64>,

    /// Cache only keys with this prefix (repeatable; default: all keys).
    #[arg(
        long,
        env = "SIDECACHE_L1_INCLUDE_PREFIX",
        value_name = "PREFIX",
        value_delimiter = ','
    )]
    pub l1_include_prefix: Vec<String>,

    /// write-behind acknowledges plain SET/SETEX/PSETEX/MSET from memory and
    /// flushes them in batches; write-through waits for upstream [default: write-behind].
    #[arg(long, env = "SIDECACHE_WRITE_MODE", value_enum)]
    pub write_mode: Option<WriteMode>,

    /// Most writes in one upstream pipeline [default: 200].
    #[arg(long, env = "SIDECACHE_WRITE_BATCH", value_name = "N")]
    pub write_batch: Option<usize>,

    /// Batches sent upstream before the first one's answers are in, per
    /// queue, when a whole batch more is waiting (sustained write load);
    /// 1 sends one at a time [default: 1].
    #[arg(long, env = "SIDECACHE_WRITE_PIPELINE", value_name = "N")]
    pub write_pipeline: Option<usize>,

    /// Longest a queued write waits for its batch to fill, seconds; 0 sends
    /// as soon as the previous batch is acknowledged [default: 0].
    #[arg(long, env = "SIDECACHE_WRITE_FLUSH_INTERVAL", value_name = "SECS")]
    pub write_flush_interval: Option<f64>,

    /// Most writes queued and not yet flushed; more wait [default: 100000].
    #[arg(long, env = "SIDECACHE_WRITE_QUEUE_MAX", value_name = "N")]
    pub write_queue_max: Option<usize>,

    /// Most bytes of writes queued and not yet flushed (their commands plus
    /// 64 bytes each); more wait [default: 64mb].
    #[arg(long, env = "SIDECACHE_WRITE_QUEUE_MAX_BYTES", value_name = "BYTES")]
    pub write_queue_max_bytes: Option<String>,

    /// Seconds a write waits for queue space before `-ERR` [default: 5].
    #[arg(long, env = "SIDECACHE_WRITE_QUEUE_TIMEOUT", value_name = "SECS")]
    pub write_queue_timeout: Option<f64>,

    /// Follow other clients' writes with Redis client tracking
    /// (invalidation channel per master): optin (alias on) tracks only the
    /// keys cached here, bcast hears of every write, off leaves only the
    /// TTL cap [default: optin].
    #[arg(long, env = "SIDECACHE_TRACKING", value_enum)]
    pub tracking: Option<TrackingArg>,

    /// When the upstream refuses CLIENT TRACKING, sidecache instances
    /// publish the keys they write on this pub/sub channel and drop the
    /// keys others publish; `off`: the TTL cap alone [default: __sidecache__:invalidate].
    #[arg(
        long,
        env = "SIDECACHE_PEER_INVALIDATION_CHANNEL",
        value_name = "CHANNEL|off"
    )]
    pub peer_invalidation_channel: Option<String>,

    /// Never cache keys with this prefix (repeatable).
    #[arg(
        long,
        env = "SIDECACHE_L1_EXCLUDE_PREFIX",
        value_name = "PREFIX",
        value_delimiter = ','
    )]
    pub l1_exclude_prefix: Vec<String>,
}

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

impl Options {
    /// Fills unset options from `file`.
    fn or(self, file: Options) -> Options {
        Options {
            config: self.config,
            listen: self.listen.or(file.listen),
            unix_socket: self.unix_socket.or(file.unix_socket),
            unix_socket_mode: self.unix_socket_mode.or(file.unix_socket_mode),
            upstream: if self.upstream.is_empty() {
                file.upstream
            } else {
                self.upstream
            },
            mode: self.mode.or(file.mode),
            pool_size: self.pool_size.or(file.pool_size),
            proto_max_bulk_len: self.proto_max_bulk_len.or(file.proto_max_bulk_len),
            max_multibulk_len: self.max_multibulk_len.or(file.max_multibulk_len),
            client_query_buffer_limit: self
                .client_query_buffer_limit
                .or(file.client_query_buffer_limit),
            maxclients: self.maxclients.or(file.maxclients),
            requirepass: self.requirepass.or(file.requirepass),
            shutdown_timeout: self.shutdown_timeout.or(file.shutdown_timeout),
            connect_timeout: self.connect_timeout.or(file.connect_timeout),
            upstream_timeout: self.upstream_timeout.or(file.upstream_timeout),
            max_session_connections: self
                .max_session_connections
                .or(file.max_session_connections),
            timeout: self.timeout.or(file.timeout),
            tcp_keepalive: self.tcp_keepalive.or(file.tcp_keepalive),
            protected_mode: self.protected_mode.or(file.protected_mode),
            client_output_buffer_limit: if self.client_output_buffer_limit.is_empty() {
                file.client_output_buffer_limit
            } else {
                self.client_output_buffer_limit
            },
            refresh_interval: self.refresh_interval.or(file.refresh_interval),
            tls_ca_file: self.tls_ca_file.or(file.tls_ca_file),
            log_level: self.log_level.or(file.log_level),
            log_format: self.log_format.or(file.log_format),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            upstream_wait: self.upstream_wait.or(file.upstream_wait),
            threads: self.threads.or(file.threads),
            write_mode: self.write_mode.or(file.write_mode),
            write_batch: self.write_batch.or(file.write_batch),
            write_pipeline: self.write_pipeline.or(file.write_pipeline),
            write_flush_interval: self.write_flush_interval.or(file.write_flush_interval),
            write_queue_max: self.write_queue_max.or(file.write_queue_max),
            write_queue_timeout: self.write_queue_timeout.or(file.write_queue_timeout),
            write_queue_max_bytes: self.write_queue_max_bytes.or(file.write_queue_max_bytes),
            l1_max_bytes: self.l1_max_bytes.or(file.l1_max_bytes),
            l1_max_value_bytes: self.l1_max_value_bytes.or(file.l1_max_value_bytes),
            l1_ttl_cap: self.l1_ttl_cap.or(file.l1_ttl_cap),
            l1_cache_nil: self.l1_cache_nil.or(file.l1_cache_nil),
            tracking: self.tracking.or(file.tracking),
            peer_invalidation_channel: self
                .peer_invalidation_channel
                .or(file.peer_invalidation_channel),
            l1_include_prefix: if self.l1_include_prefix.is_empty() {
                file.l1_include_prefix
            } else {
                self.l1_include_prefix
            },
            l1_exclude_prefix: if self.l1_exclude_prefix.is_empty() {
                file.l1_exclude_prefix
            } else {
                self.l1_exclude_prefix
            },
        }
    }
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
        let pool_size = o.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        if pool_size == 0 || pool_size > 64 {
            return Err(err("--pool-size", "must be between 1 and 64"));
        }
        let write_batch = o.write_batch.unwrap_or(200);
        if write_batch == 0 || write_batch > 100_000 {
            return Err(err("--write-batch", "must be between 1 and 100000"));
        }
        let write_pipeline = o.write_pipeline.unwrap_or(1);
        if write_pipeline == 0 || write_pipeline > 64 {
            return Err(err("--write-pipeline", "must be between 1 and 64"));
        }
        let write_queue_max = o.write_queue_max.unwrap_or(100_000);
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
            64 << 20,
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
            queue_timeout: secs("--write-queue-timeout", o.write_queue_timeout, 5.0)?,
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
            connect_timeout: secs("--connect-timeout", o.connect_timeout, 3.0)?,
            max_session_connections: match o.max_session_connections.unwrap_or(64) {
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
                v => Some(secs("--upstream-timeout", v, 10.0)?),
            },
            refresh_interval: secs("--refresh-interval", o.refresh_interval, 30.0)?,
            tls_ca_file: o.tls_ca_file,
            coherence: match o.tracking.unwrap_or(TrackingArg::Optin) {
                mode @ (TrackingArg::Optin | TrackingArg::Bcast) => {
                    sidecache_pool::tracking::Coherence::Tracking {
                        mode: if mode == TrackingArg::Bcast {
                            sidecache_pool::tracking::TrackingMode::Bcast
                        } else {
                            sidecache_pool::tracking::TrackingMode::Optin
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
                                sidecache_pool::tracking::DEFAULT_PEER_CHANNEL
                                    .as_bytes()
                                    .to_vec(),
                            ),
                        },
                    }
                }
                TrackingArg::Off => sidecache_pool::tracking::Coherence::Off,
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
        let tcp_keepalive = match o.tcp_keepalive.unwrap_or(300) {
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
                sidecache_pool::tracking::Coherence::Off => "tracking off".to_owned(),
                sidecache_pool::tracking::Coherence::Tracking {
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
mod tests {
    use super::*;

    fn opts(args: &[&str]) -> Options {
        Options::try_parse_from(std::iter::once("sidecache").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn defaults() {
        let c =
            Config::from_options(opts(&["--upstream", "redis://127.0.0.1:6379"])).expect("valid");
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.proto_max_bulk_len, DEFAULT_PROTO_MAX_BULK_LEN);
        assert_eq!(c.upstream.pool_size, DEFAULT_POOL_SIZE);
        assert_eq!(c.upstream.write.pipeline, 1);
        assert!(c.unix_socket.is_none());
    }

    #[test]
    fn errors_name_the_option() {
        let e = Config::from_options(opts(&[])).expect_err("upstream required");
        assert_eq!(e.key, "--upstream");
        let e = Config::from_options(opts(&["--upstream", "redis://h", "--listen", "nope"]))
            .expect_err("bad");
        assert_eq!(e.key, "--listen");
        let e = Config::from_options(opts(&[
            "--upstream",
            "redis://h",
            "--unix-socket-mode",
            "999",
        ]))
        .expect_err("bad");
        assert_eq!(e.key, "--unix-socket-mode");
        let e = Config::from_options(opts(&[
            "--upstream",
            "redis://h",
            "--proto-max-bulk-len",
            "12parsecs",
        ]))
        .expect_err("bad");
        assert_eq!(e.key, "--proto-max-bulk-len");
        for bad in ["0", "1025"] {
            let e = Config::from_options(opts(&["--upstream", "redis://h", "--threads", bad]))
                .expect_err("out of range");
            assert_eq!(e.key, "--threads");
        }
        for bad in ["0", "65"] {
            let e =
                Config::from_options(opts(&["--upstream", "redis://h", "--write-pipeline", bad]))
                    .expect_err("out of range");
            assert_eq!(e.key, "--write-pipeline");
        }
        let c = Config::from_options(opts(&["--upstream", "redis://h", "--write-pipeline", "4"]))
            .expect("valid");
        assert_eq!(c.upstream.write.pipeline, 4);
    }

    #[test]
    fn tracking_modes() {
        use sidecache_pool::tracking::{Coherence, TrackingMode};
        let mode = |args: &[&str]| {
            let mut all = vec!["--upstream", "redis://h"];
            all.extend_from_slice(args);
            match Config::from_options(opts(&all))
                .expect("valid")
                .upstream
                .coherence
            {
                Coherence::Tracking { mode, .. } => Some(mode),
                Coherence::Off => None,
            }
        };
        assert_eq!(mode(&[]), Some(TrackingMode::Optin));
        assert_eq!(mode(&["--tracking", "on"]), Some(TrackingMode::Optin));
        assert_eq!(mode(&["--tracking", "optin"]), Some(TrackingMode::Optin));
        assert_eq!(mode(&["--tracking", "bcast"]), Some(TrackingMode::Bcast));
        assert_eq!(mode(&["--tracking", "off"]), None);
        let o: Options = toml::from_str("tracking = \"on\"").expect("on in a file");
        assert_eq!(o.tracking, Some(TrackingArg::Optin));
    }

    #[test]
    fn threads_default_to_the_cpus_less_one() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let c = Config::from_options(opts(&["--upstream", "redis://h"])).expect("valid");
        assert_eq!(c.threads, cpus.saturating_sub(1).max(1));
        let c = Config::from_options(opts(&["--upstream", "redis://h", "--threads", "3"]))
            .expect("valid");
        assert_eq!(c.threads, 3);
    }

    #[test]
    fn example_file_is_valid() {
        let text = include_str!("../../deploy/sidecache.toml.example");
        let o: Options = toml::from_str(text).expect("example parses with every key known");
        let c = Config::from_options(o).expect("example validates");
        assert_eq!(c.l1.max_bytes, 256 * 1024 * 1024);
    }

    #[test]
    fn l1_options() {
        let c = Config::from_options(opts(&[
            "--upstream",
            "redis://h",
            "--l1-max-bytes",
            "0",
            "--l1-ttl-cap",
            "5",
            "--l1-include-prefix",
            "a:",
            "--l1-include-prefix",
            "b:",
            "--l1-cache-nil",
            "1",
        ]))
        .expect("valid");
        assert_eq!(c.l1.max_bytes, 0);
        assert_eq!(c.l1.ttl_cap, Duration::from_secs(5));
        assert_eq!(c.l1.include_prefixes, vec![b"a:".to_vec(), b"b:".to_vec()]);
        assert_eq!(c.l1.cache_nil, Some(Duration::from_secs(1)));
        let e = Config::from_options(opts(&["--upstream", "redis://h", "--l1-ttl-cap", "0"]))
            .expect_err("bad");
        assert_eq!(e.key, "--l1-ttl-cap");
    }

    #[test]
    fn file_fills_gaps_flags_win() {
        let file: Options = toml::from_str(
            "listen = \"127.0.0.1:7777\"\npool_size = 3\nupstream = [\"redis://a:1\"]\n",
        )
        .expect("toml");
        let merged = opts(&["--pool-size", "5"]).or(file);
        let c = Config::from_options(merged).expect("valid");
        assert_eq!(c.listen.port(), 7777);
        assert_eq!(c.upstream.pool_size, 5);
        assert_eq!(c.upstream.seeds[0].addr.port, 1);
        assert!(toml::from_str::<Options>("bogus = 1").is_err());
    }

    #[test]
    fn observability_options() {
        let c = Config::from_options(opts(&["--upstream", "redis://:s3cret@h"])).expect("valid");
        assert_eq!(
            c.metrics_listen.map(|a| a.to_string()).as_deref(),
            Some(DEFAULT_METRICS_LISTEN)
        );
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.upstream_wait, Duration::ZERO);
        let line = c.redacted();
        assert!(!line.contains("s3cret"), "{line}");
        assert!(line.contains("<auth>@"), "{line}");
        let c = Config::from_options(opts(&[
            "--upstream",
            "redis://h",
            "--metrics-listen",
            "off",
            "--log-format",
            "json",
            "--upstream-wait",
            "2.5",
        ]))
        .expect("valid");
        assert!(c.metrics_listen.is_none());
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.upstream_wait, Duration::from_millis(2500));
        let e = Config::from_options(opts(&["--upstream", "redis://h", "--metrics-listen", "x"]))
            .expect_err("bad");
        assert_eq!(e.key, "--metrics-listen");
        let e = Config::from_options(opts(&["--upstream", "redis://h", "--upstream-wait=-1"]))
            .expect_err("bad");
        assert_eq!(e.key, "--upstream-wait");
    }

    #[test]
    fn output_limits_as_redis_writes_them() {
        let (l, normal) = output_limits(&["pubsub 1mb 256kb 5".into()]).unwrap();
        assert_eq!(normal, DEFAULT_NORMAL_OUTPUT_LIMIT);
        assert_eq!(l.hard, 1 << 20);
        assert_eq!(l.soft, 256 << 10);
        assert_eq!(l.soft_time, Duration::from_secs(5));
        assert_eq!(
            output_limits(&[]).unwrap().0,
            crate::pubsub::OutputLimit::PUBSUB_DEFAULT
        );
        assert_eq!(output_limits(&["pubsub 0 0 0".into()]).unwrap().0.hard, 0);
        let both = output_limits(&["normal 4mb 0 0 pubsub 1mb 0 0".into()]).unwrap();
        assert_eq!((both.0.hard, both.1), (1 << 20, 4 << 20));
        for bad in [
            "pubsub 1mb",
            "normal 1mb 1mb 60",
            "replica 0 0 0",
            "pubsub 1mb 1mb x",
            "pubsub 1zb 0 0",
        ] {
            let e = output_limits(&[bad.into()]).unwrap_err();
            assert_eq!(e.key, "--client-output-buffer-limit", "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(
            size("k", Some("512mb"), 0).expect("valid"),
            512 * 1024 * 1024
        );
        assert_eq!(size("k", Some("1000"), 0).expect("valid"), 1000);
        assert_eq!(size("k", Some("2k"), 0).expect("valid"), 2000);
        assert!(size("k", Some("x"), 0).is_err());
    }
}
