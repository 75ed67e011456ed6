//! The proxy's own `INFO` sections, shaped as Redis shapes them
//! (`# Section` then `field:value` lines): `# Proxy` with the headline
//! figures (is the cache helping, is it safe), `# L1`, `# Write-behind`
//! and `# Coherence` with the detail. Upstream's own sections follow them
//! in `INFO`.
//!
//! Section names: `proxy`, `l1`, `writebehind` (or `write-behind`),
//! `coherence`; `INFO`, `INFO default`, `INFO all` and `INFO everything`
//! include all four.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use sidecache_pool::cluster::topology::Topology;

use crate::config::WriteMode;
use crate::report::export::uncovered_slots;
use crate::state::Shared;

/// Which of the proxy's sections to render.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sections(u8);

impl Sections {
    const PROXY: u8 = 1;
    const L1: u8 = 2;
    const WRITE: u8 = 4;
    const COHERENCE: u8 = 8;
    const ALL: u8 = 15;

    /// From INFO's arguments: our sections, and whether upstream must be
    /// asked too (some requested section is not ours).
    pub fn select(args: &[Bytes]) -> (Sections, bool) {
        if args.is_empty() {
            return (Sections(Self::ALL), true);
        }
        let mut ours = 0;
        let mut upstream = false;
        for a in args {
            match &a.to_ascii_lowercase()[..] {
                b"proxy" => ours |= Self::PROXY,
                b"l1" => ours |= Self::L1,
                b"writebehind" | b"write-behind" => ours |= Self::WRITE,
                b"coherence" => ours |= Self::COHERENCE,
                b"all" | b"everything" | b"default" => {
                    ours = Self::ALL;
                    upstream = true;
                }
                _ => upstream = true,
            }
        }
        (Sections(ours), upstream)
    }

    /// Whether no section of ours is wanted.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// The requested sections' text (CRLF line ends, as Redis).
pub fn render(s: &Shared, topo: &Topology, which: Sections) -> String {
    let mut out = String::new();
    if which.0 & Sections::PROXY != 0 {
        out += &proxy(s, topo);
    }
    if which.0 & Sections::L1 != 0 {
        out += &l1(s);
    }
    if which.0 & Sections::WRITE != 0 {
        out += &write_behind(s);
    }
    if which.0 & Sections::COHERENCE != 0 {
        out += &coherence(s);
    }
    out
}

fn coherence(s: &Shared) -> String {
    let up = &s.upstream;
    let channels = s.tracking_shards();
    let mut out = format!(
        "# Coherence\r\ntracking_channels_up:{}\r\ntracking_channels:{}\r\nl1_ttl_cap_seconds:{}\r\n",
        channels.iter().filter(|c| c.1).count(),
        channels.len(),
        s.l1.config().ttl_cap.as_secs_f64(),
    );
    if let Some(m) = up.tracking_mode() {
        out.push_str(&format!("tracking_mode:{}\r\n", m.as_str()));
    }
    if let (Some(st), Some(sidecache_pool::config::TrackingMode::Optin)) =
        (up.coherence_stats(), up.tracking_mode())
    {
        out.push_str(&format!(
            "registered_reads:{}\r\nwritten_released:{}\r\nwritten_uncached:{}\r\nwritten_kept:{}\r\nrereading_unread_writes:{}\r\ntracking_echoes:{}\r\n",
            load(&st.registered_reads),
            s.l1.stats().released,
            s.l1.stats().uncached,
            s.l1.stats().refills,
            u8::from(s.l1.rereads_unread_writes()),
            load(&st.echoes),
        ));
    }
    if let Some(st) = up.coherence_stats() {
        out.push_str(&format!(
            "invalidation_messages:{}\r\ninvalidated_keys:{}\r\ninvalidation_flushes:{}\r\ntracking_channel_losses:{}\r\n",
            load(&st.messages),
            load(&st.invalidated_keys),
            load(&st.flushes),
            load(&st.channel_losses),
        ));
    }
    if let Some(p) = up.peer() {
        out.push_str(&format!(
            "peer_invalidation_channel:{}\r\npeer_channel_up:{}\r\npeer_messages_published:{}\r\npeer_messages_received:{}\r\n",
            String::from_utf8_lossy(p.name()),
            u8::from(p.is_up()),
            load(&p.published),
            load(&p.received),
        ));
    }
    out
}

/// Appends the upstream's INFO text as a client of sidecache should see
/// it: one standalone server (what HELLO says too), whatever is behind. A
/// cluster's `redis_mode:cluster` / `server_mode:cluster` (Valkey) become
/// `standalone` and `cluster_enabled:1` becomes `0`, so clients and tools
/// that pick their cluster mode from INFO do not take sidecache for a
/// cluster node (its `CLUSTER` commands are not served). The proxy's own
/// `upstream_mode` says what is behind it.
pub fn append_as_standalone(upstream: &[u8], out: &mut Vec<u8>) {
    let mut rest = upstream;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .map_or(rest.len(), |i| i + 1);
        let (line, tail) = rest.split_at(end);
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        let body = body.strip_suffix(b"\r").unwrap_or(body);
        let ending = &line[body.len()..];
        match body {
            b"redis_mode:cluster" => out.extend_from_slice(b"redis_mode:standalone"),
            b"server_mode:cluster" => out.extend_from_slice(b"server_mode:standalone"),
            b"cluster_enabled:1" => out.extend_from_slice(b"cluster_enabled:0"),
            _ => out.extend_from_slice(body),
        }
        out.extend_from_slice(ending);
        rest = tail;
    }
}

fn load_n(a: &std::sync::atomic::AtomicUsize) -> usize {
    a.load(std::sync::atomic::Ordering::Relaxed)
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn hit_ratio(s: &Shared) -> f64 {
    let l1 = s.l1.stats();
    let lookups = l1.hits + l1.misses;
    if lookups == 0 {
        0.0
    } else {
        l1.hits as f64 / lookups as f64
    }
}

fn proxy(s: &Shared, topo: &Topology) -> String {
    let info = s.upstream.server_info();
    let sessions = s.upstream.sessions();
    let wb = s.upstream.write_behind();
    let tracked = s.tracked.figures();
    let totals = s.tracked.totals();
    let users = s.users.usage();
    let user_pools = s.users.pool_counts();
    format!(
        "# Proxy\r\nsidecache_version:{}\r\nupstream_mode:{}\r\nupstream_engine:{}\r\nupstream_version:{}\r\nupstream_masters:{}\r\ncluster_slots_uncovered:{}\r\nl1_hit_ratio:{:.4}\r\nwrite_queue_depth:{}\r\nwrites_failed:{}\r\ntracking:{}\r\ncoherence_mode:{}\r\ninvalidations_received:{}\r\nconnected_clients:{}\r\ntotal_connections_received:{}\r\nrejected_connections:{}\r\ntotal_commands_processed:{}\r\nprotocol_errors:{}\r\nupstream_errors:{}\r\nupstream_health:{}\r\nupstream_readonly_reconnects:{}\r\nfailover_held:{}\r\nfailover_resent_reads:{}\r\nfailover_absorbed:{}\r\nupstream_auth:{}\r\nupstream_auth_refreshes:{}\r\nupstream_auth_refresh_failures:{}\r\nupstream_reauths:{}\r\nupstream_reauth_failures:{}\r\ntransactions_executed:{}\r\ntransactions_aborted:{}\r\ntransactions_watch_failed:{}\r\ntransactions_discarded:{}\r\nsession_connections_in_use:{}\r\nsession_connections_max:{}\r\nsession_connection_waits:{}\r\nsession_connection_refusals:{}\r\nacl_users:{}\r\nacl_users_max:{}\r\nacl_user_connections_in_use:{}\r\nacl_user_connections_opened:{}\r\nacl_user_connection_refusals:{}\r\nacl_logins:{}\r\nacl_auth_failures:{}\r\nblocked_clients:{}\r\npaused_clients:{}\r\nblocked_unblocked_on_disconnect:{}\r\npubsub_clients:{}\r\nmonitor_clients:{}\r\npubsub_upstream_links:{}\r\npubsub_upstream_subscriptions:{}\r\npubsub_messages_received:{}\r\npubsub_messages_delivered:{}\r\nclient_output_buffer_limit_disconnections:{}\r\npubsub_link_losses:{}\r\ntracking_clients:{}\r\ntracking_total_keys:{}\r\ntracking_total_items:{}\r\ntracking_total_prefixes:{}\r\ntracking_messages_sent:{}\r\nclient_panics:{}\r\nuptime_in_seconds:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        if info.cluster { "cluster" } else { "standalone" },
        info.engine(),
        info.engine_version(),
        topo.nodes().len(),
        uncovered_slots(topo),
        hit_ratio(s),
        wb.depth(),
        load(&wb.stats.failed),
        s.tracking_state(),
        s.upstream.coherence_mode().as_str(),
        s.invalidations_received(),
        s.connected_clients(),
        load(&s.stats.connections_received),
        load(&s.stats.rejected_connections),
        load(&s.stats.commands),
        load(&s.stats.protocol_errors),
        load(&s.stats.upstream_errors),
        s.upstream
            .trouble()
            .map_or_else(|| "ok".to_owned(), |t| t.replace(['\r', '\n'], " ")),
        s.upstream.readonly_reconnects(),
        load(&s.upstream.failover_stats().held),
        load(&s.upstream.failover_stats().resent_reads),
        sidecache_pool::Absorbed::ALL
            .iter()
            .map(|&k| s.upstream.failover_stats().absorbed(k))
            .sum::<u64>(),
        match &s.config.upstream_auth {
            crate::config::UpstreamAuth::Url => "url",
            crate::config::UpstreamAuth::Iam { .. } => "iam",
            crate::config::UpstreamAuth::PasswordFile(_) => "password-file",
        },
        load(&s.upstream.auth().stats.refreshes),
        load(&s.upstream.auth().stats.refresh_failures),
        load(&s.upstream.auth().stats.reauths),
        load(&s.upstream.auth().stats.reauth_failures),
        load(&s.stats.tx.executed),
        load(&s.stats.tx.aborted),
        load(&s.stats.tx.watch_failed),
        load(&s.stats.tx.discarded),
        sessions.stats.in_use.load(std::sync::atomic::Ordering::Relaxed),
        sessions.max(),
        load(&sessions.stats.waits),
        load(&sessions.stats.refusals),
        users.0,
        s.users.max_users(),
        users.1,
        user_pools.0,
        user_pools.1,
        load(&s.users.stats.logins),
        load(&s.users.stats.auth_failures),
        // As Redis's: blocking commands and the clients a pause holds.
        s.stats.blocking.blocked.load(std::sync::atomic::Ordering::Relaxed)
            + s.pause.waiting(),
        s.pause.waiting(),
        load(&s.stats.blocking.unblocked_gone),
        load_n(&s.pubsub.stats.subscribers),
        load_n(&s.pubsub.stats.monitors),
        load_n(&s.pubsub.stats.links),
        load_n(&s.pubsub.stats.topics),
        load(&s.pubsub.stats.messages_in),
        load(&s.pubsub.stats.messages_out),
        load(&s.pubsub.stats.output_limit_disconnects),
        load(&s.pubsub.stats.link_losses),
        tracked.0,
        tracked.1,
        totals.0,
        totals.1,
        tracked.2,
        load(&s.stats.client_panics),
        s.started.elapsed().as_secs(),
    )
}

fn l1(s: &Shared) -> String {
    let l1 = s.l1.stats();
    format!(
        "# L1\r\nl1_enabled:{}\r\nl1_max_bytes:{}\r\nl1_bytes:{}\r\nl1_history_bytes:{}\r\nl1_entries:{}\r\nl1_hits:{}\r\nl1_misses:{}\r\nl1_hit_ratio:{:.4}\r\nl1_fills:{}\r\nl1_fills_discarded:{}\r\nl1_evictions:{}\r\nl1_invalidations:{}\r\nl1_read_hits:{}\r\nl1_read_misses:{}\r\nl1_read_fills:{}\r\nl1_stale_served:{}\r\n",
        u8::from(s.l1.enabled()),
        s.l1.config().max_bytes,
        l1.bytes,
        s.l1.history_bytes(),
        l1.entries,
        l1.hits,
        l1.misses,
        hit_ratio(s),
        l1.fills,
        l1.fills_discarded,
        l1.evictions,
        l1.invalidations,
        l1.read_hits,
        l1.read_misses,
        l1.read_fills,
        load(&s.stale.served),
    )
}

fn write_behind(s: &Shared) -> String {
    let wb = s.upstream.write_behind();
    let st = &wb.stats;
    let flushed = load(&st.flushed);
    let sizes = batch_sizes(wb.config(), &st.batch_sizes);
    format!(
        "# Write-behind\r\nwrite_mode:{}\r\nwrite_queue_depth:{}\r\nwrite_queue_max:{}\r\nwrite_queue_bytes:{}\r\nwrite_queue_max_bytes:{}\r\nwrite_batch_max:{}\r\nwrite_pipeline:{}\r\nwrites_queued:{}\r\nwrites_flushed:{}\r\nwrites_failed:{}\r\nwrites_refused:{}\r\nwrite_backpressure_waits:{}\r\nwrites_rerouted:{}\r\nslotmap_refreshes:{}\r\nfailovers_followed:{}\r\nwrite_batches:{}\r\nwrite_batch_sizes:{}\r\nwrite_retries:{}\r\nwrite_batches_ahead:{}\r\nwrite_flush_latency_avg_us:{}\r\nwrite_flush_latency_max_us:{}\r\n",
        match s.config.write_mode {
            WriteMode::WriteBehind => "write-behind",
            WriteMode::WriteThrough => "write-through",
        },
        wb.depth(),
        wb.config().queue_max,
        wb.queued_bytes(),
        wb.config().queue_max_bytes,
        wb.config().batch,
        wb.config().pipeline,
        load(&st.queued),
        flushed,
        load(&st.failed),
        load(&st.refused),
        load(&st.waits),
        load(&st.rerouted),
        load(&s.upstream.failover_stats().refreshes),
        load(&s.upstream.failover_stats().masters_replaced),
        load(&st.batches),
        sizes,
        load(&st.retries),
        load(&st.ahead),
        load(&st.latency_us_sum).checked_div(flushed).unwrap_or(0),
        load(&st.latency_us_max),
    ) + &journal(s)
}

/// The write journal's lines of the write-behind section.
fn journal(s: &Shared) -> String {
    let Some(j) = s.upstream.write_behind().journal() else {
        return "write_journal:off\r\n".to_owned();
    };
    let st = j.stats();
    format!(
        "write_journal:{}\r\nwrite_journal_fsync:{}\r\nwrite_journal_bytes:{}\r\nwrite_journal_segments:{}\r\nwrite_journal_records:{}\r\nwrite_journal_replayed:{}\r\nwrite_journal_dropped_bytes:{}\r\nwrite_journal_errors:{}\r\n",
        j.config().path.display(),
        j.config().fsync,
        load(&st.bytes),
        load(&st.segments),
        load(&st.appended),
        load(&st.replayed),
        load(&st.dropped_bytes),
        load(&st.errors),
    )
}

/// `1=…,2-10=…,11-50=…,51-199=…,200+=…` for the buckets of the configured
/// batch size (these are the default's).
fn batch_sizes(cfg: &sidecache_pool::WriteConfig, counts: &[AtomicU64]) -> String {
    let mut out = String::new();
    let mut low = 1;
    let mut full = 0;
    for (i, b) in cfg.batch_size_bounds().enumerate() {
        let name = if b == low {
            b.to_string()
        } else {
            format!("{low}-{b}")
        };
        out.push_str(&format!("{name}={},", counts.get(i).map_or(0, load)));
        low = b + 1;
        full = i + 1;
    }
    let full = counts.get(full).map_or(0, load);
    out.push_str(&format!("{}+={full}", cfg.batch));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_name_the_configured_buckets() {
        let counts: Vec<AtomicU64> = (1..=5).map(AtomicU64::new).collect();
        let cfg = sidecache_pool::WriteConfig::default();
        assert_eq!(
            batch_sizes(&cfg, &counts),
            "1=1,2-10=2,11-50=3,51-199=4,200+=5"
        );
        let cfg = sidecache_pool::WriteConfig { batch: 20, ..cfg };
        assert_eq!(batch_sizes(&cfg, &counts), "1=1,2-10=2,11-19=3,20+=4");
    }

    fn sel(args: &[&str]) -> (Sections, bool) {
        let args: Vec<Bytes> = args
            .iter()
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect();
        Sections::select(&args)
    }

    #[test]
    fn a_cluster_upstream_reads_as_one_standalone_server() {
        let up = b"# Server\r\nredis_version:7.0.15\r\nredis_mode:cluster\r\nserver_mode:cluster\r\n\r\n# Cluster\r\ncluster_enabled:1\r\ncluster_enabled:10\r\n";
        let mut out = Vec::new();
        append_as_standalone(up, &mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nserver_mode:standalone\r\n\r\n# Cluster\r\ncluster_enabled:0\r\ncluster_enabled:10\r\n"
        );
        // A standalone upstream's text is kept byte for byte.
        let plain = b"# Server\r\nredis_mode:standalone\r\n# Cluster\r\ncluster_enabled:0";
        let mut out = Vec::new();
        append_as_standalone(plain, &mut out);
        assert_eq!(&out[..], &plain[..]);
    }

    #[test]
    fn section_selection() {
        assert_eq!(sel(&[]), (Sections(Sections::ALL), true));
        assert_eq!(sel(&["PROXY"]), (Sections(Sections::PROXY), false));
        assert_eq!(
            sel(&["l1", "write-behind"]),
            (Sections(Sections::L1 | Sections::WRITE), false)
        );
        assert_eq!(sel(&["server"]), (Sections(0), true));
        assert_eq!(sel(&["proxy", "server"]), (Sections(Sections::PROXY), true));
        assert_eq!(sel(&["everything"]), (Sections(Sections::ALL), true));
    }
}
