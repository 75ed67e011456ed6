//! The commands of the load: how a read and a write of a key are spelled
//! in RESP (`GET`/`SET`, or `HGETALL`/`HSET` of a 10-field hash), key
//! names (`PREFIX%08d`), versioned values for `--check-values` and the
//! version in a read's reply. Owns no I/O and no key choice (`keys` draws
//! the key).

use std::io::Write;

use bytes::BytesMut;
use clap::ValueEnum;
use sidecache_resp::frame::Value;

use super::keys::Sampler;

/// Value type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// GET / SET.
    String,
    /// HGETALL / HSET of a 10-field hash.
    Hash,
}

/// Fields of a hash value.
pub(crate) const HASH_FIELDS: usize = 10;

/// The load's settings, shared by the connections.
pub(crate) struct Cfg {
    pub(crate) keys: u64,
    pub(crate) sampler: Sampler,
    /// Probability of a write.
    pub(crate) write_frac: f64,
    pub(crate) kind: Kind,
    pub(crate) prefix: String,
    /// Bytes of a string value, or of one hash field's value.
    pub(crate) value_size: usize,
    pub(crate) check: bool,
    /// Connections of the load, in every process of it (the writers of
    /// `--check-values` split the keys between them).
    pub(crate) conns: u64,
}

impl Cfg {
    fn push_key(&self, out: &mut Vec<u8>, key: u64) {
        let digits = key.checked_ilog10().map_or(1, |d| d as usize + 1).max(8);
        let _ = write!(
            out,
            "${}\r\n{}{key:08}\r\n",
            self.prefix.len() + digits,
            self.prefix
        );
    }

    /// A read of `key`.
    pub(crate) fn push_read(&self, out: &mut Vec<u8>, key: u64) {
        match self.kind {
            Kind::String => out.extend_from_slice(b"*2\r\n$3\r\nGET\r\n"),
            Kind::Hash => out.extend_from_slice(b"*2\r\n$7\r\nHGETALL\r\n"),
        }
        self.push_key(out, key);
    }

    /// A write of `key` (versioned when checking values).
    pub(crate) fn push_write(&self, out: &mut Vec<u8>, key: u64, conn: u64, version: u64) {
        let head = self
            .check
            .then(|| format!("{conn:04}:{version:020}:").into_bytes());
        let value = |out: &mut Vec<u8>, head: Option<&[u8]>| {
            let h = head.unwrap_or_default();
            let pad = self.value_size.saturating_sub(h.len());
            let _ = write!(out, "${}\r\n", h.len() + pad);
            out.extend_from_slice(h);
            out.resize(out.len() + pad, b'x');
            out.extend_from_slice(b"\r\n");
        };
        match self.kind {
            Kind::String => {
                out.extend_from_slice(b"*3\r\n$3\r\nSET\r\n");
                self.push_key(out, key);
                value(out, head.as_deref());
            }
            Kind::Hash => {
                let _ = write!(out, "*{}\r\n$4\r\nHSET\r\n", 2 + 2 * HASH_FIELDS);
                self.push_key(out, key);
                for f in 0..HASH_FIELDS {
                    bulk(out, format!("f{f}").as_bytes());
                    value(out, if f == 0 { head.as_deref() } else { None });
                }
            }
        }
    }

    /// The version in a read's reply (`None`: no versioned value in it).
    pub(crate) fn version_of(&self, frame: BytesMut) -> Option<u64> {
        let v = Value::decode(&frame.freeze()).ok()?;
        let payload = match self.kind {
            Kind::String => v.as_bytes()?.clone(),
            Kind::Hash => {
                let items = v.into_items()?;
                let mut it = items.chunks_exact(2);
                it.find(|p| p[0].as_bytes().is_some_and(|f| &f[..] == b"f0"))?[1]
                    .as_bytes()?
                    .clone()
            }
        };
        let mut parts = payload.split(|&b| b == b':');
        let _writer = parts.next()?;
        std::str::from_utf8(parts.next()?).ok()?.parse().ok()
    }
}

/// A RESP bulk string.
pub(crate) fn bulk(out: &mut Vec<u8>, a: &[u8]) {
    let _ = write!(out, "${}\r\n", a.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_back() {
        for kind in [Kind::String, Kind::Hash] {
            let cfg = Cfg {
                keys: 10,
                sampler: Sampler::Uniform(10),
                write_frac: 0.5,
                kind,
                prefix: "wl:".into(),
                value_size: 40,
                check: true,
                conns: 2,
            };
            let mut out = Vec::new();
            cfg.push_write(&mut out, 3, 1, 12345);
            // The reply a server would give to a read of what was written.
            let reply = match kind {
                Kind::String => {
                    let v = &out[out.len() - 42..];
                    let mut r = b"$40\r\n".to_vec();
                    r.extend_from_slice(v);
                    r
                }
                Kind::Hash => {
                    let cmd = Value::decode(&bytes::Bytes::from(out.clone()));
                    let Ok(Value::Array(items)) = cmd else {
                        panic!("not an array")
                    };
                    let mut r = BytesMut::new();
                    Value::Array(items[2..].to_vec()).encode(&mut r);
                    r.to_vec()
                }
            };
            assert_eq!(cfg.version_of(BytesMut::from(&reply[..])), Some(12345));
        }
    }
}
