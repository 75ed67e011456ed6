//! The override list: what `COMMAND` cannot say about how a proxy must treat
//! a command. Everything not listed is forwarded to its key's node.

use super::flags::Flags;
use crate::pubsub::Kind;

/// How a reply is assembled from per-node parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// MGET: values placed back at their keys' positions.
    Values,
    /// DEL/UNLINK/EXISTS/TOUCH/DBSIZE: integers summed.
    Sum,
    /// MSET/FLUSHALL/…: `+OK` if every part is, else the first error.
    AllOk,
    /// KEYS: arrays concatenated.
    Concat,
    /// RANDOMKEY: the first non-nil reply.
    FirstNonNil,
    /// SCRIPT LOAD/FUNCTION …: the first error, else the first reply.
    First,
}

/// The proxy's treatment of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// Send to the node of its keys (any node when keyless).
    Forward,
    /// Multi-key command split per slot on a cluster (one node otherwise).
    Split(Merge),
    /// Sent to every master on a cluster (one node otherwise).
    FanOut(Merge),
    /// SCAN: one master at a time, the cursor says which.
    Scan,
    /// INFO: a `# Proxy` section plus the upstream's.
    Info,
    /// SCRIPT KILL / FUNCTION KILL, REPLICAOF / SLAVEOF: to every master on
    /// its control connection, never behind anything (a shared connection
    /// may be the one blocked behind the running script; REPLICAOF NO ONE
    /// is what lets writes queued for a demoted server land); `+OK` if any
    /// master said so, else its error.
    Kill,
    /// FUNCTION STATS, which Redis answers while a script runs (it reports
    /// the running one): to the first master not known healthy (the first
    /// master if all are), on its control connection, never behind the
    /// script's own command on a shared connection.
    Control,
    /// XREAD/XREADGROUP: forwarded unless they BLOCK.
    MaybeBlocking,
    /// MULTI/EXEC/DISCARD/WATCH/UNWATCH: the client's session machinery.
    Transaction,
    /// Blocks (BLPOP, BZPOPMIN, WAIT, …): runs on a held connection.
    Blocking,
    /// SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE (`sub`) and their UNSUBSCRIBE
    /// forms: the client's subscriptions, held through the shared hub
    /// ([`crate::pubsub`]).
    PubSub {
        /// Which kind of subscription.
        kind: Kind,
        /// Subscribe (true) or unsubscribe.
        sub: bool,
    },
    /// MONITOR: fed by this proxy (every command it receives).
    Monitor,
    /// PUBLISH / SPUBLISH (`shard`): forwarded; the reply counts this
    /// proxy's local receivers, not its one upstream subscription.
    Publish {
        /// SPUBLISH.
        shard: bool,
    },
    /// PUBSUB NUMSUB / SHARDNUMSUB (`shard`): forwarded, counts adjusted
    /// the same way.
    NumSub {
        /// SHARDNUMSUB.
        shard: bool,
    },
    /// Needs a dedicated upstream connection; refused with this reason.
    Unsupported(&'static str),
}

/// What a command makes the L1 drop; decided once per command when the
/// table is loaded, read by every dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalidation {
    /// A read: nothing.
    None,
    /// Its keys; with `written_only`, only those whose key spec says they
    /// may change (ZUNIONSTORE's destination, not its sources).
    Keys {
        /// Only the keys of writing key specs.
        written_only: bool,
    },
    /// Everything: it reaches beyond its key arguments (another database,
    /// every key).
    All,
}

/// Commands not flagged `write` that may write the keys they declare (their
/// key specs say so too; listed in case a server's do not).
const SCRIPTS: &[&str] = &["eval", "evalsha", "fcall"];
/// Write commands whose effect reaches beyond their key arguments.
const CLEARS_ALL: &[&str] = &["move", "copy", "swapdb", "flushall", "flushdb"];

/// The invalidation of a command. `writes_keys`: it is flagged `write` or a
/// key spec may change its key (PFCOUNT is `readonly` with an RW key);
/// `spec_writes`: some key spec says which keys change.
pub fn invalidation(name: &str, writes_keys: bool, spec_writes: bool) -> Invalidation {
    if CLEARS_ALL.contains(&name) {
        Invalidation::All
    } else if writes_keys || SCRIPTS.contains(&name) {
        Invalidation::Keys {
            written_only: spec_writes,
        }
    } else {
        Invalidation::None
    }
}

/// Whether a command may be acknowledged from memory (write-behind); the
/// arguments decide in [`super::write::plan`].
pub fn write_behind(name: &str) -> bool {
    matches!(name, "set" | "setex" | "psetex" | "mset")
}

fn pubsub(kind: Kind, sub: bool) -> Handling {
    Handling::PubSub { kind, sub }
}

/// Why SYNC, PSYNC and REPLCONF are refused.
pub const REPLICATION: &str = "replication commands cannot be proxied";

/// The handling of a command named `name` (lower case; `container|sub` for
/// subcommands), given its flags from `COMMAND`.
pub fn for_command(name: &str, container: Option<&str>, flags: Flags) -> Handling {
    match (container, name) {
        (None, "mget") => Handling::Split(Merge::Values),
        (None, "mset") => Handling::Split(Merge::AllOk),
        (None, "del" | "unlink" | "exists" | "touch") => Handling::Split(Merge::Sum),
        (None, "dbsize") => Handling::FanOut(Merge::Sum),
        (None, "flushall" | "flushdb") => Handling::FanOut(Merge::AllOk),
        (None, "keys") => Handling::FanOut(Merge::Concat),
        (None, "randomkey") => Handling::FanOut(Merge::FirstNonNil),
        (None, "scan") => Handling::Scan,
        (None, "info") => Handling::Info,
        (None, "xread" | "xreadgroup") => Handling::MaybeBlocking,
        (None, "multi" | "exec" | "discard" | "watch" | "unwatch") => Handling::Transaction,
        (None, "subscribe") => pubsub(Kind::Channel, true),
        (None, "psubscribe") => pubsub(Kind::Pattern, true),
        (None, "ssubscribe") => pubsub(Kind::Shard, true),
        (None, "unsubscribe") => pubsub(Kind::Channel, false),
        (None, "punsubscribe") => pubsub(Kind::Pattern, false),
        (None, "sunsubscribe") => pubsub(Kind::Shard, false),
        (None, "monitor") => Handling::Monitor,
        (None, "publish") => Handling::Publish { shard: false },
        (None, "spublish") => Handling::Publish { shard: true },
        (Some("pubsub"), "pubsub|numsub") => Handling::NumSub { shard: false },
        (Some("pubsub"), "pubsub|shardnumsub") => Handling::NumSub { shard: true },
        (None, "sync" | "psync" | "replconf") => Handling::Unsupported(REPLICATION),
        (None, "wait" | "waitaof") => Handling::Blocking,
        (Some("config"), "config|set" | "config|resetstat") => Handling::FanOut(Merge::AllOk),
        (Some("script"), "script|kill") | (Some("function"), "function|kill") => Handling::Kill,
        (None, "replicaof" | "slaveof") => Handling::Kill,
        (Some("function"), "function|stats") => Handling::Control,
        (Some("script"), "script|load" | "script|flush" | "script|exists") => {
            Handling::FanOut(Merge::First)
        }
        (
            Some("function"),
            "function|load" | "function|delete" | "function|flush" | "function|restore",
        ) => Handling::FanOut(Merge::First),
        _ if flags.blocking => Handling::Blocking,
        _ => Handling::Forward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides() {
        let f = Flags::default();
        assert_eq!(for_command("mget", None, f), Handling::Split(Merge::Values));
        assert_eq!(for_command("get", None, f), Handling::Forward);
        assert_eq!(
            for_command("script|load", Some("script"), f),
            Handling::FanOut(Merge::First)
        );
        let blocking = Flags {
            blocking: true,
            ..Flags::default()
        };
        assert_eq!(for_command("blpop", None, blocking), Handling::Blocking);
        assert_eq!(for_command("wait", None, f), Handling::Blocking);
        assert_eq!(
            for_command("script|kill", Some("script"), f),
            Handling::Kill
        );
        assert_eq!(
            for_command("function|kill", Some("function"), f),
            Handling::Kill
        );
        assert_eq!(for_command("replicaof", None, f), Handling::Kill);
        assert_eq!(
            for_command("function|stats", Some("function"), f),
            Handling::Control
        );
        assert_eq!(
            for_command("xread", None, blocking),
            Handling::MaybeBlocking
        );
        assert_eq!(for_command("multi", None, f), Handling::Transaction);
    }

    #[test]
    fn invalidations() {
        assert_eq!(invalidation("get", false, false), Invalidation::None);
        assert_eq!(
            invalidation("pfcount", true, true),
            Invalidation::Keys { written_only: true }
        );
        assert_eq!(
            invalidation("eval", false, false),
            Invalidation::Keys {
                written_only: false
            }
        );
        assert_eq!(invalidation("flushall", true, false), Invalidation::All);
        assert!(write_behind("setex") && !write_behind("setnx"));
    }
}
