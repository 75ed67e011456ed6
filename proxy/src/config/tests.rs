//! Configuration parsing tests.
use super::*;
use clap::Parser;

fn opts(args: &[&str]) -> Options {
    Options::try_parse_from(std::iter::once("sidecache").chain(args.iter().copied()))
        .expect("valid flags")
}

#[test]
fn defaults() {
    let c = Config::from_options(opts(&["--upstream", "redis://127.0.0.1:6379"])).expect("valid");
    assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.proto_max_bulk_len, DEFAULT_PROTO_MAX_BULK_LEN);
    assert_eq!(c.upstream.pool_size, 2);
    assert_eq!(c.upstream.write.pipeline, 4);
    assert!(c.unix_socket.is_none());
}

#[test]
fn errors_name_the_option() {
    let e = Config::from_options(opts(&[])).expect_err("upstream required");
    assert_eq!(e.key, "--upstream");
    let e = Config::from_options(opts(&["--upstream", "redis://h", "--listen", "nope"]))
        .expect_err("bad");
    assert_eq!(e.key, "--listen");
    let e = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--unix-socket-mode",
        "999",
    ]))
    .expect_err("bad");
    assert_eq!(e.key, "--unix-socket-mode");
    let e = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--proto-max-bulk-len",
        "12parsecs",
    ]))
    .expect_err("bad");
    assert_eq!(e.key, "--proto-max-bulk-len");
    for bad in ["0", "1025"] {
        let e = Config::from_options(opts(&["--upstream", "redis://h", "--threads", bad]))
            .expect_err("out of range");
        assert_eq!(e.key, "--threads");
    }
    for bad in ["0", "65"] {
        let e = Config::from_options(opts(&["--upstream", "redis://h", "--write-pipeline", bad]))
            .expect_err("out of range");
        assert_eq!(e.key, "--write-pipeline");
    }
    let c = Config::from_options(opts(&["--upstream", "redis://h", "--write-pipeline", "4"]))
        .expect("valid");
    assert_eq!(c.upstream.write.pipeline, 4);
}

#[test]
fn tracking_modes() {
    use sidecache_pool::config::{Coherence, TrackingMode};
    let mode = |args: &[&str]| {
        let mut all = vec!["--upstream", "redis://h"];
        all.extend_from_slice(args);
        match Config::from_options(opts(&all))
            .expect("valid")
            .upstream
            .coherence
        {
            Coherence::Tracking { mode, .. } => Some(mode),
            Coherence::Off => None,
        }
    };
    assert_eq!(mode(&[]), Some(TrackingMode::Optin));
    assert_eq!(mode(&["--tracking", "on"]), Some(TrackingMode::Bcast));
    assert_eq!(mode(&["--tracking", "optin"]), Some(TrackingMode::Optin));
    assert_eq!(mode(&["--tracking", "bcast"]), Some(TrackingMode::Bcast));
    assert_eq!(mode(&["--tracking", "off"]), None);
    let o: Options = toml::from_str("tracking = \"on\"").expect("on in a file");
    assert_eq!(o.tracking, Some(TrackingArg::Bcast));
}

#[test]
fn threads_default_to_the_cpus_less_one() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let c = Config::from_options(opts(&["--upstream", "redis://h"])).expect("valid");
    assert_eq!(c.threads, cpus.saturating_sub(1).max(1));
    let c =
        Config::from_options(opts(&["--upstream", "redis://h", "--threads", "3"])).expect("valid");
    assert_eq!(c.threads, 3);
}

#[test]
fn example_file_is_valid() {
    let text = include_str!("../../../deploy/sidecache.toml.example");
    let o: Options = toml::from_str(text).expect("example parses with every key known");
    let c = Config::from_options(o).expect("example validates");
    assert_eq!(c.l1.max_bytes, 256 * 1024 * 1024);
}

#[test]
fn l1_options() {
    let c = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--l1-max-bytes",
        "0",
        "--l1-ttl-cap",
        "5",
        "--l1-include-prefix",
        "a:",
        "--l1-include-prefix",
        "b:",
        "--l1-cache-nil",
        "1",
    ]))
    .expect("valid");
    assert_eq!(c.l1.max_bytes, 0);
    assert_eq!(c.l1.ttl_cap, Duration::from_secs(5));
    assert_eq!(c.l1.include_prefixes, vec![b"a:".to_vec(), b"b:".to_vec()]);
    assert_eq!(c.l1.cache_nil, Some(Duration::from_secs(1)));
    let e = Config::from_options(opts(&["--upstream", "redis://h", "--l1-ttl-cap", "0"]))
        .expect_err("bad");
    assert_eq!(e.key, "--l1-ttl-cap");
}

#[test]
fn the_ttl_caps_default_depends_on_what_else_bounds_staleness() {
    // Client tracking reports other writers' changes: a long safety net.
    let c = Config::from_options(opts(&["--upstream", "redis://h"])).expect("valid");
    assert_eq!(c.l1.ttl_cap, Duration::from_secs(600));
    assert!(!c.l1_ttl_cap_given);
    let c = Config::from_options(opts(&["--upstream", "redis://h", "--tracking", "bcast"]))
        .expect("valid");
    assert_eq!(c.l1.ttl_cap, Duration::from_secs(600));
    // Tracking off: the cap is the bound.
    let c = Config::from_options(opts(&["--upstream", "redis://h", "--tracking", "off"]))
        .expect("valid");
    assert_eq!(c.l1.ttl_cap, Duration::from_secs(60));
    // Given, it is kept whatever the mode.
    let c = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--tracking",
        "off",
        "--l1-ttl-cap",
        "900",
    ]))
    .expect("valid");
    assert_eq!(c.l1.ttl_cap, Duration::from_secs(900));
    assert!(c.l1_ttl_cap_given);
}

#[test]
fn file_fills_gaps_flags_win() {
    let file: Options = toml::from_str(
        "listen = \"127.0.0.1:7777\"\npool_size = 3\nupstream = [\"redis://a:1\"]\n",
    )
    .expect("toml");
    let merged = opts(&["--pool-size", "5"]).or(file);
    let c = Config::from_options(merged).expect("valid");
    assert_eq!(c.listen.port(), 7777);
    assert_eq!(c.upstream.pool_size, 5);
    assert_eq!(c.upstream.seeds[0].addr.port, 1);
    assert!(toml::from_str::<Options>("bogus = 1").is_err());
}

#[test]
fn observability_options() {
    let c = Config::from_options(opts(&["--upstream", "redis://:s3cret@h"])).expect("valid");
    assert_eq!(
        c.metrics_listen.map(|a| a.to_string()).as_deref(),
        Some(DEFAULT_METRICS_LISTEN)
    );
    assert_eq!(c.log_format, LogFormat::Text);
    assert_eq!(c.upstream_wait, Duration::ZERO);
    let line = c.redacted();
    assert!(!line.contains("s3cret"), "{line}");
    assert!(line.contains("<auth>@"), "{line}");
    let c = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--metrics-listen",
        "off",
        "--log-format",
        "json",
        "--upstream-wait",
        "2.5",
    ]))
    .expect("valid");
    assert!(c.metrics_listen.is_none());
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.upstream_wait, Duration::from_millis(2500));
    let e = Config::from_options(opts(&["--upstream", "redis://h", "--metrics-listen", "x"]))
        .expect_err("bad");
    assert_eq!(e.key, "--metrics-listen");
    let e = Config::from_options(opts(&["--upstream", "redis://h", "--upstream-wait=-1"]))
        .expect_err("bad");
    assert_eq!(e.key, "--upstream-wait");
}

#[test]
fn output_limits_as_redis_writes_them() {
    let (l, normal) = output_limits(&["pubsub 1mb 256kb 5".into()]).unwrap();
    assert_eq!(normal, DEFAULT_NORMAL_OUTPUT_LIMIT);
    assert_eq!(l.hard, 1 << 20);
    assert_eq!(l.soft, 256 << 10);
    assert_eq!(l.soft_time, Duration::from_secs(5));
    assert_eq!(
        output_limits(&[]).unwrap().0,
        crate::pubsub::OutputLimit::PUBSUB_DEFAULT
    );
    assert_eq!(output_limits(&["pubsub 0 0 0".into()]).unwrap().0.hard, 0);
    let both = output_limits(&["normal 4mb 0 0 pubsub 1mb 0 0".into()]).unwrap();
    assert_eq!((both.0.hard, both.1), (1 << 20, 4 << 20));
    for bad in [
        "pubsub 1mb",
        "normal 1mb 1mb 60",
        "replica 0 0 0",
        "pubsub 1mb 1mb x",
        "pubsub 1zb 0 0",
    ] {
        let e = output_limits(&[bad.into()]).unwrap_err();
        assert_eq!(e.key, "--client-output-buffer-limit", "{bad}");
    }
}

#[test]
fn sizes() {
    assert_eq!(
        size("k", Some("512mb"), 0).expect("valid"),
        512 * 1024 * 1024
    );
    assert_eq!(size("k", Some("1000"), 0).expect("valid"), 1000);
    assert_eq!(size("k", Some("2k"), 0).expect("valid"), 2000);
    assert!(size("k", Some("x"), 0).is_err());
}

#[test]
fn write_journal_options() {
    use sidecache_pool::write_behind::journal::Fsync;
    let c = Config::from_options(opts(&["--upstream", "redis://h"])).expect("valid");
    assert_eq!(c.journal, None, "off by default");
    let c = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--write-journal",
        "/var/lib/sidecache/journal",
    ]))
    .expect("valid");
    let j = c.journal.expect("journal");
    assert_eq!(
        j.path,
        std::path::PathBuf::from("/var/lib/sidecache/journal")
    );
    assert_eq!(j.fsync, Fsync::EverySec, "everysec by default, as Redis");
    // Segments of an eighth of the 64 MB queue.
    assert_eq!(j.segment_bytes, 8 << 20);
    for (arg, want) in [
        ("always", Fsync::Always),
        ("everysec", Fsync::EverySec),
        ("no", Fsync::No),
    ] {
        let c = Config::from_options(opts(&[
            "--upstream",
            "redis://h",
            "--write-journal",
            "j",
            "--write-journal-fsync",
            arg,
            "--write-queue-max-bytes",
            "1mb",
        ]))
        .expect("valid");
        let j = c.journal.expect("journal");
        assert_eq!(j.fsync, want);
        assert_eq!(j.segment_bytes, 128 << 10);
    }
    let e = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--write-journal-fsync",
        "always",
    ]))
    .expect_err("fsync alone");
    assert_eq!(e.key, "--write-journal-fsync");
    let file: Options =
        toml::from_str("write_journal = \"/j\"\nwrite_journal_fsync = \"always\"\n").expect("toml");
    let c = Config::from_options(opts(&["--upstream", "redis://h"]).or(file)).expect("valid");
    assert_eq!(c.journal.map(|j| j.fsync), Some(Fsync::Always));
}

#[test]
fn hotkeys_and_prefix_stats_options() {
    let c = Config::from_options(opts(&["--upstream", "redis://h"])).expect("valid");
    assert_eq!((c.hotkeys_capacity, c.hotkeys_sample), (256, 32));
    assert!(c.prefix_stats.is_empty());
    let c = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--hotkeys-capacity",
        "0",
        "--hotkeys-sample",
        "1",
        "--prefix-stats",
        "user:,session:",
    ]))
    .expect("valid");
    assert_eq!((c.hotkeys_capacity, c.hotkeys_sample), (0, 1));
    assert_eq!(
        c.prefix_stats,
        vec![b"user:".to_vec(), b"session:".to_vec()]
    );
    for (flag, v) in [
        ("--hotkeys-capacity", "5000"),
        ("--hotkeys-sample", "0"),
        ("--prefix-stats", "a,,b"),
        ("--prefix-stats", "other"),
    ] {
        let e = Config::from_options(opts(&["--upstream", "redis://h", flag, v])).expect_err("bad");
        assert_eq!(e.key, flag, "{v}");
    }
    let many: Vec<String> = (0..65).map(|i| format!("p{i}:")).collect();
    let e = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--prefix-stats",
        &many.join(","),
    ]))
    .expect_err("too many");
    assert_eq!(e.key, "--prefix-stats");
    let o: Options = toml::from_str("upstream = [\"redis://h\"]\nhotkeys_capacity = 64\nhotkeys_sample = 4\nprefix_stats = [\"a:\"]\n")
        .expect("toml keys");
    let c = Config::from_options(o).expect("valid");
    assert_eq!((c.hotkeys_capacity, c.hotkeys_sample), (64, 4));
    let c = Config::from_options(opts(&[
        "--upstream",
        "redis://h",
        "--prefix-stats-separator",
        ":",
    ]))
    .expect("valid");
    assert_eq!(c.prefix_separator, Some(b':'));
    for args in [
        &["--prefix-stats-separator", "::"][..],
        &["--prefix-stats-separator", ":", "--prefix-stats", "a:"][..],
    ] {
        let mut a = vec!["--upstream", "redis://h"];
        a.extend_from_slice(args);
        let e = Config::from_options(opts(&a)).expect_err("bad");
        assert_eq!(e.key, "--prefix-stats-separator");
    }
}

#[test]
fn hotkeys_subcommand_leaves_the_flags_alone() {
    // The old flat flags still parse, with no subcommand.
    let o = opts(&[
        "--listen",
        "127.0.0.1:7000",
        "--upstream",
        "redis://h",
        "--pool-size",
        "3",
    ]);
    assert!(o.command.is_none());
    assert_eq!(o.pool_size, Some(3));
    let o = opts(&[
        "hotkeys",
        "--by",
        "misses",
        "-n",
        "5",
        "--addr",
        "127.0.0.1:7000",
    ]);
    match o.command {
        Some(Command::Hotkeys(a)) => {
            assert_eq!(
                (a.by.as_str(), a.n, a.addr.as_str()),
                ("misses", 5, "127.0.0.1:7000")
            );
        }
        other => panic!("not hotkeys: {other:?}"),
    }
    let o = opts(&["hotkeys"]);
    match o.command {
        Some(Command::Hotkeys(a)) => {
            assert_eq!(
                (a.by.as_str(), a.n, a.addr.as_str()),
                ("reads", 20, "127.0.0.1:6380")
            );
        }
        other => panic!("not hotkeys: {other:?}"),
    }
    assert!(Options::try_parse_from(["sidecache", "hotkeys", "--by", "size"]).is_err());
}

#[test]
fn top_subcommand() {
    match opts(&["top"]).command {
        Some(Command::Top(a)) => {
            assert_eq!(
                (a.metrics.as_str(), a.interval, a.n),
                ("127.0.0.1:9121", 1.0, 10)
            );
        }
        other => panic!("not top: {other:?}"),
    }
    let o = opts(&[
        "top",
        "--metrics",
        "10.0.0.1:9200",
        "--interval",
        "0.5",
        "-n",
        "3",
    ]);
    match o.command {
        Some(Command::Top(a)) => {
            assert_eq!(
                (a.metrics.as_str(), a.interval, a.n),
                ("10.0.0.1:9200", 0.5, 3)
            );
        }
        other => panic!("not top: {other:?}"),
    }
    for bad in ["0", "0.05", "-1", "5000", "x"] {
        assert!(
            Options::try_parse_from(["sidecache", "top", "--interval", bad]).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn l1_commands_option() {
    let up = ["--upstream", "redis://127.0.0.1:6379"];
    let c = Config::from_options(opts(&up)).expect("valid");
    assert_eq!(c.l1_commands.len(), crate::cmd::reads::READS.len());
    assert!(c.l1_commands.iter().any(|n| n == "hgetall"));
    let c = Config::from_options(opts(&[
        up[0],
        up[1],
        "--l1-commands",
        "GET,hgetall, smembers",
    ]))
    .expect("valid");
    assert_eq!(c.l1_commands, vec!["hgetall", "smembers"]);
    let e = Config::from_options(opts(&[
        up[0],
        up[1],
        "--l1-commands",
        "hgetall,srandmember",
    ]))
    .expect_err("srandmember is not cacheable");
    assert_eq!(e.key, "--l1-commands");
    assert!(e.message.contains("srandmember"), "{}", e.message);
}

#[test]
fn stale_if_error_takes_durations() {
    use std::time::Duration;
    let d = |v: &str| super::sections::duration("--l1-stale-if-error", Some(v));
    assert_eq!(d("30s").unwrap(), Some(Duration::from_secs(30)));
    assert_eq!(d("500ms").unwrap(), Some(Duration::from_millis(500)));
    assert_eq!(d("2m").unwrap(), Some(Duration::from_secs(120)));
    assert_eq!(d("1.5").unwrap(), Some(Duration::from_millis(1500)));
    assert_eq!(d("0").unwrap(), None);
    assert_eq!(
        super::sections::duration("--l1-stale-if-error", None).unwrap(),
        None
    );
    for bad in ["", "s", "-1s", "10x", "25h", "nan"] {
        let e = d(bad).expect_err(bad).to_string();
        assert!(e.contains("--l1-stale-if-error"), "{e}");
    }
}
