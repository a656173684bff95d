//! The `sim` provider: talks to `nodewarden-simcloud` over HTTP exactly as a
//! real provider talks to its cloud — every call has a timeout, 5xx and 429
//! come back as retryable errors, 404 as [`CloudError::NotFound`], and
//! nothing is retried inside (the caller's backoff decides).
//!
//! It speaks only the protocol in [`wire`] (the `nodewarden-simwire` crate);
//! the simulator itself (the `nodewarden-simcloud` crate and binary) is
//! another process and nothing of it is imported here.

pub use nodewarden_simwire as wire;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use serde::de::DeserializeOwned;

use self::wire::{CreateBody, ErrorBody, Faults, ImageBody, InstanceView, MAX_STATES, parse_provider_id};
use super::{
    CloudError, CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, InstanceState, ScalingGroup,
};

/// Default limit for one call, answer included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of one sim-cloud.
#[derive(Clone, Debug)]
pub struct SimProvider {
    /// `http://host:port`, without a trailing slash.
    endpoint: String,
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl SimProvider {
    /// A provider for the sim-cloud at `endpoint` (`http://127.0.0.1:34567`,
    /// or just `127.0.0.1:34567`).
    pub fn new(endpoint: &str) -> Result<SimProvider, CloudError> {
        let endpoint = endpoint.trim_end_matches('/');
        let endpoint = if endpoint.contains("://") {
            endpoint.to_string()
        } else {
            format!("http://{endpoint}")
        };
        let uri: Uri = endpoint
            .parse()
            .map_err(|e| CloudError::Config(format!("invalid sim-cloud endpoint {endpoint:?}: {e}")))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err(CloudError::Config(format!(
                "the sim-cloud endpoint must be http://host:port, not {endpoint:?}"
            )));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Ok(SimProvider {
            endpoint,
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Limits every call to `timeout` (connect, request and answer).
    pub fn with_timeout(mut self, timeout: Duration) -> SimProvider {
        self.timeout = timeout;
        self
    }

    /// Every instance the sim-cloud ever had (not a provider call; for tests
    /// that prove nothing leaked).
    pub async fn list_instances(&self) -> Result<Vec<InstanceView>, CloudError> {
        self.call(Method::GET, "/instances", None::<&()>).await
    }

    /// The sim-cloud's injected faults (a test control, not a provider call).
    pub async fn faults(&self) -> Result<Faults, CloudError> {
        self.call(Method::GET, "/faults", None::<&()>).await
    }

    /// Replaces the sim-cloud's injected faults (a test control, not a
    /// provider call; `Faults::default()` switches them all off).
    pub async fn set_faults(&self, faults: &Faults) -> Result<Faults, CloudError> {
        self.call(Method::POST, "/faults", Some(faults)).await
    }

    /// One instance by its provider ID, checked to be of the named group.
    pub async fn instance(&self, provider_id: &str) -> Result<InstanceView, CloudError> {
        let (group, name) = split(provider_id)?;
        let view: InstanceView = self
            .call(Method::GET, &format!("/instances/{name}"), None::<&()>)
            .await?;
        if view.instance.group != group {
            return Err(CloudError::NotFound {
                what: format!("instance {name} in group {group}"),
            });
        }
        Ok(view)
    }

    /// One HTTP exchange with a JSON answer, under the timeout.
    async fn call<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, CloudError> {
        let what = format!("{method} {path}");
        let exchange = self.exchange(method, path, body);
        let (status, retry_after, bytes) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CloudError::Timeout { after: self.timeout })??;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| CloudError::InvalidResponse(format!("{what}: {e}")));
        }
        let message = serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|b| b.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
        Err(error_for(status, retry_after, &what, message))
    }

    async fn exchange<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, Option<Duration>, Bytes), CloudError> {
        let body = match body {
            Some(b) => serde_json::to_vec(b)
                .map_err(|e| CloudError::InvalidResponse(format!("encoding the request: {e}")))?,
            None => Vec::new(),
        };
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.endpoint))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CloudError::Transport(format!("building the request: {e}")))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| CloudError::Transport(format!("{e:#}")))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| CloudError::Transport(format!("reading the answer: {e}")))?
            .to_bytes();
        Ok((status, retry_after, bytes))
    }
}

/// Maps a failed answer onto the provider-neutral errors.
fn error_for(status: StatusCode, retry_after: Option<Duration>, what: &str, message: String) -> CloudError {
    match status {
        StatusCode::NOT_FOUND => CloudError::NotFound {
            what: format!("{what} ({message})"),
        },
        StatusCode::TOO_MANY_REQUESTS => CloudError::Throttled { retry_after },
        s if s.is_server_error() => CloudError::Server {
            status: s.as_u16(),
            message,
        },
        s => CloudError::Rejected {
            status: s.as_u16(),
            message,
        },
    }
}

fn split(provider_id: &str) -> Result<(&str, &str), CloudError> {
    parse_provider_id(provider_id).ok_or_else(|| CloudError::InvalidProviderId {
        provider_id: provider_id.to_string(),
        reason: "expected sim://<group>/<instance>".into(),
    })
}

impl CloudProvider for SimProvider {
    fn name(&self) -> &str {
        "sim"
    }

    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        Box::pin(async move {
            let body = CreateBody {
                request_id: request.request_id.clone(),
            };
            let path = format!("/groups/{}/instances", request.group_id);
            let view: InstanceView = self.call(Method::POST, &path, Some(&body)).await?;
            Ok(CreatedNode {
                node_name: view.instance.name,
                provider_id: view.provider_id,
                image: Some(view.instance.image),
            })
        })
    }

    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            // Checks the group first: never delete an instance by a
            // provider ID that names another group.
            let view = self.instance(provider_id).await?;
            let path = format!("/instances/{}", view.instance.name);
            let _: InstanceView = self.call(Method::DELETE, &path, None::<&()>).await?;
            Ok(())
        })
    }

    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        Box::pin(async move { Ok(self.instance(provider_id).await?.state) })
    }

    fn states_per_call(&self) -> usize {
        MAX_STATES
    }

    fn node_states<'a>(
        &'a self,
        provider_ids: &'a [String],
    ) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
        Box::pin(async move {
            // By instance name: two IDs may name one instance in two groups.
            let mut wanted: BTreeMap<&str, Vec<(&str, &String)>> = BTreeMap::new();
            for id in provider_ids {
                let (group, name) = split(id)?;
                wanted.entry(name).or_default().push((group, id));
            }
            if wanted.is_empty() {
                return Ok(BTreeMap::new());
            }
            let names: Vec<&str> = wanted.keys().copied().collect();
            let path = format!("/states?names={}", names.join(","));
            let views: Vec<InstanceView> = self.call(Method::GET, &path, None::<&()>).await?;
            // An instance of another group than its provider ID names is
            // not the one asked about.
            let mut states = BTreeMap::new();
            for view in views {
                let asked = wanted.get(view.instance.name.as_str()).into_iter().flatten();
                for (_, id) in asked.filter(|(group, _)| *group == view.instance.group) {
                    states.insert((*id).clone(), view.state);
                }
            }
            Ok(states)
        })
    }

    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move { Ok(self.instance(provider_id).await?.instance.image) })
    }

    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move { Ok(self.instance(provider_id).await?.instance.group) })
    }

    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move {
            let path = format!("/groups/{group_id}/image");
            let body: ImageBody = self.call(Method::GET, &path, None::<&()>).await?;
            Ok(body.image)
        })
    }

    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let path = format!("/groups/{group_id}/image");
            let body = ImageBody {
                image: image.to_string(),
            };
            let _: ImageBody = self.call(Method::PUT, &path, Some(&body)).await?;
            Ok(())
        })
    }

    fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
        Box::pin(async move { self.call(Method::GET, "/groups", None::<&()>).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_map_to_retryable_and_final_errors() {
        let throttled = error_for(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(3)),
            "GET /x",
            String::new(),
        );
        assert!(throttled.retryable());
        assert_eq!(throttled.retry_after(), Some(Duration::from_secs(3)));
        let server = error_for(StatusCode::SERVICE_UNAVAILABLE, None, "GET /x", "down".into());
        assert!(server.retryable());
        let missing = error_for(StatusCode::NOT_FOUND, None, "GET /x", "gone".into());
        assert!(missing.is_not_found() && !missing.retryable());
        let bad = error_for(StatusCode::BAD_REQUEST, None, "PUT /x", "empty".into());
        assert!(matches!(bad, CloudError::Rejected { status: 400, .. }));
    }

    #[test]
    fn endpoints_and_provider_ids_are_checked() {
        assert!(SimProvider::new("127.0.0.1:1").is_ok());
        assert!(SimProvider::new("http://127.0.0.1:1/").is_ok());
        assert!(SimProvider::new("https://127.0.0.1:1").is_err());
        assert!(matches!(
            split("aws:///zone/i-1"),
            Err(CloudError::InvalidProviderId { .. })
        ));
        assert_eq!(split("sim://g/g-00001").ok(), Some(("g", "g-00001")));
    }

    #[tokio::test]
    async fn an_unreachable_cloud_is_a_retryable_error() {
        // A port nothing listens on: bind one, then free it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let provider = SimProvider::new(&format!("127.0.0.1:{port}"))
            .expect("a valid endpoint")
            .with_timeout(Duration::from_secs(2));
        let err = provider.list_groups().await.expect_err("nobody listens");
        assert!(err.retryable(), "{err}");
    }

    #[test]
    fn the_provider_is_object_safe() {
        let provider: std::sync::Arc<dyn CloudProvider> =
            std::sync::Arc::new(SimProvider::new("127.0.0.1:1").expect("a valid endpoint"));
        assert_eq!(provider.name(), "sim");
    }
}
