//! Unit tests of the script reader.
use super::*;
use bytes::Bytes;
use sidecache_resp::frame::Value;

fn table() -> CommandTable {
    let entry = |name: &str, flags: &[&str]| {
        Value::Array(vec![
            Value::Bulk(Bytes::copy_from_slice(name.as_bytes())),
            Value::Int(-1),
            Value::Array(
                flags
                    .iter()
                    .map(|f| Value::Status(Bytes::copy_from_slice(f.as_bytes())))
                    .collect(),
            ),
            Value::Int(1),
            Value::Int(1),
            Value::Int(1),
        ])
    };
    CommandTable::from_command_reply(Value::Array(vec![
        entry("get", &["readonly"]),
        entry("hgetall", &["readonly"]),
        entry("set", &["write"]),
        entry("incr", &["write"]),
        entry("ping", &[]),
    ]))
    .expect("table")
}

#[test]
fn scripts_that_call_no_read_are_told_apart() {
    let t = table();
    let no = [
        "redis.call('set', 'key3{t}', 'bar')",
        "redis.call('ping')",
        "return 1",
        "redis.pcall( \"INCR\" , KEYS[1]) server.call('SET', KEYS[1], 'x')",
    ];
    for s in no {
        assert!(!may_read(s.as_bytes(), &t), "{s}");
    }
    let yes = [
        "redis.call('get', 'key3{t}')",
        "return redis.call('set', KEYS[1], 'x'), redis.call(\"GET\", KEYS[1])",
        "server.pcall('HGETALL', KEYS[1])",
        // What the text cannot settle counts as a read.
        "local c = redis.call; return c('get', KEYS[1])",
        "return redis.call(ARGV[1], KEYS[1])",
        "return redis.call('g\\x65t', KEYS[1])",
        "return redis.call('nosuchcommand', KEYS[1])",
        "return redis.call([[get]], KEYS[1])",
    ];
    for s in yes {
        assert!(may_read(s.as_bytes(), &t), "{s}");
    }
}
