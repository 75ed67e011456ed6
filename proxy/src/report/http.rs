//! The HTTP endpoint (`--metrics-listen`): `/metrics` (Prometheus text
//! format), `/healthz` (the process answers) and `/readyz` (200 once the
//! upstream topology is known, every slot is served and no master's latest
//! reply was BUSY, LOADING or MASTERDOWN; 503 with a one-line reason
//! otherwise, e.g. `upstream 127.0.0.1:7000 busy: BUSY Redis is busy …`)
//! and `/debug/hotkeys?by=reads|misses|writes&n=20[&db=0]` (JSON, see
//! [`crate::metrics::hotkeys::to_json`]). HTTP/1.1 only, GET and HEAD only, nothing else.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::report::export::Exporter;

/// Serves the endpoint on `listener` until `stop` is cancelled.
pub async fn serve(listener: TcpListener, exporter: Arc<Exporter>, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let exporter = Arc::clone(&exporter);
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let exporter = Arc::clone(&exporter);
                async move { Ok::<_, Infallible>(respond(&exporter, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                r = conn => if let Err(e) = r {
                    debug!(error = %e, "metrics endpoint: connection");
                },
                _ = stop.cancelled() => {}
            }
        });
    }
}

fn respond(exporter: &Exporter, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
    }
    match req.uri().path() {
        "/metrics" => match exporter.encode() {
            Ok(body) => {
                let mut r = text(StatusCode::OK, body);
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(prometheus::TEXT_FORMAT),
                );
                r
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        },
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/debug/hotkeys" => match exporter.hotkeys(req.uri().query()) {
            Ok(body) => {
                let mut r = text(StatusCode::OK, body);
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                r
            }
            Err((status, why)) => text(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                format!("{why}\n"),
            ),
        },
        "/readyz" => match exporter.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz or /debug/hotkeys\n".into(),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
