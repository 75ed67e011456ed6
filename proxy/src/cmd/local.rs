//! Which commands are local, by name: a leaf that the metrics can count
//! by without depending on how the commands run.

/// A locally answered command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// PING \[message\]
    Ping,
    /// ECHO message
    Echo,
    /// QUIT
    Quit,
    /// SELECT db
    Select,
    /// HELLO [protover [AUTH user pass] [SETNAME name]]
    Hello,
    /// AUTH \[user\] pass
    Auth,
    /// CLIENT subcommand …
    Client,
    /// RESET
    Reset,
    /// CLUSTER …, READONLY, READWRITE, ASKING: the proxy is a standalone server to clients.
    ClusterDisabled,
    /// SIDECACHE HOTKEYS …, SIDECACHE HELP: the proxy's own commands.
    Sidecache,
}

impl Local {
    /// The local command with this lower-case name.
    pub fn lookup(lname: &[u8]) -> Option<Local> {
        Some(match lname {
            b"ping" => Local::Ping,
            b"echo" => Local::Echo,
            b"quit" => Local::Quit,
            b"select" => Local::Select,
            b"hello" => Local::Hello,
            b"auth" => Local::Auth,
            b"client" => Local::Client,
            b"reset" => Local::Reset,
            b"cluster" | b"readonly" | b"readwrite" | b"asking" => Local::ClusterDisabled,
            b"sidecache" => Local::Sidecache,
            _ => return None,
        })
    }

    /// Whether the command changes state that later commands' routing
    /// depends on (pending upstream work is flushed before it runs).
    pub fn changes_session(self) -> bool {
        matches!(
            self,
            Local::Select | Local::Hello | Local::Auth | Local::Reset
        )
    }

    /// Whether the command may run before the client authenticated.
    pub fn allowed_unauthenticated(self) -> bool {
        matches!(
            self,
            Local::Auth | Local::Hello | Local::Quit | Local::Reset
        )
    }
}
