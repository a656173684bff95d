//! Asking Jaeger's query API for the traces a timeline is drawn from.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::jaeger::{TimelineError, Trace, parse_traces, traces_query};
use crate::{REPLACE_NODE, ROLLOUT};

/// How long a request may wait for its answer, and the answer to arrive.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Most traces asked for per operation.
const LIMIT: usize = 10_000;

/// Why Jaeger's traces could not be had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The query API's address and path make no URL.
    #[error("{uri} is not a URL: {source}")]
    Url {
        /// What was asked for.
        uri: String,
        /// Why it is no URL.
        source: http::uri::InvalidUri,
    },
    /// The system's TLS roots could not be loaded (for an https address).
    #[error("loading the system's TLS roots: {0}")]
    TlsRoots(#[source] std::io::Error),
    /// No answer came within the timeout.
    #[error("GET {uri}: no answer within 60 s")]
    NoAnswer {
        /// What was asked for.
        uri: String,
    },
    /// The request failed (connection refused, reset, ...).
    #[error("GET {uri}: {source}")]
    Request {
        /// What was asked for.
        uri: String,
        /// Why it failed.
        source: hyper_util::client::legacy::Error,
    },
    /// The answer began but did not finish within the timeout.
    #[error("GET {uri}: the answer did not finish within 60 s")]
    Unfinished {
        /// What was asked for.
        uri: String,
    },
    /// The answer broke off.
    #[error("reading the answer of {uri}: {source}")]
    Read {
        /// What was asked for.
        uri: String,
        /// Why reading it failed.
        source: hyper::Error,
    },
    /// Jaeger answered with an error status.
    #[error("GET {uri}: {status} {text}")]
    Status {
        /// What was asked for.
        uri: String,
        /// The status.
        status: http::StatusCode,
        /// The start of the answer's body.
        text: String,
    },
    /// The answer is not a list of traces.
    #[error("GET {uri}: {source}")]
    Answer {
        /// What was asked for.
        uri: String,
        /// Why it could not be read.
        source: TimelineError,
    },
}

/// The `replace node` and `rollout` traces of `service` that started
/// between `start` and `end` (µs since the epoch; Jaeger reads these and
/// ignores a `lookback` parameter), from the query API at `jaeger` (where its
/// UI would be, e.g. `http://127.0.0.1:16686`).
pub async fn fetch_traces(
    jaeger: &str,
    service: &str,
    start: u64,
    end: u64,
) -> Result<Vec<Trace>, FetchError> {
    let base = jaeger.trim_end_matches('/');
    let mut traces = Vec::new();
    for operation in [REPLACE_NODE, ROLLOUT] {
        let uri = format!("{base}{}", traces_query(service, operation, start, end, LIMIT));
        let body = get(&uri).await?;
        traces.extend(parse_traces(&body).map_err(|source| FetchError::Answer { uri, source })?);
    }
    Ok(traces)
}

/// GET `uri` (http or https): the body, or why not.
async fn get(uri: &str) -> Result<String, FetchError> {
    let parsed: http::Uri = uri.parse().map_err(|source| FetchError::Url {
        uri: uri.to_string(),
        source,
    })?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(FetchError::TlsRoots)?
        .https_or_http()
        .enable_http1()
        .build();
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let uri = uri.to_string();
    let response = match tokio::time::timeout(TIMEOUT, client.get(parsed)).await {
        Err(_) => return Err(FetchError::NoAnswer { uri }),
        Ok(Err(source)) => return Err(FetchError::Request { uri, source }),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    let body = match tokio::time::timeout(TIMEOUT, response.into_body().collect()).await {
        Err(_) => return Err(FetchError::Unfinished { uri }),
        Ok(Err(source)) => return Err(FetchError::Read { uri, source }),
        Ok(Ok(body)) => body.to_bytes(),
    };
    let text = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        let text = text.chars().take(300).collect();
        return Err(FetchError::Status { uri, status, text });
    }
    Ok(text)
}
