//! Configuration: command-line flags, `SIDECACHE_*` environment variables
//! and an optional TOML file, merged with precedence flag > env > file >
//! default, validated once into [`Config`].

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::ValueEnum;
use serde::Deserialize;
use sidecache_l1::L1Config;
use sidecache_pool::config as pool;
use sidecache_pool::UpstreamConfig;

mod credentials;
mod options;
mod replicas;
mod sections;

pub use credentials::UpstreamAuth;
pub use options::Options;

/// `--script-flags-max`'s default.
pub const DEFAULT_SCRIPT_FLAGS_MAX: usize = 10_000;
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

/// When the write journal is synced to disk (`--write-journal-fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FsyncArg {
    /// Every group of writes is synced before they are acknowledged.
    Always,
    /// Synced once a second (the default, as Redis's appendfsync).
    Everysec,
    /// Never synced by sidecache; the kernel writes back.
    No,
}

/// Whether the L1 follows other clients' writes with Redis client tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrackingArg {
    /// Default-mode tracking with `OPTIN` (the default): Redis tracks only
    /// the keys this sidecache cached and tells only it about them.
    Optin,
    /// `CLIENT TRACKING ON BCAST NOLOOP` on every master: every written key
    /// is sent to every sidecache (`on` is an alias).
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

/// A subcommand: the binary does something else than serve.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Print a running sidecache's hot keys (SIDECACHE HOTKEYS over RESP).
    Hotkeys(HotkeysArgs),
    /// Watch a running sidecache in the terminal (its metrics endpoint).
    Top(TopArgs),
    /// Print an ElastiCache IAM token signed with the AWS credential chain,
    /// as `--upstream-iam` makes them (e.g. for `redis-cli --pass`).
    IamToken(IamTokenArgs),
}

/// `sidecache top [--metrics 127.0.0.1:9121] [--interval 1] [-n 10]`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// The sidecache's metrics endpoint (its --metrics-listen address):
    /// /metrics and /debug/hotkeys are read from there.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_METRICS_LISTEN)]
    pub metrics: String,
    /// Seconds between refreshes (0.1 to 3600).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = top_interval)]
    pub interval: f64,
    /// How many hot keys (by reads) to show.
    #[arg(short = 'n', long = "count", default_value_t = 10)]
    pub n: usize,
}

fn top_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: expected seconds from 0.1 to 3600")),
    }
}

/// `sidecache iam-token --cache NAME --user ID [--region R] [--serverless]`.
#[derive(Debug, Clone, clap::Args)]
pub struct IamTokenArgs {
    /// The replication group id, or the serverless cache name.
    #[arg(long, value_name = "NAME")]
    pub cache: String,
    /// The ElastiCache user id.
    #[arg(long, value_name = "ID")]
    pub user: String,
    /// The AWS region [default: the AWS chain's, e.g. AWS_REGION].
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// A serverless cache.
    #[arg(long)]
    pub serverless: bool,
}

/// `sidecache hotkeys [--by reads|misses|writes] [-n 20] [--addr ADDR]`.
#[derive(Debug, Clone, clap::Args)]
pub struct HotkeysArgs {
    /// Ranking: reads (L1 lookups), misses or writes.
    #[arg(long, default_value = "reads", value_parser = ["reads", "misses", "writes"])]
    pub by: String,
    /// How many keys.
    #[arg(short = 'n', long = "count", default_value_t = 20)]
    pub n: usize,
    /// The sidecache to ask (its --listen address).
    #[arg(long, default_value = "127.0.0.1:6380")]
    pub addr: String,
    /// Its --requirepass, if set.
    #[arg(long, env = "SIDECACHE_REQUIREPASS", hide_env_values = true)]
    pub password: Option<String>,
}

/// Most `--prefix-stats` prefixes.
pub const MAX_PREFIX_STATS: usize = 64;

/// The bounds of `--hotkeys-capacity` and `--hotkeys-sample`, which the
/// hot-key counters (metrics/hotkeys.rs) are built with.
pub mod hotkeys_bounds {
    /// Default counters per dimension (`--hotkeys-capacity`).
    pub const DEFAULT_CAPACITY: usize = 256;
    /// Default sampling: one lookup or write in this many (`--hotkeys-sample`).
    pub const DEFAULT_SAMPLE: u32 = 32;
    /// Largest `--hotkeys-capacity` (a replacement scans every count).
    pub const MAX_CAPACITY: usize = 4096;
    /// Largest `--hotkeys-sample`.
    pub const MAX_SAMPLE: u32 = 1 << 20;
}

/// Default `--acl-max-users`.
pub const DEFAULT_ACL_MAX_USERS: usize = 16;
/// Default `--acl-user-connections`.
pub const DEFAULT_ACL_USER_CONNECTIONS: usize = 8;

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
    /// How upstream connections authenticate (for the start-up line; the
    /// secret itself is in `upstream`).
    pub upstream_auth: credentials::UpstreamAuth,
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
    /// Whether `--l1-ttl-cap` was given (flag, environment or file). When
    /// not, and the upstream turns out to refuse client tracking, the cap
    /// falls back to [`sidecache_l1::config::UNTRACKED_TTL_CAP`].
    pub l1_ttl_cap_given: bool,
    /// `--l1-commands`: the reads besides GET and MGET the L1 caches
    /// (lower-case names).
    pub l1_commands: Vec<String>,
    /// `--l1-stale-if-error`: how long entries of a master out of reach
    /// are still served (`None`: dropped at once).
    pub l1_stale_if_error: Option<Duration>,
    /// How SETs are acknowledged.
    pub write_mode: WriteMode,
    /// `--write-journal`: where write-behind writes are recorded before
    /// they are acknowledged (`None`: not recorded).
    pub journal: Option<sidecache_pool::write_behind::journal::JournalConfig>,
    /// The output limit of subscribers and MONITOR clients.
    pub output_limit_pubsub: crate::pubsub::OutputLimit,
    /// A normal client's pending replies past which its requests are not
    /// read (0: no bound).
    pub output_limit_normal: u64,
    /// Idle clients are closed after this long (`None`: never).
    pub timeout: Option<Duration>,
    /// TCP keepalive idle time of client sockets (`None`: off).
    pub tcp_keepalive: Option<Duration>,
    /// `--hotkeys-capacity`: counters per hot-key ranking (0: off).
    pub hotkeys_capacity: usize,
    /// `--tracking-table-max-keys`: keys followed for CLIENT TRACKING
    /// clients at most.
    pub tracking_table_max_keys: usize,
    /// `--script-flags-max`: read-only scripts' SHAs remembered for
    /// CLIENT PAUSE WRITE.
    pub script_flags_max: usize,
    /// `--acl-max-users`: ACL users with connections of their own at
    /// once (0: off).
    pub acl_max_users: usize,
    /// `--acl-user-connections`: upstream connections per ACL user.
    pub acl_user_connections: usize,
    /// `--hotkeys-sample`: one event in this many is counted.
    pub hotkeys_sample: u32,
    /// `--prefix-stats`: the key prefixes with L1 figures of their own
    /// (empty: off).
    pub prefix_stats: Vec<Vec<u8>>,
    /// `--prefix-stats-separator`: prefixes are keys' first segments up to
    /// this byte (`None`: off).
    pub prefix_separator: Option<u8>,
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

    /// Validates merged options and applies defaults, section by section
    /// (in `config/sections.rs`), in the order the first bad option is
    /// reported.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad option.
    pub fn from_options(o: Options) -> Result<Config, ConfigError> {
        let (listen, unix_socket) = sections::listen(&o)?;
        let mut upstream = sections::upstream(&o)?;
        upstream.reads = replicas::reads(&o)?;
        let upstream_auth = credentials::credentials(&o, &mut upstream)?;
        let (proto_max_bulk_len, max_multibulk_len) = sections::request_limits(&o)?;
        let (metrics_listen, upstream_wait, threads) = sections::runtime(&o)?;
        let maxclients = o.maxclients.unwrap_or(DEFAULT_MAXCLIENTS);
        if maxclients == 0 {
            return Err(err("--maxclients", "must be at least 1"));
        }
        let l1 = sections::l1(&o)?;
        let l1_commands =
            crate::cmd::reads::parse_allowed(o.l1_commands.as_deref().unwrap_or("all"))
                .map_err(|e| err("--l1-commands", e))?;
        let (output_limit_pubsub, output_limit_normal) =
            output_limits(&o.client_output_buffer_limit)?;
        let requirepass = sections::requirepass(&o, listen)?;
        let tcp_keepalive = match o
            .tcp_keepalive
            .unwrap_or(pool::DEFAULT_TCP_KEEPALIVE.as_secs())
        {
            0 => None,
            s => Some(Duration::from_secs(s)),
        };
        upstream.tcp_keepalive = tcp_keepalive;
        let (hotkeys_capacity, hotkeys_sample, prefix_stats) = sections::hotkeys(&o)?;
        let prefix_separator = sections::prefix_separator(&o)?;
        let acl_max_users = match o.acl_max_users.unwrap_or(DEFAULT_ACL_MAX_USERS) {
            n @ 0..=10_000 => n,
            _ => return Err(err("--acl-max-users", "must be between 0 and 10000")),
        };
        let acl_user_connections = match o
            .acl_user_connections
            .unwrap_or(DEFAULT_ACL_USER_CONNECTIONS)
        {
            n @ 1..=10_000 => n,
            _ => return Err(err("--acl-user-connections", "must be between 1 and 10000")),
        };
        Ok(Config {
            acl_max_users,
            acl_user_connections,
            prefix_separator,
            hotkeys_capacity,
            tracking_table_max_keys: match o.tracking_table_max_keys {
                Some(0) => return Err(err("--tracking-table-max-keys", "must be at least 1")),
                Some(n) => n,
                None => crate::tracking::DEFAULT_MAX_KEYS,
            },
            script_flags_max: o.script_flags_max.unwrap_or(DEFAULT_SCRIPT_FLAGS_MAX),
            hotkeys_sample,
            prefix_stats,
            l1,
            l1_ttl_cap_given: o.l1_ttl_cap.is_some(),
            l1_commands,
            l1_stale_if_error: sections::duration(
                "--l1-stale-if-error",
                o.l1_stale_if_error.as_deref(),
            )?,
            output_limit_pubsub,
            output_limit_normal,
            write_mode: o.write_mode.unwrap_or(WriteMode::WriteBehind),
            journal: sections::journal(&o, upstream.write.queue_max_bytes)?,
            listen,
            unix_socket,
            upstream,
            upstream_auth,
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

    /// A one-line summary for the start-up log, secrets redacted (the
    /// [`fmt::Display`] of [`Config`]).
    pub fn redacted(&self) -> String {
        self.to_string()
    }
}

/// The one-line start-up summary: every setting, secrets redacted
/// (passwords and upstream credentials shown as `<set>` / `<auth>@`).
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        write!(
            f,
            "listen={} unix_socket={:?} upstream={:?} mode={:?} pool_size={} fill_connections={} max_session_connections={} acl_max_users={} acl_user_connections={} connect_timeout={:?} upstream_timeout={:?} refresh_interval={:?} upstream_auth={} upstream_reauth_interval={:?} tls_ca_file={:?} maxclients={} requirepass={} l1_max_bytes={} l1_max_value_bytes={} l1_ttl_cap={:?} l1_cache_nil={:?} l1_include_prefixes={} l1_exclude_prefixes={} write_mode={:?} write_batch={} write_pipeline={} write_flush_interval={:?} write_queue_max={} write_queue_max_bytes={} write_queue_timeout={:?} write_journal={} coherence={} shutdown_timeout={:?} metrics_listen={} upstream_wait={:?} threads={} log_level={} log_format={:?} hotkeys_capacity={} hotkeys_sample={} prefix_stats={} prefix_stats_separator={:?}",
            self.listen,
            self.unix_socket.as_ref().map(|u| &u.0),
            ups,
            self.upstream.mode,
            self.upstream.pool_size,
            self.upstream.fill_connections,
            self.upstream.max_session_connections,
            self.acl_max_users,
            self.acl_user_connections,
            self.upstream.connect_timeout,
            self.upstream.command_timeout,
            self.upstream.refresh_interval,
            self.upstream_auth,
            self.upstream
                .secret
                .as_ref()
                .and(self.upstream.reauth_interval),
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
            match &self.journal {
                Some(j) => format!("{} (fsync {})", j.path.display(), j.fsync),
                None => "off".to_owned(),
            },
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
            self.hotkeys_capacity,
            self.hotkeys_sample,
            self.prefix_stats.len(),
            self.prefix_separator.map(char::from),
        )
    }
}

/// A positive number of seconds (`default` when not given).
fn secs(key: &'static str, v: Option<f64>, default: f64) -> Result<Duration, ConfigError> {
    let v = v.unwrap_or(default);
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| err(key, format!("{v} is not a positive number of seconds")))
}

/// The default worker threads: one per CPU this process may use (cgroup
/// quotas count), less one left to the application it runs beside, at
/// least one. On 2 CPUs that is one thread, which measured faster at
/// `-P 1` for GET hits and SET than two (`bench/ab.sh`, docs/configuration.md).
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
        if words.is_empty() || !words.len().is_multiple_of(4) {
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
