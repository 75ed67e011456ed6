//! Unit tests of the tracking table.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::pubsub::{Hub, OutputLimit};
use tokio::sync::mpsc::Receiver;

fn hub() -> Hub {
    Hub::new(
        OutputLimit::PUBSUB_DEFAULT,
        std::time::Duration::from_secs(1),
    )
}

/// What `rx` holds now, as text.
fn drain(rx: &mut Receiver<Delivery>) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(d) = rx.try_recv() {
        out.push(match d {
            Delivery::Invalidate(Some(k)) => k
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            Delivery::Invalidate(None) => "*".to_owned(),
            Delivery::RedirectBroken(id) => format!("broken {id}"),
            other => format!("{other:?}"),
        });
    }
    out
}

/// Client 1 tracks in BCAST mode, client 2 in BCAST NOLOOP; their
/// messages.
fn bcast_pair(h: &Hub) -> (Tracked, Receiver<Delivery>, Receiver<Delivery>) {
    let t = Tracked::default();
    let (o1, r1) = Outbox::new(h);
    let (o2, r2) = Outbox::new(h);
    t.add_outbox(1, &o1);
    t.add_outbox(2, &o2);
    let bcast = Sink {
        bcast: true,
        ..Sink::default()
    };
    t.enable(1, bcast.clone());
    t.enable(
        2,
        Sink {
            noloop: true,
            ..bcast
        },
    );
    (t, r1, r2)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

#[test]
fn messages_go_to_readers_once_and_by_prefix() {
    let h = hub();
    let t = Tracked::new(100);
    let (o1, mut r1) = Outbox::new(&h);
    let (o2, mut r2) = Outbox::new(&h);
    t.add_outbox(1, &o1);
    t.add_outbox(2, &o2);
    assert!(!t.active());
    t.enable(1, Sink::default());
    t.enable(
        2,
        Sink {
            bcast: true,
            prefixes: vec![b("u:")],
            ..Sink::default()
        },
    );
    t.register(1, &b("k"));
    t.register(1, &b("u:1"));
    t.invalidate(&[b("k"), b("u:1"), b("other")], None);
    assert_eq!(drain(&mut r1), ["k", "u:1"]);
    // BCAST: held until released.
    assert!(drain(&mut r2).is_empty());
    t.release(0);
    assert_eq!(drain(&mut r2), ["u:1"]);
    // One message per read: not again until read again.
    t.invalidate(&[b("k")], None);
    assert!(drain(&mut r1).is_empty());
    // NOLOOP: its own writes say nothing.
    t.enable(
        1,
        Sink {
            noloop: true,
            ..Sink::default()
        },
    );
    t.register(1, &b("k"));
    t.invalidate(&[b("k")], Some(1));
    assert!(drain(&mut r1).is_empty());
    assert_eq!(t.figures(), (2, 0, 3));
    t.register(1, &b("k"));
    t.register(1, &b("k"));
    assert_eq!(t.totals(), (1, 1));
}

#[test]
fn bcast_keys_go_as_one_message_per_prefix() {
    let h = hub();
    let t = Tracked::default();
    let (o1, mut r1) = Outbox::new(&h);
    let (o2, mut r2) = Outbox::new(&h);
    t.add_outbox(1, &o1);
    t.add_outbox(2, &o2);
    t.enable(
        1,
        Sink {
            bcast: true,
            ..Sink::default()
        },
    );
    t.enable(
        2,
        Sink {
            bcast: true,
            noloop: true,
            prefixes: vec![b("a:"), b("b:")],
            ..Sink::default()
        },
    );
    // An MSET, then an EXEC of four writes (one key twice), one by
    // client 2 itself.
    t.invalidate(&[b("a:1"), b("b:1"), b("c:1")], None);
    t.invalidate(&[b("a:2")], None);
    t.invalidate(&[b("a:1")], None);
    t.invalidate(&[b("b:2")], Some(2));
    t.release(2);
    assert_eq!(drain(&mut r1), ["a:1 a:2 b:1 b:2 c:1"]);
    assert_eq!(drain(&mut r2), ["a:1 a:2", "b:1"]);
    // Released once; a flush sends held keys before its own message.
    t.release(0);
    assert!(drain(&mut r1).is_empty());
    t.touch(1);
    t.invalidate(&[b("z")], None);
    t.flush();
    assert_eq!(drain(&mut r1), ["z", "*"]);
}

#[test]
fn redis_echo_of_a_write_told_of_is_not_sent_again() {
    let h = hub();
    let (t, mut r1, mut r2) = bcast_pair(&h);
    // Client 2 writes k (an MSET of k and j): 1 is told, 2 is not
    // (NOLOOP); Redis's echo of it tells neither again.
    t.invalidate(&[b("k"), b("j")], Some(2));
    t.release(2);
    assert_eq!(drain(&mut r1), ["j k"]);
    t.invalidate_learned(&[b("k")]);
    t.release(0);
    assert!(drain(&mut r1).is_empty());
    assert!(drain(&mut r2).is_empty());
    // Another writer's change of a key not told of is news.
    t.invalidate_learned(&[b("x")]);
    t.release(0);
    assert_eq!(drain(&mut r1), ["x"]);
    assert_eq!(drain(&mut r2), ["x"]);
    // Once client 1 read, a change of k is news to it again.
    t.touch(1);
    t.invalidate_learned(&[b("k"), b("j")]);
    t.release(0);
    assert_eq!(drain(&mut r1), ["j k"]);
    assert!(drain(&mut r2).is_empty());
    // Tracking turned off and on again keeps what it was told of.
    t.disable(2);
    t.enable(
        2,
        Sink {
            bcast: true,
            ..Sink::default()
        },
    );
    t.invalidate_learned(&[b("k")]);
    t.release(0);
    assert!(drain(&mut r2).is_empty());
}

#[test]
fn redis_report_of_a_forwarded_write_before_its_reply_is_no_news() {
    let h = hub();
    let t = Tracked::default();
    let (o1, mut r1) = Outbox::new(&h);
    let (o2, mut r2) = Outbox::new(&h);
    t.add_outbox(1, &o1);
    t.add_outbox(2, &o2);
    t.enable(
        1,
        Sink {
            noloop: true,
            ..Sink::default()
        },
    );
    t.enable(
        2,
        Sink {
            bcast: true,
            ..Sink::default()
        },
    );
    t.register(1, &b("k"));
    // Client 1 (NOLOOP) sends a write of k; Redis reports it before
    // the reply is read: neither client hears of it from Redis.
    t.writing(&[b("k")], 1);
    t.invalidate_learned(&[b("k")]);
    t.release(0);
    assert!(drain(&mut r1).is_empty());
    assert!(drain(&mut r2).is_empty());
    // The reply: the BCAST client is told, once.
    t.invalidate(&[b("k")], Some(1));
    t.release(1);
    assert!(drain(&mut r1).is_empty());
    assert_eq!(drain(&mut r2), ["k"]);
    // A client that does not track: nothing changes for the others.
    t.register(1, &b("j"));
    t.writing(&[b("j")], 9);
    t.invalidate_learned(&[b("j")]);
    assert_eq!(drain(&mut r1), ["j"]);
}

#[test]
fn flushes_say_it_once_until_something_is_read() {
    let h = hub();
    let t = Tracked::default();
    let (o1, mut r1) = Outbox::new(&h);
    t.add_outbox(1, &o1);
    t.enable(1, Sink::default());
    t.register(1, &b("k"));
    t.flush();
    t.flush();
    assert_eq!(drain(&mut r1), ["*"]);
    t.register(1, &b("k"));
    t.flush();
    assert_eq!(drain(&mut r1), ["*"]);
    // Nothing queued for a key forgotten by the flush.
    t.invalidate(&[b("k")], None);
    assert!(drain(&mut r1).is_empty());
}

#[test]
fn redirects_forget_and_the_table_bound() {
    let h = hub();
    let t = Tracked::new(2);
    let (o1, mut r1) = Outbox::new(&h);
    let (o9, mut r9) = Outbox::new(&h);
    t.add_outbox(1, &o1);
    t.add_outbox(9, &o9);
    t.enable(
        1,
        Sink {
            redirect: 9,
            ..Sink::default()
        },
    );
    t.register(1, &b("a"));
    t.invalidate(&[b("a")], None);
    assert_eq!(drain(&mut r9), ["a"]);
    assert!(drain(&mut r1).is_empty());
    // The target left: its client hears of it.
    t.remove(9);
    t.register(1, &b("a"));
    t.invalidate(&[b("a")], None);
    assert_eq!(drain(&mut r1), ["broken 9"]);
    // forget: this client only, at once.
    t.enable(1, Sink::default());
    t.register(1, &b("x"));
    t.forget(1, &[b("x")]);
    assert_eq!(drain(&mut r1), ["x"]);
    t.invalidate(&[b("x")], None);
    assert!(drain(&mut r1).is_empty());
    // Over the bound, a key is forgotten and its reader told.
    for k in ["p", "q", "r"] {
        t.register(1, &b(k));
    }
    assert_eq!(drain(&mut r1).len(), 1);
    assert_eq!(t.figures().1, 2);
}

#[test]
fn a_read_sent_a_message_while_in_flight_gets_no_second_one() {
    let h = hub();
    let (t, mut r1, mut r2) = bcast_pair(&h);
    // Both read k (dispatched); an expiry of k is sent to both while the
    // reads are in flight: the reads' own messages are not sent again.
    t.touch(1);
    t.touch(2);
    t.invalidate(&[b("k")], None);
    t.release(0);
    assert_eq!(drain(&mut r1), ["k"]);
    assert_eq!(drain(&mut r2), ["k"]);
    t.forget(1, &[b("k")]);
    t.forget(2, &[b("k")]);
    assert!(drain(&mut r1).is_empty());
    assert!(drain(&mut r2).is_empty());
    // A key only counted as told (client 2's own NOLOOP write, which sends
    // it nothing) still gets the read's message; so does one after a
    // new read's dispatch.
    t.touch(1);
    t.touch(2);
    t.writing(&[b("j")], 2);
    t.invalidate(&[b("j")], Some(2));
    t.release(2);
    assert_eq!(drain(&mut r1), ["j"]);
    assert!(drain(&mut r2).is_empty());
    t.forget(2, &[b("j")]);
    assert_eq!(drain(&mut r2), ["j"]);
    t.touch(1);
    t.forget(1, &[b("j")]);
    assert_eq!(drain(&mut r1), ["j"]);
    // The message sent in place of following j stands for j's expiry too;
    // any other change of j is sent, and after a read so is its expiry.
    let now = Instant::now();
    t.expire_at(&b("j"), now);
    t.expire_due(now);
    assert!(drain(&mut r1).is_empty());
    assert!(drain(&mut r2).is_empty());
    t.invalidate(&[b("j")], None);
    t.release(0);
    assert_eq!(drain(&mut r1), ["j"]);
    t.touch(1);
    t.expire_at(&b("j"), now);
    t.expire_due(now);
    assert_eq!(drain(&mut r1), ["j"]);
}

#[test]
fn a_flush_empties_the_table_with_no_client_tracking() {
    let t = Tracked::default();
    t.enable(1, Sink::default());
    t.register(1, &b("k"));
    t.disable(1);
    assert_eq!(t.totals(), (1, 0));
    t.flush();
    assert_eq!(t.totals(), (0, 0));
}
