//! A client of the Compute Engine v1 REST API: the few resources a node
//! rollout touches (instances, their boot disks, managed instance groups,
//! instance templates, operations), as serde structs of the fields
//! nodewarden reads, and operations waited for. Calls do not retry.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::super::CloudError;
use super::super::http::{Http, Reply};
use super::credentials::{Cached, Source};
use super::errors::{self, OperationError};

/// Compute's endpoint when none is configured.
pub const ENDPOINT: &str = "https://compute.googleapis.com";
/// How often an operation is read until it is done.
const OPERATION_POLL: Duration = Duration::from_millis(500);

/// An instance (`compute#instance`): the fields nodewarden reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Instance {
    /// Its name.
    pub name: String,
    /// Its zone's URL.
    pub zone: String,
    /// PROVISIONING, STAGING, RUNNING, STOPPING, TERMINATED, ...
    pub status: String,
    /// Its disks, the boot disk among them.
    pub disks: Vec<AttachedDisk>,
    /// Its metadata (`created-by` names its group).
    pub metadata: Metadata,
}

/// A disk of an instance.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AttachedDisk {
    /// Whether it boots the instance.
    pub boot: bool,
    /// The disk's URL.
    pub source: String,
}

/// An instance's metadata.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Metadata {
    /// Its key/value items.
    pub items: Vec<MetadataItem>,
}

/// One metadata item.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct MetadataItem {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Option<String>,
}

impl Instance {
    /// A metadata item's value.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .items
            .iter()
            .find(|i| i.key == key)
            .and_then(|i| i.value.as_deref())
    }

    /// Its boot disk's URL (the first disk when none says boot).
    pub fn boot_disk(&self) -> Option<&str> {
        self.disks
            .iter()
            .find(|d| d.boot)
            .or_else(|| self.disks.first())
            .map(|d| d.source.as_str())
            .filter(|s| !s.is_empty())
    }
}

/// A disk: the image it was made from.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Disk {
    /// The image it was made from (a URL).
    pub source_image: String,
}

/// A managed instance group (`compute#instanceGroupManager`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GroupManager {
    /// Its name.
    pub name: String,
    /// Its zone's URL.
    pub zone: String,
    /// What its instances' names start with.
    pub base_instance_name: String,
    /// Its instance template's URL.
    pub instance_template: String,
    /// How many instances it keeps.
    pub target_size: i64,
}

/// An operation (`compute#operation`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Operation {
    /// Its name, by which it is read again.
    pub name: String,
    /// PENDING, RUNNING or DONE.
    pub status: String,
    /// Its zone's URL; none for a global operation.
    pub zone: Option<String>,
    /// Its errors, when it failed.
    pub error: Option<OperationErrors>,
    /// The HTTP status its failure corresponds to.
    pub http_error_status_code: Option<u16>,
}

/// A failed operation's errors.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct OperationErrors {
    /// Each error.
    pub errors: Vec<OperationError>,
}

impl Operation {
    /// Its errors, when it failed.
    pub fn errors(&self) -> &[OperationError] {
        self.error
            .as_ref()
            .map(|e| e.errors.as_slice())
            .unwrap_or_default()
    }
}

/// One page of an aggregated list: scope (`zones/Z`) → its items.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AggregatedPage<T> {
    #[serde(default = "BTreeMap::new")]
    items: BTreeMap<String, ScopedItems<T>>,
    #[serde(default)]
    next_page_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScopedItems<T> {
    #[serde(default = "Vec::new")]
    instance_group_managers: Vec<T>,
}

/// Calls to Compute with a token of the configured source.
pub struct Compute {
    http: Http,
    endpoint: String,
    credentials: Cached,
    call_timeout: Duration,
}

impl Compute {
    /// A client of `endpoint` (None: Google's), authenticated by `source`.
    pub fn new(
        endpoint: Option<String>,
        source: Source,
        call_timeout: Duration,
    ) -> Result<Compute, CloudError> {
        let endpoint = endpoint.unwrap_or_else(|| ENDPOINT.into());
        endpoint
            .parse::<http::Uri>()
            .map_err(|e| CloudError::Config(format!("the GCP endpoint {endpoint:?} is not a URL: {e}")))?;
        Ok(Compute {
            http: Http::new(Duration::from_secs(5))?,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            credentials: Cached::new(source),
            call_timeout,
        })
    }

    /// The HTTP client (the metadata server is asked with it too).
    pub fn http(&self) -> &Http {
        &self.http
    }

    /// GET `compute/v1/<path>`; `what` names its object in errors.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, what: &str) -> Result<T, CloudError> {
        let reply = self.send(http::Method::GET, path, None, what).await?;
        decode(&reply, what)
    }

    /// POST `compute/v1/<path>` with a JSON body.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        what: &str,
    ) -> Result<T, CloudError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| CloudError::InvalidResponse(format!("{what}: encoding the request: {e}")))?;
        let reply = self.send(http::Method::POST, path, Some(body), what).await?;
        decode(&reply, what)
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
        what: &str,
    ) -> Result<Reply, CloudError> {
        let uri = format!("{}/compute/v1/{path}", self.endpoint);
        let mut request = http::Request::builder()
            .method(method)
            .uri(&uri)
            .header(http::header::USER_AGENT, "nodewarden")
            .header(http::header::ACCEPT, "application/json");
        if let Some(bearer) = self.credentials.bearer(&self.http).await? {
            request = request.header(http::header::AUTHORIZATION, bearer);
        }
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CloudError::Config(format!("{what}: {uri}: {e}")))?;
        let reply = self.http.send(request, self.call_timeout).await?;
        if (200..300).contains(&reply.status) {
            return Ok(reply);
        }
        let retry_after = reply
            .header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        Err(errors::classify(reply.status, &reply.body, retry_after, what))
    }

    /// Waits until `operation` is done, for at most `limit`; a failed
    /// operation is returned as it is (see [`check`]).
    pub async fn wait_done(
        &self,
        project: &str,
        operation: Operation,
        limit: Duration,
        what: &str,
    ) -> Result<Operation, CloudError> {
        let deadline = tokio::time::Instant::now() + limit;
        let path = match &operation.zone {
            Some(zone) if !zone.is_empty() => {
                format!(
                    "projects/{project}/zones/{}/operations/",
                    super::ids::zone_name(zone)
                )
            }
            _ => format!("projects/{project}/global/operations/"),
        };
        let mut current = operation;
        while current.status != "DONE" {
            if tokio::time::Instant::now() > deadline {
                return Err(CloudError::Timeout { after: limit });
            }
            tokio::time::sleep(OPERATION_POLL).await;
            current = self.get(&format!("{path}{}", current.name), what).await?;
        }
        Ok(current)
    }

    /// Every managed instance group of the project, across its zones.
    pub async fn all_group_managers(&self, project: &str) -> Result<Vec<GroupManager>, CloudError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("projects/{project}/aggregated/instanceGroupManagers");
            if let Some(t) = &token {
                path = format!("{path}?{}", crate::cloud::form::encode(&[("pageToken", t)]));
            }
            let page: AggregatedPage<GroupManager> = self.get(&path, "the instance group managers").await?;
            out.extend(page.items.into_values().flat_map(|s| s.instance_group_managers));
            token = page.next_page_token.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }
}

/// A done operation, or its errors as a [`CloudError`] about `what`.
pub fn check(operation: Operation, what: &str) -> Result<Operation, CloudError> {
    match operation.errors() {
        [] => Ok(operation),
        errors => Err(errors::operation_failed(
            operation.http_error_status_code,
            errors,
            what,
        )),
    }
}

fn decode<T: DeserializeOwned>(reply: &Reply, what: &str) -> Result<T, CloudError> {
    let body = if reply.body.trim().is_empty() {
        "{}"
    } else {
        &reply.body
    };
    serde_json::from_str(body).map_err(|e| CloudError::InvalidResponse(format!("{what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_answers_decode_to_what_is_read() {
        let instance: Instance = serde_json::from_str(
            r#"{"kind":"compute#instance","id":"123","name":"w-abcde","zone":"https://www.googleapis.com/compute/v1/projects/p/zones/z",
                "status":"RUNNING","disks":[{"boot":true,"source":"https://www.googleapis.com/compute/v1/projects/p/zones/z/disks/w-abcde"}],
                "metadata":{"items":[{"key":"created-by","value":"projects/42/zones/z/instanceGroupManagers/w"}]}}"#,
        )
        .expect("an instance");
        assert_eq!(
            instance.metadata("created-by"),
            Some("projects/42/zones/z/instanceGroupManagers/w")
        );
        assert_eq!(
            instance.boot_disk(),
            Some("https://www.googleapis.com/compute/v1/projects/p/zones/z/disks/w-abcde")
        );
        let op: Operation = serde_json::from_str(
            r#"{"name":"operation-1","status":"DONE","httpErrorStatusCode":409,
                "error":{"errors":[{"code":"RESOURCE_ALREADY_EXISTS","message":"exists"}]}}"#,
        )
        .expect("an operation");
        assert_eq!(op.errors().len(), 1);
        assert_eq!(op.http_error_status_code, Some(409));
        let page: AggregatedPage<GroupManager> = serde_json::from_str(
            r#"{"items":{"zones/a":{"instanceGroupManagers":[{"name":"g","targetSize":3}]},
                         "zones/b":{"warning":{"code":"NO_RESULTS_ON_PAGE"}}},"nextPageToken":"t"}"#,
        )
        .expect("a page");
        let groups: Vec<GroupManager> = page
            .items
            .into_values()
            .flat_map(|s| s.instance_group_managers)
            .collect();
        assert_eq!((groups.len(), groups[0].target_size), (1, 3));
        assert_eq!(page.next_page_token.as_deref(), Some("t"));
    }
}
