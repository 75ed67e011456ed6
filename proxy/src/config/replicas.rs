//! `--read-from` and its companions: where reads go, sidecache's and the
//! nodes' availability zones, and the replica probes' bounds
//! (docs/replica-reads.md).

use std::time::Duration;

use sidecache_pool::config::{ReadConfig, ReadFrom};
use sidecache_pool::NodeAddr;

use super::{err, secs, ConfigError, Options};

/// The replica reads' section.
pub(super) fn reads(o: &Options) -> Result<ReadConfig, ConfigError> {
    let read_from = match o.read_from.as_deref() {
        None => ReadFrom::Primary,
        Some(m) => m.parse().map_err(|e: String| err("--read-from", e))?,
    };
    let az = o.az.as_deref().map(str::trim).filter(|a| !a.is_empty());
    if matches!(
        read_from,
        ReadFrom::AzAffinity | ReadFrom::AzAffinityReplicasAndPrimary
    ) && az.is_none()
    {
        return Err(err(
            "--az",
            format!(
                "required with --read-from {} (the zone this sidecache runs in)",
                read_from.as_str()
            ),
        ));
    }
    let node_az = o
        .replica_az
        .iter()
        .map(|entry| {
            let bad = || {
                err(
                    "--replica-az",
                    format!("{entry:?} is not HOST:PORT=AZ (e.g. 10.0.1.5:6379=use1-az1)"),
                )
            };
            let (addr, zone) = entry.trim().split_once('=').ok_or_else(bad)?;
            let addr = NodeAddr::parse(addr.trim()).ok_or_else(bad)?;
            let zone = zone.trim();
            if zone.is_empty() {
                return Err(bad());
            }
            Ok((addr, zone.to_owned()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let check_interval = secs(
        "--replica-check-interval",
        o.replica_check_interval,
        sidecache_pool::config::DEFAULT_CHECK_INTERVAL.as_secs_f64(),
    )?;
    if check_interval < Duration::from_millis(1) {
        return Err(err("--replica-check-interval", "must be at least 0.001"));
    }
    let max_lag = secs(
        "--replica-max-lag",
        o.replica_max_lag,
        sidecache_pool::config::DEFAULT_MAX_LAG.as_secs_f64(),
    )?;
    if max_lag <= check_interval {
        return Err(err(
            "--replica-max-lag",
            "must be longer than --replica-check-interval (a replica is proven caught up once per interval)",
        ));
    }
    Ok(ReadConfig {
        read_from,
        az: az.map(str::to_owned),
        node_az,
        max_lag,
        check_interval,
    })
}
