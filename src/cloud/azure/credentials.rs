//! Where nodewarden's ARM tokens come from, in the order Azure's SDKs look:
//! a client secret (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`,
//! `AZURE_CLIENT_SECRET`), workload identity (the federated token file an
//! AKS or self-managed cluster's webhook mounts: `AZURE_FEDERATED_TOKEN_FILE`
//! with the tenant and client IDs), and last the VM's managed identity from
//! the instance metadata service (with `AZURE_CLIENT_ID` for a
//! user-assigned one) — what Constellation's nodes have. Tokens are fetched
//! again five minutes before they expire.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde::{Deserialize, Deserializer};

use super::super::CloudError;
use super::super::form;
use super::super::http::{Http, Reply};

/// The scope asked of Azure AD: Resource Manager.
pub const SCOPE: &str = "https://management.azure.com/.default";
/// The resource asked of the metadata service.
pub const RESOURCE: &str = "https://management.azure.com/";
/// Azure AD's authority when `AZURE_AUTHORITY_HOST` names none.
pub const AUTHORITY: &str = "https://login.microsoftonline.com";
/// The instance metadata service.
pub const IMDS: &str = "http://169.254.169.254";
/// How long before expiry a token is fetched again.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// How long a token request may take.
const TOKEN_DEADLINE: Duration = Duration::from_secs(10);

/// Where tokens come from.
#[derive(Clone)]
pub enum Source {
    /// An app registration's client secret.
    Secret {
        /// Azure AD's authority (`https://login.microsoftonline.com`).
        authority: String,
        /// The tenant.
        tenant: String,
        /// The app's client ID.
        client_id: String,
        /// Its secret.
        secret: String,
    },
    /// Workload identity: a Kubernetes service account token exchanged for
    /// the federated app's.
    Workload {
        /// Azure AD's authority.
        authority: String,
        /// The tenant.
        tenant: String,
        /// The federated app's (or managed identity's) client ID.
        client_id: String,
        /// The projected service account token, read at every fetch.
        token_file: PathBuf,
    },
    /// The VM's managed identity.
    Managed {
        /// The metadata service's base URL.
        endpoint: String,
        /// A user-assigned identity's client ID; None: the system-assigned one.
        client_id: Option<String>,
    },
}

impl std::fmt::Debug for Source {
    // Never the secret in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Secret {
                tenant, client_id, ..
            } => write!(f, "client secret of {client_id} in {tenant}"),
            Source::Workload {
                tenant,
                client_id,
                token_file,
                ..
            } => {
                write!(
                    f,
                    "workload identity {client_id} in {tenant} ({})",
                    token_file.display()
                )
            }
            Source::Managed { client_id, .. } => write!(f, "managed identity {client_id:?}"),
        }
    }
}

impl Source {
    /// The source the environment (`var`) names, in the SDKs' order.
    pub fn choose(var: &dyn Fn(&str) -> Option<String>) -> Source {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let authority = set("AZURE_AUTHORITY_HOST").unwrap_or_else(|| AUTHORITY.into());
        let authority = authority.trim_end_matches('/').to_string();
        let (tenant, client_id) = (set("AZURE_TENANT_ID"), set("AZURE_CLIENT_ID"));
        if let (Some(tenant), Some(client_id)) = (tenant.clone(), client_id.clone()) {
            if let Some(secret) = set("AZURE_CLIENT_SECRET") {
                return Source::Secret {
                    authority,
                    tenant,
                    client_id,
                    secret,
                };
            }
            if let Some(file) = set("AZURE_FEDERATED_TOKEN_FILE") {
                let token_file = PathBuf::from(file);
                return Source::Workload {
                    authority,
                    tenant,
                    client_id,
                    token_file,
                };
            }
        }
        Source::Managed {
            endpoint: IMDS.into(),
            client_id,
        }
    }

    async fn fetch(&self, http: &Http) -> Result<Token, CloudError> {
        let (request, what) = match self {
            Source::Secret {
                authority,
                tenant,
                client_id,
                secret,
            } => {
                let form = form::encode(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    ("scope", SCOPE),
                    ("client_secret", secret),
                ]);
                (
                    post_form(&token_url(authority, tenant), form)?,
                    "Azure AD (client secret)",
                )
            }
            Source::Workload {
                authority,
                tenant,
                client_id,
                token_file,
            } => {
                let assertion = std::fs::read_to_string(token_file).map_err(|e| {
                    CloudError::Config(format!("the federated token file {}: {e}", token_file.display()))
                })?;
                let form = form::encode(&[
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id),
                    ("scope", SCOPE),
                    (
                        "client_assertion_type",
                        "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
                    ),
                    ("client_assertion", assertion.trim()),
                ]);
                (
                    post_form(&token_url(authority, tenant), form)?,
                    "Azure AD (workload identity)",
                )
            }
            Source::Managed { endpoint, client_id } => (
                imds_request(endpoint, client_id.as_deref())?,
                "the managed identity",
            ),
        };
        let reply = http.send(request, TOKEN_DEADLINE).await?;
        token_from(&reply, what)
    }
}

fn token_url(authority: &str, tenant: &str) -> String {
    format!("{authority}/{tenant}/oauth2/v2.0/token")
}

fn post_form(url: &str, form: String) -> Result<http::Request<Full<Bytes>>, CloudError> {
    http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(form)))
        .map_err(|e| CloudError::Config(format!("the token URL {url}: {e}")))
}

fn imds_request(endpoint: &str, client_id: Option<&str>) -> Result<http::Request<Full<Bytes>>, CloudError> {
    let mut query = vec![("api-version", "2018-02-01"), ("resource", RESOURCE)];
    if let Some(id) = client_id {
        query.push(("client_id", id));
    }
    let url = format!(
        "{}/metadata/identity/oauth2/token?{}",
        endpoint.trim_end_matches('/'),
        form::encode(&query)
    );
    http::Request::get(&url)
        .header("Metadata", "true")
        .body(Full::new(Bytes::new()))
        .map_err(|e| CloudError::Config(format!("the metadata service URL {url}: {e}")))
}

/// A token answer: Azure AD's (`expires_in` a number) or the metadata
/// service's (a string).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(deserialize_with = "number_or_string")]
    expires_in: u64,
}

fn number_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Number(u64),
        Text(String),
    }
    match Either::deserialize(d)? {
        Either::Number(n) => Ok(n),
        Either::Text(t) => t.trim().parse().map_err(serde::de::Error::custom),
    }
}

fn token_from(reply: &Reply, what: &str) -> Result<Token, CloudError> {
    if reply.status >= 500 || reply.status == 429 {
        return Err(CloudError::Server {
            status: reply.status,
            message: format!("{what}: {}", reply.body.trim()),
        });
    }
    if reply.status != 200 {
        return Err(CloudError::Config(format!(
            "{what} refused a token: {}",
            reply.body.trim()
        )));
    }
    let answer: TokenAnswer = serde_json::from_str(&reply.body)
        .map_err(|e| CloudError::InvalidResponse(format!("{what}'s token: {e}")))?;
    let lifetime = Duration::from_secs(answer.expires_in);
    Ok(Token {
        access_token: answer.access_token,
        refresh_at: tokio::time::Instant::now() + lifetime.saturating_sub(REFRESH_BEFORE),
    })
}

struct Token {
    access_token: String,
    refresh_at: tokio::time::Instant,
}

/// Tokens of one source, fetched when there is none or it is about to expire.
pub struct Cached {
    source: Source,
    token: tokio::sync::Mutex<Option<Token>>,
}

impl Cached {
    /// Tokens of `source`, none fetched yet.
    pub fn new(source: Source) -> Cached {
        Cached {
            source,
            token: tokio::sync::Mutex::default(),
        }
    }

    /// The `Authorization` header's value.
    pub async fn bearer(&self, http: &Http) -> Result<String, CloudError> {
        let mut token = self.token.lock().await;
        if let Some(t) = token.as_ref()
            && tokio::time::Instant::now() < t.refresh_at
        {
            return Ok(format!("Bearer {}", t.access_token));
        }
        let fresh = self.source.fetch(http).await?;
        let header = format!("Bearer {}", fresh.access_token);
        *token = Some(fresh);
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(vars: &[(&str, &str)]) -> Source {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Source::choose(&|n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
    }

    #[test]
    fn sources_are_chosen_in_the_sdks_order() {
        let ids = [("AZURE_TENANT_ID", "t"), ("AZURE_CLIENT_ID", "c")];
        let with = |more: &[(&'static str, &'static str)]| {
            let mut all = ids.to_vec();
            all.extend_from_slice(more);
            choose(&all)
        };
        assert!(matches!(
            with(&[("AZURE_CLIENT_SECRET", "s"), ("AZURE_FEDERATED_TOKEN_FILE", "/f")]),
            Source::Secret { .. }
        ));
        assert!(matches!(
            with(&[("AZURE_FEDERATED_TOKEN_FILE", "/f"), ("AZURE_AUTHORITY_HOST", "https://login.example/")]),
            Source::Workload { authority, .. } if authority == "https://login.example"
        ));
        assert!(matches!(with(&[]), Source::Managed { client_id: Some(c), .. } if c == "c"));
        assert!(matches!(choose(&[]), Source::Managed { client_id: None, endpoint } if endpoint == IMDS));
    }

    #[test]
    fn both_token_answers_decode() {
        let reply = |body: &str| Reply {
            status: 200,
            headers: http::HeaderMap::new(),
            body: body.into(),
        };
        let aad = token_from(
            &reply(r#"{"token_type":"Bearer","expires_in":3599,"access_token":"a"}"#),
            "aad",
        );
        assert_eq!(aad.expect("a token").access_token, "a");
        let imds = token_from(
            &reply(r#"{"access_token":"m","expires_in":"3599","expires_on":"1","token_type":"Bearer"}"#),
            "mi",
        );
        assert_eq!(imds.expect("a token").access_token, "m");
        let refused = Reply {
            status: 401,
            headers: http::HeaderMap::new(),
            body: r#"{"error":"invalid_client"}"#.into(),
        };
        assert!(matches!(token_from(&refused, "aad"), Err(CloudError::Config(_))));
    }
}
