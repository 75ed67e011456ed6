//! Typed upstream configuration. Parsed and validated by the binary; this
//! crate never reads the environment or files.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

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

/// Credentials sent with AUTH / HELLO AUTH.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// ACL user; `None` means the default user (`AUTH password`).
    pub username: Option<String>,
    /// The password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

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

/// Everything the pool needs to reach upstream.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Seeds; at least one.
    pub seeds: Vec<Seed>,
    /// Deployment mode.
    pub mode: Mode,
    /// Multiplexed connections per node (and per database / protocol).
    pub pool_size: usize,
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
    /// Largest reply bulk accepted from upstream.
    pub max_reply_bulk: usize,
    /// Write-behind batching and queue bounds.
    pub write: crate::write_behind::WriteConfig,
    /// How the L1 stays coherent with other writers.
    pub coherence: crate::coherence::tracking::Coherence,
    /// TCP keepalive idle time of upstream sockets (`None`: off).
    pub tcp_keepalive: Option<Duration>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            seeds: Vec::new(),
            mode: Mode::Auto,
            pool_size: 2,
            connect_timeout: Duration::from_secs(3),
            command_timeout: Some(Duration::from_secs(10)),
            max_session_connections: 64,
            refresh_interval: Duration::from_secs(30),
            tls_ca_file: None,
            max_reply_bulk: 1 << 30,
            write: crate::write_behind::WriteConfig::default(),
            coherence: crate::coherence::tracking::Coherence::default(),
            tcp_keepalive: Some(Duration::from_secs(300)),
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
