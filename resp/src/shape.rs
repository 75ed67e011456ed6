//! A read's reply written in the other protocol.
//!
//! A reply cached for a RESP2 client may be served to a RESP3 one and the
//! other way round. RESP3 to RESP2 mostly needs no knowledge of the
//! command (Redis shows a map as a flat array, a set as an array, a double
//! as a bulk string, a nil as `$-1`), but scored ranges are pairs in RESP3
//! and flat in RESP2; RESP2 to RESP3 does too, because a flat array does
//! not say it is a map: the [`Shape`] of the command's reply says what
//! each protocol holds. Redis formats a double the same
//! way in both (`d2string`), so only the framing changes.

use bytes::{Bytes, BytesMut};

use crate::encode::Reply;
use crate::frame::{ProtocolError, Value};
use crate::Proto;

/// What a read's reply is in RESP3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    /// The same in both protocols but for nils (a string, an integer, a
    /// status, an array of strings or nils).
    Plain,
    /// A map (HGETALL): a flat array of field, value in RESP2.
    Map,
    /// A set (SMEMBERS): an array in RESP2.
    Set,
    /// A double or nil (ZSCORE): a bulk string in RESP2.
    Double,
    /// An array of doubles or nils (ZMSCORE).
    Doubles,
    /// An array of [member, score] pairs (ZRANGE … WITHSCORES): a flat
    /// array of member, score strings in RESP2.
    Scored,
}

/// Writes `frame` (a complete reply in `from`) to `out` in `to`.
///
/// # Errors
/// [`ProtocolError`] when `frame` is not one well-formed reply.
pub fn convert(
    frame: &Bytes,
    shape: Shape,
    from: Proto,
    to: Proto,
    out: &mut BytesMut,
) -> Result<(), ProtocolError> {
    if from == to {
        out.extend_from_slice(frame);
        return Ok(());
    }
    let v = Value::decode(frame)?;
    match to {
        Proto::Resp2 => Reply {
            out,
            proto: Proto::Resp2,
        }
        .value(&to_resp2(v, shape)),
        Proto::Resp3 => to_resp3(v, shape).encode(out),
    }
    Ok(())
}

/// A RESP3 reply as Redis sends it in RESP2, but for the types
/// [`Reply::value`] shows as RESP2 does.
fn to_resp2(v: Value, shape: Shape) -> Value {
    match (shape, v) {
        (Shape::Scored, Value::Array(pairs)) => {
            let mut flat = Vec::with_capacity(pairs.len() * 2);
            for p in pairs {
                match p {
                    Value::Array(ms) => flat.extend(ms),
                    other => flat.push(other),
                }
            }
            Value::Array(flat)
        }
        (_, v) => v,
    }
}

/// A RESP2 reply as Redis sends it in RESP3.
fn to_resp3(v: Value, shape: Shape) -> Value {
    let double = |v: Value| match v {
        Value::Bulk(b) => Value::Double(b),
        other => other,
    };
    match (shape, v) {
        (Shape::Map, Value::Array(items)) if items.len() % 2 == 0 => {
            let mut kv = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                kv.push((k, v));
            }
            Value::Map(kv)
        }
        (Shape::Set, Value::Array(items)) => Value::Set(items),
        (Shape::Double, v) => double(v),
        (Shape::Doubles, Value::Array(items)) => {
            Value::Array(items.into_iter().map(double).collect())
        }
        (Shape::Scored, Value::Array(items)) if items.len() % 2 == 0 => {
            let mut pairs = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(m), Some(s)) = (it.next(), it.next()) {
                pairs.push(Value::Array(vec![m, double(s)]));
            }
            Value::Array(pairs)
        }
        // Nils are `_` when encoded; everything else is the same.
        (_, v) => v,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn both(shape: Shape, resp2: &str, resp3: &str) {
        let (r2, r3) = (Bytes::from(resp2.to_owned()), Bytes::from(resp3.to_owned()));
        let mut out = BytesMut::new();
        convert(&r2, shape, Proto::Resp2, Proto::Resp3, &mut out).unwrap();
        assert_eq!(out, resp3.as_bytes(), "{shape:?} to RESP3");
        out.clear();
        convert(&r3, shape, Proto::Resp3, Proto::Resp2, &mut out).unwrap();
        assert_eq!(out, resp2.as_bytes(), "{shape:?} to RESP2");
        out.clear();
        convert(&r3, shape, Proto::Resp3, Proto::Resp3, &mut out).unwrap();
        assert_eq!(out, resp3.as_bytes());
    }

    /// Each pair was read from Redis 7.0 (the same command on a RESP2
    /// and on a RESP3 connection).
    #[test]
    fn replies_as_redis_sends_them_in_each_protocol() {
        both(Shape::Plain, "$1\r\nv\r\n", "$1\r\nv\r\n");
        both(Shape::Plain, "$-1\r\n", "_\r\n");
        both(Shape::Plain, ":3\r\n", ":3\r\n");
        both(Shape::Plain, "+hash\r\n", "+hash\r\n");
        both(
            Shape::Plain,
            "*2\r\n$1\r\n1\r\n$-1\r\n",
            "*2\r\n$1\r\n1\r\n_\r\n",
        );
        both(
            Shape::Map,
            "*4\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n",
            "%2\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n",
        );
        both(Shape::Map, "*0\r\n", "%0\r\n");
        both(
            Shape::Set,
            "*2\r\n$1\r\ny\r\n$1\r\nx\r\n",
            "~2\r\n$1\r\ny\r\n$1\r\nx\r\n",
        );
        both(Shape::Set, "*0\r\n", "~0\r\n");
        both(
            Shape::Double,
            "$18\r\n1.1000000000000001\r\n",
            ",1.1000000000000001\r\n",
        );
        both(Shape::Double, "$6\r\n1e+100\r\n", ",1e+100\r\n");
        both(Shape::Double, "$-1\r\n", "_\r\n");
        both(
            Shape::Doubles,
            "*2\r\n$18\r\n1.1000000000000001\r\n$-1\r\n",
            "*2\r\n,1.1000000000000001\r\n_\r\n",
        );
        both(
            Shape::Scored,
            "*4\r\n$1\r\na\r\n$18\r\n1.1000000000000001\r\n$1\r\nb\r\n$1\r\n2\r\n",
            "*2\r\n*2\r\n$1\r\na\r\n,1.1000000000000001\r\n*2\r\n$1\r\nb\r\n,2\r\n",
        );
        both(Shape::Scored, "*0\r\n", "*0\r\n");
    }

    #[test]
    fn a_broken_frame_is_an_error() {
        let mut out = BytesMut::new();
        let bad = Bytes::from_static(b"*2\r\n$1\r\na\r\n");
        assert!(convert(&bad, Shape::Map, Proto::Resp2, Proto::Resp3, &mut out).is_err());
    }
}
