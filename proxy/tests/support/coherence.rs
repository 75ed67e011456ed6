//! Helpers of the coherence tests (`tests/coherence.rs`, `tests/optin.rs`):
//! reading INFO, caching a key through a proxy, timing until a write is
//! served, direct connections to a cluster's masters.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

use super::{info_field, Cluster};

/// The bound asserted (generous for shared, noisy machines); the measured
/// distribution is printed.
pub const BOUND: Duration = Duration::from_millis(500);

pub async fn info(c: &mut MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg(&["proxy", "l1", "writebehind", "coherence"])
        .query_async(c)
        .await
        .unwrap()
}

/// Reads `key` through `c` until it equals `want`; the time it took.
pub async fn time_until(c: &mut MultiplexedConnection, key: &str, want: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let got: Option<String> = c.get(key).await.unwrap();
        if got.as_deref() == Some(want) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < BOUND,
            "{key}: still {got:?}, not {want:?}, after {:?}",
            t0.elapsed()
        );
        tokio::task::yield_now().await;
    }
}

/// Caches `key` in the proxy behind `c` (reads until served from the L1).
pub async fn cache(c: &mut MultiplexedConnection, key: &str) {
    let t0 = Instant::now();
    loop {
        let before = info_field(&info(c).await, "l1_hits");
        let _: Option<String> = c.get(key).await.unwrap();
        let _: Option<String> = c.get(key).await.unwrap();
        if info_field(&info(c).await, "l1_hits") > before {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{key} never cached");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls INFO until `field` equals `want` (at most `limit`).
pub async fn wait_field(c: &mut MultiplexedConnection, field: &str, want: u64, limit: Duration) {
    let t0 = Instant::now();
    loop {
        let got = info_field(&info(c).await, field);
        if got == want {
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "{field} is {got}, not {want}, after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sets each key directly and caches it through `c`.
pub async fn seed_and_cache(
    d: &mut MultiplexedConnection,
    c: &mut MultiplexedConnection,
    keys: &[String],
) {
    for k in keys {
        let _: () = d.set(k, "v").await.unwrap();
        cache(c, k).await;
    }
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub fn report(what: &str, mut d: Vec<Duration>) {
    d.sort();
    eprintln!(
        "staleness {what}: n={} p50={:?} p99={:?} max={:?}",
        d.len(),
        percentile(&d, 0.5),
        percentile(&d, 0.99),
        d[d.len() - 1]
    );
}

/// `--tracking MODE` and `extra`.
pub fn with_mode<'a>(mode: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--tracking", mode];
    v.extend_from_slice(extra);
    v
}

/// The client ids of the invalidation channels on the server behind `d`:
/// the connections with the tracking flag (in either mode, `mode` only
/// names it in messages).
pub async fn channel_ids(d: &mut MultiplexedConnection, mode: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(d)
        .await
        .unwrap();
    let field = |l: &str, name: &str| {
        l.split(' ')
            .find_map(|f| f.strip_prefix(name).map(str::to_owned))
    };
    let mut ids: Vec<String> = list
        .lines()
        .filter(|l| field(l, "flags=").is_some_and(|f| f.contains('t')))
        .filter_map(|l| field(l, "id="))
        .collect();
    ids.sort();
    ids.dedup();
    assert!(!ids.is_empty(), "no {mode} channel: {list}");
    ids
}

/// Kills the tracking connection `id` on the server behind `d` and waits
/// until sidecache (behind `c`) counts one more loss than before, with its
/// L1 cleared, then until its channel is up again. (Relative: on a loaded
/// machine a heartbeat may time out and count a loss of its own, which
/// clears the L1 too.)
pub async fn kill_tracking_conn(
    d: &mut MultiplexedConnection,
    c: &mut MultiplexedConnection,
    id: &str,
) {
    let before = info_field(&info(c).await, "tracking_channel_losses");
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(d)
        .await
        .unwrap();
    let t0 = Instant::now();
    loop {
        let inf = info(c).await;
        if info_field(&inf, "tracking_channel_losses") > before {
            assert_eq!(info_field(&inf, "l1_entries"), 0, "cleared on loss");
            break;
        }
        assert!(t0.elapsed() < BOUND, "loss of connection {id} not noticed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_field(c, "tracking_channels_up", 1, Duration::from_secs(5)).await;
}

/// Direct connections to a cluster's masters, routed by slot.
pub struct Direct {
    pub ranges: Vec<(u16, u16, usize)>,
    pub conns: Vec<MultiplexedConnection>,
}

impl Direct {
    pub async fn cluster(c: &Cluster) -> Direct {
        let mut conns = Vec::new();
        let mut ranges = Vec::new();
        let mut first = c.nodes[0]
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut first)
            .await
            .unwrap();
        for entry in slots {
            let int = |v: &redis::Value| -> u16 { redis::from_redis_value(v).unwrap() };
            let master: Vec<redis::Value> = redis::from_redis_value(&entry[2]).unwrap();
            let port = int(&master[1]);
            let i = c.nodes.iter().position(|n| n.port == port).unwrap();
            ranges.push((int(&entry[0]), int(&entry[1]), i));
        }
        for n in &c.nodes {
            conns.push(n.client().get_multiplexed_async_connection().await.unwrap());
        }
        Direct { ranges, conns }
    }

    /// SET on whichever master takes it (maps may lag after a failover).
    pub async fn set_anywhere(&mut self, key: &str, value: &str) {
        let t0 = Instant::now();
        loop {
            for c in &mut self.conns {
                if c.set::<_, _, ()>(key, value).await.is_ok() {
                    return;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no master takes {key}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn conn(&mut self, key: &str) -> &mut MultiplexedConnection {
        let slot = sidecache_pool::Slot::for_key(key.as_bytes()).get();
        let i = self
            .ranges
            .iter()
            .find(|r| r.0 <= slot && slot <= r.1)
            .unwrap()
            .2;
        &mut self.conns[i]
    }
}

/// Runs a test once per tracking mode (`optin`, the default, and `bcast`),
/// each a test of its own: `NAME::optin`, `NAME::bcast`. The test is an
/// `async fn NAME(mode: &str)` beside the call.
#[allow(unused_macros)]
macro_rules! in_every_mode {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn optin() {
                super::$name("optin").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn bcast() {
                super::$name("bcast").await
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use in_every_mode;
