//! Where nodewarden's AWS credentials come from, in the order the SDKs look:
//! fixed keys given to it, the environment's keys, a web identity token
//! (IRSA: `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, exchanged at STS),
//! the container credentials endpoint (EKS Pod Identity, ECS), the shared
//! credentials file's profile, and last the instance profile through the
//! instance metadata service (IMDSv2). Temporary credentials are fetched
//! again five minutes before they expire.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use super::super::CloudError;
use super::super::http::{Http, Reply};
use super::xml::Xml;

/// Keys that sign requests.
#[derive(Clone, PartialEq)]
pub struct Credentials {
    /// The access key id (`AKIA...`, `ASIA...` for temporary keys).
    pub access_key_id: String,
    /// The secret that signs.
    pub secret_access_key: String,
    /// Temporary credentials' session token.
    pub session_token: Option<String>,
    /// When temporary credentials stop working.
    pub expires: Option<jiff::Timestamp>,
}

impl std::fmt::Debug for Credentials {
    // Never the secret or the token in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// How long before expiry temporary credentials are fetched again.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// How long the metadata and container endpoints may take.
const LOCAL_DEADLINE: Duration = Duration::from_secs(5);
const IMDS: &str = "http://169.254.169.254";
const ECS: &str = "http://169.254.170.2";

/// One source of credentials, chosen at start from the environment.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// Keys given to nodewarden, in the environment or in a profile.
    Fixed(Credentials),
    /// A web identity token exchanged at STS for a role's credentials (IRSA).
    WebIdentity {
        /// The token's file, read again at each exchange (it is rotated).
        token_file: PathBuf,
        /// The role to assume.
        role_arn: String,
        /// The session's name in CloudTrail.
        session_name: String,
        /// STS's endpoint.
        sts_endpoint: String,
    },
    /// The container credentials endpoint (EKS Pod Identity, ECS).
    Container {
        /// The endpoint.
        uri: String,
        /// Its authorization token, given in the environment.
        token: Option<String>,
        /// Its authorization token's file (read at each fetch).
        token_file: Option<PathBuf>,
    },
    /// The instance profile, through IMDSv2 at this endpoint
    /// (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, else `http://169.254.169.254`).
    InstanceMetadata(String),
}

impl Source {
    /// The first source the environment names (`var` reads it), fixed keys
    /// given to nodewarden first.
    pub fn choose(
        fixed: Option<(String, String)>,
        var: &dyn Fn(&str) -> Option<String>,
        sts_endpoint: String,
    ) -> Result<Source, CloudError> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some((id, secret)) = fixed {
            return Ok(Source::Fixed(keys(id, secret, None)));
        }
        if let (Some(id), Some(secret)) = (set("AWS_ACCESS_KEY_ID"), set("AWS_SECRET_ACCESS_KEY")) {
            return Ok(Source::Fixed(keys(id, secret, set("AWS_SESSION_TOKEN"))));
        }
        if let (Some(file), Some(role_arn)) = (set("AWS_WEB_IDENTITY_TOKEN_FILE"), set("AWS_ROLE_ARN")) {
            return Ok(Source::WebIdentity {
                token_file: file.into(),
                role_arn,
                session_name: set("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "nodewarden".into()),
                sts_endpoint,
            });
        }
        let uri = set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
            .or_else(|| set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").map(|p| format!("{ECS}{p}")));
        if let Some(uri) = uri {
            return Ok(Source::Container {
                uri,
                token: set("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
                token_file: set("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE").map(PathBuf::from),
            });
        }
        if let Some(found) = profile_keys(var)? {
            return Ok(Source::Fixed(found));
        }
        if set("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Err(CloudError::Config(
                "no AWS credentials: none in the environment, no web identity, no container \
                 endpoint, no profile, and the instance metadata service is disabled"
                    .into(),
            ));
        }
        let imds = set("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| IMDS.into());
        Ok(Source::InstanceMetadata(imds.trim_end_matches('/').to_string()))
    }

    /// Fetches credentials from this source.
    pub async fn fetch(&self, http: &Http) -> Result<Credentials, CloudError> {
        match self {
            Source::Fixed(keys) => Ok(keys.clone()),
            Source::WebIdentity {
                token_file,
                role_arn,
                session_name,
                sts_endpoint,
            } => {
                let token = read_token(token_file)?;
                let body = crate::cloud::form::encode(&[
                    ("Action", "AssumeRoleWithWebIdentity"),
                    ("Version", "2011-06-15"),
                    ("RoleArn", role_arn),
                    ("RoleSessionName", session_name),
                    ("WebIdentityToken", token.trim()),
                ]);
                let request = http::Request::post(sts_endpoint.as_str())
                    .header(http::header::CONTENT_TYPE, super::sigv4::FORM)
                    .body(Full::new(Bytes::from(body)))
                    .map_err(|e| CloudError::Config(format!("STS endpoint {sts_endpoint}: {e}")))?;
                let reply = checked(
                    http.send(request, LOCAL_DEADLINE * 2).await?,
                    "STS AssumeRoleWithWebIdentity",
                )?;
                sts_credentials(&reply.body)
            }
            Source::Container {
                uri,
                token,
                token_file,
            } => {
                let token = match (token_file, token) {
                    (Some(file), _) => Some(read_token(file)?.trim().to_string()),
                    (None, token) => token.clone(),
                };
                let mut request = http::Request::get(uri.as_str());
                if let Some(token) = token {
                    request = request.header(http::header::AUTHORIZATION, token);
                }
                let request = request
                    .body(Full::default())
                    .map_err(|e| CloudError::Config(format!("container credentials URI {uri}: {e}")))?;
                let reply = checked(
                    http.send(request, LOCAL_DEADLINE).await?,
                    "the container credentials endpoint",
                )?;
                json_credentials(&reply.body)
            }
            Source::InstanceMetadata(endpoint) => instance_metadata(http, endpoint).await,
        }
    }
}

/// The current credentials of a source, fetched again before they expire.
pub struct Cached {
    source: Source,
    current: tokio::sync::Mutex<Option<Credentials>>,
}

impl Cached {
    /// Nothing fetched yet.
    pub fn new(source: Source) -> Cached {
        Cached {
            source,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// Credentials valid for at least five more minutes.
    pub async fn get(&self, http: &Http) -> Result<Credentials, CloudError> {
        let mut current = self.current.lock().await;
        let fresh = current.as_ref().filter(|c| {
            c.expires
                .is_none_or(|at| jiff::Timestamp::now() + REFRESH_BEFORE < at)
        });
        if let Some(fresh) = fresh {
            return Ok(fresh.clone());
        }
        let fetched = self.source.fetch(http).await?;
        *current = Some(fetched.clone());
        Ok(fetched)
    }
}

fn keys(id: String, secret: String, token: Option<String>) -> Credentials {
    Credentials {
        access_key_id: id,
        secret_access_key: secret,
        session_token: token,
        expires: None,
    }
}

fn read_token(file: &PathBuf) -> Result<String, CloudError> {
    std::fs::read_to_string(file)
        .map_err(|e| CloudError::Config(format!("reading the token file {}: {e}", file.display())))
}

/// A credentials endpoint's answer, or a configuration error naming it.
fn checked(reply: Reply, what: &str) -> Result<Reply, CloudError> {
    match reply.status {
        200..=299 => Ok(reply),
        500.. => Err(CloudError::Server {
            status: reply.status,
            message: format!("{what}: {}", reply.body.trim()),
        }),
        status => Err(CloudError::Config(format!(
            "{what} refused nodewarden credentials ({status}): {}",
            reply.body.trim()
        ))),
    }
}

/// IMDSv2: a session token, the instance profile's role, its credentials.
async fn instance_metadata(http: &Http, imds: &str) -> Result<Credentials, CloudError> {
    let unreachable = |e: CloudError| {
        CloudError::Config(format!(
            "no AWS credentials in the environment, and the instance metadata service \
             did not give the instance profile's: {e}"
        ))
    };
    let token_request = http::Request::put(format!("{imds}/latest/api/token"))
        .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
        .body(Full::default())
        .map_err(|e| CloudError::Config(e.to_string()))?;
    let token = checked(
        http.send(token_request, LOCAL_DEADLINE)
            .await
            .map_err(unreachable)?,
        "IMDS",
    )?
    .body;
    let get = |path: String| {
        http::Request::get(format!("{imds}{path}"))
            .header("x-aws-ec2-metadata-token", token.trim())
            .body(Full::default())
            .map_err(|e| CloudError::Config(e.to_string()))
    };
    let base = "/latest/meta-data/iam/security-credentials/";
    let roles = checked(http.send(get(base.into())?, LOCAL_DEADLINE).await?, "IMDS")?.body;
    let role = roles.lines().next().unwrap_or_default().trim().to_string();
    if role.is_empty() {
        return Err(CloudError::Config("the instance has no instance profile".into()));
    }
    let reply = checked(
        http.send(get(format!("{base}{role}"))?, LOCAL_DEADLINE).await?,
        "IMDS",
    )?;
    json_credentials(&reply.body)
}

/// The JSON both the metadata service and the container endpoint answer.
pub fn json_credentials(body: &str) -> Result<Credentials, CloudError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        access_key_id: String,
        secret_access_key: String,
        token: Option<String>,
        expiration: Option<String>,
    }
    let answer: Answer = serde_json::from_str(body)
        .map_err(|e| CloudError::InvalidResponse(format!("credentials that are not AWS's JSON: {e}")))?;
    Ok(Credentials {
        access_key_id: answer.access_key_id,
        secret_access_key: answer.secret_access_key,
        session_token: answer.token,
        expires: answer.expiration.as_deref().map(expiry).transpose()?,
    })
}

/// STS's AssumeRoleWithWebIdentity answer.
pub fn sts_credentials(body: &str) -> Result<Credentials, CloudError> {
    let xml = Xml::parse(body).map_err(|e| CloudError::InvalidResponse(format!("STS: {e}")))?;
    let at = |name: &str| {
        xml.text_at(&["AssumeRoleWithWebIdentityResult", "Credentials", name])
            .ok_or_else(|| CloudError::InvalidResponse(format!("STS's answer has no Credentials/{name}")))
    };
    Ok(Credentials {
        access_key_id: at("AccessKeyId")?,
        secret_access_key: at("SecretAccessKey")?,
        session_token: Some(at("SessionToken")?),
        expires: Some(expiry(&at("Expiration")?)?),
    })
}

fn expiry(text: &str) -> Result<jiff::Timestamp, CloudError> {
    text.parse()
        .map_err(|e| CloudError::InvalidResponse(format!("an expiry that is not a time ({text}): {e}")))
}

/// The shared credentials file's keys of `AWS_PROFILE` (or `default`).
fn profile_keys(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Credentials>, CloudError> {
    let path = var("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".aws/credentials")));
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return Ok(None);
    };
    let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".into());
    Ok(ini_keys(&text, &profile))
}

/// The keys of `[profile]` in an INI text.
pub fn ini_keys(text: &str, profile: &str) -> Option<Credentials> {
    let mut section = String::new();
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if section == profile
            && let Some((key, value)) = line.split_once('=')
        {
            let value = Some(value.trim().to_string());
            match key.trim() {
                "aws_access_key_id" => id = value,
                "aws_secret_access_key" => secret = value,
                "aws_session_token" => token = value,
                _ => {}
            }
        }
    }
    Some(keys(id?, secret?, token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn choose(vars: &[(&str, &str)]) -> Source {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Source::choose(None, &|k| vars.get(k).cloned(), "https://sts.example".into()).expect("a source")
    }

    #[test]
    fn sources_are_chosen_in_the_sdks_order() {
        let env_keys = [("AWS_ACCESS_KEY_ID", "AKID"), ("AWS_SECRET_ACCESS_KEY", "s")];
        let irsa = [("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"), ("AWS_ROLE_ARN", "arn:r")];
        let pod_identity = [(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://169.254.170.23/v1/credentials",
        )];
        let all: Vec<_> = env_keys
            .iter()
            .chain(&irsa)
            .chain(&pod_identity)
            .copied()
            .collect();
        assert!(matches!(choose(&all), Source::Fixed(c) if c.access_key_id == "AKID"));
        let no_keys: Vec<_> = irsa.iter().chain(&pod_identity).copied().collect();
        assert!(
            matches!(choose(&no_keys), Source::WebIdentity { session_name, .. } if session_name == "nodewarden")
        );
        assert!(
            matches!(choose(&pod_identity), Source::Container { uri, .. } if uri.ends_with("/v1/credentials"))
        );
        let ecs = [("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/creds")];
        assert!(
            matches!(choose(&ecs), Source::Container { uri, .. } if uri == "http://169.254.170.2/v2/creds")
        );
        let imds = Source::InstanceMetadata("http://169.254.169.254".into());
        assert_eq!(choose(&[("HOME", "/nonexistent")]), imds);
        assert_eq!(
            choose(&[("AWS_ACCESS_KEY_ID", ""), ("HOME", "/nonexistent")]),
            imds
        );
        let disabled = Source::choose(
            None,
            &|k| (k == "AWS_EC2_METADATA_DISABLED").then(|| "true".into()),
            String::new(),
        );
        assert!(matches!(disabled, Err(CloudError::Config(_))));
    }

    #[test]
    fn answers_give_their_keys_and_expiry() {
        let json = r#"{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"ASIA1","SecretAccessKey":"s",
            "Token":"t","Expiration":"2026-11-28T18:00:00Z"}"#;
        let c = json_credentials(json).expect("IMDS's JSON");
        assert_eq!(
            (c.access_key_id.as_str(), c.session_token.as_deref()),
            ("ASIA1", Some("t"))
        );
        assert_eq!(
            c.expires.map(|t| t.to_string()),
            Some("2026-11-28T18:00:00Z".into())
        );
        let xml = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
            <AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIA2</AccessKeyId>
            <SecretAccessKey>s2</SecretAccessKey><SessionToken>t2</SessionToken>
            <Expiration>2026-11-28T19:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult>
            </AssumeRoleWithWebIdentityResponse>"#;
        let c = sts_credentials(xml).expect("STS's XML");
        assert_eq!(
            (c.access_key_id.as_str(), c.session_token.as_deref()),
            ("ASIA2", Some("t2"))
        );
        assert!(sts_credentials("<x/>").is_err());
        assert!(!format!("{c:?}").contains("s2"), "the secret stays out of Debug");
    }

    /// A metadata service on loopback that hands out credentials expiring
    /// in `ttl`, counting the credentials it gave.
    async fn metadata_service(ttl: jiff::SignedDuration) -> (String, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("an address");
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                // The whole head, however the client's writes arrive.
                let mut head = Vec::new();
                let mut chunk = [0; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let request = String::from_utf8_lossy(&head).to_lowercase();
                let body = if request.starts_with("put /latest/api/token") {
                    "imds-token".to_string()
                } else if !request.contains("x-aws-ec2-metadata-token: imds-token") {
                    String::new()
                } else if request.starts_with("get /latest/meta-data/iam/security-credentials/ ") {
                    "node-role\n".to_string()
                } else {
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    let expires = jiff::Timestamp::now() + ttl;
                    format!(
                        r#"{{"AccessKeyId":"ASIA{n}","SecretAccessKey":"s","Token":"t","Expiration":"{expires}"}}"#
                    )
                };
                let status = if body.is_empty() {
                    "401 Unauthorized"
                } else {
                    "200 OK"
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(reply.as_bytes()).await;
            }
        });
        (format!("http://{address}"), served)
    }

    #[tokio::test]
    async fn instance_profile_credentials_are_fetched_again_before_they_expire() {
        let http = Http::new(Duration::from_secs(1)).expect("a client");
        let (endpoint, served) = metadata_service(jiff::SignedDuration::from_secs(3600)).await;
        let lasting = Cached::new(Source::InstanceMetadata(endpoint));
        let first = lasting.get(&http).await.expect("credentials");
        let again = lasting.get(&http).await.expect("credentials");
        assert_eq!(
            (first.access_key_id.as_str(), again.access_key_id.as_str()),
            ("ASIA0", "ASIA0")
        );
        assert_eq!(served.load(Ordering::SeqCst), 1, "an hour's credentials are kept");
        let (endpoint, served) = metadata_service(jiff::SignedDuration::from_secs(120)).await;
        let expiring = Cached::new(Source::InstanceMetadata(endpoint));
        let first = expiring.get(&http).await.expect("credentials");
        let again = expiring.get(&http).await.expect("credentials");
        assert_eq!(
            (first.access_key_id.as_str(), again.access_key_id.as_str()),
            ("ASIA0", "ASIA1")
        );
        assert_eq!(
            served.load(Ordering::SeqCst),
            2,
            "credentials 2 minutes from expiry are fetched again"
        );
        let nobody = Cached::new(Source::InstanceMetadata("http://127.0.0.1:9".into()));
        assert!(
            matches!(nobody.get(&http).await, Err(CloudError::Config(_))),
            "no metadata service: a configuration error"
        );
    }

    #[test]
    fn profiles_are_read_by_name() {
        let ini =
            "[default]\naws_access_key_id = A\naws_secret_access_key = B\n\n[other]\naws_access_key_id=C\n";
        assert_eq!(
            ini_keys(ini, "default").map(|c| c.access_key_id),
            Some("A".into())
        );
        assert_eq!(
            ini_keys(ini, "other"),
            None,
            "a profile without a secret is no keys"
        );
    }
}
