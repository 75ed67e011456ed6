//! Reading a queued write's keys back from its encoded command, framed as
//! Redis (and the request parser) read it: a line ends at `\r` and the byte
//! after it, and a bulk's two trailing bytes are skipped unread, so a
//! command queued as the client sent it reads back the same keys Redis
//! applies it to.

/// The keys of an encoded `SET key …` or `MSET k v k v …`, as slices of
/// it; none for anything else.
pub(super) fn keys_of(cmd: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut args = Args::new(cmd);
    let mset = args
        .next()
        .is_some_and(|name| name.eq_ignore_ascii_case(b"MSET"));
    // SET's one key: taken, not stepped past (stepping would parse the
    // rest of the command for nothing).
    args.step_by(if mset { 2 } else { 1 })
        .take(if mset { usize::MAX } else { 1 })
}

/// The bulk arguments of one encoded command (`*N` then `$len` bulks).
struct Args<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Args<'a> {
    fn new(cmd: &'a [u8]) -> Args<'a> {
        match header(cmd, b'*') {
            Some((n, at)) => Args {
                rest: &cmd[at..],
                left: n,
            },
            None => Args { rest: &[], left: 0 },
        }
    }
}

impl<'a> Iterator for Args<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        let (len, at) = header(self.rest, b'$')?;
        let data = self.rest.get(at..at + len)?;
        self.rest = self.rest.get(at + len + 2..)?;
        self.left -= 1;
        Some(data)
    }
}

/// `<kind><number>\r\n` at the start of `buf`: the number and where what
/// follows starts.
fn header(buf: &[u8], kind: u8) -> Option<(usize, usize)> {
    if buf.first() != Some(&kind) {
        return None;
    }
    let end = sidecache_resp::find::byte(b'\r', buf)?;
    let n = sidecache_resp::int::parse_i64(buf.get(1..end)?)?;
    Some((usize::try_from(n).ok()?, end + 2))
}
