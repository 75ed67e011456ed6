//! CLIENT TRACKING, CLIENT CACHING, CLIENT GETREDIR and CLIENT
//! TRACKINGINFO: a client's own client-side-caching state, with Redis's
//! replies and error texts (read off Redis 7.0). What the state makes
//! sidecache send is in [`super::table`]; the contract in
//! [`crate::tracking`].

use bytes::Bytes;
use sidecache_resp::encode::Reply;
use sidecache_resp::int::parse_i64;

/// One client's tracking state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracking {
    /// CLIENT TRACKING ON.
    pub on: bool,
    /// BCAST: every change of a key under `prefixes` (all keys when none).
    pub bcast: bool,
    /// OPTIN: only reads after CLIENT CACHING YES are tracked.
    pub optin: bool,
    /// OPTOUT: reads are tracked unless after CLIENT CACHING NO.
    pub optout: bool,
    /// NOLOOP: no messages for the client's own writes.
    pub noloop: bool,
    /// REDIRECT: the client that gets the messages (0: this one).
    pub redirect: u64,
    /// BCAST prefixes.
    pub prefixes: Vec<Bytes>,
    /// CLIENT CACHING YES/NO, for the next command only.
    pub caching: Option<bool>,
}

impl Tracking {
    /// Whether this command's reads are to be tracked (its keys followed
    /// for this client): always, but in OPTIN mode only after CLIENT
    /// CACHING YES and in OPTOUT mode not after CLIENT CACHING NO.
    pub fn tracks_reads(&self) -> bool {
        self.tracks_reads_with(self.caching)
    }

    /// [`Tracking::tracks_reads`] with `caching` in force instead of its own.
    pub fn tracks_reads_with(&self, caching: Option<bool>) -> bool {
        self.on
            && if self.optin {
                caching == Some(true)
            } else if self.optout {
                caching != Some(false)
            } else {
                true
            }
    }
}

/// What CLIENT TRACKING changed, for the connection to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing (an error, or the same state).
    None,
    /// Tracking is on (or its options changed).
    On,
    /// Tracking is off.
    Off,
}

/// `CLIENT TRACKING ON|OFF [REDIRECT id] [PREFIX p …] [BCAST] [OPTIN]
/// [OPTOUT] [NOLOOP]`; `exists` says whether a client id is connected.
pub fn tracking(
    args: &[Bytes],
    t: &mut Tracking,
    exists: impl Fn(u64) -> bool,
    r: &mut Reply<'_>,
) -> Change {
    if args.len() < 3 {
        r.error("ERR wrong number of arguments for 'client|tracking' command");
        return Change::None;
    }
    let on = if args[2].eq_ignore_ascii_case(b"on") {
        true
    } else if args[2].eq_ignore_ascii_case(b"off") {
        false
    } else {
        r.error("ERR syntax error");
        return Change::None;
    };
    let mut next = Tracking {
        on,
        ..Tracking::default()
    };
    let mut redirect: Option<i64> = None;
    let mut i = 3;
    while i < args.len() {
        let a = args[i].to_ascii_lowercase();
        let more = i + 1 < args.len();
        match &a[..] {
            b"redirect" if more => {
                let Some(id) = parse_i64(&args[i + 1]) else {
                    r.error("ERR value is not an integer or out of range");
                    return Change::None;
                };
                redirect = Some(id);
                i += 2;
                continue;
            }
            b"prefix" if more => {
                next.prefixes.push(args[i + 1].clone());
                i += 2;
                continue;
            }
            b"bcast" => next.bcast = true,
            b"optin" => next.optin = true,
            b"optout" => next.optout = true,
            b"noloop" => next.noloop = true,
            _ => {
                r.error("ERR syntax error");
                return Change::None;
            }
        }
        i += 1;
    }
    if !on {
        *t = Tracking::default();
        r.ok();
        return Change::Off;
    }
    if !next.prefixes.is_empty() && !next.bcast {
        r.error("ERR PREFIX option requires BCAST mode to be enabled");
        return Change::None;
    }
    if t.on && t.bcast != next.bcast {
        r.error("ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.");
        return Change::None;
    }
    if next.optin && next.optout {
        r.error("ERR You can't specify both OPTIN mode and OPTOUT mode");
        return Change::None;
    }
    if next.bcast && (next.optin || next.optout) {
        r.error("ERR OPTIN and OPTOUT are not compatible with BCAST");
        return Change::None;
    }
    if t.on && ((next.optin && t.optout) || (next.optout && t.optin)) {
        r.error("ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.");
        return Change::None;
    }
    // As Redis's checks: each given prefix against the client's current
    // ones (BCAST without PREFIX is the empty prefix), then against the
    // prefixes given after it.
    let current: &[Bytes] = if t.on && t.bcast { &t.prefixes } else { &[] };
    for (j, p) in next.prefixes.iter().enumerate() {
        if let Some(q) = current
            .iter()
            .find(|q| p.starts_with(q) || q.starts_with(p))
        {
            r.error(&format!(
                "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single client must not overlap.",
                String::from_utf8_lossy(p),
                String::from_utf8_lossy(q)
            ));
            return Change::None;
        }
        for q in &next.prefixes[j + 1..] {
            if p.starts_with(q) || q.starts_with(p) {
                r.error(&format!(
                    "ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a single client must not overlap.",
                    String::from_utf8_lossy(p),
                    String::from_utf8_lossy(q)
                ));
                return Change::None;
            }
        }
    }
    if let Some(id) = redirect {
        match u64::try_from(id) {
            Ok(id) if id > 0 && exists(id) => next.redirect = id,
            _ => {
                r.error("ERR The client ID you want redirect to does not exist");
                return Change::None;
            }
        }
    }
    // BCAST without PREFIX follows every key: the empty prefix, as Redis
    // keeps it (and shows it in CLIENT TRACKINGINFO).
    if next.bcast && next.prefixes.is_empty() {
        next.prefixes.push(Bytes::new());
    }
    // Turning it on again keeps the prefixes already given (Redis adds
    // the new ones).
    if t.on {
        let mut prefixes = std::mem::take(&mut t.prefixes);
        for p in next.prefixes.drain(..) {
            if !prefixes.contains(&p) {
                prefixes.push(p);
            }
        }
        next.prefixes = prefixes;
    }
    *t = next;
    r.ok();
    Change::On
}

/// `CLIENT CACHING YES|NO`.
pub fn caching(args: &[Bytes], t: &mut Tracking, r: &mut Reply<'_>) {
    if args.len() != 3 {
        return r.error("ERR wrong number of arguments for 'client|caching' command");
    }
    // As Redis and Valkey: the tracking state first, then the argument.
    if !t.on {
        return r.error("ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled");
    }
    let yes = if args[2].eq_ignore_ascii_case(b"yes") {
        true
    } else if args[2].eq_ignore_ascii_case(b"no") {
        false
    } else {
        return r.error("ERR syntax error");
    };
    if yes && !t.optin {
        return r
            .error("ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.");
    }
    if !yes && !t.optout {
        return r
            .error("ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.");
    }
    t.caching = Some(yes);
    r.ok();
}

/// `CLIENT GETREDIR`: -1 when tracking is off, else the redirect (0: none).
pub fn getredir(t: &Tracking, r: &mut Reply<'_>) {
    r.int(if t.on { t.redirect as i64 } else { -1 });
}

/// `CLIENT TRACKINGINFO`; `redirect_gone`: the redirect client left.
pub fn trackinginfo(t: &Tracking, redirect_gone: bool, r: &mut Reply<'_>) {
    r.map(3);
    r.bulk(b"flags");
    let mut flags: Vec<&str> = Vec::new();
    if !t.on {
        flags.push("off");
    } else {
        flags.push("on");
        if t.bcast {
            flags.push("bcast");
        }
        if t.optin {
            flags.push("optin");
            if t.caching == Some(true) {
                flags.push("caching-yes");
            }
        }
        if t.optout {
            flags.push("optout");
            if t.caching == Some(false) {
                flags.push("caching-no");
            }
        }
        if t.noloop {
            flags.push("noloop");
        }
        if redirect_gone {
            flags.push("broken_redirect");
        }
    }
    r.set(flags.len());
    for f in flags {
        r.bulk(f.as_bytes());
    }
    r.bulk(b"redirect");
    r.int(if t.on { t.redirect as i64 } else { -1 });
    r.bulk(b"prefixes");
    // In byte order, as Redis lists them (its radix tree's).
    let mut prefixes: Vec<&Bytes> = t.prefixes.iter().collect();
    prefixes.sort_unstable();
    r.array(prefixes.len());
    for p in prefixes {
        r.bulk(p);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use sidecache_pool::Proto;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ')
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    /// Runs `line` (a CLIENT TRACKING or CACHING) on `t`: its RESP2 reply.
    fn run(t: &mut Tracking, line: &str) -> String {
        let mut out = BytesMut::new();
        let mut r = Reply {
            out: &mut out,
            proto: Proto::Resp2,
        };
        let a = args(line);
        if a[1].eq_ignore_ascii_case(b"caching") {
            caching(&a, t, &mut r);
        } else {
            tracking(&a, t, |id| id == 7, &mut r);
        }
        String::from_utf8(out.to_vec()).unwrap()
    }

    /// Each reply was read off Redis 7.0.15 for the same sequence.
    #[test]
    fn replies_and_errors_are_redis_own() {
        let mut t = Tracking::default();
        let cases = [
            ("CLIENT TRACKING ON PREFIX x", "-ERR PREFIX option requires BCAST mode to be enabled\r\n"),
            ("CLIENT TRACKING ON OPTIN OPTOUT", "-ERR You can't specify both OPTIN mode and OPTOUT mode\r\n"),
            ("CLIENT TRACKING ON BCAST OPTIN", "-ERR OPTIN and OPTOUT are not compatible with BCAST\r\n"),
            ("CLIENT TRACKING ON REDIRECT 999999", "-ERR The client ID you want redirect to does not exist\r\n"),
            ("CLIENT TRACKING ON BCAST PREFIX a PREFIX ab", "-ERR Prefix 'a' overlaps with another provided prefix 'ab'. Prefixes for a single client must not overlap.\r\n"),
            ("CLIENT TRACKING ON FOO", "-ERR syntax error\r\n"),
            ("CLIENT TRACKING MAYBE", "-ERR syntax error\r\n"),
            ("CLIENT CACHING YES", "-ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled\r\n"),
            ("CLIENT TRACKING ON", "+OK\r\n"),
            ("CLIENT TRACKING ON BCAST", "-ERR You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode.\r\n"),
            ("CLIENT TRACKING ON OPTIN", "+OK\r\n"),
            ("CLIENT CACHING NO", "-ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.\r\n"),
            ("CLIENT CACHING MAYBE", "-ERR syntax error\r\n"),
            ("CLIENT CACHING YES", "+OK\r\n"),
            ("CLIENT TRACKING ON OPTOUT", "-ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode.\r\n"),
            ("CLIENT TRACKING OFF", "+OK\r\n"),
            ("CLIENT TRACKING ON REDIRECT abc", "-ERR value is not an integer or out of range\r\n"),
            ("CLIENT TRACKING ON REDIRECT -1", "-ERR The client ID you want redirect to does not exist\r\n"),
            ("CLIENT TRACKING ON REDIRECT 0", "-ERR The client ID you want redirect to does not exist\r\n"),
            ("CLIENT TRACKING ON REDIRECT", "-ERR syntax error\r\n"),
            ("CLIENT TRACKING ON REDIRECT 7 NOLOOP", "+OK\r\n"),
            ("CLIENT TRACKING OFF", "+OK\r\n"),
            ("CLIENT TRACKING ON BCAST PREFIX FOO PREFIX BAR", "+OK\r\n"),
            ("CLIENT TRACKING ON BCAST PREFIX FO", "-ERR Prefix 'FO' overlaps with an existing prefix 'FOO'. Prefixes for a single client must not overlap.\r\n"),
            ("CLIENT TRACKING ON BCAST PREFIX BARB PREFIX Z", "-ERR Prefix 'BARB' overlaps with an existing prefix 'BAR'. Prefixes for a single client must not overlap.\r\n"),
            ("CLIENT TRACKING OFF", "+OK\r\n"),
            ("CLIENT TRACKING ON BCAST", "+OK\r\n"),
            ("CLIENT TRACKING ON BCAST PREFIX x", "-ERR Prefix 'x' overlaps with an existing prefix ''. Prefixes for a single client must not overlap.\r\n"),
            ("CLIENT TRACKING OFF", "+OK\r\n"),
            ("CLIENT TRACKING ON REDIRECT 7 NOLOOP", "+OK\r\n"),
        ];
        for (line, want) in cases {
            assert_eq!(run(&mut t, line), want, "{line}");
        }
        assert!(t.on && t.noloop && t.redirect == 7);
    }

    #[test]
    fn client_caching_checks_tracking_then_its_argument_as_redis() {
        // Replies read from Redis 7.0.15 and Valkey 9.1.2.
        let off = "-ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled\r\n";
        let mut t = Tracking::default();
        for line in [
            "CLIENT CACHING yes",
            "CLIENT CACHING no",
            "CLIENT CACHING maybe",
        ] {
            assert_eq!(run(&mut t, line), off, "{line}");
        }
        run(&mut t, "CLIENT TRACKING ON");
        let cases = [
            (
                "CLIENT CACHING yes",
                "-ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.\r\n",
            ),
            (
                "CLIENT CACHING no",
                "-ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.\r\n",
            ),
            ("CLIENT CACHING maybe", "-ERR syntax error\r\n"),
        ];
        for (line, want) in cases {
            assert_eq!(run(&mut t, line), want, "{line}");
        }
        run(&mut t, "CLIENT TRACKING OFF");
        run(&mut t, "CLIENT TRACKING ON OPTIN");
        assert_eq!(run(&mut t, "CLIENT CACHING yes"), "+OK\r\n");
    }

    #[test]
    fn trackinginfo_and_getredir_as_redis_shows_them() {
        let show = |t: &Tracking| {
            let mut out = BytesMut::new();
            let mut r = Reply {
                out: &mut out,
                proto: Proto::Resp2,
            };
            trackinginfo(t, false, &mut r);
            getredir(t, &mut r);
            String::from_utf8(out.to_vec()).unwrap()
        };
        let mut t = Tracking::default();
        assert_eq!(
            show(&t),
            "*6\r\n$5\r\nflags\r\n*1\r\n$3\r\noff\r\n$8\r\nredirect\r\n:-1\r\n$8\r\nprefixes\r\n*0\r\n:-1\r\n"
        );
        // BCAST: its prefixes in byte order; none is the empty one.
        run(&mut t, "CLIENT TRACKING ON BCAST PREFIX FOO PREFIX BAR");
        assert!(show(&t).ends_with("$8\r\nprefixes\r\n*2\r\n$3\r\nBAR\r\n$3\r\nFOO\r\n:0\r\n"));
        run(&mut t, "CLIENT TRACKING OFF");
        run(&mut t, "CLIENT TRACKING ON BCAST");
        assert!(show(&t).ends_with("$8\r\nprefixes\r\n*1\r\n$0\r\n\r\n:0\r\n"));
        run(&mut t, "CLIENT TRACKING OFF");
        run(&mut t, "CLIENT TRACKING ON OPTIN");
        run(&mut t, "CLIENT CACHING YES");
        assert_eq!(
            show(&t),
            "*6\r\n$5\r\nflags\r\n*3\r\n$2\r\non\r\n$5\r\noptin\r\n$11\r\ncaching-yes\r\n$8\r\nredirect\r\n:0\r\n$8\r\nprefixes\r\n*0\r\n:0\r\n"
        );
        assert!(t.tracks_reads());
        t.caching = None;
        assert!(!t.tracks_reads());
    }
}
