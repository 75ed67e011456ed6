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

fn reads(script: &str, declared: &[&str]) -> Option<Vec<usize>> {
    let d: Vec<&[u8]> = declared.iter().map(|k| k.as_bytes()).collect();
    read_keys(script.as_bytes(), &table(), &d)
}

#[test]
fn the_keys_a_script_reads_are_found_where_its_text_shows_them() {
    let two = ["key1{t}", "key2{t}"];
    // Valkey's unit/tracking: only the key the read reads.
    assert_eq!(reads("server.call('get', 'key2{t}')", &two), Some(vec![1]));
    assert_eq!(
        reads("return redis.call('GET', KEYS[1])", &two),
        Some(vec![0])
    );
    assert_eq!(
        reads(
            "local a = redis.call('get', KEYS[2]) redis.call('set', KEYS[1], a)",
            &two
        ),
        Some(vec![1])
    );
    // No read, or a read of a key not declared: nothing declared is read.
    assert_eq!(reads("server.call('ping')", &two), Some(vec![]));
    assert_eq!(
        reads("server.call('set', 'key3{t}', 'bar')", &two),
        Some(vec![])
    );
    assert_eq!(reads("redis.call('get', 'other')", &two), Some(vec![]));
    // What the text does not show: every declared key counts.
    assert_eq!(reads("redis.call('get', k)", &two), None);
    assert_eq!(reads("redis.call(cmd, KEYS[1])", &two), None);
    assert_eq!(reads("redis.call('nosuch', KEYS[1])", &two), None);
    assert_eq!(reads("redis.call('get', KEYS[1]", &two), None);
}
