//! The hyper server for `/healthz`, `/readyz` and `/metrics`.
//!
//! `/healthz` answers 200 while the process serves at all. `/readyz` answers
//! 200 once every store has its first full list — a standby replica with warm
//! stores is ready too, so a rolling update of the Deployment never waits for
//! leadership. `/metrics` serves OpenMetrics text.
//!
//! Every connection is held to [`ConnLimits::ENDPOINTS`] ([`conn`]): a cap on
//! connections, a head read and idle timeout, a head size limit and a write
//! timeout, so no client can hold this port's descriptors or memory.

pub mod conn;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use conn::ConnLimits;

use crate::telemetry::Metrics;

/// What the endpoints report on.
#[derive(Clone)]
pub struct HttpState {
    /// The metrics `/metrics` serves.
    pub metrics: Metrics,
    /// True once the replica can do its job (stores synced).
    pub ready: Arc<dyn Fn() -> bool + Send + Sync>,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn respond(state: &HttpState, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok".to_string()),
        (&Method::GET, "/readyz") if (state.ready)() => (StatusCode::OK, "text/plain", "ok".to_string()),
        (&Method::GET, "/readyz") => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "caches not synced".to_string(),
        ),
        (&Method::GET, "/metrics") => (StatusCode::OK, OPENMETRICS, state.metrics.encode()),
        (&Method::GET, _) => (StatusCode::NOT_FOUND, "text/plain", "not found".to_string()),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed".to_string(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

/// Binds `addr` and serves /healthz, /readyz and /metrics until `shutdown`
/// is cancelled. Returns the bound address (useful with port 0) and the
/// serving future.
pub async fn bind(
    addr: SocketAddr,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()>)> {
    bind_with(
        addr,
        ConnLimits::ENDPOINTS,
        shutdown,
        move |req: Request<Incoming>| {
            let response = respond(&state, &req);
            async move { response }
        },
    )
    .await
}

/// Binds `addr` and answers every HTTP/1.1 request with `handler` until
/// `shutdown` is cancelled, each connection held to `limits` (the operator's
/// endpoints and the sim-cloud's API).
pub async fn bind_with<F, Fut>(
    addr: SocketAddr,
    limits: ConnLimits,
    shutdown: CancellationToken,
    handler: F,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()>)>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let slots = conn::Slots::new(limits.max_connections);
    let serve = async move {
        while let Some(stream) = conn::accept(&listener, &shutdown).await {
            let Some(slot) = slots.take() else {
                // Dropped: closed at once.
                tracing::debug!(addr = %local, "too many HTTP connections: closing a new one");
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = service_fn(move |req| {
                    let answer = handler(req);
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let conn = limits.http1().serve_connection(limits.io(stream), service);
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "HTTP connection ended with an error");
                }
            });
        }
    };
    Ok((local, serve))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connecting");
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("writing");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("reading");
        let text = String::from_utf8_lossy(&raw).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let content_type = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-type: ")
                    .map(str::to_string)
            })
            .unwrap_or_default();
        (status, content_type, body.to_string())
    }

    #[tokio::test]
    async fn endpoints_answer_health_readiness_and_metrics() {
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let metrics = Metrics::new();
        metrics.leader.set(1);
        let state = HttpState {
            metrics,
            ready: Arc::new(move || flag.load(Ordering::SeqCst)),
        };
        let shutdown = CancellationToken::new();
        let (addr, serve) = bind(
            "127.0.0.1:0".parse().expect("an address"),
            state,
            shutdown.clone(),
        )
        .await
        .expect("binding");
        let server = tokio::spawn(serve);

        assert_eq!(get(addr, "/healthz").await.0, 200);
        assert_eq!(
            get(addr, "/readyz").await.0,
            503,
            "not ready before the caches synced"
        );
        ready.store(true, Ordering::SeqCst);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        let (status, content_type, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            content_type.starts_with("application/openmetrics-text"),
            "{content_type}"
        );
        assert!(body.contains("nodewarden_leader 1"), "{body}");
        assert!(body.trim_end().ends_with("# EOF"), "OpenMetrics ends with # EOF");
        assert_eq!(get(addr, "/nope").await.0, 404);

        shutdown.cancel();
        server.await.expect("the server stops on shutdown");
    }

    /// A server answering 200 "ok" to everything, held to `limits`.
    async fn serve_ok(limits: ConnLimits) -> (SocketAddr, CancellationToken) {
        let shutdown = CancellationToken::new();
        let (addr, serve) = bind_with(
            "127.0.0.1:0".parse().expect("an address"),
            limits,
            shutdown.clone(),
            |_req: Request<Incoming>| async { Response::new(Full::new(Bytes::from_static(b"ok"))) },
        )
        .await
        .expect("binding");
        tokio::spawn(serve);
        (addr, shutdown)
    }

    /// Reads until the server closes the connection (EOF or a reset); what
    /// arrived before. Panics when it is still open after `patience`.
    async fn read_until_closed(stream: &mut tokio::net::TcpStream, patience: Duration) -> Vec<u8> {
        let mut got = Vec::new();
        let read = tokio::time::timeout(patience, async {
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(
            read.is_ok(),
            "the server kept the connection open for {patience:?}"
        );
        got
    }

    /// One GET on `stream`, kept alive; the status.
    async fn get_kept_alive(stream: &mut tokio::net::TcpStream) -> u16 {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("writing");
        let mut raw = Vec::new();
        let mut buf = [0u8; 1024];
        // "ok" is the whole body: the answer ends with it.
        while !raw.ends_with(b"ok") {
            let n = stream.read(&mut buf).await.expect("reading");
            assert!(
                n > 0,
                "closed before the answer: {}",
                String::from_utf8_lossy(&raw)
            );
            raw.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&raw)
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    const PATIENCE: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn a_connection_past_the_cap_is_closed_at_once() {
        let (addr, shutdown) = serve_ok(ConnLimits {
            max_connections: 2,
            // Long: the first two stay open through the test.
            header_read_timeout: Duration::from_secs(300),
            ..ConnLimits::ENDPOINTS
        })
        .await;
        let connect = || tokio::net::TcpStream::connect(addr);
        let mut first = connect().await.expect("connecting");
        let _second = connect().await.expect("connecting");
        // Accepted in order: the third finds no slot and is closed, unanswered.
        let mut third = connect().await.expect("connecting");
        let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let answer = read_until_closed(&mut third, PATIENCE).await;
        assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
        // The held ones are served as before.
        assert_eq!(get_kept_alive(&mut first).await, 200);
        // A slot is free again once a connection ends.
        drop(first);
        let served = tokio::time::timeout(PATIENCE, async {
            loop {
                if get(addr, "/healthz").await.0 == 200 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(served.is_ok(), "a new connection is served once one ended");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_head_that_never_completes_and_an_idle_connection_are_closed() {
        let (addr, shutdown) = serve_ok(ConnLimits {
            // Long enough for the test's own head on a busy machine.
            header_read_timeout: Duration::from_secs(2),
            ..ConnLimits::ENDPOINTS
        })
        .await;
        let mut partial = tokio::net::TcpStream::connect(addr).await.expect("connecting");
        partial
            .write_all(b"GET /healthz HTTP/1.1\r\nHost:")
            .await
            .expect("writing");
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connecting");
        assert_eq!(get_kept_alive(&mut idle).await, 200, "kept alive after an answer");
        let mut silent = tokio::net::TcpStream::connect(addr).await.expect("connecting");
        for stream in [&mut partial, &mut idle, &mut silent] {
            let rest = read_until_closed(stream, PATIENCE).await;
            // hyper may answer a timed-out head with 408 before closing; never 200.
            assert!(
                !String::from_utf8_lossy(&rest).contains(" 200 "),
                "{}",
                String::from_utf8_lossy(&rest)
            );
        }
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_head_over_the_limit_is_refused() {
        let (addr, shutdown) = serve_ok(ConnLimits::ENDPOINTS).await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connecting");
        let huge = "a".repeat(64 * 1024);
        let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {huge}\r\n\r\n");
        // The server may close before taking it all.
        let _ = stream.write_all(request.as_bytes()).await;
        let answer = read_until_closed(&mut stream, PATIENCE).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        shutdown.cancel();
    }
}
