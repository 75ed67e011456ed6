//! Key extraction (`CommandInfo::keys`) from the command table.
//!
//! Input: byte 0 picks the table. Even: the table built from a real
//! `COMMAND` reply of Redis 7.0.15 (`fixtures/command-redis-7.0.15.resp`).
//! Odd: a one-command table whose entry (arity, flags, legacy positions and
//! two key specs) is built from the next 16 bytes, as a hostile or buggy
//! upstream could send it. The rest is a client's request stream, parsed
//! with the real parser. Checked for each request:
//! - key positions are arguments (< argc; ≥ 1 for a real command), and
//!   `Ok` only when the arity holds;
//! - the keys a command may write are a subset of its keys;
//! - for a real command without `movablekeys`, the key specs find exactly
//!   the legacy first/last/step positions;
//! - nothing panics or hangs (a huge `numkeys` must not loop).
#![no_main]

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use sidecache::cmd::table::{CommandInfo, CommandTable};
use sidecache_resp::frame::Value;
use sidecache_resp::request::{InlineQuotes, Limits, Parser, Request};

static COMMAND_REPLY: &[u8] = include_bytes!("../fixtures/command-redis-7.0.15.resp");

fn real_table() -> &'static CommandTable {
    static TABLE: OnceLock<CommandTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let v = Value::decode(&Bytes::from_static(COMMAND_REPLY)).expect("fixture decodes");
        CommandTable::from_command_reply(v).expect("fixture is a command table")
    })
}

fn bulk(s: &[u8]) -> Value {
    Value::Bulk(Bytes::copy_from_slice(s))
}

/// A small or an extreme integer from one byte.
fn int(b: u8) -> Value {
    Value::Int(match b {
        0xF0 => i64::MAX,
        0xF1 => i64::MIN,
        0xF2 => i64::from(i32::MAX),
        0xF3 => -i64::from(i32::MAX),
        b => i64::from(b as i8 % 8),
    })
}

fn spec(b: &[u8]) -> Value {
    let begin = match b[0] % 3 {
        0 => Value::Array(vec![
            bulk(b"type"),
            bulk(b"index"),
            bulk(b"spec"),
            Value::Array(vec![bulk(b"index"), int(b[1])]),
        ]),
        1 => Value::Array(vec![
            bulk(b"type"),
            bulk(b"keyword"),
            bulk(b"spec"),
            Value::Array(vec![
                bulk(b"keyword"),
                bulk(b"K"),
                bulk(b"startfrom"),
                int(b[1]),
            ]),
        ]),
        _ => Value::Array(vec![bulk(b"type"), bulk(b"unknown")]),
    };
    let find = match b[2] % 3 {
        0 => Value::Array(vec![
            bulk(b"type"),
            bulk(b"range"),
            bulk(b"spec"),
            Value::Array(vec![
                bulk(b"lastkey"),
                int(b[3]),
                bulk(b"keystep"),
                int(b[4]),
                bulk(b"limit"),
                int(b[5]),
            ]),
        ]),
        1 => Value::Array(vec![
            bulk(b"type"),
            bulk(b"keynum"),
            bulk(b"spec"),
            Value::Array(vec![
                bulk(b"keynumidx"),
                int(b[3]),
                bulk(b"firstkey"),
                int(b[4]),
                bulk(b"keystep"),
                int(b[5]),
            ]),
        ]),
        _ => Value::Array(vec![bulk(b"type"), bulk(b"unknown")]),
    };
    let flags = if b[0] & 0x80 != 0 {
        vec![bulk(b"RW")]
    } else {
        vec![bulk(b"RO")]
    };
    Value::Array(vec![
        bulk(b"flags"),
        Value::Array(flags),
        bulk(b"begin_search"),
        begin,
        bulk(b"find_keys"),
        find,
    ])
}

fn synthetic_table(b: &[u8; 16]) -> Option<CommandTable> {
    let mut flags = vec![];
    if b[1] & 1 != 0 {
        flags.push(Value::Status(Bytes::from_static(b"movablekeys")));
    }
    if b[1] & 2 != 0 {
        flags.push(Value::Status(Bytes::from_static(b"write")));
    }
    let nspecs = usize::from(b[1] >> 2) % 3;
    let specs = (0..nspecs)
        .map(|i| spec(&b[4 + i * 6..10 + i * 6]))
        .collect();
    let entry = Value::Array(vec![
        bulk(b"x"),
        int(b[0]),
        Value::Array(flags),
        int(b[2]),
        int(b[3]),
        int(b[15]),
        Value::Array(vec![]),
        Value::Array(vec![]),
        Value::Array(specs),
        Value::Array(vec![]),
    ]);
    CommandTable::from_command_reply(Value::Array(vec![entry])).ok()
}

fn legacy(info: &CommandInfo, argc: usize) -> Vec<usize> {
    let argc = argc as i64;
    let last = if info.last < 0 {
        argc + info.last
    } else {
        info.last
    };
    let mut out = vec![];
    let mut i = info.first;
    while i <= last && i < argc {
        out.push(i as usize);
        let Some(next) = i.checked_add(info.step.max(1)) else {
            break;
        };
        i = next;
    }
    out
}

fn check(table: &CommandTable, real: bool, args: &[Bytes]) {
    let Some(info) = table.lookup(args) else {
        return;
    };
    let mut keys = Vec::new();
    let r = info.keys(args, &mut keys);
    let mut written = Vec::new();
    let w = info.keys_where(args, &mut written, true);
    let Ok(complete) = r else {
        return;
    };
    assert!(info.arity_ok(args.len()));
    for &k in &keys {
        // (A synthetic table may name the command itself as a key.)
        assert!(
            k < args.len() && (k >= 1 || !real),
            "{}: key {k} of {} args",
            info.name,
            args.len()
        );
    }
    if let Ok(_) = w {
        for k in &written {
            assert!(keys.contains(k), "{}: written key {k} not a key", info.name);
        }
    }
    if real && complete && !info.flags.movablekeys && info.first > 0 {
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, legacy(info, args.len()), "{} {:?}", info.name, args);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let synthetic;
    let (table, real, stream) = if sel & 1 == 0 {
        (real_table(), true, rest)
    } else {
        let Some((head, stream)) = rest.split_first_chunk::<16>() else {
            return;
        };
        synthetic = synthetic_table(head);
        let Some(t) = synthetic.as_ref() else {
            return;
        };
        (t, false, stream)
    };
    let mut p = Parser::new(Limits {
        max_bulk: 1 << 20,
        max_multibulk: 1 << 16,
        inline_quotes: InlineQuotes::Strict,
    });
    let mut buf = BytesMut::from(stream);
    let mut req = Request::default();
    while let Ok(Some(())) = p.parse(&mut buf, &mut req) {
        check(table, real, &req.args);
    }
});
