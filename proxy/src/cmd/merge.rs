//! Assembling one client reply from the replies of per-node parts, so that
//! a split or fanned-out command answers exactly as a single Redis would.

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_resp::encode::put_header;
use sidecache_resp::frame::{self, Value};

/// One part's reply and the positions (in the client's key order) of the
/// keys it carried.
#[derive(Debug)]
pub struct PartReply<'a> {
    /// The reply frame.
    pub frame: Bytes,
    /// Key positions, for [`super::handling::Merge::Values`].
    pub positions: &'a [u32],
}

fn is_nil(f: &[u8]) -> bool {
    f == b"$-1\r\n" || f == b"*-1\r\n" || f == b"_\r\n"
}

/// Writes the merged reply to `out`.
pub fn merge(
    kind: super::handling::Merge,
    parts: Vec<PartReply<'_>>,
    nkeys: usize,
    out: &mut BytesMut,
) {
    use super::handling::Merge;
    // Any error answers the whole command, as it would on one server.
    if let Some(e) = parts.iter().find(|p| frame::error_text(&p.frame).is_some()) {
        out.put_slice(&e.frame);
        return;
    }
    match kind {
        Merge::Values => {
            let mut slots: Vec<Option<Bytes>> = vec![None; nkeys];
            for p in &parts {
                match frame::array_elements(&p.frame) {
                    Ok(Some(els)) if els.len() == p.positions.len() => {
                        for (e, &pos) in els.into_iter().zip(p.positions) {
                            if let Some(s) = slots.get_mut(pos as usize) {
                                *s = Some(e);
                            }
                        }
                    }
                    _ => {
                        out.put_slice(b"-ERR sidecache: unexpected reply shape from upstream\r\n");
                        return;
                    }
                }
            }
            put_header(out, b'*', nkeys as i64);
            for s in slots {
                match s {
                    Some(b) => out.put_slice(&b),
                    None => out.put_slice(b"$-1\r\n"),
                }
            }
        }
        Merge::Sum => {
            let mut sum: i64 = 0;
            for p in &parts {
                match Value::decode(&p.frame).ok().and_then(|v| match v {
                    Value::Int(i) => Some(i),
                    _ => None,
                }) {
                    Some(i) => sum = sum.saturating_add(i),
                    None => {
                        out.put_slice(b"-ERR sidecache: unexpected reply shape from upstream\r\n");
                        return;
                    }
                }
            }
            put_header(out, b':', sum);
        }
        Merge::AllOk | Merge::First => match parts.first() {
            Some(p) => out.put_slice(&p.frame),
            None => out.put_slice(b"+OK\r\n"),
        },
        Merge::FirstNonNil => match parts.iter().find(|p| !is_nil(&p.frame)).or(parts.first()) {
            Some(p) => out.put_slice(&p.frame),
            None => out.put_slice(b"$-1\r\n"),
        },
        Merge::Concat => {
            let mut all = Vec::new();
            for p in &parts {
                if let Ok(Some(els)) = frame::array_elements(&p.frame) {
                    all.extend(els);
                }
            }
            put_header(out, b'*', all.len() as i64);
            for e in all {
                out.put_slice(&e);
            }
        }
    }
}

/// SCRIPT KILL / FUNCTION KILL sent to every master: `+OK` if any master
/// killed a script (what a Redis Cluster client fanning it out expects),
/// else the first Redis error (`-NOTBUSY …`, `-UNKILLABLE …`), else the
/// first upstream failure.
pub fn kill(parts: &[sidecache_pool::Result<Bytes>], out: &mut BytesMut) {
    let frames = || parts.iter().filter_map(|p| p.as_ref().ok());
    if let Some(ok) = frames().find(|f| frame::error_text(f).is_none()) {
        out.put_slice(ok);
    } else if let Some(e) = frames().next() {
        out.put_slice(e);
    } else if let Some(Err(e)) = parts.first() {
        e.write_reply(out);
    } else {
        out.put_slice(b"-ERR no upstream master to send the command to\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::super::handling::Merge;
    use super::*;

    fn part<'a>(f: &'static [u8], pos: &'a [u32]) -> PartReply<'a> {
        PartReply {
            frame: Bytes::from_static(f),
            positions: pos,
        }
    }

    #[test]
    fn kill_is_ok_when_any_master_killed_one() {
        let notbusy = || {
            Ok(Bytes::from_static(
                b"-NOTBUSY No scripts in execution right now.\r\n",
            ))
        };
        let mut out = BytesMut::new();
        kill(
            &[notbusy(), Ok(Bytes::from_static(b"+OK\r\n")), notbusy()],
            &mut out,
        );
        assert_eq!(&out[..], b"+OK\r\n");
        out.clear();
        kill(&[notbusy(), notbusy()], &mut out);
        assert_eq!(&out[..], b"-NOTBUSY No scripts in execution right now.\r\n");
        out.clear();
        let lost = sidecache_pool::Error::Timeout {
            addr: "127.0.0.1:7000".into(),
        };
        kill(&[Err(lost.clone()), notbusy()], &mut out);
        assert!(out.starts_with(b"-NOTBUSY"));
        out.clear();
        kill(&[Err(lost)], &mut out);
        assert_eq!(
            &out[..],
            b"-ERR upstream 127.0.0.1:7000 did not answer in time\r\n"
        );
    }

    #[test]
    fn mget_in_client_order() {
        let mut out = BytesMut::new();
        merge(
            Merge::Values,
            vec![
                part(b"*2\r\n$1\r\na\r\n$-1\r\n", &[0, 2]),
                part(b"*1\r\n$1\r\nb\r\n", &[1]),
            ],
            3,
            &mut out,
        );
        assert_eq!(&out[..], b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n");
    }

    #[test]
    fn sums_and_errors() {
        let mut out = BytesMut::new();
        merge(
            Merge::Sum,
            vec![part(b":2\r\n", &[]), part(b":3\r\n", &[])],
            0,
            &mut out,
        );
        assert_eq!(&out[..], b":5\r\n");
        let mut out = BytesMut::new();
        merge(
            Merge::AllOk,
            vec![part(b"+OK\r\n", &[]), part(b"-ERR x\r\n", &[])],
            0,
            &mut out,
        );
        assert_eq!(&out[..], b"-ERR x\r\n");
        let mut out = BytesMut::new();
        merge(
            Merge::FirstNonNil,
            vec![part(b"$-1\r\n", &[]), part(b"$1\r\nk\r\n", &[])],
            0,
            &mut out,
        );
        assert_eq!(&out[..], b"$1\r\nk\r\n");
        let mut out = BytesMut::new();
        merge(
            Merge::Concat,
            vec![
                part(b"*1\r\n$1\r\na\r\n", &[]),
                part(b"*0\r\n", &[]),
                part(b"*1\r\n$1\r\nb\r\n", &[]),
            ],
            0,
            &mut out,
        );
        assert_eq!(&out[..], b"*2\r\n$1\r\na\r\n$1\r\nb\r\n");
    }
}
