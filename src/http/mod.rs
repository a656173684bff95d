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

/// Binds `addr` and serves until `shutdown` is cancelled. Returns the bound
/// address (useful with port 0) and the serving future.
pub async fn bind(
    addr: SocketAddr,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()>)> {
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
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let response = respond(&state, &req);
                    async move { Ok::<_, Infallible>(response) }
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
