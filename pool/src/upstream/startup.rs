//! The steps of [`Upstream::connect`]: the first reachable seed, what it
//! is (version, mode, databases), the invalidation channel chosen, and the
//! first topology with the background tasks that keep it.

use std::sync::Arc;

use sidecache_resp::frame::{self, Value};
use tracing::warn;

use super::{info_field, replicas, slotmap, ServerInfo, Upstream};
use crate::cluster::topology::Topology;
use crate::coherence::peer::Peer;
use crate::coherence::tracking::{CoherenceMode, Hub};
use crate::config::{Coherence, Mode, NodeAddr, Session, TrackingMode, UpstreamConfig};
use crate::conn::connect::{expect_ok, Connector};
use crate::conn::mux::Replies;
use crate::error::{Error, Result};

/// The first seed that answers, in order, with its replies to `INFO
/// server`, `INFO cluster`, `CONFIG GET databases`, `CONFIG GET
/// cluster-databases` (Valkey 9's numbered databases in cluster mode) and
/// `HELLO 3` (last: it turns the probe's connection to RESP3); otherwise
/// the last seed's error.
pub(super) async fn probe_seeds(
    connector: &Connector,
    cfg: &UpstreamConfig,
) -> Result<(NodeAddr, Replies)> {
    let mut last_err = None;
    for seed in &cfg.seeds {
        let cmds: [&[&[u8]]; 5] = [
            &[b"INFO", b"server"],
            &[b"INFO", b"cluster"],
            &[b"CONFIG", b"GET", b"databases"],
            &[b"CONFIG", b"GET", b"cluster-databases"],
            &[b"HELLO", b"3"],
        ];
        match connector
            .oneshot(&seed.addr, Session::default(), &cmds)
            .await
        {
            Ok(r) => return Ok((seed.addr.clone(), r)),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| Error::Config("no --upstream given".into())))
}

/// What the seed's replies say: its version, whether it is a cluster
/// (checked against `--mode`), the databases a client may SELECT, and its
/// HELLO fields.
pub(super) fn server_info(
    cfg: &UpstreamConfig,
    seed_addr: &NodeAddr,
    replies: &[bytes::Bytes],
) -> Result<ServerInfo> {
    let server = expect_ok(&replies[0]).map_err(|e| Error::Connect {
        addr: seed_addr.to_string(),
        reason: format!("INFO failed: {e}"),
    })?;
    let server = server.as_bytes().cloned().unwrap_or_default();
    let version = info_field(&server, "redis_version").unwrap_or_else(|| "7.0.0".into());
    let cluster_enabled = expect_ok(&replies[1])
        .ok()
        .and_then(|v| v.as_bytes().cloned())
        .and_then(|b| info_field(&b, "cluster_enabled"))
        .is_some_and(|v| v == "1");
    let cluster = match cfg.mode {
        Mode::Auto => cluster_enabled,
        Mode::Cluster if !cluster_enabled => {
            return Err(Error::Config(format!(
                "--mode cluster, but {seed_addr} has cluster mode off"
            )))
        }
        Mode::Cluster => true,
        Mode::Standalone => false,
    };
    // A cluster has database 0 only, unless it is Valkey 9+ started with
    // `cluster-databases` above 1 (a server without that setting answers
    // an empty list).
    let databases = if cluster {
        config_number(replies.get(3)).unwrap_or(1)
    } else {
        config_number(replies.get(2)).unwrap_or(16)
    };
    Ok(ServerInfo {
        version,
        databases,
        cluster,
        hello: replies.get(4).map(hello_fields).unwrap_or_default(),
    })
}

/// The number a `CONFIG GET name` reply gives its one setting; `None` for
/// an error, an unknown setting or a value out of range.
fn config_number(reply: Option<&bytes::Bytes>) -> Option<u16> {
    Value::decode(reply?)
        .ok()
        .and_then(Value::into_items)
        .and_then(|v| v.get(1).and_then(Value::as_int))
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&n| n > 0)
}

/// The field/value pairs of a `HELLO 3` reply; none for an error or
/// anything but a map.
fn hello_fields(reply: &bytes::Bytes) -> Vec<(bytes::Bytes, Value)> {
    match Value::decode(reply) {
        Ok(Value::Map(kv)) => kv
            .into_iter()
            .filter_map(|(k, v)| Some((k.as_bytes()?.clone(), v)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The tracking mode in force: `--tracking`'s, except optin on a server
/// older than Redis 7, which gets bcast (with a warning).
pub(super) fn tracking_mode(cfg: &UpstreamConfig, info: &ServerInfo) -> TrackingMode {
    // Optin is proven (tests, measurements) on Redis 7.0+ and Valkey only.
    // Redis 6 sends a command's own invalidations before its reply rather
    // than after, and its tracking table differs; rather than run an
    // unproven mode, older servers get bcast, which Redis 6 serves as 7
    // does (correct, dearer with many sidecaches: see docs/coherence.md).
    let major: u32 = info
        .version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(7);
    match &cfg.coherence {
        Coherence::Tracking {
            mode: TrackingMode::Optin,
            ..
        } if major < 7 => {
            warn!(version = %info.version, "--tracking optin needs Redis 7 or later; using bcast");
            TrackingMode::Bcast
        }
        Coherence::Tracking { mode, .. } => *mode,
        Coherence::Off => TrackingMode::Bcast,
    }
}

/// The coherence mode: client tracking when the seed accepts it, else the
/// peer channel when one is configured, else TTL-only (or off).
pub(super) async fn coherence_mode(
    cfg: &UpstreamConfig,
    connector: &Connector,
    seed_addr: &NodeAddr,
    tracking_mode: TrackingMode,
) -> Result<CoherenceMode> {
    Ok(match &cfg.coherence {
        Coherence::Off => CoherenceMode::Off,
        Coherence::Tracking {
            prefixes,
            peer_channel,
            ..
        } => {
            let args = crate::coherence::tracking::probe_args(tracking_mode, prefixes);
            match probe_tracking(connector, seed_addr, &args).await? {
                CoherenceMode::Unsupported if peer_channel.is_some() => CoherenceMode::Peer,
                m => m,
            }
        }
    })
}

/// The invalidation hub and, in peer mode, the peer channel that
/// `coherence` needs (neither when off or TTL-only).
pub(super) fn channels(
    cfg: &UpstreamConfig,
    coherence: CoherenceMode,
    tracking_mode: TrackingMode,
    seed_addr: &NodeAddr,
) -> (Option<Arc<Hub>>, Option<Arc<Peer>>) {
    match (&cfg.coherence, coherence) {
        (Coherence::Tracking { prefixes, .. }, CoherenceMode::Tracking) => {
            (Some(Arc::new(Hub::new(tracking_mode, prefixes))), None)
        }
        (
            Coherence::Tracking {
                peer_channel: Some(name),
                ..
            },
            CoherenceMode::Peer,
        ) => {
            let hub = Arc::new(Hub::new(TrackingMode::Bcast, &[]));
            let gate = Arc::new(crate::coherence::tracking::Channel::for_all(
                seed_addr.clone(),
                Arc::clone(&hub),
            ));
            let peer = Arc::new(Peer::new(name.clone(), gate));
            (Some(hub), Some(peer))
        }
        _ => (None, None),
    }
}

impl Upstream {
    /// Installs the first topology (cluster: the seed's slot map, kept
    /// fresh by the background refresher), subscribes the peer channel,
    /// and waits for the invalidation channels up to `--connect-timeout`.
    pub(super) async fn start(&self, seed_addr: &NodeAddr) -> Result<()> {
        if self.inner.info.cluster {
            let ranges = self.read_slots(seed_addr).await?;
            let _ = self.install(&ranges);
            tokio::spawn(slotmap::refresher(
                Arc::clone(&self.inner),
                self.inner.cfg.refresh_interval,
            ));
        } else {
            let node = self.node(seed_addr);
            self.inner.topo.store(Arc::new(Topology::standalone(node)));
        }
        if let Some(rr) = &self.inner.reads {
            let history = replicas::first_probes(self, rr, self.inner.cfg.connect_timeout).await;
            tokio::spawn(replicas::monitor(
                Arc::clone(&self.inner),
                Arc::clone(rr),
                history,
            ));
        }
        if let Some(p) = &self.inner.peer {
            tokio::spawn(crate::tasks::peer_subscriber::subscribe(
                self.clone(),
                Arc::clone(p),
            ));
        }
        self.await_channels(self.inner.cfg.connect_timeout).await;
        Ok(())
    }
}

/// Whether `addr` accepts client tracking (`HELLO 3` + the registration
/// the channels will send); a refusal is logged once and means TTL-only.
async fn probe_tracking(
    connector: &Connector,
    addr: &NodeAddr,
    args: &[&[u8]],
) -> Result<CoherenceMode> {
    let session = Session {
        db: 0,
        proto: crate::config::Proto::Resp3,
    };
    let r = match connector.oneshot(addr, session, &[args]).await {
        Ok(r) => r,
        Err(Error::Handshake { reply, .. }) => {
            warn!(node = %addr, reply, "HELLO 3 refused: no client tracking; the L1 TTL cap alone bounds staleness");
            return Ok(CoherenceMode::Unsupported);
        }
        Err(e) => return Err(e),
    };
    match r.first().and_then(|f| frame::error_text(f)) {
        None => Ok(CoherenceMode::Tracking),
        Some(e) => {
            warn!(node = %addr, reply = %String::from_utf8_lossy(e), "CLIENT TRACKING refused: the L1 TTL cap alone bounds staleness of other clients' writes");
            Ok(CoherenceMode::Unsupported)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str) -> ServerInfo {
        ServerInfo {
            version: version.into(),
            databases: 16,
            cluster: false,
            hello: Vec::new(),
        }
    }

    #[test]
    fn hello_fields_keep_the_servers_order_and_values() {
        let valkey = bytes::Bytes::from_static(
            b"%3\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$7\r\nversion\r\n$5\r\n9.1.2\r\n$7\r\nmodules\r\n*1\r\n%1\r\n$4\r\nname\r\n$3\r\nlua\r\n",
        );
        let got = hello_fields(&valkey);
        let keys: Vec<&[u8]> = got.iter().map(|(k, _)| &k[..]).collect();
        assert_eq!(keys, [&b"server"[..], b"version", b"modules"]);
        assert_eq!(got[0].1, Value::Bulk(bytes::Bytes::from_static(b"valkey")));
        // Redis 5 and older: no HELLO.
        let old = bytes::Bytes::from_static(b"-ERR unknown command 'HELLO'\r\n");
        assert!(hello_fields(&old).is_empty());
    }

    #[test]
    fn optin_is_the_default_and_falls_back_to_bcast_before_redis_7() {
        let cfg = UpstreamConfig::default();
        assert_eq!(tracking_mode(&cfg, &info("7.0.15")), TrackingMode::Optin);
        // Valkey reports redis_version 7.2.4.
        assert_eq!(tracking_mode(&cfg, &info("7.2.4")), TrackingMode::Optin);
        assert_eq!(tracking_mode(&cfg, &info("6.2.14")), TrackingMode::Bcast);
        assert_eq!(tracking_mode(&cfg, &info("5.0.7")), TrackingMode::Bcast);
        let bcast = UpstreamConfig {
            coherence: Coherence::Tracking {
                mode: TrackingMode::Bcast,
                prefixes: Vec::new(),
                peer_channel: None,
            },
            ..UpstreamConfig::default()
        };
        assert_eq!(tracking_mode(&bcast, &info("7.0.15")), TrackingMode::Bcast);
    }
}
