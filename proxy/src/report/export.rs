//! The Prometheus side: one collector that reads every counter at scrape
//! time (the proxy's, the L1's, the pool's write-behind stats, the
//! topology) and builds the metric families; and readiness.
//!
//! Nothing here runs per command. A scrape takes the client-registry lock
//! once (connected clients), the shard map lock once, and walks the slot
//! map once in cluster mode.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{Encoder as _, Registry, TextEncoder};
use sidecache_pool::cluster::slot::SLOT_COUNT;
use sidecache_pool::cluster::topology::Topology;
use sidecache_pool::Slot;

use crate::state::Shared;

mod collect;
use collect::collect_shared;

/// Kinds of metric families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, count and sum.
    Histogram,
    /// Count and sum (no quantiles).
    Summary,
}

/// One exported family: name, kind, label names, help.
#[derive(Debug)]
pub struct Family {
    /// Full name.
    pub name: &'static str,
    /// Type.
    pub kind: Kind,
    /// Label names (bounded values only: never keys or client addresses).
    pub labels: &'static [&'static str],
    /// Help text.
    pub help: &'static str,
}

const fn fam(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family {
        name,
        kind,
        labels,
        help,
    }
}

use Kind::{Counter as C, Gauge as G, Histogram as H, Summary as S};

/// Every metric sidecache exports, once. `shard` is a master's `host:port`.
pub const FAMILIES: &[Family] = &[
    // Process and clients.
    fam("sidecache_build_info", G, &["version"], "Always 1; the sidecache version as a label."),
    fam("sidecache_start_time_seconds", G, &[], "Start time of the process, seconds since the Unix epoch."),
    fam("sidecache_ready", G, &[], "1 when /readyz answers 200 (upstream known, every slot served, no master answering BUSY/LOADING/MASTERDOWN, not shutting down)."),
    fam("sidecache_connected_clients", G, &[], "Client connections open now."),
    fam("sidecache_connections_received_total", C, &[], "Client connections accepted."),
    fam("sidecache_connections_rejected_total", C, &[], "Client connections refused by --maxclients."),
    fam("sidecache_protocol_errors_total", C, &[], "Client requests that could not be parsed (the client is disconnected)."),
    fam("sidecache_commands_total", C, &["command", "outcome"], "Commands by name (subcommands count under their command; unknown: neither in the upstream command table nor one the proxy answers itself, such as SIDECACHE) and outcome (ok, or error: an error reply)."),
    fam("sidecache_command_duration_seconds", H, &["path"], "Latency as clients see it, from reading a request to writing its reply, by path: l1_hit, upstream (upstream took part), local (answered by the proxy)."),
    // L1.
    fam("sidecache_l1_hits_total", C, &[], "L1 lookups answered from memory."),
    fam("sidecache_l1_misses_total", C, &[], "L1 lookups that went upstream."),
    fam("sidecache_l1_fills_total", C, &[], "Entries inserted from an upstream fetch."),
    fam("sidecache_l1_fills_discarded_total", C, &[], "Fetched values not cached because a write or invalidation raced them."),
    fam("sidecache_l1_evictions_total", C, &[], "Entries evicted for capacity."),
    fam("sidecache_l1_invalidations_total", C, &[], "Keys dropped from the L1 by writes."),
    fam("sidecache_l1_writes_total", C, &[], "Values cached from the proxy's own writes (write-behind)."),
    fam("sidecache_l1_read_hits_total", C, &[], "Lookups of reads other than GET/MGET (--l1-commands: HGETALL, SMEMBERS, …) answered from memory; also in sidecache_l1_hits_total."),
    fam("sidecache_l1_read_misses_total", C, &[], "Lookups of reads other than GET/MGET that went upstream; also in sidecache_l1_misses_total."),
    fam("sidecache_l1_read_fills_total", C, &[], "Replies of reads other than GET/MGET cached by a fill; also in sidecache_l1_fills_total."),
    fam("sidecache_l1_written_released_total", C, &[], "Optin tracking: written values dropped from the L1 once their write reached upstream (keys not read within the TTL cap, while sidecache_l1_rereading_unread_writes is 0: Redis does not track a key for the client that wrote it; the next read registers it again)."),
    fam("sidecache_l1_stale_served_total", C, &[], "L1 hits served while their master's invalidation channel was lost, within --l1-stale-if-error of the loss (0 unless it is set)."),
    fam("sidecache_l1_written_uncached_total", C, &[], "Optin tracking: own writes not cached at all, their key written before and not read since (predicted unread: no insert, no release; a read before the write lands waits for it upstream)."),
    fam("sidecache_l1_written_kept_total", C, &[], "Optin tracking: written values kept in the L1 once their write reached upstream, the key registered again and read back in the write's pipeline (keys read within the TTL cap and since their last write, and keys with no recent read while sidecache_l1_rereading_unread_writes is 1)."),
    fam("sidecache_l1_rereading_unread_writes", G, &[], "Optin tracking: 1 while writes of keys nobody read are re-read too (their keys stay cached), because this sidecache's unread writes were being read later (measured on 1 key in 16); 0 while only writes of keys read within the TTL cap are."),
    fam("sidecache_l1_entries", G, &[], "Entries held."),
    fam("sidecache_l1_bytes", G, &[], "Bytes the entries held weigh: their keys' and values' allocations as malloc sizes them and each entry's slot in the store, what they add to resident memory."),
    fam("sidecache_l1_max_bytes", G, &[], "L1 capacity in bytes (0: L1 off)."),
    fam("sidecache_l1_history_bytes", G, &[], "Bytes of the L1 capacity held for its eviction history (keys evicted last, remembered to admit them straight back); sidecache_l1_bytes stays within the capacity less these."),
    fam("sidecache_process_resident_bytes", G, &[], "The process's resident memory (VmRSS), to compare with sidecache_l1_max_bytes: the L1 bound is what the L1 adds to it."),
    fam("sidecache_prefix_hits_total", C, &["prefix"], "L1 lookups answered from memory, by key prefix (--prefix-stats; other: no listed prefix)."),
    fam("sidecache_prefix_misses_total", C, &["prefix"], "L1 lookups that went upstream, by key prefix (--prefix-stats; other: no listed prefix)."),
    fam("sidecache_prefix_hit_bytes_total", C, &["prefix"], "Value bytes served from the L1, by key prefix (--prefix-stats; other: no listed prefix)."),
    // Write-behind.
    fam("sidecache_write_queue_depth", G, &[], "Acknowledged writes queued and not yet flushed or failed: what a hard crash would lose."),
    fam("sidecache_write_queue_max", G, &[], "Most writes the queue holds (--write-queue-max)."),
    fam("sidecache_write_queue_bytes", G, &[], "Bytes of the queued writes (their commands plus 64 bytes each)."),
    fam("sidecache_write_queue_max_bytes", G, &[], "Most bytes the queue holds (--write-queue-max-bytes)."),
    fam("sidecache_write_backpressure_waits_total", C, &[], "Writes that waited for room in the queue (their client was not read meanwhile)."),
    fam("sidecache_writes_rerouted_total", C, &[], "Queued writes sent to another master than the one they were queued for (failover, resharding)."),
    fam("sidecache_slotmap_refreshes_total", C, &[], "Cluster slot-map refreshes (periodic, or asked for after a redirect or a failure)."),
    fam("sidecache_failovers_followed_total", C, &[], "Slot-map refreshes in which a master left the map (failover or resharding followed)."),
    fam("sidecache_failover_held_requests_total", C, &[], "Requests (a command, or a node's pipeline) held for a passing failure and sent again, counted when the hold ends (answered, or answered the error at --upstream-timeout)."),
    fam("sidecache_failover_hold_duration_seconds", H, &[], "How long each held request was held."),
    fam("sidecache_failover_resent_reads_total", C, &[], "Read-only pipelines sent again after their upstream connection was lost before the replies."),
    fam("sidecache_failover_absorbed_total", C, &["kind"], "Tries made again instead of answering an error, by what held them: clusterdown, tryagain, loading (Redis's error replies: the command did not run), unreachable (nothing was sent), connection_lost (read-only pipelines)."),
    fam("sidecache_transactions_total", C, &["outcome"], "Transactions by outcome: executed, aborted (EXECABORT), watch_failed (nil EXEC), discarded."),
    fam("sidecache_pubsub_clients", G, &[], "Clients subscribed to a channel, pattern or shard channel now."),
    fam("sidecache_monitor_clients", G, &[], "Clients in MONITOR now."),
    fam("sidecache_pubsub_upstream_links", G, &[], "Upstream connections holding the shared subscriptions."),
    fam("sidecache_pubsub_upstream_subscriptions", G, &[], "Channels, patterns and shard channels subscribed upstream (one each, however many local subscribers)."),
    fam("sidecache_pubsub_messages_received_total", C, &[], "Messages received from upstream subscriptions."),
    fam("sidecache_pubsub_messages_delivered_total", C, &[], "Messages and MONITOR lines queued for local clients (one per client reached)."),
    fam("sidecache_client_output_limit_disconnects_total", C, &[], "Subscribers and MONITOR clients disconnected for passing --client-output-buffer-limit."),
    fam("sidecache_client_panics_total", C, &[], "Client tasks that panicked; each closed its own client only."),
    fam("sidecache_pubsub_link_losses_total", C, &[], "Subscribers disconnected because the upstream connection of their subscription broke."),
    fam("sidecache_client_tracking_clients", G, &[], "Clients with CLIENT TRACKING on."),
    fam("sidecache_client_tracking_keys", G, &[], "Keys followed for default-mode tracking clients (--tracking-table-max-keys bounds them)."),
    fam("sidecache_client_tracking_messages_total", C, &[], "Invalidation messages queued for tracking clients (a key each, or one for everything)."),
    fam("sidecache_blocked_clients", G, &[], "Clients blocked now in a blocking command (BLPOP, XREAD BLOCK, WAIT, ...) on a held connection."),
    fam("sidecache_paused_clients", G, &[], "Clients whose command CLIENT PAUSE holds now."),
    fam("sidecache_blocked_unblocked_on_disconnect_total", C, &[], "Blocked commands unblocked upstream (CLIENT UNBLOCK) because their client left."),
    fam("sidecache_upstream_auth_refreshes_total", C, &[], "Rotating upstream secret fetched (--upstream-iam token signed, --upstream-password-file read), at start and on refresh."),
    fam("sidecache_upstream_auth_refresh_failures_total", C, &[], "Fetches of the rotating upstream secret that failed (the previous secret stayed in use)."),
    fam("sidecache_upstream_reauths_total", C, &[], "AUTH with the current secret accepted on a live upstream connection (--upstream-reauth-interval)."),
    fam("sidecache_upstream_reauth_failures_total", C, &[], "AUTH on a live upstream connection refused; the connection was replaced."),
    fam("sidecache_session_connections", G, &[], "Upstream connections held by single clients now (WATCH, a MULTI spanning requests)."),
    fam("sidecache_session_connections_max", G, &[], "Most held connections (--max-session-connections)."),
    fam("sidecache_session_connection_waits_total", C, &[], "Clients that waited for a held connection to be released."),
    fam("sidecache_session_connection_refusals_total", C, &[], "Clients refused a held connection: the bound stayed reached."),
    fam("sidecache_acl_users", G, &[], "ACL users (other than the --upstream one) with clients authenticated now, each with connections of its own."),
    fam("sidecache_acl_users_max", G, &[], "Most such users at once (--acl-max-users; 0: AUTH as another user is refused)."),
    fam("sidecache_acl_user_connections", G, &[], "Connections of ACL users' pools carrying a client's commands now."),
    fam("sidecache_acl_user_connections_opened_total", C, &[], "Connections opened authenticated as an ACL user (each AUTH is checked on a fresh one)."),
    fam("sidecache_acl_user_connection_refusals_total", C, &[], "Commands refused because their ACL user's connections stayed in use (--acl-user-connections)."),
    fam("sidecache_acl_logins_total", C, &[], "AUTH / HELLO AUTH as an ACL user accepted by the upstream."),
    fam("sidecache_acl_auth_failures_total", C, &[], "AUTH / HELLO AUTH as an ACL user refused (by the upstream, or by --acl-max-users)."),
    fam("sidecache_writes_queued_total", C, &[], "Writes acknowledged from memory and queued."),
    fam("sidecache_writes_flushed_total", C, &[], "Queued writes acknowledged by upstream."),
    fam("sidecache_writes_failed_total", C, &[], "Queued writes upstream refused for good (their keys are dropped from the L1)."),
    fam("sidecache_writes_refused_total", C, &[], "Writes refused because the queue stayed full for --write-queue-timeout."),
    fam("sidecache_write_retries_total", C, &[], "Write-behind re-sends after connection loss, redirects or retryable errors."),
    fam("sidecache_write_batches_ahead_total", C, &[], "Batches sent before the answers of earlier ones were in (--write-pipeline above 1)."),
    fam("sidecache_write_batch_size", H, &[], "Writes per upstream pipeline (count: batches; sum: writes settled, which lags the batches in flight)."),
    fam("sidecache_write_flush_duration_seconds", S, &[], "Time from acknowledging a write to upstream settling it (sum and count)."),
    fam("sidecache_write_flush_duration_max_seconds", G, &[], "Longest time from acknowledgement to settlement since start."),
    fam("sidecache_write_journal_enabled", G, &[], "1 when write-behind writes are journalled before they are acknowledged (--write-journal)."),
    fam("sidecache_write_journal_bytes", G, &[], "Bytes in the write journal's segment files now (a segment is deleted once every write in it landed upstream)."),
    fam("sidecache_write_journal_segments", G, &[], "Segment files of the write journal now."),
    fam("sidecache_write_journal_records_total", C, &[], "Writes recorded in the write journal."),
    fam("sidecache_write_journal_fsync_duration_seconds", H, &[], "Time one fdatasync of the write journal took (one covers every write that arrived while the one before ran)."),
    fam("sidecache_write_journal_replayed_records_total", C, &[], "Writes replayed from the journal at start (what the previous run left unflushed)."),
    fam("sidecache_write_journal_dropped_bytes_total", C, &[], "Bytes of torn or corrupt journal records dropped at start (a record cut by a crash mid-write)."),
    fam("sidecache_write_journal_errors_total", C, &[], "Failures to write or sync the journal (writes are then refused with -MISCONF)."),
    fam("sidecache_shutdown_writes_flushed_total", C, &[], "Writes flushed by the shutdown drain."),
    fam("sidecache_shutdown_writes_unflushed", G, &[], "Writes still queued when the shutdown drain gave up."),
    // Invalidation channel.
    fam("sidecache_coherence_mode", G, &["mode"], "1 for the coherence mode in force (tracking, peer, ttl-only, off), 0 for the others."),
    fam("sidecache_tracking_up", G, &["shard"], "1 while the invalidation channel is up: one per master (client tracking), or peer:CHANNEL (peer fallback)."),
    fam("sidecache_invalidations_received_total", C, &[], "Invalidation messages received (client-tracking pushes, or other sidecaches' peer messages)."),
    fam("sidecache_invalidated_keys_total", C, &[], "Keys named by client-tracking invalidation messages."),
    fam("sidecache_tracking_channel_losses_total", C, &[], "Tracking connections lost (connection broken or heartbeat unanswered; under optin each master has --fill-connections of them); each loss clears that master's part of the L1."),
    fam("sidecache_tracking_echoes_total", C, &[], "Optin tracking: invalidations Redis sent back for this sidecache's own writes (dropped: the write was told of when acknowledged)."),
    fam("sidecache_tracking_registered_reads_total", C, &[], "Optin tracking: reads that fill the L1, sent on a master's tracking connection (each registers its key in Redis's tracking table for this sidecache)."),
    // Upstream.
    fam("sidecache_upstream_info", G, &["mode", "engine", "version"], "Always 1; the upstream mode (standalone or cluster), engine (redis, valkey) and the engine's own version."),
    fam("sidecache_upstream_masters", G, &[], "Masters in the current topology."),
    fam("sidecache_cluster_slots_uncovered", G, &[], "Hash slots no master serves (cluster; readiness fails while above 0)."),
    fam("sidecache_topology_changes_total", C, &[], "Changes of the set of masters seen after start."),
    fam("sidecache_upstream_commands_total", C, &["shard"], "Commands client connections sent to the master."),
    fam("sidecache_upstream_pipeline_failures_total", C, &["shard"], "Client pipelines to the master that failed (connect, connection lost, queued writes not flushed in time)."),
    fam("sidecache_upstream_write_waits_total", C, &["shard"], "Client pipelines that waited for the master's queued writes first (per-key order)."),
    fam("sidecache_upstream_pool_connections", G, &["shard"], "Multiplexed connections per database and protocol in use to the master (--pool-size)."),
    fam("sidecache_upstream_errors_total", C, &[], "Commands answered with an upstream failure (not Redis's own error replies)."),
    fam("sidecache_upstream_redirects_total", C, &["kind"], "MOVED and ASK replies followed for client commands."),
    fam("sidecache_upstream_readonly_reconnects_total", C, &[], "Upstream connections closed and re-opened (fresh DNS resolution) because a standalone node answered READONLY: the endpoint moved to a new primary."),
    // Replica reads (--read-from other than primary).
    fam("sidecache_reads_routed_total", C, &["target"], "L1 misses and read-only forwarded commands by where they went: primary, replica_same_az (a replica in --az), replica_other_az (--read-from other than primary)."),
    fam("sidecache_replica_reads_on_primary_total", C, &["reason"], "Reads that went to the master though it has replicas: own_write (a write of the slot not yet proven on a usable replica: read-your-writes), no_replica (none usable: down, loading, link down, past --replica-max-lag)."),
    fam("sidecache_replica_read_fallbacks_total", C, &[], "Reads sent to a replica that failed there (connection lost or refused, no answer in time) and were sent again to the master."),
    fam("sidecache_replica_lag_seconds", G, &["replica", "az"], "How long before the last probe the replica was last proven to hold all its master had (0 to about one --replica-check-interval when it keeps up)."),
    fam("sidecache_replica_usable", G, &["replica", "az"], "1 while the replica's last probe answered with its link up and it is within --replica-max-lag."),
    fam("sidecache_upstream_healthy", G, &["shard"], "0 while the master's latest reply was BUSY, LOADING or MASTERDOWN, or a request to it is overdue; 1 otherwise."),
];

/// State the exporter and readiness read; filled in as start-up proceeds.
#[derive(Debug)]
struct Cell {
    shared: OnceLock<Weak<Shared>>,
    waiting: Mutex<Option<String>>,
    started: f64,
}

impl Cell {
    fn shared(&self) -> Option<Arc<Shared>> {
        self.shared.get().and_then(Weak::upgrade)
    }
}

/// The registry behind `/metrics` and the answer of `/readyz`.
pub struct Exporter {
    cell: Arc<Cell>,
    registry: Registry,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("cell", &self.cell)
            .finish()
    }
}

impl Default for Exporter {
    fn default() -> Self {
        Exporter::new()
    }
}

impl Exporter {
    /// An exporter with no upstream yet (`/readyz` answers 503).
    pub fn new() -> Exporter {
        let cell = Arc::new(Cell {
            shared: OnceLock::new(),
            waiting: Mutex::new(None),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        });
        let descs = FAMILIES
            .iter()
            .map(|f| {
                Desc::new(
                    f.name.into(),
                    f.help.into(),
                    f.labels.iter().map(|l| (*l).to_owned()).collect(),
                    Default::default(),
                )
                .expect("invariant: the metric table holds valid names")
            })
            .collect();
        let registry = Registry::new();
        registry
            .register(Box::new(Collect {
                cell: Arc::clone(&cell),
                descs,
            }))
            .expect("invariant: one collector, unique names");
        Exporter { cell, registry }
    }

    /// The proxy is up: metrics and readiness read `shared` from now on.
    pub fn attach(&self, shared: &Arc<Shared>) {
        let _ = self.cell.shared.set(Arc::downgrade(shared));
    }

    /// Start-up is still waiting for the upstream; `why` is the last error.
    pub fn waiting(&self, why: &str) {
        *self.cell.waiting.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.to_owned());
    }

    /// The registry (to add collectors of one's own).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// `/metrics` in the Prometheus text format.
    ///
    /// # Errors
    /// The encoder's error (only for malformed families, a bug).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::with_capacity(16 * 1024);
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// The `/debug/hotkeys` answer for query string `q`: the JSON body, or
    /// the status and a one-line reason.
    ///
    /// # Errors
    /// 400 for a bad query, 503 before start-up finished, 404 when hot
    /// keys are off.
    pub fn hotkeys(&self, q: Option<&str>) -> Result<String, (u16, String)> {
        use crate::metrics::hotkeys;
        let (by, n, db) = hotkeys::parse_query(q).map_err(|e| (400, e))?;
        let shared = self
            .cell
            .shared()
            .ok_or_else(|| (503, "upstream not reached yet".to_owned()))?;
        if !shared.hotkeys.enabled() {
            return Err((404, "hot keys are off (--hotkeys-capacity 0)".into()));
        }
        let top = shared.hotkeys.top(by, db, n);
        Ok(hotkeys::to_json(by, shared.hotkeys.sample(), &top))
    }

    /// `Ok` when ready to serve; otherwise a one-line reason.
    pub fn readiness(&self) -> Result<(), String> {
        readiness(&self.cell)
    }
}

fn readiness(cell: &Cell) -> Result<(), String> {
    let Some(shared) = cell.shared() else {
        let waiting = cell.waiting.lock().unwrap_or_else(|p| p.into_inner());
        return Err(match &*waiting {
            Some(e) => format!("upstream not reached yet: {}", one_line(e)),
            None => "upstream not reached yet".into(),
        });
    };
    if shared.metrics.shutting_down.load(Ordering::Relaxed) {
        return Err("shutting down".into());
    }
    let topo = shared.upstream.topology();
    decide(topo.nodes().len(), uncovered_slots(&topo)).inspect_err(|_| {
        // A fresh slot map may already cover them (rate-limited upstream).
        shared.upstream.request_refresh();
    })?;
    // A master that answers BUSY, LOADING or MASTERDOWN serves nothing.
    match shared.upstream.trouble() {
        Some(t) => Err(one_line(&t)),
        None => Ok(()),
    }
}

/// Readiness from the topology's figures (pure: tested without sockets).
fn decide(masters: usize, uncovered: usize) -> Result<(), String> {
    if masters == 0 {
        return Err("upstream topology not known yet".into());
    }
    if uncovered > 0 {
        return Err(format!(
            "{uncovered} of {SLOT_COUNT} hash slots are served by no master"
        ));
    }
    Ok(())
}

fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

/// Hash slots no master serves (0 for a standalone upstream).
pub fn uncovered_slots(topo: &Topology) -> usize {
    if !topo.is_cluster() {
        return if topo.nodes().is_empty() {
            usize::from(SLOT_COUNT)
        } else {
            0
        };
    }
    (0..SLOT_COUNT)
        .filter_map(Slot::new)
        .filter(|s| topo.node_index(*s).is_err())
        .count()
}

struct Collect {
    cell: Arc<Cell>,
    descs: Vec<Desc>,
}

/// Families being built for one scrape, by name.
#[derive(Default)]
struct Out {
    fams: BTreeMap<&'static str, MetricFamily>,
}

impl Out {
    fn push(&mut self, name: &'static str, labels: &[(&str, &str)], m: proto::Metric) {
        let Some(f) = FAMILIES.iter().find(|f| f.name == name) else {
            debug_assert!(false, "{name} is not in FAMILIES");
            return;
        };
        debug_assert_eq!(f.labels.len(), labels.len(), "{name}");
        let fam = self.fams.entry(f.name).or_insert_with(|| {
            let mut fam = MetricFamily::default();
            fam.set_name(f.name.into());
            fam.set_help(f.help.into());
            fam.set_field_type(match f.kind {
                Kind::Counter => MetricType::COUNTER,
                Kind::Gauge => MetricType::GAUGE,
                Kind::Histogram => MetricType::HISTOGRAM,
                Kind::Summary => MetricType::SUMMARY,
            });
            fam
        });
        let mut m = m;
        m.set_label(
            labels
                .iter()
                .map(|(k, v)| {
                    let mut l = proto::LabelPair::default();
                    l.set_name((*k).into());
                    l.set_value((*v).into());
                    l
                })
                .collect(),
        );
        fam.mut_metric().push(m);
    }

    fn counter(&mut self, name: &'static str, labels: &[(&str, &str)], v: u64) {
        let mut c = proto::Counter::default();
        c.set_value(v as f64);
        let mut m = proto::Metric::default();
        m.set_counter(c);
        self.push(name, labels, m);
    }

    fn gauge(&mut self, name: &'static str, labels: &[(&str, &str)], v: f64) {
        let mut g = proto::Gauge::default();
        g.set_value(v);
        self.push(name, labels, proto::Metric::from_gauge(g));
    }

    fn histogram(
        &mut self,
        name: &'static str,
        labels: &[(&str, &str)],
        buckets: impl Iterator<Item = (f64, u64)>,
        count: u64,
        sum: f64,
    ) {
        let mut h = proto::Histogram::default();
        h.set_bucket(
            buckets
                .map(|(le, n)| {
                    let mut b = proto::Bucket::default();
                    b.set_upper_bound(le);
                    b.set_cumulative_count(n);
                    b
                })
                .collect(),
        );
        h.set_sample_count(count);
        h.set_sample_sum(sum);
        let mut m = proto::Metric::default();
        m.set_histogram(h);
        self.push(name, labels, m);
    }

    fn summary(&mut self, name: &'static str, count: u64, sum: f64) {
        let mut s = proto::Summary::default();
        s.set_sample_count(count);
        s.set_sample_sum(sum);
        let mut m = proto::Metric::default();
        m.set_summary(s);
        self.push(name, &[], m);
    }
}

impl Collector for Collect {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut o = Out::default();
        o.gauge(
            "sidecache_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))],
            1.0,
        );
        o.gauge("sidecache_start_time_seconds", &[], self.cell.started);
        let ready = readiness(&self.cell).is_ok();
        o.gauge("sidecache_ready", &[], if ready { 1.0 } else { 0.0 });
        if let Some(shared) = self.cell.shared() {
            collect_shared(&shared, &mut o);
        }
        o.fams.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_decision() {
        assert!(decide(0, 0).is_err());
        assert!(decide(1, 0).is_ok());
        let e = decide(3, 1).expect_err("uncovered");
        assert_eq!(e, "1 of 16384 hash slots are served by no master");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn families_follow_the_naming_rules() {
        let mut seen = std::collections::HashSet::new();
        for f in FAMILIES {
            assert!(seen.insert(f.name), "{} twice", f.name);
            assert!(f.name.starts_with("sidecache_"), "{}", f.name);
            assert_eq!(
                f.kind == Kind::Counter,
                f.name.ends_with("_total"),
                "{}: only counters end in _total",
                f.name
            );
            assert!(!f.help.is_empty());
            for l in f.labels {
                assert!(!["key", "addr", "client"].contains(l), "{}", f.name);
            }
        }
    }

    #[test]
    fn dashboard_uses_only_exported_metrics() {
        let dash = include_str!("../../../deploy/grafana/sidecache.json");
        let mut used = 0;
        for (i, _) in dash.match_indices("sidecache_") {
            let name: String = dash[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if name == "sidecache_" {
                continue;
            }
            let known = FAMILIES.iter().any(|f| {
                name == f.name
                    || (matches!(f.kind, Kind::Histogram | Kind::Summary)
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name == format!("{}{s}", f.name)))
            });
            assert!(known, "the dashboard uses {name}, which is not exported");
            used += 1;
        }
        assert!(used > 20);
    }

    #[test]
    fn before_attach_only_process_figures() {
        let e = Exporter::new();
        e.waiting("connection refused\r\n");
        let text = e.encode().expect("encodes");
        assert!(text.contains("sidecache_ready 0"), "{text}");
        assert!(text.contains("sidecache_build_info{version="), "{text}");
        assert_eq!(
            e.readiness().expect_err("not ready"),
            "upstream not reached yet: connection refused  "
        );
    }
}
