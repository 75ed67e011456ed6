use super::*;

#[derive(Default)]
struct Seen(Mutex<Vec<String>>);

impl CoherenceListener for Seen {
    fn invalidate(&self, keys: &[Bytes]) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            g.push(String::from_utf8_lossy(k).into_owned());
        }
    }
    fn invalidate_echo(&self, keys: &[Bytes], written_db: Option<u16>) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            match written_db {
                Some(db) => g.push(format!("echo {} sparing {db}", String::from_utf8_lossy(k))),
                None => g.push(format!("echo {}", String::from_utf8_lossy(k))),
            }
        }
    }

    fn reset_node(&self, node: &NodeAddr) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.push(format!("reset {node}"));
    }
    fn reset_all(&self) {}
}

#[test]
fn handshake_drops_overlapping_prefixes() {
    let h = handshake(&[b"user:".to_vec(), b"user:1".to_vec(), b"cart:".to_vec()]);
    assert_eq!(
        &h[..],
        b"*9\r\n$6\r\nCLIENT\r\n$8\r\nTRACKING\r\n$2\r\nON\r\n$5\r\nBCAST\r\n$6\r\nNOLOOP\r\n$6\r\nPREFIX\r\n$5\r\ncart:\r\n$6\r\nPREFIX\r\n$5\r\nuser:\r\n"
    );
}

/// A hub in `mode` whose listener records what it is told, and one
/// channel of it.
fn channel_with_listener(mode: TrackingMode) -> (Arc<Hub>, Arc<Seen>, Channel) {
    let hub = Arc::new(Hub::new(mode, &[]));
    let seen = Arc::new(Seen::default());
    let l: Arc<dyn CoherenceListener> = seen.clone();
    assert!(hub.listener.set(l).is_ok());
    let addr = NodeAddr {
        host: "127.0.0.1".into(),
        port: 7000,
    };
    let ch = Channel::new(addr, 0, Arc::clone(&hub));
    (hub, seen, ch)
}

#[test]
fn pushes_reach_the_listener_and_loss_resets() {
    let (hub, seen, ch) = channel_with_listener(TrackingMode::Bcast);
    assert!(!ch.is_up());
    ch.on_push(
        &Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
        &[],
    );
    // The echo of our own write of b: b is applied as an echo.
    ch.on_push(
        &Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
        &[Bytes::from_static(b"b")],
    );
    ch.on_push(
        &Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nb\r\n"),
        &[Bytes::from_static(b"b")],
    );
    ch.on_push(
        &Bytes::from_static(b">2\r\n$10\r\ninvalidate\r\n_\r\n"),
        &[],
    );
    // Not an invalidation: ignored.
    ch.on_push(
        &Bytes::from_static(b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n"),
        &[],
    );
    // Lost while never up: nothing to clear.
    ch.set_down("test");
    ch.set_up();
    assert!(ch.is_up());
    ch.set_down("test");
    assert!(!ch.is_up());
    let got = seen.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        got,
        vec![
            "a",
            "b",
            "echo b sparing 0",
            "a",
            "echo b sparing 0",
            "reset 127.0.0.1:7000",
            "reset 127.0.0.1:7000"
        ]
    );
    assert_eq!(hub.stats.invalidated_keys.load(Ordering::Relaxed), 5);
    assert_eq!(hub.stats.echoes.load(Ordering::Relaxed), 2);
    assert_eq!(hub.stats.flushes.load(Ordering::Relaxed), 1);
    assert_eq!(hub.stats.channel_losses.load(Ordering::Relaxed), 1);
}

/// `s` as a key or argument.
fn b(s: &'static str) -> Bytes {
    Bytes::from_static(s.as_bytes())
}

/// Redis's RESP3 invalidation push of `k`.
fn push(k: &str) -> Bytes {
    Bytes::from(format!(
        ">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{k}\r\n",
        k.len()
    ))
}

#[test]
fn an_awaited_echo_is_taken_once_and_a_read_answered_ends_the_wait() {
    let (hub, seen, ch) = channel_with_listener(TrackingMode::Optin);
    // No client tracks: nothing is awaited.
    hub.expect_echoes(&[b("a")]);
    assert!(!ch.awaits_echoes());
    hub.echo_wanted.store(true, Ordering::Relaxed);
    hub.expect_echoes(&[b("a"), b("b"), b("c")]);
    assert!(ch.awaits_echoes());
    // a's report: its echo, once; the next one is news.
    ch.on_push(&push("a"), &[]);
    ch.on_push(&push("a"), &[]);
    // A read of b answered: b's registration may be new, its report
    // is news.
    ch.answered(&[b("GET"), b("b")]);
    ch.on_push(&push("b"), &[]);
    // A script may read any key: every wait ends.
    ch.answered(&[b("EVALSHA"), b("0123"), b("1"), b("x")]);
    assert!(!ch.awaits_echoes());
    ch.on_push(&push("c"), &[]);
    let got = seen.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(got, vec!["echo a", "a", "b", "c"]);
    assert_eq!(hub.stats.echoes.load(Ordering::Relaxed), 1);
    // Past the bound the waits are forgotten, not kept unbounded.
    let many: Vec<Bytes> = (0..ECHOES_DUE_MAX)
        .map(|i| Bytes::from(i.to_string()))
        .collect();
    hub.expect_echoes(&many);
    hub.expect_echoes(&[b("z")]);
    assert_eq!(hub.due().hashes.len(), 1);
}

/// Echo waits are per connection of the node: a read answered on one fill
/// connection registers the key there only, so the report of our write
/// on the other connection (whose registration came before it) is still
/// our echo; each connection's report is taken once.
#[test]
fn echo_waits_are_per_connection() {
    let (hub, seen, first) = channel_with_listener(TrackingMode::Optin);
    let addr = NodeAddr {
        host: "127.0.0.1".into(),
        port: 7000,
    };
    let first = first.placed(0, 2);
    let second = Channel::new(addr, 0, Arc::clone(&hub)).placed(1, 2);
    hub.echo_wanted.store(true, Ordering::Relaxed);
    hub.expect_echoes(&[b("k"), b("j")]);
    // k read back on the first connection, reported on the second: echo.
    first.answered(&[b("GET"), b("k")]);
    second.on_push(&push("k"), &[]);
    // Both connections' waits for k ended: its next report is news.
    assert_eq!(hub.due().hashes.len(), 1);
    second.on_push(&push("k"), &[]);
    first.on_push(&push("k"), &[]);
    // j reported on both (registered on both before the write): echoes.
    first.on_push(&push("j"), &[]);
    second.on_push(&push("j"), &[]);
    assert!(!first.awaits_echoes());
    // A script answered on the first ends its waits there only.
    hub.expect_echoes(&[b("x")]);
    first.answered(&[b("EVALSHA"), b("0123"), b("0")]);
    second.on_push(&push("x"), &[]);
    first.on_push(&push("x"), &[]);
    let got = seen.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        got,
        vec!["echo k", "k", "k", "echo j", "echo j", "echo x", "x"]
    );
}

#[test]
fn invalidations_are_read_in_place_as_the_general_decode_reads_them() {
    let keys = |f: &[u8]| -> Option<Vec<Bytes>> {
        invalidated_keys(&Bytes::copy_from_slice(f)).map(|k| k.into_vec())
    };
    let general = |f: &[u8]| decode_invalidation(&Bytes::copy_from_slice(f));
    let one = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nkey\r\n";
    assert_eq!(keys(one), Some(vec![Bytes::from("key")]));
    let three = b">2\r\n$10\r\ninvalidate\r\n*3\r\n$1\r\na\r\n$0\r\n\r\n$4\r\nb\r\nc\r\n";
    let want = vec![Bytes::from("a"), Bytes::new(), Bytes::from("b\r\nc")];
    assert_eq!(keys(three), Some(want.clone()));
    assert_eq!(general(three).flatten().map(|k| k.into_vec()), Some(want));
    // Other shapes go to the general decode: a flush (null), a set, a
    // frame cut short or with bytes after it, another push.
    for other in [
        &b">2\r\n$10\r\ninvalidate\r\n_\r\n"[..],
        b">2\r\n$10\r\ninvalidate\r\n~1\r\n$1\r\na\r\n",
        b">2\r\n$10\r\ninvalidate\r\n*2\r\n$1\r\na\r\n",
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nab\r\n",
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$x\r\na\r\n",
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\na\r\nzz",
        b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
    ] {
        assert_eq!(keys(other), None, "{}", String::from_utf8_lossy(other));
    }
    assert_eq!(general(b">2\r\n$10\r\ninvalidate\r\n_\r\n"), Some(None));
    assert_eq!(
        general(b">2\r\n$10\r\ninvalidate\r\n~1\r\n$1\r\na\r\n")
            .flatten()
            .map(|k| k.into_vec()),
        Some(vec![Bytes::from("a")])
    );
    assert_eq!(
        general(b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n"),
        None
    );
}
