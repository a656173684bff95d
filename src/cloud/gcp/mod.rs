//! The `gcp` provider: managed instance groups of Compute Engine through its
//! REST API (rustls with ring, no C crypto), mapped the way Constellation
//! maps them.
//!
//! - A ScalingGroup's groupId is `projects/P/zones/Z/instanceGroupManagers/G`;
//!   the cluster's groups are those whose instance template carries the
//!   label `constellation-uid`, their role `constellation-role` and their
//!   node group `constellation-node-group`.
//! - The group image is the boot disk's `sourceImage` of its instance
//!   template; a new image is a copy of the template under the next name
//!   (`<name>-<n+1>`) set as the group's template.
//! - create = `createInstances` of one named instance, the name derived
//!   from the request's key (so a create asked again names the same
//!   instance and cannot start a second); delete = `deleteInstances`, which
//!   lowers the group's target size with it. No capacity arithmetic: nothing
//!   a lost answer can make land twice.
//! - Provider IDs are `gce://<project>/<zone>/<instance>`.
//!
//! Calls do not retry inside: the work queue's backoff is in charge and
//! every retry shows in its metrics.

pub mod api;
mod calls;
pub mod credentials;
pub mod errors;
pub mod ids;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    CloudError, CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, GroupRole, InstanceState,
    ScalingGroup,
};
use api::{Compute, Disk, GroupManager, Instance, Operation};
use ids::{GroupRef, InstanceRef};

/// The cluster label on the cluster's instance templates (Constellation's).
pub const CLUSTER_LABEL: &str = "constellation-uid";
/// The role label: `control-plane` (or `controlplane`) or `worker`.
pub const ROLE_LABEL: &str = "constellation-role";
/// The node group label (the ScalingGroup's nodeGroupName).
pub const NODE_GROUP_LABEL: &str = "constellation-node-group";
/// The metadata item GCE gives a group's instances: the group that made it.
pub const CREATED_BY: &str = "created-by";
/// How long a create, delete or template change waits for its operation.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(90);

/// How the provider reaches Compute.
#[derive(Clone, Debug, Default)]
pub struct GcpConfig {
    /// The cluster's `constellation-uid`: only its groups are listed.
    pub cluster_uid: String,
    /// The project of the cluster's groups; else the key file's, else the
    /// metadata server's.
    pub project: Option<String>,
    /// Another endpoint (a fake); else Google's.
    pub endpoint: Option<String>,
    /// Where tokens come from; None: application-default credentials.
    pub credentials: Option<credentials::Source>,
    /// How long one call may take; None: [`errors::DEFAULT_CALL_TIMEOUT`].
    pub call_timeout: Option<Duration>,
}

/// Managed instance groups of one cluster.
pub struct GcpProvider {
    compute: Compute,
    project: String,
    cluster_uid: String,
    /// Project numbers (as `created-by` names projects) → project IDs.
    project_ids: tokio::sync::Mutex<HashMap<String, String>>,
}

impl GcpProvider {
    /// A provider of the cluster's groups, with tokens from the configured
    /// source or application-default credentials.
    pub async fn new(config: GcpConfig) -> Result<GcpProvider, CloudError> {
        if config.cluster_uid.is_empty() {
            return Err(CloudError::Config("no cluster uid (--gcp-cluster-uid)".into()));
        }
        let source = match config.credentials {
            Some(source) => source,
            None => credentials::Source::choose(&|name| std::env::var(name).ok())?,
        };
        let given = config
            .project
            .filter(|p| !p.trim().is_empty())
            .or_else(|| source.project());
        let metadata_host = match &source {
            credentials::Source::Metadata(host) => Some(host.clone()),
            _ => None,
        };
        let timeout = config.call_timeout.unwrap_or(errors::DEFAULT_CALL_TIMEOUT);
        let compute = Compute::new(config.endpoint, source, timeout)?;
        let project = match (given, metadata_host) {
            (Some(project), _) => project,
            (None, Some(host)) => metadata_project(&compute, &host).await?,
            (None, None) => {
                return Err(CloudError::Config(
                    "no GCP project: set --gcp-project (the credentials name none)".into(),
                ));
            }
        };
        Ok(GcpProvider {
            compute,
            project,
            cluster_uid: config.cluster_uid,
            project_ids: tokio::sync::Mutex::default(),
        })
    }

    async fn instance(&self, at: &InstanceRef) -> Result<Instance, CloudError> {
        let path = format!("projects/{}/zones/{}/instances/{}", at.project, at.zone, at.name);
        self.compute
            .get(&path, &format!("instance {}", at.provider_id()))
            .await
    }

    async fn group_manager(&self, group: &GroupRef) -> Result<GroupManager, CloudError> {
        let path = format!(
            "projects/{}/zones/{}/instanceGroupManagers/{}",
            group.project, group.zone, group.name
        );
        self.compute
            .get(&path, &format!("instance group {}", group.id()))
            .await
    }

    async fn template(&self, link: &str) -> Result<Value, CloudError> {
        let path = ids::short(link);
        if !path.contains("/global/instanceTemplates/") {
            return Err(CloudError::Config(format!(
                "instance template {path}: only global instance templates are supported"
            )));
        }
        self.compute.get(path, &format!("instance template {path}")).await
    }

    /// Waits for `operation` of `project`; its errors as a [`CloudError`].
    async fn finish(&self, project: &str, operation: Operation, what: &str) -> Result<Operation, CloudError> {
        let done = self
            .compute
            .wait_done(project, operation, OPERATION_TIMEOUT, what)
            .await?;
        api::check(done, what)
    }

    /// The project ID of a `created-by` group (which names the project by number).
    async fn project_id(&self, named: &str) -> Result<String, CloudError> {
        if named == self.project || !named.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(named.to_string());
        }
        if let Some(id) = self.project_ids.lock().await.get(named) {
            return Ok(id.clone());
        }
        let project: Value = self
            .compute
            .get(&format!("projects/{named}"), &format!("project {named}"))
            .await?;
        let id = project["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CloudError::InvalidResponse(format!("project {named} has no name")))?
            .to_string();
        self.project_ids
            .lock()
            .await
            .insert(named.to_string(), id.clone());
        Ok(id)
    }

    /// The group that made the instance, named by project ID.
    async fn group_of(&self, at: &InstanceRef, instance: &Instance) -> Result<GroupRef, CloudError> {
        let mut group = instance
            .metadata(CREATED_BY)
            .and_then(ids::created_by)
            .ok_or_else(|| CloudError::NotFound {
                what: format!("the managed instance group of instance {}", at.provider_id()),
            })?;
        group.project = self.project_id(&group.project).await?;
        Ok(group)
    }
}

/// The project the metadata server's VM belongs to.
async fn metadata_project(compute: &Compute, host: &str) -> Result<String, CloudError> {
    let reply = credentials::metadata_get(compute.http(), host, "project/project-id").await?;
    match reply.status {
        200 if !reply.body.trim().is_empty() => Ok(reply.body.trim().to_string()),
        status => Err(CloudError::Config(format!(
            "no GCP project: set --gcp-project (the metadata server at {host} answered {status})"
        ))),
    }
}

/// The image a template's instances boot from.
fn template_image(template: &Value) -> Option<&str> {
    template["properties"]["disks"][0]["initializeParams"]["sourceImage"]
        .as_str()
        .filter(|s| !s.is_empty())
}

/// A label of a template's instances.
fn template_label<'a>(template: &'a Value, key: &str) -> Option<&'a str> {
    template["properties"]["labels"][key].as_str()
}

/// What GCE says of an instance (`status`), as a PendingNode's state
/// (Constellation's mapping: GCE's TERMINATED is a stopped VM, not a
/// deleted one). Not found is the caller's to judge (see the trait).
pub fn state_of(status: &str) -> InstanceState {
    match status {
        "PROVISIONING" | "STAGING" => InstanceState::Creating,
        "RUNNING" => InstanceState::Ready,
        "STOPPING" | "SUSPENDING" | "SUSPENDED" | "REPAIRING" | "TERMINATED" => InstanceState::Stopped,
        _ => InstanceState::Unknown,
    }
}

/// The role a template's `constellation-role` label says.
fn role_of(label: Option<&str>) -> GroupRole {
    match label {
        Some("control-plane" | "controlplane" | "ControlPlane") => GroupRole::ControlPlane,
        _ => GroupRole::Worker,
    }
}

/// The template `current` with another name and boot image, without the
/// fields Compute sets itself.
pub fn template_copy(current: &Value, name: &str, image: &str) -> Value {
    let mut copy = current.clone();
    if let Some(fields) = copy.as_object_mut() {
        for output_only in ["id", "selfLink", "selfLinkWithId", "creationTimestamp", "kind"] {
            fields.remove(output_only);
        }
    }
    copy["name"] = json!(name);
    copy["properties"]["disks"][0]["initializeParams"]["sourceImage"] = json!(image);
    copy
}

impl CloudProvider for GcpProvider {
    fn name(&self) -> &str {
        "gcp"
    }

    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        Box::pin(self.create(request))
    }

    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(self.delete(provider_id))
    }

    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        Box::pin(async move {
            let at = InstanceRef::parse(provider_id)?;
            Ok(state_of(&self.instance(&at).await?.status))
        })
    }

    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move {
            let at = InstanceRef::parse(provider_id)?;
            let instance = self.instance(&at).await?;
            let disk = instance.boot_disk().ok_or_else(|| {
                CloudError::InvalidResponse(format!("instance {provider_id} has no boot disk"))
            })?;
            let disk: Disk = self
                .compute
                .get(ids::short(disk), &format!("disk {}", ids::short(disk)))
                .await?;
            match disk.source_image.as_str() {
                "" => Err(CloudError::InvalidResponse(format!(
                    "the boot disk of instance {provider_id} has no source image"
                ))),
                image => Ok(ids::short(image).to_string()),
            }
        })
    }

    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move {
            let at = InstanceRef::parse(provider_id)?;
            let instance = self.instance(&at).await?;
            Ok(self.group_of(&at, &instance).await?.id())
        })
    }

    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(self.group_image_of(group_id))
    }

    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(self.set_image(group_id, image))
    }

    fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
        Box::pin(self.groups())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_states_follow_constellation() {
        for (status, state) in [
            ("PROVISIONING", InstanceState::Creating),
            ("STAGING", InstanceState::Creating),
            ("RUNNING", InstanceState::Ready),
            ("STOPPING", InstanceState::Stopped),
            ("SUSPENDED", InstanceState::Stopped),
            ("REPAIRING", InstanceState::Stopped),
            ("TERMINATED", InstanceState::Stopped),
            ("SOMETHING_NEW", InstanceState::Unknown),
        ] {
            assert_eq!(state_of(status), state, "{status}");
        }
    }

    #[test]
    fn a_template_copy_has_the_new_name_and_image_and_no_output_fields() {
        let current = json!({
            "kind": "compute#instanceTemplate", "id": "1", "name": "w-1", "selfLink": "x", "creationTimestamp": "t",
            "properties": {"machineType": "n2d-standard-4", "labels": {"constellation-uid": "u"},
                "disks": [{"boot": true, "initializeParams": {"sourceImage": "projects/i/global/images/old", "diskSizeGb": "10"}}]},
        });
        let copy = template_copy(&current, "w-2", "projects/i/global/images/new");
        assert_eq!(copy["name"], "w-2");
        assert_eq!(template_image(&copy), Some("projects/i/global/images/new"));
        assert_eq!(
            copy["properties"]["disks"][0]["initializeParams"]["diskSizeGb"],
            "10"
        );
        assert_eq!(template_label(&copy, CLUSTER_LABEL), Some("u"));
        for gone in ["id", "selfLink", "creationTimestamp", "kind"] {
            assert!(copy.get(gone).is_none(), "{gone}");
        }
        assert_eq!(
            template_image(&current),
            Some("projects/i/global/images/old"),
            "the original is untouched"
        );
    }

    #[test]
    fn roles_follow_the_label() {
        assert_eq!(role_of(Some("control-plane")), GroupRole::ControlPlane);
        assert_eq!(role_of(Some("ControlPlane")), GroupRole::ControlPlane);
        assert_eq!(role_of(Some("worker")), GroupRole::Worker);
        assert_eq!(role_of(None), GroupRole::Worker);
    }
}
