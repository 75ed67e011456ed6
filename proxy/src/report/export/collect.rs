//! The scrape-time collectors of [`super::Collect`], one per section of
//! [`super::FAMILIES`], called in the order below (the metrics of a
//! family are pushed from one section only).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{uncovered_slots, Out};
use crate::metrics::{Path, LATENCY_BOUNDS_NS};
use crate::state::Shared;

/// Every figure read from `Shared`, section by section.
pub(super) fn collect_shared(s: &Shared, o: &mut Out) {
    clients_and_commands(s, o);
    l1(s, o);
    write_queue(s, o);
    failover_and_transactions(s, o);
    pubsub_and_blocking(s, o);
    sessions(s, o);
    users(s, o);
    auth(s, o);
    write_flushes(s, o);
    journal(s, o);
    invalidation(s, o);
    upstream(s, o);
    replica_reads(s, o);
}

/// A counter's value.
#[inline]
fn l(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// Connected clients, connections accepted and refused, protocol errors,
/// commands by name and outcome, and the latency histograms.
fn clients_and_commands(s: &Shared, o: &mut Out) {
    // Clients and commands.
    o.gauge(
        "sidecache_connected_clients",
        &[],
        s.connected_clients() as f64,
    );
    o.counter(
        "sidecache_connections_received_total",
        &[],
        l(&s.stats.connections_received),
    );
    o.counter(
        "sidecache_connections_rejected_total",
        &[],
        l(&s.stats.rejected_connections),
    );
    o.counter(
        "sidecache_protocol_errors_total",
        &[],
        l(&s.stats.protocol_errors),
    );
    let m = &s.metrics;
    for (name, err, n) in m.commands() {
        let outcome = if err { "error" } else { "ok" };
        o.counter(
            "sidecache_commands_total",
            &[("command", name), ("outcome", outcome)],
            n,
        );
    }
    if m.enabled() {
        for p in Path::ALL {
            let h = m.latency(p).snapshot();
            o.histogram(
                "sidecache_command_duration_seconds",
                &[("path", p.label())],
                LATENCY_BOUNDS_NS
                    .iter()
                    .map(|b| *b as f64 / 1e9)
                    .zip(h.cumulative),
                h.count,
                h.sum_ns as f64 / 1e9,
            );
        }
    }
}

/// The L1's counters and sizes.
fn l1(s: &Shared, o: &mut Out) {
    // L1.
    let st = s.l1.stats();
    o.counter("sidecache_l1_hits_total", &[], st.hits);
    o.counter("sidecache_l1_misses_total", &[], st.misses);
    o.counter("sidecache_l1_fills_total", &[], st.fills);
    o.counter(
        "sidecache_l1_fills_discarded_total",
        &[],
        st.fills_discarded,
    );
    o.counter("sidecache_l1_evictions_total", &[], st.evictions);
    o.counter("sidecache_l1_invalidations_total", &[], st.invalidations);
    o.counter("sidecache_l1_writes_total", &[], st.writes);
    o.counter("sidecache_l1_read_hits_total", &[], st.read_hits);
    o.counter("sidecache_l1_read_misses_total", &[], st.read_misses);
    o.counter("sidecache_l1_read_fills_total", &[], st.read_fills);
    o.counter("sidecache_l1_written_released_total", &[], st.released);
    o.counter("sidecache_l1_written_uncached_total", &[], st.uncached);
    o.counter("sidecache_l1_written_kept_total", &[], st.refills);
    o.counter(
        "sidecache_l1_stale_served_total",
        &[],
        s.stale.served.load(std::sync::atomic::Ordering::Relaxed),
    );
    o.gauge(
        "sidecache_l1_rereading_unread_writes",
        &[],
        f64::from(u8::from(s.l1.rereads_unread_writes())),
    );
    o.gauge("sidecache_l1_entries", &[], st.entries as f64);
    o.gauge("sidecache_l1_bytes", &[], st.bytes as f64);
    o.gauge(
        "sidecache_l1_max_bytes",
        &[],
        s.l1.config().max_bytes as f64,
    );
    o.gauge(
        "sidecache_l1_history_bytes",
        &[],
        s.l1.history_bytes() as f64,
    );
    if let Some(rss) = resident_bytes() {
        o.gauge("sidecache_process_resident_bytes", &[], rss as f64);
    }
    for f in s.metrics.prefixes.figures() {
        let label = [("prefix", &*f.label)];
        o.counter("sidecache_prefix_hits_total", &label, f.hits);
        o.counter("sidecache_prefix_misses_total", &label, f.misses);
        o.counter("sidecache_prefix_hit_bytes_total", &label, f.hit_bytes);
    }
}

/// The write-behind queue: its fill, its bounds, and the writes that
/// waited for room or were rerouted.
fn write_queue(s: &Shared, o: &mut Out) {
    // Write-behind.
    let wb = s.upstream.write_behind();
    let ws = &wb.stats;
    o.gauge("sidecache_write_queue_depth", &[], wb.depth() as f64);
    o.gauge(
        "sidecache_write_queue_max",
        &[],
        wb.config().queue_max as f64,
    );
    o.gauge("sidecache_write_queue_bytes", &[], wb.queued_bytes() as f64);
    o.gauge(
        "sidecache_write_queue_max_bytes",
        &[],
        wb.config().queue_max_bytes as f64,
    );
    o.counter(
        "sidecache_write_backpressure_waits_total",
        &[],
        l(&ws.waits),
    );
    o.counter("sidecache_writes_rerouted_total", &[], l(&ws.rerouted));
}

/// Slot-map refreshes and failovers followed; transactions by outcome.
fn failover_and_transactions(s: &Shared, o: &mut Out) {
    let fo = s.upstream.failover_stats();
    o.counter("sidecache_slotmap_refreshes_total", &[], l(&fo.refreshes));
    o.counter(
        "sidecache_failovers_followed_total",
        &[],
        l(&fo.masters_replaced),
    );
    o.counter("sidecache_failover_held_requests_total", &[], l(&fo.held));
    let mut acc = 0;
    let buckets: Vec<(f64, u64)> = sidecache_pool::upstream::HOLD_BUCKETS_MS
        .iter()
        .zip(&fo.hold_buckets)
        .map(|(&le, n)| {
            acc += l(n);
            (le as f64 / 1e3, acc)
        })
        .collect();
    o.histogram(
        "sidecache_failover_hold_duration_seconds",
        &[],
        buckets.into_iter(),
        fo.hold_buckets.iter().map(l).sum(),
        l(&fo.hold_us_sum) as f64 / 1e6,
    );
    o.counter(
        "sidecache_failover_resent_reads_total",
        &[],
        l(&fo.resent_reads),
    );
    for kind in sidecache_pool::Absorbed::ALL {
        o.counter(
            "sidecache_failover_absorbed_total",
            &[("kind", kind.label())],
            fo.absorbed(kind),
        );
    }
    let tx = &s.stats.tx;
    for (outcome, c) in [
        ("executed", &tx.executed),
        ("aborted", &tx.aborted),
        ("watch_failed", &tx.watch_failed),
        ("discarded", &tx.discarded),
    ] {
        o.counter(
            "sidecache_transactions_total",
            &[("outcome", outcome)],
            l(c),
        );
    }
}

/// Pub/sub and MONITOR clients and links, output-limit disconnects,
/// client panics, and blocked clients.
fn pubsub_and_blocking(s: &Shared, o: &mut Out) {
    let ps = &s.pubsub.stats;
    let n =
        |a: &std::sync::atomic::AtomicUsize| a.load(std::sync::atomic::Ordering::Relaxed) as f64;
    o.gauge("sidecache_pubsub_clients", &[], n(&ps.subscribers));
    o.gauge("sidecache_monitor_clients", &[], n(&ps.monitors));
    o.gauge("sidecache_pubsub_upstream_links", &[], n(&ps.links));
    o.gauge(
        "sidecache_pubsub_upstream_subscriptions",
        &[],
        n(&ps.topics),
    );
    o.counter(
        "sidecache_pubsub_messages_received_total",
        &[],
        l(&ps.messages_in),
    );
    o.counter(
        "sidecache_pubsub_messages_delivered_total",
        &[],
        l(&ps.messages_out),
    );
    o.counter(
        "sidecache_client_output_limit_disconnects_total",
        &[],
        l(&ps.output_limit_disconnects),
    );
    o.counter(
        "sidecache_pubsub_link_losses_total",
        &[],
        l(&ps.link_losses),
    );
    let (clients, keys, messages) = s.tracked.figures();
    o.gauge("sidecache_client_tracking_clients", &[], clients as f64);
    o.gauge("sidecache_client_tracking_keys", &[], keys as f64);
    o.counter("sidecache_client_tracking_messages_total", &[], messages);
    o.counter(
        "sidecache_client_panics_total",
        &[],
        l(&s.stats.client_panics),
    );
    o.gauge(
        "sidecache_blocked_clients",
        &[],
        s.stats
            .blocking
            .blocked
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    o.gauge("sidecache_paused_clients", &[], s.pause.waiting() as f64);
    o.counter(
        "sidecache_blocked_unblocked_on_disconnect_total",
        &[],
        l(&s.stats.blocking.unblocked_gone),
    );
}

/// Rotating upstream credentials: refreshes and re-authentications (all
/// zero without `--upstream-iam` / `--upstream-password-file`).
fn auth(s: &Shared, o: &mut Out) {
    let a = &s.upstream.auth().stats;
    o.counter(
        "sidecache_upstream_auth_refreshes_total",
        &[],
        l(&a.refreshes),
    );
    o.counter(
        "sidecache_upstream_auth_refresh_failures_total",
        &[],
        l(&a.refresh_failures),
    );
    o.counter("sidecache_upstream_reauths_total", &[], l(&a.reauths));
    o.counter(
        "sidecache_upstream_reauth_failures_total",
        &[],
        l(&a.reauth_failures),
    );
}

/// Held (session) connections: in use, bound, waits and refusals.
fn sessions(s: &Shared, o: &mut Out) {
    let sessions = s.upstream.sessions();
    o.gauge(
        "sidecache_session_connections",
        &[],
        sessions
            .stats
            .in_use
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    o.gauge(
        "sidecache_session_connections_max",
        &[],
        sessions.max() as f64,
    );
    o.counter(
        "sidecache_session_connection_waits_total",
        &[],
        l(&sessions.stats.waits),
    );
    o.counter(
        "sidecache_session_connection_refusals_total",
        &[],
        l(&sessions.stats.refusals),
    );
}

/// Clients of ACL users other than the `--upstream` one.
fn users(s: &Shared, o: &mut Out) {
    let u = &s.users;
    let (users, held) = u.usage();
    let (opened, refusals) = u.pool_counts();
    o.gauge("sidecache_acl_users", &[], users as f64);
    o.gauge("sidecache_acl_users_max", &[], u.max_users() as f64);
    o.gauge("sidecache_acl_user_connections", &[], held as f64);
    o.counter("sidecache_acl_user_connections_opened_total", &[], opened);
    o.counter(
        "sidecache_acl_user_connection_refusals_total",
        &[],
        refusals,
    );
    o.counter("sidecache_acl_logins_total", &[], l(&u.stats.logins));
    o.counter(
        "sidecache_acl_auth_failures_total",
        &[],
        l(&u.stats.auth_failures),
    );
}

/// The write journal (all zero without `--write-journal`).
fn journal(s: &Shared, o: &mut Out) {
    use sidecache_pool::write_behind::journal::{JournalStats, FSYNC_BUCKETS_US};
    let none = JournalStats::default();
    let j = s.upstream.write_behind().journal();
    let js = j.map_or(&none, |j| j.stats());
    o.gauge(
        "sidecache_write_journal_enabled",
        &[],
        if j.is_some() { 1.0 } else { 0.0 },
    );
    o.gauge("sidecache_write_journal_bytes", &[], l(&js.bytes) as f64);
    o.gauge(
        "sidecache_write_journal_segments",
        &[],
        l(&js.segments) as f64,
    );
    o.counter(
        "sidecache_write_journal_records_total",
        &[],
        l(&js.appended),
    );
    let mut acc = 0;
    let buckets: Vec<(f64, u64)> = FSYNC_BUCKETS_US
        .iter()
        .zip(&js.fsync_buckets)
        .map(|(&le, n)| {
            acc += l(n);
            (le as f64 / 1e6, acc)
        })
        .collect();
    let count: u64 = js.fsync_buckets.iter().map(l).sum();
    o.histogram(
        "sidecache_write_journal_fsync_duration_seconds",
        &[],
        buckets.into_iter(),
        count,
        l(&js.fsync_us_sum) as f64 / 1e6,
    );
    o.counter(
        "sidecache_write_journal_replayed_records_total",
        &[],
        l(&js.replayed),
    );
    o.counter(
        "sidecache_write_journal_dropped_bytes_total",
        &[],
        l(&js.dropped_bytes),
    );
    o.counter("sidecache_write_journal_errors_total", &[], l(&js.errors));
}

/// Write-behind writes by fate, the batch sizes, the flush latency,
/// and what the shutdown drain flushed.
fn write_flushes(s: &Shared, o: &mut Out) {
    let wb = s.upstream.write_behind();
    let ws = &wb.stats;
    let m = &s.metrics;
    o.counter("sidecache_writes_queued_total", &[], l(&ws.queued));
    let (flushed, failed) = (l(&ws.flushed), l(&ws.failed));
    o.counter("sidecache_writes_flushed_total", &[], flushed);
    o.counter("sidecache_writes_failed_total", &[], failed);
    o.counter("sidecache_writes_refused_total", &[], l(&ws.refused));
    o.counter("sidecache_write_retries_total", &[], l(&ws.retries));
    o.counter("sidecache_write_batches_ahead_total", &[], l(&ws.ahead));
    // The pool's buckets (with the default batch of 200: 1, 2–10, 11–50,
    // 51–199, then full batches).
    let mut acc = 0;
    let sizes: Vec<(f64, u64)> = s
        .upstream
        .write_behind()
        .config()
        .batch_size_bounds()
        .map(|b| b as f64)
        .zip(&ws.batch_sizes)
        .map(|(le, n)| {
            acc += l(n);
            (le, acc)
        })
        .collect();
    o.histogram(
        "sidecache_write_batch_size",
        &[],
        sizes.into_iter(),
        l(&ws.batches),
        (flushed + failed) as f64,
    );
    o.summary(
        "sidecache_write_flush_duration_seconds",
        flushed + failed,
        l(&ws.latency_us_sum) as f64 / 1e6,
    );
    o.gauge(
        "sidecache_write_flush_duration_max_seconds",
        &[],
        l(&ws.latency_us_max) as f64 / 1e6,
    );
    o.counter(
        "sidecache_shutdown_writes_flushed_total",
        &[],
        l(&m.shutdown_flushed),
    );
    o.gauge(
        "sidecache_shutdown_writes_unflushed",
        &[],
        l(&m.shutdown_unflushed) as f64,
    );
}

/// The invalidation channel: coherence mode, channels up, messages and
/// keys received, channels lost.
fn invalidation(s: &Shared, o: &mut Out) {
    // Invalidation channel.
    for (shard, up) in s.tracking_shards() {
        o.gauge(
            "sidecache_tracking_up",
            &[("shard", &shard)],
            if up { 1.0 } else { 0.0 },
        );
    }
    o.counter(
        "sidecache_invalidations_received_total",
        &[],
        s.invalidations_received(),
    );
    let mode = s.upstream.coherence_mode();
    for (name, m) in [
        (
            "tracking",
            sidecache_pool::coherence::tracking::CoherenceMode::Tracking,
        ),
        (
            "peer",
            sidecache_pool::coherence::tracking::CoherenceMode::Peer,
        ),
        (
            "ttl-only",
            sidecache_pool::coherence::tracking::CoherenceMode::Unsupported,
        ),
        (
            "off",
            sidecache_pool::coherence::tracking::CoherenceMode::Off,
        ),
    ] {
        o.gauge(
            "sidecache_coherence_mode",
            &[("mode", name)],
            if mode == m { 1.0 } else { 0.0 },
        );
    }
    let cs = s.upstream.coherence_stats();
    o.counter(
        "sidecache_invalidated_keys_total",
        &[],
        cs.map_or(0, |c| l(&c.invalidated_keys)),
    );
    o.counter(
        "sidecache_tracking_channel_losses_total",
        &[],
        cs.map_or(0, |c| l(&c.channel_losses)),
    );
    o.counter(
        "sidecache_tracking_registered_reads_total",
        &[],
        cs.map_or(0, |c| l(&c.registered_reads)),
    );
    o.counter(
        "sidecache_tracking_echoes_total",
        &[],
        cs.map_or(0, |c| l(&c.echoes)),
    );
}

/// The upstream: mode and version, masters and uncovered slots, and per
/// master the commands, failures, waits, connections and health.
fn upstream(s: &Shared, o: &mut Out) {
    let m = &s.metrics;
    // Upstream.
    let info = s.upstream.server_info();
    o.gauge(
        "sidecache_upstream_info",
        &[
            (
                "mode",
                if info.cluster {
                    "cluster"
                } else {
                    "standalone"
                },
            ),
            ("engine", info.engine()),
            ("version", info.engine_version()),
        ],
        1.0,
    );
    let topo = s.upstream.topology();
    o.gauge("sidecache_upstream_masters", &[], topo.nodes().len() as f64);
    o.gauge(
        "sidecache_cluster_slots_uncovered",
        &[],
        uncovered_slots(&topo) as f64,
    );
    o.counter(
        "sidecache_topology_changes_total",
        &[],
        l(&m.topology_changes),
    );
    for n in topo.nodes() {
        o.gauge(
            "sidecache_upstream_pool_connections",
            &[("shard", &n.addr().to_string())],
            s.config.upstream.pool_size as f64,
        );
    }
    for (shard, c) in m.shards() {
        let labels = [("shard", shard.as_str())];
        o.counter("sidecache_upstream_commands_total", &labels, l(&c.commands));
        o.counter(
            "sidecache_upstream_pipeline_failures_total",
            &labels,
            l(&c.pipeline_failures),
        );
        o.counter(
            "sidecache_upstream_write_waits_total",
            &labels,
            l(&c.write_waits),
        );
    }
    o.counter(
        "sidecache_upstream_errors_total",
        &[],
        l(&s.stats.upstream_errors),
    );
    o.counter(
        "sidecache_upstream_readonly_reconnects_total",
        &[],
        s.upstream.readonly_reconnects(),
    );
    for n in topo.nodes() {
        o.gauge(
            "sidecache_upstream_healthy",
            &[("shard", &n.addr().to_string())],
            if n.is_healthy() { 1.0 } else { 0.0 },
        );
    }
    for (kind, c) in ["moved", "ask"].into_iter().zip(&m.redirects) {
        o.counter(
            "sidecache_upstream_redirects_total",
            &[("kind", kind)],
            l(c),
        );
    }
}

/// Replica reads: where reads went, and each replica's probed state
/// (nothing with `--read-from primary`).
fn replica_reads(s: &Shared, o: &mut Out) {
    let Some(rr) = s.upstream.replica_reads() else {
        return;
    };
    let st = &rr.stats;
    for (target, c) in [
        ("primary", &st.primary),
        ("replica_same_az", &st.replica_same_az),
        ("replica_other_az", &st.replica_other_az),
    ] {
        o.counter("sidecache_reads_routed_total", &[("target", target)], l(c));
    }
    for (reason, c) in [
        ("own_write", &st.own_write_primary),
        ("no_replica", &st.no_replica),
    ] {
        o.counter(
            "sidecache_replica_reads_on_primary_total",
            &[("reason", reason)],
            l(c),
        );
    }
    o.counter(
        "sidecache_replica_read_fallbacks_total",
        &[],
        l(&st.fallbacks),
    );
    let topo = s.upstream.topology();
    let max_lag = rr.cfg.max_lag.as_nanos() as u64;
    for r in topo.replicas() {
        let rs = r.replica_state();
        let addr = r.addr().to_string();
        let az = rs.az().unwrap_or_default();
        let labels = [("replica", addr.as_str()), ("az", az.as_str())];
        let lag = rs.lag_ns.load(Ordering::Relaxed);
        o.gauge("sidecache_replica_lag_seconds", &labels, lag as f64 / 1e9);
        let usable = rs.healthy() && rs.caught_up() > 0 && lag <= max_lag;
        o.gauge(
            "sidecache_replica_usable",
            &labels,
            f64::from(u8::from(usable)),
        );
    }
}

/// The process's resident memory (`VmRSS` of /proc/self/status); `None`
/// where there is no such file.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
