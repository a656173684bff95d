//! Resolving a Plan's channel: a URL that answers 302 with the latest
//! release in its Location (GitHub's `releases/latest` contract).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Why a channel did not give a version.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Not a URL nodewarden can request.
    #[error("channel {url:?} is not a valid http(s) URL")]
    BadUrl {
        /// The channel.
        url: String,
    },
    /// No answer (connection, TLS, timeout).
    #[error("channel {url}: {reason}")]
    Unreachable {
        /// The channel.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// An answer that names no version.
    #[error("channel {url}: unexpected response {status}")]
    Unexpected {
        /// The channel.
        url: String,
        /// The HTTP status.
        status: u16,
    },
}

/// How long one resolution may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What a channel is told about who asks, in upstream's headers: channel
/// servers (k3s's and rke2's among them) may answer by cluster and by the
/// version it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asker {
    /// `X-SUC-Cluster-ID`: the UID of the `kube-system` namespace.
    pub cluster_id: Option<String>,
    /// `X-SUC-Latest-Version`: the plan's last resolved version.
    pub latest_version: Option<String>,
}

impl Asker {
    /// The headers sent, empty values left out (as upstream).
    pub fn headers(&self) -> Vec<(&'static str, &str)> {
        [
            ("X-SUC-Cluster-ID", &self.cluster_id),
            ("X-SUC-Latest-Version", &self.latest_version),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_deref().filter(|v| !v.is_empty()).map(|v| (name, v)))
        .collect()
    }
}

/// GETs `url` without following redirects: on a redirect the version is
/// the last path element of Location, on 2xx the last one of `url`; `+`
/// becomes `-` (a tag may not contain `+`).
pub async fn resolve(url: &str, asker: &Asker) -> Result<String, ChannelError> {
    let bad = || ChannelError::BadUrl { url: url.to_string() };
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| ChannelError::Unreachable {
            url: url.to_string(),
            reason: format!("no TLS roots: {e}"),
        })?
        .https_or_http()
        .enable_http1()
        .build();
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let mut request = http::Request::get(uri).header(http::header::USER_AGENT, "nodewarden");
    for (name, value) in asker.headers() {
        request = request.header(name, value);
    }
    let request = request.body(Empty::new()).map_err(|_| bad())?;
    let unreachable = |reason: String| ChannelError::Unreachable {
        url: url.to_string(),
        reason,
    };
    let response = tokio::time::timeout(TIMEOUT, client.request(request))
        .await
        .map_err(|_| unreachable(format!("no answer within {TIMEOUT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    let status = response.status();
    let location = response
        .headers()
        .get(http::header::LOCATION)
        .and_then(|l| l.to_str().ok());
    version_from(url, status.as_u16(), location).ok_or(ChannelError::Unexpected {
        url: url.to_string(),
        status: status.as_u16(),
    })
}

/// The version an answer names (pure half of [`resolve`]).
pub fn version_from(url: &str, status: u16, location: Option<&str>) -> Option<String> {
    let source = match status {
        301 | 302 | 303 | 307 | 308 => location?,
        200..=299 => url,
        _ => return None,
    };
    let without_query = source.split(['?', '#']).next().unwrap_or_default();
    // Only the path counts: drop scheme and host ("https://example.com" has no path element).
    let path = match without_query.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map(|(_, p)| p).unwrap_or_default(),
        None => without_query,
    };
    let last = path.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
    if last.is_empty() {
        return None;
    }
    Some(munge(last))
}

/// `+` becomes `-`: `v1.2.3+k3s1` → `v1.2.3-k3s1`.
pub fn munge(version: &str) -> String {
    version.replace('+', "-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A channel server on loopback: it answers one request with a
    /// redirect and hands back the request it read.
    async fn channel_server() -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("an address");
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("a connection");
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let answer =
                "HTTP/1.1 302 Found\r\nLocation: /releases/tag/v1.31.2+k3s1\r\nContent-Length: 0\r\n\r\n";
            conn.write_all(answer.as_bytes()).await.expect("write");
            String::from_utf8_lossy(&request).to_lowercase()
        });
        (format!("http://{addr}/v1-release/channels/stable"), served)
    }

    #[tokio::test]
    async fn a_channel_is_told_the_cluster_and_the_version_it_runs() {
        let (url, served) = channel_server().await;
        let asker = Asker {
            cluster_id: Some("0b5a-uid".into()),
            latest_version: Some("v1.30.1-k3s1".into()),
        };
        let version = resolve(&url, &asker).await.expect("a version");
        assert_eq!(version, "v1.31.2-k3s1");
        let request = served.await.expect("served");
        assert!(request.contains("x-suc-cluster-id: 0b5a-uid\r\n"), "{request}");
        assert!(
            request.contains("x-suc-latest-version: v1.30.1-k3s1\r\n"),
            "{request}"
        );

        let (url, served) = channel_server().await;
        let asker = Asker {
            cluster_id: Some(String::new()),
            latest_version: None,
        };
        resolve(&url, &asker).await.expect("a version");
        let request = served.await.expect("served");
        assert!(
            !request.contains("x-suc-"),
            "empty values are not sent: {request}"
        );
    }

    #[test]
    fn versions_from_answers() {
        let url = "https://update.k3s.io/v1-release/channels/stable";
        let table = [
            (
                302,
                Some("https://github.com/k3s-io/k3s/releases/tag/v1.2.3+k3s1"),
                Some("v1.2.3-k3s1"),
            ),
            (302, Some("/releases/tag/v0.9.0?x=1"), Some("v0.9.0")),
            (307, Some("https://x/tags/v2/"), Some("v2")),
            (200, None, Some("stable")),
            (302, None, None),
            (404, None, None),
            (500, Some("https://x/v1"), None),
            (302, Some("https://example.com"), None),
        ];
        for (status, location, want) in table {
            assert_eq!(
                version_from(url, status, location).as_deref(),
                want,
                "{status} {location:?}"
            );
        }
    }
}
