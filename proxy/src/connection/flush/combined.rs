//! Replies put together by sidecache: a split or fanned-out command's
//! parts merged, INFO (its own sections and the upstream's), and a SCAN
//! reply's cursor carrying the master it came from.

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::Proto;
use sidecache_resp::encode::{self, put_header, Reply};
use sidecache_resp::frame::{self, Value};

use crate::cmd::handling::Merge;
use crate::cmd::merge::{self, PartReply};
use crate::connection::{Client, Part, SCAN_SHARD_BITS};

impl Client {
    /// A split or fanned-out command's reply, merged from its parts'.
    /// Returns whether a part failed.
    pub(super) async fn reply_merge(
        &mut self,
        kind: Merge,
        parts: Vec<Part>,
        nkeys: usize,
    ) -> bool {
        let mut replies = Vec::with_capacity(parts.len());
        let mut failed = None;
        for part in &parts {
            match self
                .reply_of(part.node, part.idx, part.slot, &part.cmd)
                .await
            {
                Ok(f) => replies.push(PartReply {
                    frame: f,
                    positions: &part.positions,
                }),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            Some(e) => {
                e.write_reply(&mut self.wbuf);
                true
            }
            None => {
                merge::merge(kind, replies, nkeys, &mut self.wbuf);
                false
            }
        }
    }

    /// INFO's reply: the proxy's sections, then the upstream's (when asked
    /// for).
    pub(super) async fn reply_info(
        &mut self,
        upstream: Option<(u32, u32)>,
        proxy: crate::report::info::Sections,
        proto: Proto,
    ) {
        let body = match upstream {
            Some((node, idx)) => match self.reply_of(node, idx, None, &Bytes::new()).await {
                Ok(f) => Ok(Value::decode(&f).ok().and_then(|v| match v {
                    Value::Bulk(b) | Value::Verbatim(b) => Some(b),
                    _ => None,
                })),
                Err(e) => Err(e),
            },
            None => Ok(None),
        };
        match body {
            Err(e) => e.write_reply(&mut self.wbuf),
            Ok(body) => {
                let mut text =
                    crate::report::info::render(&self.shared, &self.topo, proxy).into_bytes();
                if let Some(b) = body {
                    if !proxy.is_empty() && !b.is_empty() {
                        text.extend_from_slice(b"\r\n");
                    }
                    crate::report::info::append_as_standalone(&b, &mut text);
                }
                Reply {
                    out: &mut self.wbuf,
                    proto,
                }
                .verbatim(&text);
            }
        }
    }
}

/// Rewrites a SCAN reply's cursor to encode the master index.
pub(super) fn rewrite_scan(frame: &Bytes, shard: u64, nshards: u64, out: &mut BytesMut) {
    let Ok(Some(els)) = frame::array_elements(frame) else {
        out.put_slice(frame);
        return;
    };
    let up = els
        .first()
        .and_then(|c| Value::decode(c).ok())
        .and_then(|v| {
            v.as_bytes()
                .and_then(|b| std::str::from_utf8(b).ok()?.parse::<u64>().ok())
        });
    let (Some(up), 2) = (up, els.len()) else {
        out.put_slice(frame);
        return;
    };
    let next = if up != 0 {
        if up >> (64 - SCAN_SHARD_BITS) != 0 {
            out.put_slice(b"-ERR sidecache: upstream SCAN cursor too large to encode\r\n");
            return;
        }
        (up << SCAN_SHARD_BITS) | shard
    } else if shard + 1 < nshards {
        shard + 1
    } else {
        0
    };
    put_header(out, b'*', 2);
    encode::put_bulk(out, next.to_string().as_bytes());
    out.put_slice(&els[1]);
}
