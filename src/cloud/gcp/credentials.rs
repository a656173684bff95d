//! Where nodewarden's GCP access tokens come from, in the order Google's
//! application-default credentials look: the key file
//! `GOOGLE_APPLICATION_CREDENTIALS` names (a service account's key — what
//! Constellation gives its node operator — or a user's refresh token),
//! gcloud's application-default file, and last the metadata server (a GCE
//! VM's service account; on GKE, Workload Identity). Tokens are fetched
//! again five minutes before they expire.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;

use super::super::CloudError;
use super::super::http::{Http, Reply};

/// The scope nodewarden asks for: Compute Engine, read and write.
pub const SCOPE: &str = "https://www.googleapis.com/auth/compute";
/// Google's token endpoint, when a key file names none.
pub const TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// How long before expiry a token is fetched again.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// How long a token request may take.
const TOKEN_DEADLINE: Duration = Duration::from_secs(10);
/// The metadata server's host when `GCE_METADATA_HOST` names none.
const METADATA_HOST: &str = "metadata.google.internal";

/// A service account's key (the JSON file `gcloud iam service-accounts keys create` writes).
#[derive(Clone, Deserialize)]
pub struct ServiceAccountKey {
    /// The service account (the JWT's issuer).
    pub client_email: String,
    /// Its RSA key, PEM (PKCS #8).
    pub private_key: String,
    /// The key's id (the JWT's `kid`).
    #[serde(default)]
    pub private_key_id: String,
    /// Where tokens are asked for; Google's when missing.
    #[serde(default)]
    pub token_uri: Option<String>,
    /// The project the key belongs to.
    #[serde(default)]
    pub project_id: Option<String>,
}

impl std::fmt::Debug for ServiceAccountKey {
    // Never the private key in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("private_key_id", &self.private_key_id)
            .finish_non_exhaustive()
    }
}

/// A user's refresh token (`gcloud auth application-default login`).
#[derive(Clone, Deserialize)]
pub struct AuthorizedUser {
    /// The OAuth client.
    pub client_id: String,
    /// The OAuth client's secret.
    pub client_secret: String,
    /// The user's refresh token.
    pub refresh_token: String,
    /// Where tokens are asked for; Google's when missing.
    #[serde(default)]
    pub token_uri: Option<String>,
}

impl std::fmt::Debug for AuthorizedUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorizedUser")
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// One source of tokens, chosen at start.
#[derive(Clone, Debug)]
pub enum Source {
    /// No token at all (an emulator that checks none).
    Anonymous,
    /// A service account's key: a signed JWT exchanged for a token.
    ServiceAccount(Box<ServiceAccountKey>),
    /// A user's refresh token.
    User(AuthorizedUser),
    /// The metadata server at this host.
    Metadata(String),
}

/// The kinds of key file nodewarden reads (their `type`).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum KeyFile {
    ServiceAccount(ServiceAccountKey),
    AuthorizedUser(AuthorizedUser),
    ExternalAccount {},
}

impl Source {
    /// The first source the environment names (`var` reads it).
    pub fn choose(var: &dyn Fn(&str) -> Option<String>) -> Result<Source, CloudError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some(file) = set("GOOGLE_APPLICATION_CREDENTIALS") {
            return Self::from_file(Path::new(&file));
        }
        let gcloud = set("CLOUDSDK_CONFIG")
            .map(PathBuf::from)
            .or_else(|| set("HOME").map(|h| Path::new(&h).join(".config/gcloud")));
        if let Some(dir) = gcloud {
            let file = dir.join("application_default_credentials.json");
            if file.is_file() {
                return Self::from_file(&file);
            }
        }
        Ok(Source::Metadata(
            set("GCE_METADATA_HOST").unwrap_or_else(|| METADATA_HOST.into()),
        ))
    }

    /// The source a key file holds.
    pub fn from_file(path: &Path) -> Result<Source, CloudError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CloudError::Config(format!(
                "reading the GCP credentials file {}: {e}",
                path.display()
            ))
        })?;
        Self::from_json(&text).map_err(|e| CloudError::Config(format!("{}: {e}", path.display())))
    }

    /// The source a key file's JSON holds.
    pub fn from_json(text: &str) -> Result<Source, String> {
        match serde_json::from_str::<KeyFile>(text) {
            Ok(KeyFile::ServiceAccount(key)) => {
                signing_key(&key.private_key)?;
                Ok(Source::ServiceAccount(Box::new(key)))
            }
            Ok(KeyFile::AuthorizedUser(user)) => Ok(Source::User(user)),
            Ok(KeyFile::ExternalAccount {}) => Err(
                "workload identity federation (type external_account) is not supported: give nodewarden a \
                 service account key, or run it where the metadata server serves a service account (GKE \
                 Workload Identity, a GCE VM)"
                    .into(),
            ),
            Err(e) => Err(format!(
                "not a service_account or authorized_user credentials file: {e}"
            )),
        }
    }

    /// The project a key file names, when it does.
    pub fn project(&self) -> Option<String> {
        match self {
            Source::ServiceAccount(key) => key.project_id.clone(),
            _ => None,
        }
    }

    /// A fresh token from this source (None: anonymous).
    pub async fn fetch(&self, http: &Http) -> Result<Option<Token>, CloudError> {
        let reply = match self {
            Source::Anonymous => return Ok(None),
            Source::ServiceAccount(key) => {
                let uri = key.token_uri.clone().unwrap_or_else(|| TOKEN_URI.into());
                let assertion = jwt(key, &uri, jiff::Timestamp::now().as_second())?;
                let form = crate::cloud::form::encode(&[
                    ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                    ("assertion", &assertion),
                ]);
                post_form(http, &uri, form).await?
            }
            Source::User(user) => {
                let uri = user.token_uri.clone().unwrap_or_else(|| TOKEN_URI.into());
                let form = crate::cloud::form::encode(&[
                    ("grant_type", "refresh_token"),
                    ("client_id", &user.client_id),
                    ("client_secret", &user.client_secret),
                    ("refresh_token", &user.refresh_token),
                ]);
                post_form(http, &uri, form).await?
            }
            Source::Metadata(host) => {
                metadata_get(http, host, "instance/service-accounts/default/token").await?
            }
        };
        token_answer(&reply).map(Some)
    }
}

/// An access token and when to fetch the next.
#[derive(Clone)]
pub struct Token {
    /// The bearer token.
    pub access_token: String,
    /// When a new one is fetched: five minutes before this one expires.
    pub refresh_at: tokio::time::Instant,
}

/// The token endpoints' answer.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

fn token_answer(reply: &Reply) -> Result<Token, CloudError> {
    if !(200..300).contains(&reply.status) {
        return Err(token_refused(reply));
    }
    let answer: TokenAnswer = serde_json::from_str(&reply.body)
        .map_err(|e| CloudError::InvalidResponse(format!("a GCP token answer: {e}")))?;
    let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(3600));
    Ok(Token {
        access_token: answer.access_token,
        refresh_at: tokio::time::Instant::now() + lifetime.saturating_sub(REFRESH_BEFORE),
    })
}

/// A token request refused: a server's trouble is retried, the rest is the setup's.
fn token_refused(reply: &Reply) -> CloudError {
    let message = format!(
        "getting a GCP access token: {} {}",
        reply.status,
        reply.body.trim()
    );
    match reply.status {
        429 => CloudError::Throttled { retry_after: None },
        500.. => CloudError::Server {
            status: reply.status,
            message,
        },
        _ => CloudError::Config(message),
    }
}

async fn post_form(http: &Http, uri: &str, form: String) -> Result<Reply, CloudError> {
    let request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(http::header::USER_AGENT, "nodewarden")
        .body(Full::new(Bytes::from(form)))
        .map_err(|e| CloudError::Config(format!("the GCP token endpoint {uri:?}: {e}")))?;
    http.send(request, TOKEN_DEADLINE).await
}

/// A GET of the metadata server (`computeMetadata/v1/<path>`).
pub async fn metadata_get(http: &Http, host: &str, path: &str) -> Result<Reply, CloudError> {
    let uri = format!("http://{host}/computeMetadata/v1/{path}");
    let request = http::Request::get(&uri)
        .header("Metadata-Flavor", "Google")
        .body(Full::new(Bytes::new()))
        .map_err(|e| CloudError::Config(format!("the GCP metadata server {host:?}: {e}")))?;
    http.send(request, TOKEN_DEADLINE).await
}

/// The service account's signed JWT asking `token_uri` for a Compute
/// token, issued at `now` (seconds), valid an hour.
pub fn jwt(key: &ServiceAccountKey, token_uri: &str, now: i64) -> Result<String, CloudError> {
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": key.private_key_id});
    let claims = serde_json::json!({
        "iss": key.client_email, "scope": SCOPE, "aud": token_uri, "iat": now, "exp": now + 3600,
    });
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let pair = signing_key(&key.private_key).map_err(CloudError::Config)?;
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .map_err(|_| CloudError::Config("signing the service account's JWT failed".into()))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// The RSA key of a `-----BEGIN PRIVATE KEY-----` PEM (PKCS #8).
fn signing_key(pem: &str) -> Result<ring::signature::RsaKeyPair, String> {
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = STANDARD
        .decode(body)
        .map_err(|e| format!("the service account's private_key is not PEM: {e}"))?;
    ring::signature::RsaKeyPair::from_pkcs8(&der)
        .map_err(|e| format!("the service account's private_key is not a PKCS #8 RSA key: {e}"))
}

/// A source's token, kept until shortly before it expires.
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

    /// The `Authorization` header's value (None: anonymous).
    pub async fn bearer(&self, http: &Http) -> Result<Option<String>, CloudError> {
        let mut token = self.token.lock().await;
        if let Some(t) = token.as_ref()
            && tokio::time::Instant::now() < t.refresh_at
        {
            return Ok(Some(format!("Bearer {}", t.access_token)));
        }
        let fresh = self.source.fetch(http).await?;
        let header = fresh.as_ref().map(|t| format!("Bearer {}", t.access_token));
        *token = fresh;
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_chosen_in_the_order_of_application_default_credentials() {
        let dir = tempfile::tempdir().expect("a dir");
        let user = dir.path().join("user.json");
        std::fs::write(
            &user,
            r#"{"type":"authorized_user","client_id":"c","client_secret":"s","refresh_token":"r"}"#,
        )
        .expect("write");
        let file = user.to_string_lossy().to_string();
        let choose = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> =
                vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Source::choose(&|n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
        };
        assert!(matches!(
            choose(&[("GOOGLE_APPLICATION_CREDENTIALS", &file)]),
            Ok(Source::User(_))
        ));
        assert!(matches!(
            choose(&[("HOME", "/nonexistent")]),
            Ok(Source::Metadata(h)) if h == METADATA_HOST
        ));
        assert!(matches!(
            choose(&[("GCE_METADATA_HOST", "127.0.0.1:1")]),
            Ok(Source::Metadata(h)) if h == "127.0.0.1:1"
        ));
        let gcloud = dir.path().join("gcloud");
        std::fs::create_dir_all(&gcloud).expect("dir");
        std::fs::copy(&user, gcloud.join("application_default_credentials.json")).expect("copy");
        let config = gcloud.to_string_lossy().to_string();
        assert!(matches!(
            choose(&[("CLOUDSDK_CONFIG", &config)]),
            Ok(Source::User(_))
        ));
    }

    #[test]
    fn unusable_key_files_are_refused_saying_why() {
        let federation = Source::from_json(r#"{"type":"external_account","audience":"x"}"#);
        assert!(federation.is_err_and(|e| e.contains("external_account")));
        let bad_key =
            Source::from_json(r#"{"type":"service_account","client_email":"a@b","private_key":"x"}"#);
        assert!(bad_key.is_err_and(|e| e.contains("private_key")));
        assert!(Source::from_json("{}").is_err());
    }
}
