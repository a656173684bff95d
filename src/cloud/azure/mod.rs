//! The `azure` provider: VM scale sets (Uniform orchestration) through
//! Azure Resource Manager's REST API, mapped the way Constellation maps them.
//!
//! - A ScalingGroup's groupId is the scale set's ARM ID; the cluster's scale
//!   sets are those of its resource group tagged `constellation-uid`, their
//!   role `constellation-role` and their node group
//!   `constellation-node-group`.
//! - The group image is the model's `imageReference`; a new image is a
//!   PATCH of the model, its operation waited for. Existing VMs keep theirs.
//! - create = the capacity raised by one, recorded in the scale set's tags
//!   in the same etag-guarded PATCH (see [`records`]), so a create asked
//!   again finds its VM and raises nothing; delete = `POST …/delete` of the
//!   one instance, which lowers the capacity with it.
//! - Provider IDs are `azure://` + the VM's ARM ID; a Node is named after
//!   the VM's computer name, lower-cased.
//!
//! Calls do not retry inside: the work queue's backoff is in charge and
//! every retry shows in its metrics.

pub mod api;
pub mod credentials;
pub mod errors;
pub mod ids;
pub mod image;
pub mod records;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::{
    CloudError, CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, GroupRole, InstanceState,
    ScalingGroup,
};
use api::{Arm, InstanceView, ScaleSet, ScaleSetVm};
use ids::{ScaleSetRef, VmRef};
use records::Step;

/// The cluster tag on the cluster's scale sets (Constellation's).
pub const CLUSTER_TAG: &str = "constellation-uid";
/// The role tag: `control-plane` (or `controlplane`) or `worker`.
pub const ROLE_TAG: &str = "constellation-role";
/// The node group tag (the ScalingGroup's nodeGroupName).
pub const NODE_GROUP_TAG: &str = "constellation-node-group";
/// How long an image change waits for its operation.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(300);

/// How the provider reaches ARM.
#[derive(Clone, Debug, Default)]
pub struct AzureConfig {
    /// The cluster's `constellation-uid`: only its scale sets are listed.
    pub cluster_uid: String,
    /// The subscription of the cluster's scale sets.
    pub subscription: String,
    /// Their resource group.
    pub resource_group: String,
    /// Another endpoint (a fake); else ARM's.
    pub endpoint: Option<String>,
    /// Where tokens come from; None: chosen from the environment.
    pub credentials: Option<credentials::Source>,
    /// How long one call may take; None: [`errors::DEFAULT_CALL_TIMEOUT`].
    pub call_timeout: Option<Duration>,
    /// The longest wait between two polls (of an operation, of a create's
    /// new VM); None: 10 s.
    pub max_poll: Option<Duration>,
    /// How long a create looks for its new VM before it returns (and is
    /// asked again); None: 60 s.
    pub create_wait: Option<Duration>,
}

/// VM scale sets of one cluster.
pub struct AzureProvider {
    arm: Arm,
    subscription: String,
    resource_group: String,
    cluster_uid: String,
    max_poll: Duration,
    create_wait: Duration,
}

impl AzureProvider {
    /// A provider of the cluster's scale sets.
    pub fn new(config: AzureConfig) -> Result<AzureProvider, CloudError> {
        let required = [
            (&config.cluster_uid, "no cluster uid (--azure-cluster-uid)"),
            (&config.subscription, "no subscription (--azure-subscription)"),
            (
                &config.resource_group,
                "no resource group (--azure-resource-group)",
            ),
        ];
        if let Some((_, missing)) = required.iter().find(|(v, _)| v.trim().is_empty()) {
            return Err(CloudError::Config(missing.to_string()));
        }
        let source = config
            .credentials
            .unwrap_or_else(|| credentials::Source::choose(&|name| std::env::var(name).ok()));
        let max_poll = config.max_poll.unwrap_or(Duration::from_secs(10));
        let timeout = config.call_timeout.unwrap_or(errors::DEFAULT_CALL_TIMEOUT);
        let arm = Arm::new(
            config.endpoint,
            credentials::Cached::new(source),
            timeout,
            max_poll,
        )?;
        Ok(AzureProvider {
            arm,
            subscription: config.subscription,
            resource_group: config.resource_group,
            cluster_uid: config.cluster_uid,
            max_poll,
            create_wait: config.create_wait.unwrap_or(Duration::from_secs(60)),
        })
    }

    async fn scale_set(&self, set: &ScaleSetRef) -> Result<ScaleSet, CloudError> {
        self.arm.get(&set.id(), &format!("scale set {}", set.id())).await
    }

    async fn vms(&self, set: &ScaleSetRef) -> Result<Vec<ScaleSetVm>, CloudError> {
        let path = format!("{}/virtualMachines", set.id());
        self.arm
            .list(&path, &format!("the VMs of scale set {}", set.name))
            .await
    }

    async fn vm(&self, at: &VmRef) -> Result<ScaleSetVm, CloudError> {
        self.arm.get(&at.id(), &format!("VM {}", at.provider_id())).await
    }

    /// One step of a keyed create after another until its VM is claimed.
    async fn create(&self, request: &CreateNodeRequest) -> Result<CreatedNode, CloudError> {
        let set = ScaleSetRef::parse(&request.group_id)?;
        let key = match &request.request_id {
            Some(key) => key.clone(),
            None => format!("anonymous-{}", unix_now()),
        };
        let started = tokio::time::Instant::now();
        loop {
            let current = self.scale_set(&set).await?;
            let vms = self.vms(&set).await?;
            let ids = instance_ids(&vms)?;
            let etag = current.etag.as_deref();
            let written = match records::next_step(&key, &current.tags, &ids, unix_now()) {
                Step::Done(id) => match created(&set, &vms, id)? {
                    Some(node) => return Ok(node),
                    None => true, // Named once ARM shows its OS profile.
                },
                Step::WriteTags { tags, claimed } => {
                    let ok = self.write(&set, json!({"tags": tags}), etag).await?;
                    match claimed
                        .filter(|_| ok)
                        .map(|id| created(&set, &vms, id))
                        .transpose()?
                    {
                        Some(Some(node)) => return Ok(node),
                        _ => ok,
                    }
                }
                Step::ScaleOut { tags } => {
                    let body = json!({"sku": {"capacity": current.sku.capacity + 1}, "tags": tags});
                    self.write(&set, body, etag).await?
                }
                Step::Wait => true,
            };
            if started.elapsed() >= self.create_wait {
                return Err(CloudError::ChangeInDoubt {
                    change: format!("the scale-out of {} for {key}", set.name),
                    waited: started.elapsed(),
                    limit: Duration::from_secs(records::PENDING_LIMIT_SECS),
                });
            }
            if written {
                tokio::time::sleep(self.max_poll.min(Duration::from_secs(1))).await;
            }
        }
    }

    /// PATCHes the scale set if its etag is still `etag`; false when it
    /// changed since (the caller reads it again). The operation is not
    /// waited for: the capacity and tags show at once.
    async fn write(
        &self,
        set: &ScaleSetRef,
        body: serde_json::Value,
        etag: Option<&str>,
    ) -> Result<bool, CloudError> {
        let what = format!("scale set {}", set.id());
        match self.arm.patch(&set.id(), &body, etag, &what).await {
            Ok(_) => Ok(true),
            Err(CloudError::Rejected { status: 412, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn delete(&self, provider_id: &str) -> Result<(), CloudError> {
        let at = VmRef::parse(provider_id)?;
        let vm = self.vm(&at).await?;
        if vm.properties.provisioning_state.eq_ignore_ascii_case("Deleting") {
            return Ok(());
        }
        let path = format!("{}/delete", at.scale_set.id());
        let body = json!({"instanceIds": [at.instance_id]});
        match self.arm.post(&path, &body, &format!("VM {provider_id}")).await {
            Ok(_) => Ok(()),
            // Gone between the read and the delete.
            Err(e) if e.is_not_found() => self.vm(&at).await.map(|_| ()),
            Err(e) => Err(e),
        }
    }

    async fn groups(&self) -> Result<Vec<ScalingGroup>, CloudError> {
        let path = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets",
            self.subscription, self.resource_group
        );
        let sets: Vec<ScaleSet> = self.arm.list(&path, "the scale sets").await?;
        let mut out = Vec::new();
        for set in sets {
            if set.tags.get(CLUSTER_TAG) != Some(&self.cluster_uid) {
                continue;
            }
            let Some(role) = set.tags.get(ROLE_TAG) else {
                tracing::warn!(scale_set = %set.name, "not a scaling group: no {ROLE_TAG} tag");
                continue;
            };
            let role = role_of(role);
            let name = match set.tags.get(NODE_GROUP_TAG) {
                Some(group) => group.clone(),
                None => default_node_group(role).to_string(),
            };
            let image = model_image(&set)?;
            let size = u32::try_from(set.sku.capacity).unwrap_or(0);
            out.push(ScalingGroup {
                id: set.id,
                role,
                name,
                size,
                image,
            });
        }
        Ok(out)
    }
}

/// The node group of a scale set that names none (Constellation's defaults).
fn default_node_group(role: GroupRole) -> &'static str {
    match role {
        GroupRole::ControlPlane => "control_plane_default",
        _ => "worker_default",
    }
}

fn role_of(tag: &str) -> GroupRole {
    match tag {
        "control-plane" | "controlplane" | "ControlPlane" => GroupRole::ControlPlane,
        _ => GroupRole::Worker,
    }
}

fn model_image(set: &ScaleSet) -> Result<String, CloudError> {
    let reference = &set
        .properties
        .virtual_machine_profile
        .storage_profile
        .image_reference;
    reference.image().ok_or_else(|| {
        CloudError::InvalidResponse(format!("scale set {} names no image in its model", set.id))
    })
}

/// The VMs' instance IDs as numbers (Uniform scale sets number them).
fn instance_ids(vms: &[ScaleSetVm]) -> Result<Vec<u64>, CloudError> {
    vms.iter()
        .map(|vm| {
            vm.instance_id.parse::<u64>().map_err(|_| {
                CloudError::Config(format!(
                    "VM {} has instance ID {:?}: only Uniform scale sets (numbered instances) are supported",
                    vm.id, vm.instance_id
                ))
            })
        })
        .collect()
}

/// What a create returns: the VM `id` of `vms`; None while ARM shows no
/// computer name for it yet (its Node's name).
fn created(set: &ScaleSetRef, vms: &[ScaleSetVm], id: u64) -> Result<Option<CreatedNode>, CloudError> {
    let vm = vms
        .iter()
        .find(|vm| vm.instance_id == id.to_string())
        .ok_or_else(|| CloudError::InvalidResponse(format!("VM {id} of scale set {} vanished", set.name)))?;
    let name = vm.properties.os_profile.computer_name.to_lowercase();
    if name.is_empty() {
        return Ok(None);
    }
    Ok(Some(CreatedNode {
        node_name: name,
        provider_id: set.vm(&vm.instance_id).provider_id(),
        image: vm.properties.storage_profile.image_reference.image(),
    }))
}

/// An instance view's state: the first status code nodewarden knows wins.
pub fn state_of(view: &InstanceView) -> InstanceState {
    view.statuses
        .iter()
        .find_map(|s| code_state(&s.code.to_ascii_lowercase()))
        .unwrap_or(InstanceState::Unknown)
}

fn code_state(code: &str) -> Option<InstanceState> {
    // A failure's code may name its cause: `ProvisioningState/failed/<code>`.
    if code.starts_with("provisioningstate/failed") {
        return Some(InstanceState::Failed);
    }
    Some(match code {
        "provisioningstate/creating" | "powerstate/starting" => InstanceState::Creating,
        "provisioningstate/updating" | "provisioningstate/migrating" => InstanceState::Stopped,
        "provisioningstate/deleting" => InstanceState::Terminating,
        "powerstate/stopping"
        | "powerstate/stopped"
        | "powerstate/deallocating"
        | "powerstate/deallocated" => InstanceState::Stopped,
        "powerstate/running" => InstanceState::Ready,
        _ => return None,
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl CloudProvider for AzureProvider {
    fn name(&self) -> &str {
        "azure"
    }

    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        Box::pin(self.create(request))
    }

    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(self.delete(provider_id))
    }

    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        Box::pin(async move {
            let at = VmRef::parse(provider_id)?;
            let path = format!("{}/instanceView", at.id());
            let view: InstanceView = self.arm.get(&path, &format!("VM {provider_id}")).await?;
            Ok(state_of(&view))
        })
    }

    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move {
            let vm = self.vm(&VmRef::parse(provider_id)?).await?;
            vm.properties
                .storage_profile
                .image_reference
                .image()
                .ok_or_else(|| CloudError::InvalidResponse(format!("VM {provider_id} names no image")))
        })
    }

    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move { Ok(VmRef::parse(provider_id)?.scale_set.id()) })
    }

    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move { model_image(&self.scale_set(&ScaleSetRef::parse(group_id)?).await?) })
    }

    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let set = ScaleSetRef::parse(group_id)?;
            let reference = image::reference_for(image);
            let body = json!({"properties": {"virtualMachineProfile": {"storageProfile": {"imageReference": reference}}}});
            let what = format!("the image of scale set {}", set.id());
            let reply = self.arm.patch(&set.id(), &body, None, &what).await?;
            self.arm.wait(&reply, OPERATION_TIMEOUT, &what).await
        })
    }

    fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
        Box::pin(self.groups())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::Status;

    #[test]
    fn instance_views_map_to_states_first_known_code_first() {
        let view = |codes: &[&str]| InstanceView {
            statuses: codes.iter().map(|c| Status { code: c.to_string() }).collect(),
        };
        let cases = [
            (
                vec!["ProvisioningState/creating", "PowerState/starting"],
                InstanceState::Creating,
            ),
            (
                vec!["ProvisioningState/succeeded", "PowerState/running"],
                InstanceState::Ready,
            ),
            (
                vec!["ProvisioningState/succeeded", "PowerState/deallocated"],
                InstanceState::Stopped,
            ),
            (
                vec!["ProvisioningState/failed/InternalError", "PowerState/running"],
                InstanceState::Failed,
            ),
            (
                vec!["ProvisioningState/failed", "PowerState/running"],
                InstanceState::Failed,
            ),
            (
                vec!["ProvisioningState/deleting", "PowerState/stopping"],
                InstanceState::Terminating,
            ),
            (
                vec!["ProvisioningState/updating", "PowerState/running"],
                InstanceState::Stopped,
            ),
            (vec!["OSState/generalized"], InstanceState::Unknown),
        ];
        for (codes, want) in cases {
            assert_eq!(state_of(&view(&codes)), want, "{codes:?}");
        }
    }

    #[test]
    fn a_provider_needs_the_cluster_subscription_and_group() {
        let config = AzureConfig {
            cluster_uid: "u".into(),
            subscription: "s".into(),
            ..Default::default()
        };
        let Err(CloudError::Config(why)) = AzureProvider::new(config) else {
            panic!("refused");
        };
        assert!(why.contains("--azure-resource-group"), "{why}");
    }
}
