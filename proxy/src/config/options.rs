//! The options as given: every flag with its environment variable (also
//! the TOML file's keys), all optional so that sources can be merged.

use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

use super::{FsyncArg, LogFormat, ModeArg, TrackingArg, WriteMode, YesNo};

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

    /// Optin tracking: tracking connections per master that carry L1
    /// fills, 1–16 (each key is filled on one of them) [default: 2].
    #[arg(long, env = "SIDECACHE_FILL_CONNECTIONS", value_name = "N")]
    pub fill_connections: Option<usize>,

    /// Where L1 misses and read-only forwarded commands go: primary,
    /// replica, az-affinity or az-affinity-replicas-and-primary
    /// (docs/replica-reads.md) [default: primary].
    #[arg(long, env = "SIDECACHE_READ_FROM", value_name = "MODE")]
    pub read_from: Option<String>,

    /// The availability zone this sidecache runs in (az-affinity modes;
    /// on AWS, the instance metadata's placement/availability-zone).
    #[arg(long, env = "SIDECACHE_AZ", value_name = "NAME")]
    pub az: Option<String>,

    /// A node's availability zone, `HOST:PORT=AZ`; repeat or
    /// comma-separate. A node's own (Valkey 8 `availability-zone`) wins.
    #[arg(
        long,
        env = "SIDECACHE_REPLICA_AZ",
        value_name = "ADDR=AZ",
        value_delimiter = ','
    )]
    pub replica_az: Vec<String>,

    /// Seconds a replica may go without being proven caught up with its
    /// master before reads skip it [default: 1].
    #[arg(long, env = "SIDECACHE_REPLICA_MAX_LAG", value_name = "SECS")]
    pub replica_max_lag: Option<f64>,

    /// Seconds between probes of each replica's replication offset and
    /// link (INFO replication) [default: 0.05].
    #[arg(long, env = "SIDECACHE_REPLICA_CHECK_INTERVAL", value_name = "SECS")]
    pub replica_check_interval: Option<f64>,

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

    /// Most ACL users (other than the --upstream one) whose clients are
    /// authenticated at once; each has its own upstream connections. 0:
    /// AUTH as another user is refused (-WRONGPASS) [default: 16].
    #[arg(long, env = "SIDECACHE_ACL_MAX_USERS", value_name = "N")]
    pub acl_max_users: Option<usize>,

    /// Upstream connections per ACL user, over all masters: each carries
    /// one of that user's clients' pipelines, transactions or blocking
    /// commands at a time [default: 8].
    #[arg(long, env = "SIDECACHE_ACL_USER_CONNECTIONS", value_name = "N")]
    pub acl_user_connections: Option<usize>,

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

    /// Authenticate to ElastiCache (Redis OSS 7+, Valkey) with IAM: the
    /// password is a SigV4 token signed with the AWS credential chain
    /// (environment, EKS IRSA / Pod Identity, instance profile…), renewed
    /// every --upstream-auth-refresh and sent again on live connections
    /// every --upstream-reauth-interval. Needs --upstream-iam-cache and a
    /// user; no password in the --upstream URL [default: off].
    #[arg(
        long,
        env = "SIDECACHE_UPSTREAM_IAM",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub upstream_iam: Option<bool>,

    /// IAM: the replication group id, or the serverless cache name.
    #[arg(long, env = "SIDECACHE_UPSTREAM_IAM_CACHE", value_name = "NAME")]
    pub upstream_iam_cache: Option<String>,

    /// IAM: the AWS region of the cache [default: the AWS chain's, e.g. AWS_REGION].
    #[arg(long, env = "SIDECACHE_UPSTREAM_IAM_REGION", value_name = "REGION")]
    pub upstream_iam_region: Option<String>,

    /// IAM: the ElastiCache user id (authentication mode iam) [default:
    /// the user of the --upstream URL, `rediss://USER@host`].
    #[arg(long, env = "SIDECACHE_UPSTREAM_IAM_USER", value_name = "ID")]
    pub upstream_iam_user: Option<String>,

    /// IAM: the cache is an ElastiCache Serverless cache [default: off].
    #[arg(
        long,
        env = "SIDECACHE_UPSTREAM_IAM_SERVERLESS",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub upstream_iam_serverless: Option<bool>,

    /// Read the upstream password from this file, again on every refresh
    /// (a Kubernetes Secret mounted as a file rotates without a restart);
    /// the user, if any, is the --upstream URL's (`redis://USER@host`).
    #[arg(long, env = "SIDECACHE_UPSTREAM_PASSWORD_FILE", value_name = "PATH")]
    pub upstream_password_file: Option<PathBuf>,

    /// With --upstream-iam or --upstream-password-file: seconds between
    /// fetches of the secret (under 900 with IAM: a token lives 15
    /// minutes) [default: 300].
    #[arg(long, env = "SIDECACHE_UPSTREAM_AUTH_REFRESH", value_name = "SECS")]
    pub upstream_auth_refresh: Option<f64>,

    /// With --upstream-iam or --upstream-password-file: seconds between
    /// AUTHs with the current secret on each live upstream connection
    /// (ElastiCache closes an IAM connection 12 hours after its last
    /// authentication); 0 never [default: 3600].
    #[arg(long, env = "SIDECACHE_UPSTREAM_REAUTH_INTERVAL", value_name = "SECS")]
    pub upstream_reauth_interval: Option<f64>,

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

    /// Longest life of an L1 entry in seconds, whatever the upstream TTL
    /// [default: 600 with client tracking; 60 with `--tracking off` or an
    /// upstream that refuses tracking].
    #[arg(long, env = "SIDECACHE_L1_TTL_CAP", value_name = "SECS")]
    pub l1_ttl_cap: Option<f64>,

    /// Also cache nil replies, for this many seconds [default: off].
    #[arg(long, env = "SIDECACHE_L1_CACHE_NIL", value_name = "SECS")]
    pub l1_cache_nil: Option<f64>,

    /// While a master is out of reach (down, failing over, partitioned),
    /// go on serving the L1 entries of its slots that were coherent when
    /// contact was lost, for at most this long from that moment (`30s`,
    /// `500ms`, `2m`, or seconds); dropped the moment it or its successor
    /// is back. Trades staleness for availability (docs/coherence.md)
    /// [default: off].
    #[arg(long, env = "SIDECACHE_L1_STALE_IF_ERROR", value_name = "DURATION")]
    pub l1_stale_if_error: Option<String>,

    /// Reads the L1 caches besides GET and MGET (always cached while the L1
    /// is on): a comma-separated list of command names, or `all`
    /// [default: all].
    #[arg(long, env = "SIDECACHE_L1_COMMANDS", value_name = "LIST")]
    pub l1_commands: Option<String>,

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
    /// 1 sends one at a time [default: 4].
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

    /// Record every write-behind write in a journal in this directory
    /// before acknowledging it, and replay what it holds at start, so a
    /// crash of sidecache loses no acknowledged write (one directory per
    /// sidecache; a lock file refuses a second) [default: off].
    #[arg(long, env = "SIDECACHE_WRITE_JOURNAL", value_name = "PATH")]
    pub write_journal: Option<PathBuf>,

    /// When the journal is synced to disk, as Redis's appendfsync:
    /// always (before each acknowledgement, group commit), everysec, no
    /// [default: everysec].
    #[arg(long, env = "SIDECACHE_WRITE_JOURNAL_FSYNC", value_enum)]
    pub write_journal_fsync: Option<FsyncArg>,

    /// Follow other clients' writes with Redis client tracking
    /// (invalidation channel per master): optin tracks only the keys cached
    /// here (fleet-safe), bcast (alias on) hears of every write, off leaves
    /// only the TTL cap [default: optin].
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

    /// CLIENT TRACKING served to clients: the most keys followed for
    /// default-mode tracking clients; past it the oldest-found key is
    /// forgotten and its readers told, as Redis's tracking-table-max-keys
    /// [default: 1000000].
    #[arg(long, env = "SIDECACHE_TRACKING_TABLE_MAX_KEYS", value_name = "N")]
    pub tracking_table_max_keys: Option<usize>,

    /// CLIENT PAUSE WRITE: the most SHAs of scripts declaring `no-writes`
    /// remembered, so that their EVALSHA goes on during the pause as on
    /// Redis; past it the set starts over (a forgotten script waits for
    /// the pause's end) [default: 10000].
    #[arg(long, env = "SIDECACHE_SCRIPT_FLAGS_MAX", value_name = "N")]
    pub script_flags_max: Option<usize>,

    /// Hot keys: counters per ranking (reads, misses, writes) of the
    /// space-saving sketch behind SIDECACHE HOTKEYS and /debug/hotkeys,
    /// 0–4096; 0 turns hot keys off [default: 256].
    #[arg(long, env = "SIDECACHE_HOTKEYS_CAPACITY", value_name = "N")]
    pub hotkeys_capacity: Option<usize>,

    /// Hot keys: one read or write in N (per connection, randomised) is
    /// counted, and counts are reported times N; 1 counts all [default: 32].
    #[arg(long, env = "SIDECACHE_HOTKEYS_SAMPLE", value_name = "N")]
    pub hotkeys_sample: Option<u32>,

    /// Per-prefix L1 hits, misses and hit bytes in /metrics for these key
    /// prefixes (comma-separated, at most 64; the first that matches
    /// counts, anything else is `other`) [default: off].
    #[arg(
        long,
        env = "SIDECACHE_PREFIX_STATS",
        value_name = "PREFIX",
        value_delimiter = ','
    )]
    pub prefix_stats: Vec<String>,

    /// Per-prefix L1 figures by each key's first segment up to and with
    /// this one-byte separator (e.g. `:`: `user:` of `user:42`), the first
    /// 64 seen getting a label and later ones `other`; instead of
    /// --prefix-stats [default: off].
    #[arg(long, env = "SIDECACHE_PREFIX_STATS_SEPARATOR", value_name = "CHAR")]
    pub prefix_stats_separator: Option<String>,

    /// `sidecache hotkeys` (ask a running sidecache for its hot keys) or
    /// `sidecache top` (watch one in the terminal).
    #[command(subcommand)]
    #[serde(skip)]
    pub command: Option<super::Command>,
}

impl Options {
    /// Fills unset options from `file`: an option given on the command line
    /// or in the environment wins; a list wins when not empty. Every field
    /// is named once here, and the struct literal fails to compile when one
    /// is left out.
    pub(super) fn or(self, file: Options) -> Options {
        macro_rules! merge {
            ($($field:ident),* $(,)?) => {
                Options {
                    config: self.config,
                    command: self.command,
                    $($field: Unset::or(self.$field, file.$field),)*
                }
            };
        }
        merge!(
            listen,
            unix_socket,
            unix_socket_mode,
            upstream,
            mode,
            pool_size,
            fill_connections,
            read_from,
            az,
            replica_az,
            replica_max_lag,
            replica_check_interval,
            proto_max_bulk_len,
            max_multibulk_len,
            client_query_buffer_limit,
            maxclients,
            requirepass,
            shutdown_timeout,
            connect_timeout,
            upstream_timeout,
            max_session_connections,
            acl_max_users,
            acl_user_connections,
            timeout,
            tcp_keepalive,
            protected_mode,
            client_output_buffer_limit,
            refresh_interval,
            tls_ca_file,
            upstream_iam,
            upstream_iam_cache,
            upstream_iam_region,
            upstream_iam_user,
            upstream_iam_serverless,
            upstream_password_file,
            upstream_auth_refresh,
            upstream_reauth_interval,
            log_level,
            log_format,
            metrics_listen,
            upstream_wait,
            threads,
            write_mode,
            write_batch,
            write_pipeline,
            write_flush_interval,
            write_queue_max,
            write_queue_timeout,
            write_queue_max_bytes,
            write_journal,
            write_journal_fsync,
            l1_max_bytes,
            l1_max_value_bytes,
            l1_ttl_cap,
            l1_cache_nil,
            l1_stale_if_error,
            l1_commands,
            tracking,
            peer_invalidation_channel,
            l1_include_prefix,
            l1_exclude_prefix,
            tracking_table_max_keys,
            script_flags_max,
            hotkeys_capacity,
            hotkeys_sample,
            prefix_stats,
            prefix_stats_separator,
        )
    }
}

/// An option that may be unset, and how a set one wins over another.
trait Unset {
    fn or(self, other: Self) -> Self;
}

impl<T> Unset for Option<T> {
    fn or(self, other: Self) -> Self {
        Option::or(self, other)
    }
}

impl<T> Unset for Vec<T> {
    fn or(self, other: Self) -> Self {
        if self.is_empty() {
            other
        } else {
            self
        }
    }
}
