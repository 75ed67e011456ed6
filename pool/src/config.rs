//! Typed upstream configuration. Parsed and validated by the binary; this
//! crate never reads the environment or files.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// The default `--pool-size`: multiplexed connections per node.
pub const DEFAULT_POOL_SIZE: usize = 2;
/// The default `--fill-connections`: tracking connections per master that
/// carry L1 fills under optin tracking. One: every key of the start
/// database is then registered on the connection that also carries its
/// writes, so a write's report comes back right after it there and the
/// write's re-read keeps the key cached (`crate::coherence::refill`); a
/// key filled on another connection is reported there, where position
/// tells nothing, and its written value is released once landed. (Two
/// measured no faster on two cores: docs/coherence.md.)
pub const DEFAULT_FILL_CONNECTIONS: usize = 1;
/// The default `--connect-timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The default `--upstream-timeout`.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// The default `--max-session-connections`.
pub const DEFAULT_MAX_SESSION_CONNECTIONS: usize = 64;
/// The default `--refresh-interval`.
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// The default `--tcp-keepalive` (Redis's `tcp-keepalive` default).
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(300);
/// The default `--write-batch`: most writes in one upstream pipeline.
pub const DEFAULT_WRITE_BATCH: usize = 200;
/// The default `--write-pipeline`: batches in flight per queue.
pub const DEFAULT_WRITE_PIPELINE: usize = 4;
/// The default `--write-queue-max`.
pub const DEFAULT_WRITE_QUEUE_MAX: usize = 100_000;
/// The default `--write-queue-max-bytes`.
pub const DEFAULT_WRITE_QUEUE_MAX_BYTES: usize = 64 << 20;
/// The default `--write-queue-timeout`.
pub const DEFAULT_WRITE_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the upstream is deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Ask the first reachable seed (`INFO cluster`).
    Auto,
    /// A single server (or a primary with replicas behind one endpoint).
    Standalone,
    /// A Redis Cluster; the seeds are any of its nodes.
    Cluster,
}

pub use sidecache_resp::Proto;

/// Per-connection state that must travel with a client's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Session {
    /// Selected database (always 0 on a cluster).
    pub db: u16,
    /// Protocol version the client speaks; replies pass through unchanged,
    /// so the upstream connection speaks the same one.
    pub proto: Proto,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            db: 0,
            proto: Proto::Resp2,
        }
    }
}

pub use crate::auth::Credentials;

/// A node address as `host:port`; the host may be a name (TLS, ElastiCache).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl NodeAddr {
    /// Parses `host:port` as found in MOVED/ASK replies (`[v6]:port` too).
    pub fn parse(s: &str) -> Option<NodeAddr> {
        let (host, port) = s.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(NodeAddr {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// One `--upstream` URL, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// Where to connect.
    pub addr: NodeAddr,
    /// `rediss://`.
    pub tls: bool,
    /// `user:pass@` or `:pass@`.
    pub credentials: Option<Credentials>,
    /// `/N` path: the database clients start in (standalone only).
    pub db: u16,
}

impl Seed {
    /// Parses `redis://[[user]:pass@]host[:port][/db]` or `rediss://…`.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong.
    pub fn parse(s: &str) -> Result<Seed> {
        let url =
            url::Url::parse(s).map_err(|e| Error::Config(format!("upstream URL {s:?}: {e}")))?;
        let tls = match url.scheme() {
            "redis" => false,
            "rediss" => true,
            other => {
                return Err(Error::Config(format!(
                    "upstream URL {s:?}: scheme {other:?} is not redis:// or rediss://"
                )))
            }
        };
        let host = match url.host() {
            Some(url::Host::Ipv6(a)) => a.to_string(),
            Some(h) => h.to_string(),
            None => return Err(Error::Config(format!("upstream URL {s:?} has no host"))),
        };
        let port = url.port().unwrap_or(6379);
        let decode = |p: &str| {
            url::form_urlencoded::parse(format!("x={p}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let credentials = match url.password() {
            Some(p) => Some(Credentials {
                username: (!url.username().is_empty()).then(|| decode(url.username())),
                password: decode(p),
            }),
            None if !url.username().is_empty() => Some(Credentials {
                username: None,
                password: decode(url.username()),
            }),
            None => None,
        };
        let path = url.path().trim_start_matches('/');
        let db = if path.is_empty() {
            0
        } else {
            path.parse().map_err(|_| {
                Error::Config(format!(
                    "upstream URL {s:?}: database {path:?} is not a number"
                ))
            })?
        };
        Ok(Seed {
            addr: NodeAddr { host, port },
            tls,
            credentials,
            db,
        })
    }
}

/// Write-behind settings.
#[derive(Debug, Clone)]
pub struct WriteConfig {
    /// Most commands in one upstream pipeline.
    pub batch: usize,
    /// Most batches sent and not yet answered, per queue (1: one at a time).
    pub pipeline: usize,
    /// Longest a write waits for its batch to fill (0: send at once).
    pub flush_interval: Duration,
    /// Most writes queued (not yet flushed) in total.
    pub queue_max: usize,
    /// Most bytes of queued writes in total (their encoded commands plus
    /// `QUEUED_OVERHEAD` (in `write_behind.rs`) each).
    pub queue_max_bytes: usize,
    /// How long a write waits for queue space before it is refused.
    pub queue_timeout: Duration,
}

impl WriteConfig {
    /// Upper bounds of the batch-size buckets below a full batch: 1, 10,
    /// 50 and `batch - 1`, those below `batch` and each above the one
    /// before. Sizes above the last bound are full batches (`batch`).
    pub fn batch_size_bounds(&self) -> impl Iterator<Item = usize> {
        let batch = self.batch;
        let mut last = 0;
        [1, 10, 50, batch.saturating_sub(1)]
            .into_iter()
            .filter(move |&b| {
                let keep = b > last && b < batch;
                if keep {
                    last = b;
                }
                keep
            })
    }

    /// The bucket of a batch of `n` writes: the first bound `n` is within,
    /// else the full-batch bucket (the number of bounds). No allocation:
    /// it runs once per batch sent.
    pub fn batch_size_bucket(&self, n: usize) -> usize {
        let mut i = 0;
        for b in self.batch_size_bounds() {
            if n <= b {
                return i;
            }
            i += 1;
        }
        i
    }
}

impl Default for WriteConfig {
    fn default() -> Self {
        WriteConfig {
            batch: DEFAULT_WRITE_BATCH,
            pipeline: DEFAULT_WRITE_PIPELINE,
            flush_interval: Duration::ZERO,
            queue_max: DEFAULT_WRITE_QUEUE_MAX,
            queue_max_bytes: DEFAULT_WRITE_QUEUE_MAX_BYTES,
            queue_timeout: DEFAULT_WRITE_QUEUE_TIMEOUT,
        }
    }
}

/// The default `--peer-invalidation-channel`.
pub const DEFAULT_PEER_CHANNEL: &str = "__sidecache__:invalidate";

/// Which kind of Redis client tracking follows other writers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrackingMode {
    /// Default-mode tracking (`--tracking optin`, the default): Redis
    /// remembers the keys this sidecache reads to cache, on its channel
    /// connections, and tells it only about those (`CLIENT TRACKING ON
    /// OPTOUT` on connections that carry no other reads).
    #[default]
    Optin,
    /// `BCAST NOLOOP` (`--tracking bcast`): Redis tells every channel about
    /// every written key.
    Bcast,
}

impl TrackingMode {
    /// The name shown in INFO and the flag.
    pub fn as_str(self) -> &'static str {
        match self {
            TrackingMode::Optin => "optin",
            TrackingMode::Bcast => "bcast",
        }
    }
}

/// How the L1 stays coherent with writes made by other clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coherence {
    /// Redis client tracking on every master (`--tracking optin|bcast`).
    Tracking {
        /// Default-mode (optin) or broadcast tracking.
        mode: TrackingMode,
        /// Only keys with these prefixes are tracked (empty: all keys).
        prefixes: Vec<Vec<u8>>,
        /// When the upstream refuses tracking: the pub/sub channel on which
        /// sidecache instances publish their writes (`None`: TTL cap only).
        peer_channel: Option<Vec<u8>>,
    },
    /// No invalidation channel; the L1 TTL cap bounds staleness.
    Off,
}

impl Default for Coherence {
    fn default() -> Self {
        Coherence::Tracking {
            mode: TrackingMode::default(),
            prefixes: Vec::new(),
            peer_channel: Some(DEFAULT_PEER_CHANNEL.as_bytes().to_vec()),
        }
    }
}

/// Everything the pool needs to reach upstream.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Seeds; at least one.
    pub seeds: Vec<Seed>,
    /// Deployment mode.
    pub mode: Mode,
    /// Multiplexed connections per node (and per database / protocol).
    pub pool_size: usize,
    /// Optin tracking: tracking connections per master that carry L1
    /// fills (the first also carries the write-behind batches), 1–16.
    pub fill_connections: usize,
    /// Timeout for establishing a connection, including the handshake.
    pub connect_timeout: Duration,
    /// Most connections held by single clients at once (WATCH, a MULTI
    /// spanning requests), over all masters.
    pub max_session_connections: usize,
    /// Longest wait for the reply of a forwarded command (`None`: forever).
    pub command_timeout: Option<Duration>,
    /// How often the cluster slot map is re-read even without redirects.
    pub refresh_interval: Duration,
    /// Extra CA certificates (PEM) to trust for `rediss://`.
    pub tls_ca_file: Option<PathBuf>,
    /// Write-behind batching and queue bounds.
    pub write: WriteConfig,
    /// How the L1 stays coherent with other writers.
    pub coherence: Coherence,
    /// TCP keepalive idle time of upstream sockets (`None`: off).
    pub tcp_keepalive: Option<Duration>,
    /// A secret that changes while sidecache runs (IAM, a password file),
    /// used instead of the seeds' credentials (`None`: those).
    pub secret: Option<crate::auth::RotatingSecret>,
    /// With a rotating secret: how often a live connection sends AUTH
    /// again (`None`: never).
    pub reauth_interval: Option<Duration>,
    /// Reads from replicas (`--read-from` and its companions).
    pub reads: ReadConfig,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            seeds: Vec::new(),
            mode: Mode::Auto,
            pool_size: DEFAULT_POOL_SIZE,
            fill_connections: DEFAULT_FILL_CONNECTIONS,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: Some(DEFAULT_COMMAND_TIMEOUT),
            max_session_connections: DEFAULT_MAX_SESSION_CONNECTIONS,
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
            tls_ca_file: None,
            write: WriteConfig::default(),
            coherence: Coherence::default(),
            tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
            secret: None,
            reauth_interval: Some(crate::auth::DEFAULT_REAUTH_INTERVAL),
            reads: ReadConfig::default(),
        }
    }
}

/// The default `--replica-max-lag`.
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(1);
/// The default `--replica-check-interval`.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// Where reads go (`--read-from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadFrom {
    /// Every read to the master (the default; no replica is probed).
    #[default]
    Primary,
    /// Any usable replica, else the master.
    Replica,
    /// A usable replica in the client's AZ, else any usable replica,
    /// else the master (GLIDE's `AZAffinity`).
    AzAffinity,
    /// A usable replica in the client's AZ, else the master if it is in
    /// the client's AZ, else any usable replica, else the master (GLIDE's
    /// `AZAffinityReplicasAndPrimary`).
    AzAffinityReplicasAndPrimary,
}

impl std::str::FromStr for ReadFrom {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "primary" => Ok(ReadFrom::Primary),
            "replica" => Ok(ReadFrom::Replica),
            "az-affinity" => Ok(ReadFrom::AzAffinity),
            "az-affinity-replicas-and-primary" => Ok(ReadFrom::AzAffinityReplicasAndPrimary),
            other => Err(format!(
                "{other:?}: expected primary, replica, az-affinity or az-affinity-replicas-and-primary"
            )),
        }
    }
}

impl ReadFrom {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadFrom::Primary => "primary",
            ReadFrom::Replica => "replica",
            ReadFrom::AzAffinity => "az-affinity",
            ReadFrom::AzAffinityReplicasAndPrimary => "az-affinity-replicas-and-primary",
        }
    }
}

/// Replica reads' settings.
#[derive(Debug, Clone)]
pub struct ReadConfig {
    /// `--read-from`.
    pub read_from: ReadFrom,
    /// `--az`: the availability zone sidecache runs in.
    pub az: Option<String>,
    /// `--replica-az ADDR=AZ`: nodes' zones, where the node does not say
    /// (Valkey 8's `availability-zone`, in its `HELLO` reply, wins).
    pub node_az: Vec<(NodeAddr, String)>,
    /// `--replica-max-lag`: a replica not proven caught up for this long
    /// is skipped.
    pub max_lag: Duration,
    /// `--replica-check-interval`: how often replicas are probed.
    pub check_interval: Duration,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            read_from: ReadFrom::Primary,
            az: None,
            node_az: Vec::new(),
            max_lag: DEFAULT_MAX_LAG,
            check_interval: DEFAULT_CHECK_INTERVAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let s = Seed::parse("redis://127.0.0.1:7000").expect("valid");
        assert_eq!(s.addr.to_string(), "127.0.0.1:7000");
        assert!(!s.tls && s.credentials.is_none() && s.db == 0);
        let s =
            Seed::parse("rediss://app:p%40ss@master.x.cache.amazonaws.com:6379/2").expect("valid");
        assert!(s.tls);
        assert_eq!(s.addr.host, "master.x.cache.amazonaws.com");
        let c = s.credentials.expect("creds");
        assert_eq!(c.username.as_deref(), Some("app"));
        assert_eq!(c.password, "p@ss");
        assert_eq!(s.db, 2);
        let s = Seed::parse("redis://:secret@localhost").expect("valid");
        assert_eq!(s.addr.port, 6379);
        assert_eq!(s.credentials.expect("creds").username, None);
        let s = Seed::parse("redis://[::1]:7001").expect("valid");
        assert_eq!(s.addr.to_string(), "[::1]:7001");
        assert!(Seed::parse("http://x").is_err());
        assert!(Seed::parse("redis://h/abc").is_err());
    }

    #[test]
    fn batch_size_buckets_follow_the_batch() {
        let w = |batch| WriteConfig {
            batch,
            ..WriteConfig::default()
        };
        let bounds = |batch| w(batch).batch_size_bounds().collect::<Vec<_>>();
        assert_eq!(bounds(200), [1, 10, 50, 199]);
        assert_eq!(w(200).batch_size_bucket(1), 0);
        assert_eq!(w(200).batch_size_bucket(51), 3);
        assert_eq!(w(200).batch_size_bucket(200), 4);
        assert_eq!(bounds(20), [1, 10, 19]);
        assert_eq!(w(20).batch_size_bucket(20), 3);
        assert_eq!(bounds(11), [1, 10]);
        assert_eq!(bounds(2), [1]);
        assert!(bounds(1).is_empty());
        assert_eq!(w(1).batch_size_bucket(1), 0);
    }

    #[test]
    fn parses_node_addrs() {
        assert_eq!(
            NodeAddr::parse("10.0.0.1:6379"),
            Some(NodeAddr {
                host: "10.0.0.1".into(),
                port: 6379
            })
        );
        assert_eq!(
            NodeAddr::parse("[::1]:7000").map(|a| a.host),
            Some("::1".into())
        );
        assert_eq!(NodeAddr::parse("nope"), None);
    }
}
