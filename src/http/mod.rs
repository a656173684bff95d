//! The hyper server for `/healthz`, `/readyz` and `/metrics`.
//!
//! `/healthz` answers 200 while the process serves at all. `/readyz` answers
//! 200 once every store has its first full list — a standby replica with warm
//! stores is ready too, so a rolling update of the Deployment never waits for
//! leadership. `/metrics` serves OpenMetrics text.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    bind_with(addr, shutdown, move |req: Request<Incoming>| {
        let response = respond(&state, &req);
        async move { response }
    })
    .await
}

/// Binds `addr` and answers every HTTP/1.1 request with `handler` until
/// `shutdown` is cancelled (the operator's endpoints and the sim-cloud's API).
pub async fn bind_with<F, Fut>(
    addr: SocketAddr,
    shutdown: CancellationToken,
    handler: F,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()>)>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let serve = async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an HTTP connection failed");
                        continue;
                    }
                },
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let answer = handler(req);
                    async move { Ok::<_, Infallible>(answer.await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
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
}
