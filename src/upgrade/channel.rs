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

/// GETs `url` without following redirects: on a redirect the version is
/// the last path element of Location, on 2xx the last one of `url`; `+`
/// becomes `-` (a tag may not contain `+`).
pub async fn resolve(url: &str) -> Result<String, ChannelError> {
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
    let request = http::Request::get(uri)
        .header(http::header::USER_AGENT, "nodewarden")
        .body(Empty::new())
        .map_err(|_| bad())?;
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
