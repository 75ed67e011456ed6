//! `sidecache hotkeys`: asks a running sidecache for its hot keys over
//! RESP (`SIDECACHE HOTKEYS`) and prints them as a table. Blocking I/O: it
//! runs before (instead of) the runtime.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use bytes::{Bytes, BytesMut};
use sidecache_resp::encode::encode_command;
use sidecache_resp::frame::{Scanner, Value};

use super::escape_key;
use crate::config::HotkeysArgs;

/// Sends one command on `s` and reads its reply.
fn call(s: &mut TcpStream, args: &[&[u8]]) -> anyhow::Result<Value> {
    let mut cmd = BytesMut::new();
    encode_command(&mut cmd, args);
    s.write_all(&cmd)?;
    let mut buf = Vec::new();
    let mut scanner = Scanner::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("connection closed before the reply");
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(len) = scanner
            .scan(&buf)
            .map_err(|e| anyhow!("bad reply: {e:?}"))?
        {
            return Value::decode(&Bytes::copy_from_slice(&buf[..len]))
                .map_err(|e| anyhow!("bad reply: {e:?}"));
        }
    }
}

/// Asks `args.addr` and writes the table to `out`.
///
/// # Errors
/// Connection failures and error replies (e.g. hot keys off).
pub fn run(args: &HotkeysArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let mut s = TcpStream::connect(&args.addr)
        .with_context(|| format!("cannot connect to {}", args.addr))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    if let Some(p) = &args.password {
        if let Value::Error(e) = call(&mut s, &[b"AUTH", p.as_bytes()])? {
            bail!("{}", String::from_utf8_lossy(&e));
        }
    }
    let count = args.n.to_string();
    let reply = call(
        &mut s,
        &[
            b"SIDECACHE",
            b"HOTKEYS",
            args.by.as_bytes(),
            b"COUNT",
            count.as_bytes(),
        ],
    )?;
    let items = match reply {
        Value::Array(items) => items,
        Value::Error(e) => bail!("{}", String::from_utf8_lossy(&e)),
        other => bail!("unexpected reply: {other:?}"),
    };
    let mut rows = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::Array(pair) => match &pair[..] {
                [Value::Bulk(k), Value::Int(n)] => rows.push((escape_key(k), *n)),
                _ => bail!("unexpected entry: {pair:?}"),
            },
            other => bail!("unexpected entry: {other:?}"),
        }
    }
    writeln!(
        out,
        "{:>4}  {:>12}  key (by {}, estimated)",
        "rank", args.by, args.by
    )?;
    for (i, (k, n)) in rows.iter().enumerate() {
        writeln!(out, "{:>4}  {:>12}  {}", i + 1, n, k)?;
    }
    if rows.is_empty() {
        writeln!(out, "(no keys counted yet)")?;
    }
    Ok(())
}
