//! The connection loop: read, parse and dispatch a batch, resolve it,
//! write its replies; between batches, deliveries to a subscriber, the
//! idle timeout and shutdown.

use super::*;
use crate::state::clients::Activity;

/// A client stream: TCP or Unix.
///
/// (An attempt to skip the `EAGAIN` read after a short read by clearing
/// tokio's readiness with `try_io` lost wake-ups: `try_io` clears the
/// readiness it observes *now*, which can include an edge for data that
/// arrived after the read — the connection then hung until the client
/// sent more. The differential test caught it; do not reintroduce it
/// without a tick-exact readiness guard.)
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin {}

impl ClientStream for tokio::net::TcpStream {}

impl ClientStream for tokio::net::UnixStream {}

/// Serves one client until it quits, errs, or shutdown is requested.
pub async fn serve<S>(
    mut stream: S,
    shared: Arc<Shared>,
    addr: String,
    laddr: String,
    shutdown: CancellationToken,
) where
    S: ClientStream,
{
    let limits = Limits {
        max_bulk: shared.config.proto_max_bulk_len,
        max_multibulk: shared.config.max_multibulk_len,
        inline_quotes: inline_quotes(shared.upstream.server_info()),
    };
    let query_limit = shared.config.client_query_buffer_limit as usize;
    // Cancelled by CLIENT KILL, or at shutdown (which cancels every
    // registered client's; one registering now checks the shared token
    // after registering). A switch of its own, not a child of `shutdown`:
    // waiting on a child token cost a GET hit 150 more instructions
    // (bench/callgrind.sh).
    let kill = crate::state::kill::Kill::default();
    let mut client = Client::new(Arc::clone(&shared), addr, laddr, kill.clone());
    if shutdown.is_cancelled() {
        kill.cancel();
    }
    let mut parser = Parser::new(limits);
    parser.unauthenticated = !client.st.authenticated;
    let mut rbuf = BytesMut::with_capacity(16 * 1024);
    let mut req = Request::default();
    // One wait for the kill, polled again at every read (`state::kill`).
    let killed = kill.cancelled();
    tokio::pin!(killed);
    client.metrics.read();
    'conn: loop {
        let mut close = false;
        loop {
            parser.unauthenticated = !client.st.authenticated;
            match parser.parse(&mut rbuf, &mut req) {
                Ok(Some(())) => {
                    let (first, answered) = (client.pending.len(), client.answered);
                    if shared.pubsub.monitoring() {
                        client.monitor_feed(&req);
                    }
                    if client.st.tracking.on {
                        client.track_read(&req);
                    }
                    // CLIENT PAUSE: its own future, boxed, so the loop's
                    // state stays as small as without it.
                    if shared.pause.on()
                        && Box::pin(held_by_pause(
                            &mut client,
                            &mut stream,
                            &mut rbuf,
                            query_limit,
                            &req,
                        ))
                        .await
                        .is_err()
                    {
                        break 'conn;
                    }
                    let flow = if client.session_active() {
                        client.dispatch_in_session(&req).await
                    } else if client.subs.is_some() {
                        client.dispatch_subscribed(&req).await
                    } else {
                        client.dispatch(&req).await
                    };
                    if client.st.reply != answer::ReplyMode::On {
                        // A flush during the dispatch answered what was
                        // before it: this command's entries start at 0.
                        let first = if client.answered == answered {
                            first
                        } else {
                            0
                        };
                        client.silence_from(first);
                    }
                    match flow {
                        Flow::Continue => {}
                        Flow::Close => {
                            close = true;
                            break;
                        }
                        Flow::Block => {
                            // What came before it is answered first; then
                            // it blocks, later requests waiting in `rbuf`.
                            // It is counted once answered (`tot-cmds`), as
                            // Valkey counts a blocked command.
                            client.commands = client.commands.saturating_sub(1);
                            client.flush().await;
                            if write_out(&mut stream, &mut client.wbuf, &client.st.entry.activity)
                                .await
                                .is_err()
                            {
                                break 'conn;
                            }
                            if let Flow::Close = client
                                .run_blocking(&mut stream, &mut rbuf, query_limit)
                                .await
                            {
                                break 'conn;
                            }
                            client.commands += 1;
                            client.publish_commands();
                            if write_out(&mut stream, &mut client.wbuf, &client.st.entry.activity)
                                .await
                                .is_err()
                            {
                                break 'conn;
                            }
                            client.metrics.written(&shared.metrics);
                        }
                    }
                    if client.pending.len() >= MAX_BATCH
                        || client.batch_bytes >= MAX_BATCH_BYTES
                        || client.output_due()
                    {
                        client.flush().await;
                        if write_out(&mut stream, &mut client.wbuf, &client.st.entry.activity)
                            .await
                            .is_err()
                        {
                            break 'conn;
                        }
                        client.metrics.written(&shared.metrics);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared
                        .stats
                        .protocol_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    client.metrics.uncounted();
                    let msg = format!("ERR {e}");
                    client.local_reply(|r| r.error(&msg));
                    close = true;
                    break;
                }
            }
        }
        client.flush().await;
        if client.user_gone {
            break;
        }
        // Messages queued for it while the batch ran (CLIENT TRACKING
        // invalidations of what it read or wrote) go out in the same write,
        // right behind its replies, as Redis puts them in the same output
        // buffer: a client that looks for them once it has a reply (as
        // redis-py's client-side cache does before serving its next read)
        // finds them, never a reply without the invalidation it caused.
        // A lost subscription link still gets the batch's replies out first.
        let (mut weight, mut lost) = (0, false);
        if client.subs.is_some() {
            match client.take_ready() {
                Some(w) => weight = w,
                None => lost = true,
            }
        }
        client.early.clear();
        let failed = client.write_watched(&mut stream).await.is_err();
        if !failed {
            client.metrics.written(&shared.metrics);
            if weight > 0 {
                client.delivered(weight);
            }
        }
        if failed || close || lost {
            break;
        }
        if rbuf.len() > query_limit {
            debug!(
                id = client.st.id,
                "closing client that reached max query buffer length"
            );
            break;
        }
        let want = parser.wanted().map_or(0, |w| w.saturating_sub(rbuf.len()));
        // The last request's arguments share the read buffer's allocation.
        // The batch is answered (its pending entries, which held parts of
        // it too, are gone): once these go, `reserve` can usually reuse the
        // allocation instead of taking another (callgrind: a 16 KB malloc
        // and free per batch of forwarded commands).
        req.raw = Bytes::new();
        req.args.clear();
        // A subscriber mostly waits: it keeps small buffers.
        let least = if client.timeout_exempt() {
            if rbuf.is_empty() && rbuf.capacity() > 4 * 1024 {
                rbuf = BytesMut::new();
            }
            if client.scratch.capacity() > 256 && client.scratch.is_empty() {
                client.scratch = BytesMut::new();
            }
            512
        } else {
            16 * 1024
        };
        rbuf.reserve(want.clamp(least, 1024 * 1024));
        tokio::select! {
            biased;
            () = &mut killed => break,
            r = stream.read_buf(&mut rbuf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let now = client.metrics.read();
                    client.st.entry.touch(now, n);
                }
            },
            () = idle(shared.config.timeout, client.timeout_exempt()), if shared.config.timeout.is_some() => {
                debug!(id = client.st.id, "closing idle client (--timeout)");
                break;
            }
            next = subscribed::next(&mut client.subs), if client.subs.is_some() => {
                let subscribed::Next::Delivery(d) = next else {
                    break;
                };
                let Some(weight) = client.take_deliveries(d) else {
                    break;
                };
                if client.write_watched(&mut stream).await.is_err() {
                    break;
                }
                client.delivered(weight);
            }
        }
    }
    let _ = stream.shutdown().await;
}

impl Drop for Client {
    /// Also on a panic in the client's task: its subscriptions end and it
    /// leaves CLIENT LIST.
    fn drop(&mut self) {
        self.leave_pubsub();
        let id = self.st.id;
        self.shared.tracked.remove(id);
        self.shared.with_clients(|c| c.remove(&id));
    }
}

/// CLIENT PAUSE holds `req` (`crate::state::pause`): what came before it
/// is answered first, then it waits for the pause to end, reading what
/// the client sends meanwhile into `rbuf` (at most `query_limit`). `Err`:
/// the client is gone (closed, killed, or past the limit), and `req` is
/// not run, as Redis frees a paused client that leaves.
#[cold]
async fn held_by_pause<S: ClientStream>(
    client: &mut Client,
    stream: &mut S,
    rbuf: &mut BytesMut,
    query_limit: usize,
    req: &Request,
) -> std::io::Result<()> {
    let shared = Arc::clone(&client.shared);
    let pause = &shared.pause;
    // Nothing held (a pause just over): no command is judged.
    if pause.holds(true).is_none() {
        return Ok(());
    }
    let Some(writes) = client.pause_writes(req).await else {
        return Ok(());
    };
    if pause.holds(writes).is_none() {
        return Ok(());
    }
    client.flush().await;
    write_out(stream, &mut client.wbuf, &client.st.entry.activity).await?;
    let kill = client.st.entry.kill.clone();
    let wait = pause.wait(writes);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            () = &mut wait => return Ok(()),
            () = kill.cancelled() => break,
            r = stream.read_buf(rbuf) => match r {
                Ok(n) if n > 0 && rbuf.len() <= query_limit => {}
                _ => break,
            },
        }
    }
    Err(std::io::ErrorKind::ConnectionAborted.into())
}

impl Client {
    /// Whether `req` may change data, as `CLIENT PAUSE WRITE` judges it
    /// (`crate::cmd::pause`); `None`: no pause holds it, as Redis answers
    /// what it cannot run (an unknown command, a wrong arity) at once.
    /// EXEC may change data when a command it runs may; FCALL as its
    /// function declares (`FUNCTION LIST`, asked on a control
    /// connection). Asked only while a pause is on.
    async fn pause_writes(&mut self, req: &Request) -> Option<bool> {
        let shared = Arc::clone(&self.shared);
        let info = shared.table.lookup(&req.args)?;
        if !info.arity_ok(req.args.len()) {
            return None;
        }
        let pause = &shared.pause;
        if info.name == "exec" {
            return Some(self.tx.as_ref().is_some_and(|t| t.writes));
        }
        if matches!(info.name.as_str(), "fcall" | "fcall_ro") && !pause.all() {
            if let Some(no_writes) = function_no_writes(&shared, &req.args[1]).await {
                return Some(!no_writes);
            }
        }
        Some(crate::cmd::pause::may_change_data(info, &req.args, |sha| {
            pause.ro_script(sha)
        }))
    }
}

/// Whether upstream's function `name` declares `no-writes` (`None`: no
/// such function, or no answer).
async fn function_no_writes(shared: &crate::state::Shared, name: &[u8]) -> Option<bool> {
    let node = Arc::clone(shared.upstream.topology().nodes().first()?);
    let mut cmd = bytes::BytesMut::new();
    sidecache_resp::encode::encode_command(&mut cmd, &[b"FUNCTION".as_slice(), b"LIST"]);
    let reply = node.control_call(cmd.freeze()).await.ok()?;
    let list = sidecache_resp::frame::Value::decode(&reply).ok()?;
    crate::cmd::pause::function_no_writes(list, name)
}

/// Ready after `timeout` (`--timeout`), unless there is none or the client
/// is exempt (subscribed or in MONITOR; a blocked client never gets here).
async fn idle(timeout: Option<std::time::Duration>, exempt: bool) {
    match timeout {
        Some(t) if !exempt => tokio::time::sleep(t).await,
        _ => std::future::pending().await,
    }
}

/// Reply buffer a client keeps between batches (see [`write_out`]).
const WBUF_KEEP: usize = 64 * 1024;

/// Writes what `wbuf` holds to the client, counted in its `activity`
/// (CLIENT LIST's `tot-net-out`).
pub(super) async fn write_out<S: AsyncWrite + Unpin>(
    stream: &mut S,
    wbuf: &mut BytesMut,
    activity: &Activity,
) -> std::io::Result<()> {
    if !wbuf.is_empty() {
        stream.write_all(wbuf).await?;
        activity.wrote(wbuf.len());
        wbuf.clear();
        // A client keeps at most 64 KiB of reply buffer between batches:
        // one that read large values would otherwise hold the space of its
        // largest batch for as long as it stays connected (4 MiB each
        // before: 50 clients reading 16–64 KB values held 24 MB beside a
        // 1 MiB L1, bench/churn.sh VALUES=mix).
        if wbuf.capacity() > WBUF_KEEP {
            *wbuf = BytesMut::with_capacity(16 * 1024);
        }
    }
    Ok(())
}

/// How the upstream splits inline commands, which sidecache parses itself:
/// Valkey 9 lets text follow a closing quote (`"a b"c`), Redis and older
/// Valkey answer a protocol error.
fn inline_quotes(info: &sidecache_pool::ServerInfo) -> InlineQuotes {
    let major = |v: &str| v.split('.').next()?.parse::<u32>().ok();
    match (info.hello_text("server"), info.hello_text("version")) {
        (Some("valkey"), Some(v)) if major(v).is_some_and(|m| m >= 9) => InlineQuotes::Joined,
        _ => InlineQuotes::Strict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_quotes_follow_the_upstream_engine() {
        let info = |server: &str, version: &str| sidecache_pool::ServerInfo {
            version: "7.2.4".into(),
            databases: 16,
            cluster: false,
            hello: [("server", server), ("version", version)]
                .iter()
                .map(|(f, v)| {
                    (
                        Bytes::from(f.to_string()),
                        sidecache_resp::frame::Value::Bulk(Bytes::from(v.to_string())),
                    )
                })
                .collect(),
        };
        assert_eq!(
            inline_quotes(&info("redis", "7.0.15")),
            InlineQuotes::Strict
        );
        assert_eq!(
            inline_quotes(&info("valkey", "8.0.1")),
            InlineQuotes::Strict
        );
        assert_eq!(
            inline_quotes(&info("valkey", "9.1.2")),
            InlineQuotes::Joined
        );
        assert_eq!(
            inline_quotes(&info("valkey", "10.0.0")),
            InlineQuotes::Joined
        );
        // Valkey with extended-redis-compatibility says redis 7.2.4.
        assert_eq!(inline_quotes(&info("redis", "7.2.4")), InlineQuotes::Strict);
    }
}
