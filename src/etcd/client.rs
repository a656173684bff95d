//! A small etcd client over etcd's v3 JSON gateway (HTTPS with client
//! certificates, or plain HTTP): the member list, a member's removal and a
//! member's health. Three calls do not justify a gRPC stack; hyper and
//! rustls are there already.
//!
//! The certificate files are read for every operation, not once: a Secret
//! mount or kubeadm's renewal replaces them in place, and control-plane
//! retirements are rare.
//!
//! A rollout replaces every member the endpoints name, so the client URLs of
//! the members last listed are tried first, then the configured endpoints.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use serde_json::json;

use super::rules::{Health, Member};
use crate::runtime::error::{Categorized, Category};

/// Default limit of one call to etcd, answer included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How nodewarden reaches etcd.
#[derive(Clone, Debug, Default)]
pub struct EtcdConfig {
    /// Client URLs (`https://10.0.0.2:2379`), tried in order.
    pub endpoints: Vec<String>,
    /// The CA that signed etcd's serving certificates (PEM).
    pub ca: Option<PathBuf>,
    /// nodewarden's client certificate (PEM).
    pub cert: Option<PathBuf>,
    /// Its key (PEM).
    pub key: Option<PathBuf>,
    /// Limit of one call; [`DEFAULT_TIMEOUT`] when zero.
    pub timeout: Duration,
}

/// An etcd call that failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The configuration cannot be used (flags, certificate files).
    #[error("etcd configuration: {0}")]
    Config(String),
    /// No endpoint served the request (each one's failure listed).
    #[error("etcd: no endpoint served the request: {0}")]
    Unreachable(String),
    /// etcd refused a membership change for its own health check: a member
    /// is down, or joined or came back moments ago (`--strict-reconfig-check`).
    #[error("etcd refused the change: {0}")]
    ClusterUnhealthy(String),
    /// etcd refused or failed the request.
    #[error("etcd {what}: HTTP {status}: {message}")]
    Refused {
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// etcd's message.
        message: String,
    },
    /// An answer that is not what the gateway sends.
    #[error("etcd {what}: unexpected answer: {reason}")]
    Decode {
        /// The request.
        what: String,
        /// What did not parse.
        reason: String,
    },
}

/// Every etcd failure's category for Events and the error metric.
pub const CATEGORY: Category = Category::App("EtcdError");

impl Categorized for EtcdError {
    fn category(&self) -> Category {
        CATEGORY
    }
}

/// What a removal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    /// This call removed the member.
    Now,
    /// etcd no longer knew the ID: removed before (by an earlier call that
    /// landed late, or by someone else).
    Already,
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The client (see the module docs).
#[derive(Clone, Debug)]
pub struct EtcdClient {
    config: EtcdConfig,
    endpoints: Vec<Uri>,
    /// The client URLs of the started members last listed.
    learned: Arc<std::sync::Mutex<Vec<Uri>>>,
}

/// The gateway's JSON (proto3 mapping: 64-bit integers as strings, fields
/// at their default left out).
#[derive(Deserialize)]
struct MemberList {
    #[serde(default)]
    members: Vec<WireMember>,
}

#[derive(Deserialize)]
struct WireMember {
    #[serde(rename = "ID", deserialize_with = "u64_text")]
    id: u64,
    #[serde(default)]
    name: String,
    #[serde(default, rename = "peerURLs")]
    peer_urls: Vec<String>,
    #[serde(default, rename = "clientURLs")]
    client_urls: Vec<String>,
    #[serde(default, rename = "isLearner")]
    is_learner: bool,
}

#[derive(Deserialize)]
struct HealthAnswer {
    health: String,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct GatewayError {
    #[serde(default)]
    code: i32,
    #[serde(default)]
    message: String,
}

/// gRPC's NOT_FOUND, which etcd answers for an unknown member ID.
const GRPC_NOT_FOUND: i32 = 5;

fn u64_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Number(u64),
    }
    match Either::deserialize(d)? {
        Either::Number(n) => Ok(n),
        Either::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

impl EtcdClient {
    /// A client for `config`, its files read once here so that a wrong path
    /// stops the start rather than the first control-plane retirement.
    pub fn new(config: EtcdConfig) -> Result<EtcdClient, EtcdError> {
        if config.endpoints.is_empty() {
            return Err(EtcdError::Config("no etcd endpoint given".into()));
        }
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| {
                e.trim_end_matches('/')
                    .parse::<Uri>()
                    .ok()
                    .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some())
                    .ok_or_else(|| EtcdError::Config(format!("{e:?} is not an http(s)://host:port URL")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = EtcdClient {
            config,
            endpoints,
            learned: Default::default(),
        };
        client.http()?;
        Ok(client)
    }

    /// The endpoints, for logs.
    pub fn endpoints(&self) -> &[String] {
        &self.config.endpoints
    }

    fn timeout(&self) -> Duration {
        if self.config.timeout.is_zero() {
            DEFAULT_TIMEOUT
        } else {
            self.config.timeout
        }
    }

    /// An HTTP client with the certificates as the files hold them now.
    fn http(&self) -> Result<HttpClient, EtcdError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| EtcdError::Config(format!("reading {}: {e}", path.display())))
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| EtcdError::Config(e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &self.config.ca {
            for cert in CertificateDer::pem_slice_iter(&read(ca)?) {
                let cert = cert.map_err(|e| EtcdError::Config(format!("{}: {e}", ca.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| EtcdError::Config(format!("{}: {e}", ca.display())))?;
            }
        }
        let builder = builder.with_root_certificates(roots);
        let tls = match (&self.config.cert, &self.config.key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_slice_iter(&read(cert)?)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| EtcdError::Config(format!("{}: {e}", cert.display())))?;
                let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
                    .map_err(|e| EtcdError::Config(format!("{}: {e}", key.display())))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| EtcdError::Config(format!("client certificate: {e}")))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(EtcdError::Config(
                    "a client certificate needs its key, and a key its certificate".into(),
                ));
            }
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(self.timeout()));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Client::builder(TokioExecutor::new()).build(https))
    }

    /// One exchange under the timeout: the status and the body.
    async fn exchange(
        &self,
        http: &HttpClient,
        method: Method,
        uri: Uri,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, Bytes), String> {
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = http.request(request).await.map_err(|e| error_chain(&e))?;
            let status = response.status().as_u16();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, bytes))
        };
        tokio::time::timeout(self.timeout(), exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout()))?
    }

    /// POSTs `body` to `path` on the first endpoint that answers.
    async fn call(&self, path: &str, body: serde_json::Value) -> Result<Bytes, EtcdError> {
        let http = self.http()?;
        let mut failures = Vec::new();
        let mut endpoints = self.learned.lock().unwrap_or_else(|e| e.into_inner()).clone();
        endpoints.extend(
            self.endpoints
                .iter()
                .filter(|e| !endpoints.contains(e))
                .cloned()
                .collect::<Vec<_>>(),
        );
        for endpoint in &endpoints {
            let uri = with_path(endpoint, path)?;
            match self.exchange(&http, Method::POST, uri, Some(body.clone())).await {
                Ok((200, bytes)) => return Ok(bytes),
                Ok((status, bytes)) => {
                    let answer: Option<GatewayError> = serde_json::from_slice(&bytes).ok();
                    // The leader's verdict: every endpoint would forward to it.
                    if let Some(a) = answer
                        .as_ref()
                        .filter(|a| a.message.contains("unhealthy cluster"))
                    {
                        return Err(EtcdError::ClusterUnhealthy(a.message.clone()));
                    }
                    if answer.as_ref().is_some_and(|a| a.code == GRPC_NOT_FOUND) {
                        return Err(EtcdError::Refused {
                            what: path.into(),
                            status: 404,
                            message: answer.map(|a| a.message).unwrap_or_default(),
                        });
                    }
                    // Another member may serve it (one without a leader answers 503).
                    failures.push(format!(
                        "{endpoint}: HTTP {status}: {}",
                        answer
                            .map(|a| a.message)
                            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(200).collect())
                    ));
                }
                Err(e) => failures.push(format!("{endpoint}: {e}")),
            }
        }
        Err(EtcdError::Unreachable(failures.join("; ")))
    }

    /// The members, as a linearizable read (not a member's possibly stale view).
    pub async fn members(&self) -> Result<Vec<Member>, EtcdError> {
        let path = "/v3/cluster/member/list";
        let bytes = self.call(path, json!({"linearizable": true})).await?;
        let list: MemberList = serde_json::from_slice(&bytes).map_err(|e| EtcdError::Decode {
            what: path.into(),
            reason: e.to_string(),
        })?;
        let learned: Vec<Uri> = list
            .members
            .iter()
            .flat_map(|m| &m.client_urls)
            .filter_map(|u| u.trim_end_matches('/').parse().ok())
            .collect();
        *self.learned.lock().unwrap_or_else(|e| e.into_inner()) = learned;
        Ok(list
            .members
            .into_iter()
            .map(|m| Member {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect())
    }

    /// Removes the member with this ID. By ID, never by name or URL: etcd
    /// never reuses an ID, so a removal that lands late finds it gone and
    /// removes nothing else.
    pub async fn remove_member(&self, id: u64) -> Result<Removed, EtcdError> {
        match self
            .call("/v3/cluster/member/remove", json!({"ID": id.to_string()}))
            .await
        {
            Ok(_) => Ok(Removed::Now),
            Err(EtcdError::Refused { status: 404, .. }) => Ok(Removed::Already),
            Err(e) => Err(e),
        }
    }

    /// Whether `member` answers healthy on one of its client URLs (etcd's
    /// `/health`: it has a leader, no alarm, and serves a quorum read).
    pub async fn health(&self, member: &Member) -> Health {
        if member.client_urls.is_empty() {
            return Health::Unhealthy("not started (no client URL)".into());
        }
        let http = match self.http() {
            Ok(h) => h,
            Err(e) => return Health::Unhealthy(e.to_string()),
        };
        let mut failures = Vec::new();
        for url in &member.client_urls {
            let uri = match url.trim_end_matches('/').parse::<Uri>() {
                Ok(base) => match with_path(&base, "/health") {
                    Ok(u) => u,
                    Err(e) => {
                        failures.push(e.to_string());
                        continue;
                    }
                },
                Err(e) => {
                    failures.push(format!("{url}: {e}"));
                    continue;
                }
            };
            match self.exchange(&http, Method::GET, uri, None).await {
                Ok((status, bytes)) => match serde_json::from_slice::<HealthAnswer>(&bytes) {
                    Ok(a) if status == 200 && a.health == "true" => return Health::Healthy,
                    Ok(a) => failures.push(
                        format!("{url}: health {} {}", a.health, a.reason)
                            .trim()
                            .to_string(),
                    ),
                    Err(_) => failures.push(format!("{url}: HTTP {status}")),
                },
                Err(e) => failures.push(format!("{url}: {e}")),
            }
        }
        Health::Unhealthy(failures.join("; "))
    }

    /// The health of each of `members`, checked side by side.
    pub async fn health_of(&self, members: &[&Member]) -> BTreeMap<u64, Health> {
        let checks = members
            .iter()
            .map(|m| async move { (m.id, self.health(m).await) });
        futures::future::join_all(checks).await.into_iter().collect()
    }
}

/// `base` with `path` as its path.
fn with_path(base: &Uri, path: &str) -> Result<Uri, EtcdError> {
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        path.parse()
            .map_err(|e| EtcdError::Config(format!("{path}: {e}")))?,
    );
    Uri::from_parts(parts).map_err(|e| EtcdError::Config(format!("{base}{path}: {e}")))
}

/// An error with its causes (hyper's own message is only "client error").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_member_list_is_read() {
        let answer = br#"{"header":{"cluster_id":"1","member_id":"2","raft_term":"3"},
            "members":[{"ID":"12297829382473034410","name":"m1","peerURLs":["https://10.0.0.2:2380"],
            "clientURLs":["https://10.0.0.2:2379"]},{"ID":"17","peerURLs":["https://10.0.0.5:2380"],"isLearner":true}]}"#;
        let list: MemberList = serde_json::from_slice(answer).expect("a member list");
        assert_eq!(list.members.len(), 2);
        assert_eq!(list.members[0].id, 12297829382473034410);
        assert_eq!(
            list.members[0].client_urls,
            vec!["https://10.0.0.2:2379".to_string()]
        );
        assert!(list.members[1].name.is_empty() && list.members[1].is_learner);
    }

    #[test]
    fn endpoints_must_be_http_urls() {
        let config = |e: &str| EtcdConfig {
            endpoints: vec![e.into()],
            ..Default::default()
        };
        assert!(EtcdClient::new(config("http://127.0.0.1:2379")).is_ok());
        assert!(EtcdClient::new(config("127.0.0.1:2379")).is_err());
        assert!(EtcdClient::new(config("ftp://127.0.0.1:2379")).is_err());
        assert!(EtcdClient::new(EtcdConfig::default()).is_err());
        let missing = EtcdConfig {
            ca: Some("/nonexistent/ca.crt".into()),
            ..config("https://127.0.0.1:2379")
        };
        assert!(matches!(EtcdClient::new(missing), Err(EtcdError::Config(_))));
    }
}
