//! A 3-master Redis Cluster of real `redis-server` processes (with
//! replicas when asked), and the slot-migration steps tests take on it.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{cli, RedisServer};

/// A 3-master cluster, created with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with_replicas(0)
    }

    /// 3 masters with `replicas` replicas each (`nodes[3..]` are replicas
    /// after creation, in redis-cli's assignment).
    pub fn start_with_replicas(replicas: usize) -> Cluster {
        Cluster::start_with(replicas, 5000)
    }

    /// Like [`Cluster::start_with_replicas`], with a `cluster-node-timeout`
    /// (how long a dead master takes to be failed over).
    pub fn start_with(replicas: usize, node_timeout_ms: u32) -> Cluster {
        Cluster::start_configured(replicas, node_timeout_ms, &[])
    }

    /// Like [`Cluster::start_with`], every node also given `extra`
    /// (`--cluster-databases 16`).
    pub fn start_configured(replicas: usize, node_timeout_ms: u32, extra: &[&str]) -> Cluster {
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        args.extend_from_slice(extra);
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| RedisServer::start_node(&args, Some(node_timeout_ms)))
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(n.addr());
        }
        let r = replicas.to_string();
        let out = cmd
            .args(["--cluster-replicas", &r, "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed (see .ci/run)");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Cluster { nodes };
        c.wait_ok();
        c
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        'outer: while Instant::now() < deadline {
            for n in &self.nodes {
                if !cli(n.port, &["cluster", "info"]).contains("cluster_state:ok") {
                    std::thread::sleep(Duration::from_millis(100));
                    continue 'outer;
                }
            }
            // Every node must also agree on the slot map.
            let maps: Vec<String> = self
                .nodes
                .iter()
                .map(|n| {
                    let slots = cli(n.port, &["cluster", "slots"]);
                    let mut lines: Vec<&str> = slots.lines().collect();
                    lines.sort();
                    lines.join(",")
                })
                .collect();
            if maps.iter().all(|m| m == &maps[0]) && !maps[0].is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("cluster did not reach cluster_state:ok");
    }

    /// Waits until every replica synced and the first node's CLUSTER
    /// SLOTS lists it (gossip takes a moment after the sync): a proxy
    /// reading replicas finds them all at start.
    pub async fn wait_replicas_listed(&self, replicas: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &self.nodes {
            if !cli(n.port, &["role"]).starts_with("slave") {
                continue;
            }
            while !cli(n.port, &["info", "replication"]).contains("master_link_status:up") {
                assert!(Instant::now() < deadline, "replica never synced");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        loop {
            let slots = cli(self.nodes[0].port, &["cluster", "slots"]);
            // Each node's entry has its address, port and ID: count the IDs.
            let ids = slots.lines().filter(|l| l.len() == 40).count();
            if ids >= 3 * (1 + replicas) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CLUSTER SLOTS never listed the replicas"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn seed_url(&self) -> String {
        self.nodes[0].url()
    }

    /// The cluster node ID of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        cli(self.nodes[i].port, &["cluster", "myid"])
    }

    /// The first step of moving `slot` from node `src` to node `dst`:
    /// `IMPORTING` on the target, then `MIGRATING` on the source.
    pub fn begin_migration(&self, slot: u16, src: usize, dst: usize) {
        let slot = slot.to_string();
        let (src_id, dst_id) = (self.node_id(src), self.node_id(dst));
        let importing = ["cluster", "setslot", &slot, "importing", &src_id];
        assert_eq!(cli(self.nodes[dst].port, &importing), "OK");
        let migrating = ["cluster", "setslot", &slot, "migrating", &dst_id];
        assert_eq!(cli(self.nodes[src].port, &migrating), "OK");
    }

    /// `MIGRATE`s `keys` (all of one slot) from node `src` to node `dst`.
    pub fn migrate_keys(&self, src: usize, dst: usize, keys: &[&str]) {
        let port = self.nodes[dst].port.to_string();
        let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        assert_eq!(cli(self.nodes[src].port, &args), "OK");
    }

    /// The last step: `SETSLOT … NODE dst` on the new owner, then on every
    /// other node.
    pub fn assign_slot(&self, slot: u16, dst: usize) {
        let slot = slot.to_string();
        let dst_id = self.node_id(dst);
        let others = (0..self.nodes.len()).filter(|&i| i != dst);
        for i in std::iter::once(dst).chain(others) {
            let node = ["cluster", "setslot", &slot, "node", &dst_id];
            assert_eq!(cli(self.nodes[i].port, &node), "OK");
        }
    }

    /// Moves `slot` (holding no keys) to node `dst` without a command to
    /// node `src`, its owner: `IMPORTING` and `NODE` on `dst` (which bumps
    /// `dst`'s config epoch), `NODE` on the other nodes; `src` learns the
    /// new owner from the cluster bus.
    pub fn move_slot_leaving_out(&self, slot: u16, src: usize, dst: usize) {
        let slot = slot.to_string();
        let (src_id, dst_id) = (self.node_id(src), self.node_id(dst));
        let importing = ["cluster", "setslot", &slot, "importing", &src_id];
        assert_eq!(cli(self.nodes[dst].port, &importing), "OK");
        let others = (0..self.nodes.len()).filter(|&i| i != dst && i != src);
        for i in std::iter::once(dst).chain(others) {
            let node = ["cluster", "setslot", &slot, "node", &dst_id];
            assert_eq!(cli(self.nodes[i].port, &node), "OK");
        }
    }

    /// The node (index) serving `key` (the one that does not answer MOVED).
    pub fn node_for(&self, key: &str) -> usize {
        for (i, n) in self.nodes.iter().enumerate() {
            if !cli(n.port, &["exists", key]).contains("MOVED") {
                return i;
            }
        }
        panic!("no node serves {key}");
    }
}
