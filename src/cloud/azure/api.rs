//! A client of Azure Resource Manager's compute API: the few resources a
//! node rollout touches (VM scale sets, their VMs and instance views), as
//! serde structs of the fields nodewarden reads, lists followed through
//! `nextLink`, and long-running operations polled through
//! `Azure-AsyncOperation` (else `Location`). Calls do not retry.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::super::CloudError;
use super::super::http::{Http, Reply};
use super::credentials::Cached;
use super::errors;
use super::image::ImageReference;

/// ARM's endpoint when none is configured.
pub const ENDPOINT: &str = "https://management.azure.com";
/// The compute API version the calls speak.
pub const API_VERSION: &str = "2024-11-01";

/// A VM scale set: the fields nodewarden reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScaleSet {
    /// Its ARM ID.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its tags (the cluster's, and nodewarden's create records).
    pub tags: BTreeMap<String, String>,
    /// Its SKU: the capacity.
    pub sku: Sku,
    /// Changes with every change of the scale set (for `If-Match`).
    pub etag: Option<String>,
    /// Its properties.
    pub properties: ScaleSetProperties,
}

/// A scale set's SKU.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Sku {
    /// How many VMs it keeps.
    pub capacity: i64,
}

/// A scale set's properties.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScaleSetProperties {
    /// Its model: what new VMs are made from.
    pub virtual_machine_profile: VmProfile,
}

/// A scale set's VM model, or a VM's own properties (the same shape for
/// the fields read).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VmProfile {
    /// Its storage: the image.
    pub storage_profile: StorageProfile,
}

/// Where a VM's disks come from.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StorageProfile {
    /// Its image.
    pub image_reference: ImageReference,
}

/// One VM of a scale set.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScaleSetVm {
    /// Its ARM ID.
    pub id: String,
    /// Its instance ID in the scale set.
    pub instance_id: String,
    /// Its properties.
    pub properties: VmProperties,
}

/// A scale set VM's properties.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VmProperties {
    /// Creating, Succeeded, Deleting, Failed, ...
    pub provisioning_state: String,
    /// Its OS: the computer name its Node is named after.
    pub os_profile: OsProfile,
    /// Its storage: the image it booted.
    pub storage_profile: StorageProfile,
}

/// A VM's OS settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OsProfile {
    /// Its host name.
    pub computer_name: String,
}

/// A VM's instance view: its status codes.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct InstanceView {
    /// `ProvisioningState/…`, `PowerState/…`, in ARM's order.
    pub statuses: Vec<Status>,
}

/// One status of an instance view.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Status {
    /// Its code.
    pub code: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page<T> {
    #[serde(default = "Vec::new")]
    value: Vec<T>,
    #[serde(default)]
    next_link: Option<String>,
}

/// A long-running operation's status (`Azure-AsyncOperation`'s body).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AsyncStatus {
    status: String,
    error: AsyncError,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AsyncError {
    code: String,
    message: String,
}

/// Calls to ARM with a token of the configured credential.
pub struct Arm {
    http: Http,
    endpoint: String,
    credentials: Cached,
    call_timeout: Duration,
    /// The longest wait between two polls of an operation, whatever
    /// `Retry-After` says.
    max_poll: Duration,
}

impl Arm {
    /// A client of `endpoint` (None: ARM's), authenticated by `credentials`.
    pub fn new(
        endpoint: Option<String>,
        credentials: Cached,
        call_timeout: Duration,
        max_poll: Duration,
    ) -> Result<Arm, CloudError> {
        let endpoint = endpoint.unwrap_or_else(|| ENDPOINT.into());
        endpoint
            .parse::<http::Uri>()
            .map_err(|e| CloudError::Config(format!("the Azure endpoint {endpoint:?} is not a URL: {e}")))?;
        Ok(Arm {
            http: Http::new(Duration::from_secs(5))?,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            credentials,
            call_timeout,
            max_poll,
        })
    }

    /// GET `path` (an ARM ID and what follows); `what` names it in errors.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, what: &str) -> Result<T, CloudError> {
        let reply = self
            .send(http::Method::GET, &self.url(path), None, None, what)
            .await?;
        decode(&reply, what)
    }

    /// Every item of the list at `path`, following `nextLink`.
    pub async fn list<T: DeserializeOwned>(&self, path: &str, what: &str) -> Result<Vec<T>, CloudError> {
        let mut out = Vec::new();
        let mut url = self.url(path);
        loop {
            let reply = self.send(http::Method::GET, &url, None, None, what).await?;
            let page: Page<T> = decode(&reply, what)?;
            out.extend(page.value);
            match page.next_link.filter(|l| !l.is_empty()) {
                Some(next) => url = next,
                None => return Ok(out),
            }
        }
    }

    /// PATCH `path` with a JSON body, only if the resource still has the
    /// etag `if_match` (when given).
    pub async fn patch(
        &self,
        path: &str,
        body: &serde_json::Value,
        if_match: Option<&str>,
        what: &str,
    ) -> Result<Reply, CloudError> {
        let body = body.to_string().into_bytes();
        self.send(http::Method::PATCH, &self.url(path), Some(body), if_match, what)
            .await
    }

    /// PUT `path` with a JSON body (a scale set made, in tests and tools).
    pub async fn put(&self, path: &str, body: &serde_json::Value, what: &str) -> Result<Reply, CloudError> {
        let body = body.to_string().into_bytes();
        self.send(http::Method::PUT, &self.url(path), Some(body), None, what)
            .await
    }

    /// POST `path` with a JSON body.
    pub async fn post(&self, path: &str, body: &serde_json::Value, what: &str) -> Result<Reply, CloudError> {
        let body = body.to_string().into_bytes();
        self.send(http::Method::POST, &self.url(path), Some(body), None, what)
            .await
    }

    /// Polls the operation `reply` started until it ends, for at most
    /// `limit`; Ok only when it ended `Succeeded`.
    pub async fn wait(&self, reply: &Reply, limit: Duration, what: &str) -> Result<(), CloudError> {
        let deadline = tokio::time::Instant::now() + limit;
        let Some(url) = reply.header("azure-asyncoperation").map(str::to_string) else {
            return Ok(()); // Done when answered: nothing to poll.
        };
        let mut after = self.poll_interval(reply);
        loop {
            if tokio::time::Instant::now() + after > deadline {
                return Err(CloudError::Timeout { after: limit });
            }
            tokio::time::sleep(after).await;
            let polled = self.send(http::Method::GET, &url, None, None, what).await?;
            let status: AsyncStatus = decode(&polled, what)?;
            match status.status.as_str() {
                "Succeeded" => return Ok(()),
                "Failed" | "Canceled" => {
                    let e = &status.error;
                    return Err(errors::operation_failed(
                        &status.status,
                        &e.code,
                        &e.message,
                        what,
                    ));
                }
                _ => after = self.poll_interval(&polled),
            }
        }
    }

    /// What `Retry-After` asks, at most `max_poll`; 1 s when it says nothing.
    fn poll_interval(&self, reply: &Reply) -> Duration {
        let asked = retry_after(reply).unwrap_or(Duration::from_secs(1));
        asked.min(self.max_poll)
    }

    fn url(&self, path: &str) -> String {
        let joiner = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{joiner}api-version={API_VERSION}", self.endpoint)
    }

    async fn send(
        &self,
        method: http::Method,
        url: &str,
        body: Option<Vec<u8>>,
        if_match: Option<&str>,
        what: &str,
    ) -> Result<Reply, CloudError> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(url)
            .header(http::header::USER_AGENT, "nodewarden")
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::AUTHORIZATION,
                self.credentials.bearer(&self.http).await?,
            );
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(etag) = if_match {
            request = request.header(http::header::IF_MATCH, etag);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| CloudError::Config(format!("{what}: {url}: {e}")))?;
        let reply = self.http.send(request, self.call_timeout).await?;
        if (200..300).contains(&reply.status) {
            return Ok(reply);
        }
        let code = reply.header("x-ms-error-code");
        Err(errors::classify(
            reply.status,
            &reply.body,
            code,
            retry_after(&reply),
            what,
        ))
    }
}

/// The answer's `Retry-After`, in seconds.
fn retry_after(reply: &Reply) -> Option<Duration> {
    reply
        .header("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
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
    fn arm_answers_decode_to_what_is_read() {
        let set: ScaleSet = serde_json::from_str(
            r#"{"id":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/w",
                "name":"w","location":"westeurope","etag":"\"3\"","tags":{"constellation-uid":"u"},
                "sku":{"name":"Standard_D4s_v3","capacity":2},
                "properties":{"provisioningState":"Succeeded","virtualMachineProfile":{"storageProfile":
                  {"imageReference":{"id":"/subscriptions/s/images/i"}}}}}"#,
        )
        .expect("a scale set");
        assert_eq!((set.sku.capacity, set.etag.as_deref()), (2, Some("\"3\"")));
        let image = &set
            .properties
            .virtual_machine_profile
            .storage_profile
            .image_reference;
        assert_eq!(image.image().as_deref(), Some("/subscriptions/s/images/i"));
        let page: Page<ScaleSetVm> = serde_json::from_str(
            r#"{"value":[{"id":"/subscriptions/s/x/virtualMachines/4","instanceId":"4",
                "properties":{"provisioningState":"Creating","osProfile":{"computerName":"W000004"}}}],
                "nextLink":"https://management.azure.com/next"}"#,
        )
        .expect("a page");
        assert_eq!(page.value[0].properties.os_profile.computer_name, "W000004");
        assert_eq!(
            page.next_link.as_deref(),
            Some("https://management.azure.com/next")
        );
        let view: InstanceView = serde_json::from_str(
            r#"{"statuses":[{"code":"ProvisioningState/succeeded","level":"Info"},{"code":"PowerState/running"}]}"#,
        )
        .expect("a view");
        assert_eq!(view.statuses.len(), 2);
    }
}
