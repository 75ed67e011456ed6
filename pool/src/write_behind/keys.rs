//! Reading a queued write's keys back from its encoded command, framed as
//! Redis (and the request parser) read it: a line ends at `\r` and the byte
//! after it, and a bulk's two trailing bytes are skipped unread, so a
//! command queued as the client sent it reads back the same keys Redis
//! applies it to.
//!
//! Under optin tracking every landed write is read back here (its key
//! leaves the L1), so the usual shape, a SET framed as clients send it and
//! as we encode it, is read without the general walk (callgrind: about 380
//! instructions per write went to the iterator adapters and the header
//! parses before, about 60 after).

use sidecache_resp::bulks::Bulks;
use sidecache_resp::header::read_header;

/// The keys of an encoded `SET key …` or `MSET k v k v …`, as slices of
/// it; for any other command, its first argument.
pub(crate) fn keys_of(cmd: &[u8]) -> Keys<'_> {
    keys(cmd, true)
}

/// The keys of a write-behind write (`SET`, `MSET`) as slices of it; none
/// for any other command, such as a re-read's `MGET` or `PTTL` in the same
/// batch (where [`keys_of`] would take the first argument for the key).
pub(crate) fn written_keys(cmd: &[u8]) -> Keys<'_> {
    keys(cmd, false)
}

/// [`keys_of`] (`any`: another command's first argument too) and
/// [`written_keys`].
fn keys(cmd: &[u8], any: bool) -> Keys<'_> {
    if let Some(key) = set_key(cmd) {
        return Keys {
            one: Some(key),
            pairs: Bulks::EMPTY,
        };
    }
    let mut args = Bulks::new(cmd).unwrap_or(Bulks::EMPTY);
    match args.next() {
        Some(name) if name.eq_ignore_ascii_case(b"MSET") => Keys {
            one: None,
            pairs: args,
        },
        // SET's one key: taken, not stepped past (stepping would parse the
        // rest of the command for nothing).
        Some(name) if any || name.eq_ignore_ascii_case(b"SET") => Keys {
            one: args.next(),
            pairs: Bulks::EMPTY,
        },
        _ => Keys {
            one: None,
            pairs: Bulks::EMPTY,
        },
    }
}

/// A command's keys: SET's one, or MSET's every other argument.
pub(crate) struct Keys<'a> {
    one: Option<&'a [u8]>,
    /// MSET's (key, value) arguments after the name.
    pairs: Bulks<'a>,
}

impl<'a> Iterator for Keys<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if let Some(k) = self.one.take() {
            return Some(k);
        }
        let key = self.pairs.next()?;
        // The value (a last key without one is still a key).
        let _ = self.pairs.next();
        Some(key)
    }
}

/// SET's key when the command starts `*N\r\n$3\r\nSET\r\n` (N a digit from
/// 3: what we encode and what clients send); `None` for anything else,
/// which the general walk reads. For these it finds what the walk finds:
/// the same header parse, the same check that the bulk's two trailing
/// bytes are there.
fn set_key(cmd: &[u8]) -> Option<&[u8]> {
    let [b'*', b'3'..=b'9', b'\r', b'\n', b'$', b'3', b'\r', b'\n', s, e, t, b'\r', b'\n', rest @ ..] =
        cmd
    else {
        return None;
    };
    if ![*s, *e, *t].eq_ignore_ascii_case(b"SET") {
        return None;
    }
    let (len, at) = read_header(rest, b'$')?;
    rest.get(at + len + 2..)?;
    rest.get(at..at + len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The general walk alone (what `keys_of` did before its SET path).
    fn walked(cmd: &[u8]) -> Vec<&[u8]> {
        let mut args = Bulks::new(cmd).unwrap_or(Bulks::EMPTY);
        let mset = args
            .next()
            .is_some_and(|name| name.eq_ignore_ascii_case(b"MSET"));
        args.step_by(if mset { 2 } else { 1 })
            .take(if mset { usize::MAX } else { 1 })
            .collect()
    }

    #[test]
    fn the_set_path_reads_what_the_walk_reads() {
        for cmd in [
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n".as_slice(),
            b"*3\r\n$3\r\nset\r\n$16\r\nkey:000000000123\r\n$2\r\nvv\r\n",
            b"*5\r\n$3\r\nSET\r\n$0\r\n\r\n$1\r\nv\r\n$4\r\nPXAT\r\n$3\r\n123\r\n",
            b"*3\r\n$3\r\nSeT\r\n$1\r\nk\r\n$2\r\nvvXY",
            // Truncated: no key (both ways).
            b"*3\r\n$3\r\nSET\r\n$5\r\nab",
            b"*3\r\n$3\r\nSET\r\n$2\r\nab",
        ] {
            assert_eq!(keys_of(cmd).collect::<Vec<_>>(), walked(cmd), "{cmd:?}");
        }
        assert_eq!(
            set_key(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"),
            Some(b"k".as_slice())
        );
        // Odd framing and other commands take the walk.
        assert_eq!(set_key(b"*3\r\n$3\rXset\r\n$1\r\nk\r\n$2\r\nvv\r\n"), None);
        assert_eq!(set_key(b"*3\r\n$4\r\nMSET\r\n$1\r\nk\r\n$1\r\nv\r\n"), None);
        assert_eq!(set_key(b"*2\r\n$3\r\nSET\r\n$1\r\nk\r\n"), None);
    }

    #[test]
    fn written_keys_are_those_of_writes_only() {
        fn keys(cmd: &[u8]) -> Vec<&[u8]> {
            written_keys(cmd).collect()
        }
        for cmd in [
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n".as_slice(),
            b"*3\r\n$3\rXset\r\n$1\r\nk\r\n$2\r\nvv\r\n",
            b"*5\r\n$4\r\nmset\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n",
        ] {
            assert_eq!(keys(cmd), keys_of(cmd).collect::<Vec<_>>(), "{cmd:?}");
        }
        for cmd in [
            b"*2\r\n$4\r\nPTTL\r\n$1\r\nk\r\n".as_slice(),
            b"*3\r\n$4\r\nMGET\r\n$1\r\nk\r\n$1\r\nj\r\n",
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
            b"*1\r\n$4\r\nPING\r\n",
            b"+OK\r\n",
        ] {
            assert!(keys(cmd).is_empty(), "{cmd:?}");
        }
    }

    proptest! {
        #[test]
        fn keys_of_agrees_with_the_walk(
            name in prop_oneof![Just("SET"), Just("set"), Just("MSET"), Just("mset"), Just("GET")],
            args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 0..7),
            cut in 0usize..200,
        ) {
            let mut cmd = Vec::new();
            let parts: Vec<&[u8]> = std::iter::once(name.as_bytes()).chain(args.iter().map(Vec::as_slice)).collect();
            cmd.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
            for p in &parts {
                cmd.extend_from_slice(format!("${}\r\n", p.len()).as_bytes());
                cmd.extend_from_slice(p);
                cmd.extend_from_slice(b"\r\n");
            }
            let cmd = &cmd[..cmd.len().saturating_sub(cut % 8)];
            prop_assert_eq!(keys_of(cmd).collect::<Vec<_>>(), walked(cmd));
        }
    }
}
