//! One HTTP client for every call of the clouds' providers: the APIs over
//! TLS (rustls with ring, the system's roots), metadata services and local
//! credential endpoints over plain HTTP. Each call has a deadline; nothing
//! retries here (the work queue's backoff does).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::CloudError;

/// An answer: its status, headers and body.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The answer's headers (Retry-After, the clouds' operation links).
    pub headers: http::HeaderMap,
    /// The body as text.
    pub body: String,
}

impl Reply {
    /// A header's value as text, when it has one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The client, cheap to clone.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Http {
    /// A client whose connections are given up after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Result<Http, CloudError> {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(connect_timeout));
        tcp.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| CloudError::Config(format!("no TLS roots for the cloud's endpoints: {e}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        Ok(Http {
            client: Client::builder(TokioExecutor::new()).build(https),
        })
    }

    /// Sends one request and reads its whole answer within `deadline`.
    pub async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
        deadline: Duration,
    ) -> Result<Reply, CloudError> {
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| CloudError::Transport(transport_reason(&e)))?;
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| CloudError::Transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok(Reply {
                status,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(deadline, exchange)
            .await
            .map_err(|_| CloudError::Timeout { after: deadline })?
    }
}

/// The innermost cause of a failed exchange (hyper's own text says only
/// "client error (Connect)").
fn transport_reason(e: &hyper_util::client::legacy::Error) -> String {
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        reason = format!("{reason}: {cause}");
        source = cause.source();
    }
    reason
}
