//! What the replica probes read: `INFO replication` of a master and of a
//! replica, and a node's availability zone in its `HELLO` reply (Valkey
//! 8's `availability-zone`, field `availability_zone`).

use bytes::Bytes;
use sidecache_resp::frame::Value;

/// One field of an INFO text.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim())
    })
}

/// A master's `master_repl_offset`.
pub fn master_offset(info: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(info).ok()?;
    field(text, "master_repl_offset")?.parse().ok()
}

/// What a replica's `INFO replication` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// `master_link_status:up`, and no sync in progress.
    pub link_up: bool,
    /// `slave_repl_offset`: what it has applied.
    pub offset: u64,
}

/// Parses a replica's `INFO replication`; `None` when the node says it
/// is no replica (`role:master`) or the text lacks the fields.
pub fn replica(info: &[u8]) -> Option<ReplicaInfo> {
    let text = std::str::from_utf8(info).ok()?;
    if field(text, "role")? != "slave" {
        return None;
    }
    let link_up = field(text, "master_link_status") == Some("up")
        && field(text, "master_sync_in_progress").is_none_or(|v| v == "0");
    let offset = field(text, "slave_repl_offset")?.parse().ok()?;
    Some(ReplicaInfo { link_up, offset })
}

/// A standalone master's online replicas, from its `INFO replication`
/// (`slaveN:ip=…,port=…,state=online,…`).
pub fn standalone_replicas(info: &[u8]) -> Vec<crate::config::NodeAddr> {
    let text = String::from_utf8_lossy(info);
    text.lines()
        .filter(|l| l.starts_with("slave") && l.contains(":ip="))
        .filter_map(|l| {
            let (_, v) = l.split_once(':')?;
            let get = |k: &str| {
                v.split(',')
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            };
            (get("state")? == "online").then_some(())?;
            Some(crate::config::NodeAddr {
                host: get("ip")?.to_owned(),
                port: get("port")?.parse().ok()?,
            })
        })
        .collect()
}

/// The `availability_zone` of a `HELLO` reply (a RESP2 array of field,
/// value pairs, or a RESP3 map), or the value of a `CONFIG GET
/// availability-zone` reply, if set and not empty.
pub fn hello_az(reply: &Bytes) -> Option<String> {
    let items = Value::decode(reply).ok()?.into_items()?;
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        let name: &[u8] = k.as_bytes().map_or(&[], |k| k.as_ref());
        if name == b"availability_zone" || name == b"availability-zone" {
            let az = String::from_utf8_lossy(v.as_bytes()?).into_owned();
            return (!az.is_empty()).then_some(az);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_offsets() {
        let m = b"# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1,port=7004,state=online,offset=42,lag=0\r\nmaster_repl_offset:42\r\n";
        assert_eq!(master_offset(m), Some(42));
        let r = b"# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\nmaster_link_status:up\r\nmaster_sync_in_progress:0\r\nslave_read_repl_offset:44\r\nslave_repl_offset:40\r\n";
        assert_eq!(
            replica(r),
            Some(ReplicaInfo {
                link_up: true,
                offset: 40
            })
        );
        let down = b"role:slave\r\nmaster_link_status:down\r\nslave_repl_offset:40\r\n";
        assert_eq!(replica(down).map(|r| r.link_up), Some(false));
        assert_eq!(replica(m), None);
        let found = standalone_replicas(m);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].port, 7004);
    }

    #[test]
    fn reads_the_zone_of_hello() {
        let r = Bytes::from_static(
            b"*6\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$17\r\navailability_zone\r\n$4\r\naz-1\r\n$4\r\nrole\r\n$7\r\nreplica\r\n",
        );
        assert_eq!(hello_az(&r).as_deref(), Some("az-1"));
        let config = Bytes::from_static(b"*2\r\n$17\r\navailability-zone\r\n$4\r\naz-2\r\n");
        assert_eq!(hello_az(&config).as_deref(), Some("az-2"));
        let none = Bytes::from_static(b"*2\r\n$6\r\nserver\r\n$5\r\nredis\r\n");
        assert_eq!(hello_az(&none), None);
    }
}
