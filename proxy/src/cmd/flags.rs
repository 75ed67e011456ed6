//! The command flags the proxy reads from upstream's `COMMAND` reply: a
//! leaf shared by the table and the handling rules.

/// Command flags the proxy cares about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// May modify data.
    pub write: bool,
    /// Never modifies data.
    pub readonly: bool,
    /// May block the connection.
    pub blocking: bool,
    /// Key positions depend on the arguments.
    pub movablekeys: bool,
    /// Pub/sub command.
    pub pubsub: bool,
    /// May be replicated though not flagged `write` (`EVAL`, `PUBLISH`,
    /// …): paused by `CLIENT PAUSE WRITE`.
    pub may_replicate: bool,
    /// Not shown to MONITOR (`admin`; `skip_monitor` marks the scripts,
    /// which Redis shows before they run rather than after).
    pub no_monitor: bool,
}

/// The commands Redis flags `may_replicate` (`commands.def`, Redis 7.0 to
/// 8 and Valkey alike), a flag `COMMAND` does not show.
pub const MAY_REPLICATE: &[&str] = &["pfcount", "publish", "spublish", "eval", "evalsha", "fcall"];
