//! The `aws` provider: Auto Scaling groups and EC2 through their Query APIs
//! (SigV4-signed, rustls with ring, no C crypto), mapped the way
//! Constellation maps them.
//!
//! - A ScalingGroup's groupId is the Auto Scaling group's name; the cluster's
//!   groups carry the tag `constellation-uid`, their role
//!   `constellation-role` and their node group `constellation-node-group`.
//! - The group image is the ImageId of its launch template's version; a new
//!   image is a new template version (with the instance settings copied)
//!   made the default.
//! - create = desired capacity + 1 and the new instance found; delete =
//!   terminate in the group with decrement.
//! - Provider IDs are `aws:///<zone>/<instance-id>`.
//!
//! Calls do not retry inside: the work queue's backoff is in charge and
//! every retry shows in its metrics.

pub mod api;
pub mod credentials;
mod doubt;
mod errors;
pub mod form;
pub mod query;
mod sigv4;
pub mod xml;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::{
    CloudError, CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, GroupRole, InstanceState,
    ScalingGroup,
};
use api::{Group, Instance};
use doubt::{Change, InDoubt, Seen, Verdict};
use query::QueryClient;

/// The cluster tag on the cluster's Auto Scaling groups (Constellation's).
pub const CLUSTER_TAG: &str = "constellation-uid";
/// The role tag: `control-plane` (or `controlplane`) or `worker`.
pub const ROLE_TAG: &str = "constellation-role";
/// The node group tag (the ScalingGroup's nodeGroupName).
pub const NODE_GROUP_TAG: &str = "constellation-node-group";
/// The tag an instance created for a request carries: its idempotency key.
/// The group carries it too while a create is under way, propagated at
/// launch: the instance started for the request is born with its key, so a
/// create cut off before it tagged the instance (a leader killed) still
/// finds it, whatever the group's capacity did since.
pub const REQUEST_TAG: &str = "nodewarden.dev/request-id";

/// How the provider reaches AWS.
#[derive(Clone, Debug, Default)]
pub struct AwsConfig {
    /// The cluster's `constellation-uid`: only its groups are listed.
    pub cluster_uid: String,
    /// Another endpoint for every service (moto, LocalStack); else
    /// `AWS_ENDPOINT_URL_<SERVICE>`, `AWS_ENDPOINT_URL`, or AWS's own.
    pub endpoint: Option<String>,
    /// The region of the cluster's groups (the binary's edge resolves it
    /// from `--aws-region`, `AWS_REGION` or `AWS_DEFAULT_REGION`).
    pub region: String,
    /// Fixed credentials (access key id, secret) for an emulator; else the
    /// chain of [`credentials`] (env, web identity / IRSA, container,
    /// profile, instance profile).
    pub static_credentials: Option<(String, String)>,
    /// How long one call may take; None: [`errors::DEFAULT_CALL_TIMEOUT`].
    pub call_timeout: Option<Duration>,
}

/// Auto Scaling groups and EC2 instances of one cluster.
pub struct AwsProvider {
    client: QueryClient,
    cluster_uid: String,
    /// Creates in one group run one at a time: "desired + 1" read and
    /// written by two at once would start one instance for two requests.
    create_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// A create's read of the desired capacity and its write of "desired + 1"
    /// exclude every terminate (which decrements it): a terminate landing
    /// between the two was undone by the write, and the group started an
    /// instance nobody asked for (CI's tests/it/aws.rs, one run in several: an
    /// untracked tenth node on the new image where nine were rolled).
    /// It holds the capacity changes whose answer never came: none is sent
    /// while one of them may still land ([`doubt`]).
    capacity: tokio::sync::Mutex<Vec<InDoubt>>,
    /// How long a create waits for its instance to show in the group.
    appear_timeout: Duration,
}

impl AwsProvider {
    /// A provider of the cluster's groups in the configured region, with
    /// credentials from the chain of [`credentials`].
    pub async fn new(config: AwsConfig) -> Result<AwsProvider, CloudError> {
        if config.region.trim().is_empty() {
            return Err(CloudError::Config("no AWS region (--aws-region)".into()));
        }
        if config.cluster_uid.is_empty() {
            return Err(CloudError::Config("no cluster uid (--aws-cluster-uid)".into()));
        }
        let client = QueryClient::new(query::Settings {
            region: config.region,
            endpoint: config.endpoint,
            static_credentials: config.static_credentials,
            call_timeout: config.call_timeout.unwrap_or(errors::DEFAULT_CALL_TIMEOUT),
        })?;
        Ok(AwsProvider {
            client,
            cluster_uid: config.cluster_uid,
            create_locks: std::sync::Mutex::default(),
            capacity: tokio::sync::Mutex::default(),
            appear_timeout: Duration::from_secs(60),
        })
    }

    async fn group(&self, name: &str) -> Result<Group, CloudError> {
        let (groups, _) = api::describe_groups(&self.client, &[name], None, None).await?;
        first(groups, || format!("Auto Scaling group {name}"))
    }

    /// The group's launch template: (id, version as the group names it).
    fn template_of(group: &Group) -> Result<(String, String), CloudError> {
        let spec = group.template.as_ref().ok_or_else(|| {
            CloudError::InvalidResponse(format!(
                "Auto Scaling group {} has no launch template",
                group.name
            ))
        })?;
        let id = spec.id.clone().or_else(|| spec.name.clone()).unwrap_or_default();
        Ok((id, spec.version.clone().unwrap_or_else(|| "$Default".into())))
    }

    async fn template_version(
        &self,
        template: &str,
        version: &str,
    ) -> Result<api::TemplateVersion, CloudError> {
        let versions = api::template_versions(&self.client, template, version).await?;
        first(versions, || {
            format!("launch template {template} version {version}")
        })
    }

    async fn instance(&self, id: &str) -> Result<Instance, CloudError> {
        let found = api::describe_instances(&self.client, &[id], None).await?;
        first(found, || format!("instance {id}"))
    }

    fn create_lock(&self, group: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.create_locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(group.to_string()).or_default().clone()
    }

    async fn create(&self, request: &CreateNodeRequest) -> Result<CreatedNode, CloudError> {
        let lock = self.create_lock(&request.group_id);
        let _one_at_a_time = lock.lock().await;
        let mut capacity = self.capacity.lock().await;
        self.settle(&mut capacity).await?;
        let group = self.group(&request.group_id).await?;
        let members: BTreeSet<String> = instance_ids(&group);
        if let Some(request_id) = &request.request_id {
            // Asked before: the instance started for it carries the key. Not
            // "desired above what it was": a terminate's decrement since
            // (another leader retiring a donor) hides a create that landed,
            // and asking again started a second instance for one request.
            if let Some(found) = self.tagged_instance(&members, request_id).await? {
                return self.finish_create(&request.group_id, &found, request_id).await;
            }
            self.set_launch_key(&request.group_id, Some(request_id)).await?;
        }
        let desired = group.desired_capacity;
        let sent = tokio::time::Instant::now();
        let set = api::set_desired_capacity(&self.client, &request.group_id, desired + 1).await;
        if let Err(e) = set {
            let change = Change::Desired {
                group: request.group_id.clone(),
                before: desired,
            };
            doubt::note(&mut capacity, &e, change, sent);
            return Err(e);
        }
        drop(capacity);
        let id = self.wait_new_instance(&request.group_id, &members).await?;
        match &request.request_id {
            Some(request_id) => self.finish_create(&request.group_id, &id, request_id).await,
            None => self.created(&id).await,
        }
    }

    /// Clears the capacity changes in doubt that have landed or can no
    /// longer land; fails while one may still land.
    async fn settle(&self, doubts: &mut Vec<InDoubt>) -> Result<(), CloudError> {
        while let Some(doubt) = doubts.first() {
            let seen = match &doubt.change {
                Change::Desired { group, .. } => Seen::Desired(self.group(group).await?.desired_capacity),
                Change::Terminate { instance } => Seen::InService(self.in_service(instance).await?),
            };
            match doubt::judge(doubt, seen, tokio::time::Instant::now()) {
                Verdict::Landed => {}
                Verdict::Dropped => {
                    tracing::warn!(change = %doubt.change, "a capacity change without an answer never showed: taken as dropped")
                }
                Verdict::Wait => {
                    return Err(CloudError::ChangeInDoubt {
                        change: doubt.change.to_string(),
                        waited: doubt.sent.elapsed(),
                        limit: doubt::DOUBT_LIMIT,
                    });
                }
            }
            doubts.remove(0);
        }
        Ok(())
    }

    /// The instance's membership of Auto Scaling groups (none or one).
    async fn memberships(&self, id: &str) -> Result<Vec<api::GroupInstance>, CloudError> {
        api::describe_group_instances(&self.client, &[id]).await
    }

    /// Whether the instance is in a group and not leaving it.
    async fn in_service(&self, id: &str) -> Result<bool, CloudError> {
        Ok(self.memberships(id).await?.iter().any(|i| {
            let state = &i.lifecycle_state;
            !(state.starts_with("Terminat") || state.starts_with("Detach"))
        }))
    }

    /// Tags the new instance with its request (again, if it was born with
    /// it) and takes the request off the group.
    async fn finish_create(
        &self,
        group: &str,
        id: &str,
        request_id: &str,
    ) -> Result<CreatedNode, CloudError> {
        api::tag_resource(&self.client, id, REQUEST_TAG, request_id).await?;
        self.set_launch_key(group, None).await?;
        self.created(id).await
    }

    /// Puts (Some) or takes off (None) the group's request tag: the
    /// instances it starts meanwhile carry the request's key from launch.
    async fn set_launch_key(&self, group: &str, key: Option<&str>) -> Result<(), CloudError> {
        api::set_group_tag(&self.client, group, REQUEST_TAG, key).await
    }

    async fn tagged_instance(
        &self,
        members: &BTreeSet<String>,
        request_id: &str,
    ) -> Result<Option<String>, CloudError> {
        if members.is_empty() {
            return Ok(None);
        }
        let ids: Vec<&str> = members.iter().map(String::as_str).collect();
        let tagged = api::describe_instances(&self.client, &ids, Some((REQUEST_TAG, request_id))).await?;
        Ok(tagged.into_iter().map(|i| i.id).find(|id| !id.is_empty()))
    }

    async fn wait_new_instance(&self, group: &str, before: &BTreeSet<String>) -> Result<String, CloudError> {
        let deadline = tokio::time::Instant::now() + self.appear_timeout;
        loop {
            let now = instance_ids(&self.group(group).await?);
            if let Some(new) = now.difference(before).next() {
                return Ok(new.clone());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(CloudError::Timeout {
                    after: self.appear_timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn created(&self, id: &str) -> Result<CreatedNode, CloudError> {
        let instance = self.instance(id).await?;
        let zone = instance.zone.clone().unwrap_or_default();
        Ok(CreatedNode {
            node_name: node_name(&instance),
            provider_id: format!("aws:///{zone}/{id}"),
            image: instance.image_id.clone(),
        })
    }

    async fn group_image_of(&self, name: &str) -> Result<String, CloudError> {
        let group = self.group(name).await?;
        let (template, version) = Self::template_of(&group)?;
        let v = self.template_version(&template, &version).await?;
        v.data
            .image_id
            .ok_or_else(|| CloudError::InvalidResponse(format!("launch template {template} has no ImageId")))
    }

    async fn set_image(&self, name: &str, image: &str) -> Result<(), CloudError> {
        let group = self.group(name).await?;
        let (template, version) = Self::template_of(&group)?;
        let current = self.template_version(&template, &version).await?;
        if current.data.image_id.as_deref() == Some(image) {
            return Ok(());
        }
        let data = api::TemplateData {
            image_id: Some(image.to_string()),
            ..current.data.clone()
        };
        let description = format!("nodewarden: image {image}");
        let source = current.number.unwrap_or(1);
        let number =
            api::create_template_version(&self.client, &template, source, &data, &description).await?;
        api::set_default_version(&self.client, &template, number).await
    }

    async fn groups(&self) -> Result<Vec<ScalingGroup>, CloudError> {
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let tag = Some((CLUSTER_TAG, self.cluster_uid.as_str()));
            let (page, token) = api::describe_groups(&self.client, &[], tag, next.as_deref()).await?;
            for g in page {
                let name = g.name.clone();
                let role = match group_tag(&g, ROLE_TAG).as_deref() {
                    Some("control-plane" | "controlplane" | "ControlPlane") => GroupRole::ControlPlane,
                    _ => GroupRole::Worker,
                };
                out.push(ScalingGroup {
                    id: name.clone(),
                    role,
                    name: group_tag(&g, NODE_GROUP_TAG).unwrap_or_else(|| name.clone()),
                    size: u32::try_from(instance_ids(&g).len()).unwrap_or(0),
                    image: self.group_image_of(&name).await?,
                });
            }
            next = token;
            if next.is_none() {
                return Ok(out);
            }
        }
    }
}

/// The first item of a list answer, or NotFound naming `what`.
fn first<T>(items: Vec<T>, what: impl FnOnce() -> String) -> Result<T, CloudError> {
    items
        .into_iter()
        .next()
        .ok_or_else(|| CloudError::NotFound { what: what() })
}

/// `aws:///<zone>/<instance-id>` → the instance id.
pub fn instance_id(provider_id: &str) -> Result<&str, CloudError> {
    let invalid = |reason: &str| CloudError::InvalidProviderId {
        provider_id: provider_id.to_string(),
        reason: reason.to_string(),
    };
    let rest = provider_id
        .strip_prefix("aws://")
        .ok_or_else(|| invalid("not aws://"))?;
    let id = rest.rsplit('/').next().unwrap_or_default();
    if id.starts_with("i-") {
        Ok(id)
    } else {
        Err(invalid("no instance id (i-...) at its end"))
    }
}

/// What EC2 says of an instance, as a PendingNode's state. Not found is
/// the caller's to judge (see the trait).
pub fn state_of(name: Option<&str>) -> InstanceState {
    match name {
        Some("pending") => InstanceState::Creating,
        Some("running") => InstanceState::Ready,
        Some("shutting-down") => InstanceState::Terminating,
        Some("stopping" | "stopped") => InstanceState::Stopped,
        Some("terminated") => InstanceState::Terminated,
        _ => InstanceState::Unknown,
    }
}

/// The group's instances not on their way out.
fn instance_ids(group: &Group) -> BTreeSet<String> {
    group
        .instances
        .iter()
        .filter(|i| !i.lifecycle_state.starts_with("Terminat") && !i.id.is_empty())
        .map(|i| i.id.clone())
        .collect()
}

fn group_tag(group: &Group, key: &str) -> Option<String> {
    group.tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// The name the instance's Node gets: its private DNS name (what the AWS
/// cloud provider names nodes), else its id.
fn node_name(instance: &Instance) -> String {
    instance
        .private_dns_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| instance.id.clone())
}

impl CloudProvider for AwsProvider {
    fn name(&self) -> &str {
        "aws"
    }

    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        Box::pin(self.create(request))
    }

    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        Box::pin(async move {
            let id = instance_id(provider_id)?;
            let mut capacity = self.capacity.lock().await;
            self.settle(&mut capacity).await?;
            let sent = tokio::time::Instant::now();
            match api::terminate_in_group(&self.client, id).await {
                Ok(_) => Ok(()),
                // Already gone (or never in a group): nothing left to delete.
                Err(CloudError::NotFound { .. }) => Ok(()),
                Err(CloudError::Rejected { message, .. }) if message.contains("not found") => Ok(()),
                Err(e) => {
                    let change = Change::Terminate {
                        instance: id.to_string(),
                    };
                    doubt::note(&mut capacity, &e, change, sent);
                    Err(e)
                }
            }
        })
    }

    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        Box::pin(async move {
            let id = instance_id(provider_id)?;
            match api::instance_state(&self.client, id).await? {
                Some(name) => Ok(state_of(Some(&name))),
                None => Err(CloudError::NotFound {
                    what: format!("instance {id}"),
                }),
            }
        })
    }

    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move {
            let id = instance_id(provider_id)?;
            self.instance(id)
                .await?
                .image_id
                .ok_or_else(|| CloudError::InvalidResponse(format!("instance {id} has no ImageId")))
        })
    }

    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        Box::pin(async move {
            let id = instance_id(provider_id)?;
            self.memberships(id)
                .await?
                .into_iter()
                .map(|i| i.group)
                .find(|g| !g.is_empty())
                .ok_or_else(|| CloudError::NotFound {
                    what: format!("the Auto Scaling group of instance {id}"),
                })
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
    fn provider_ids() {
        assert_eq!(instance_id("aws:///us-east-1a/i-0abc").ok(), Some("i-0abc"));
        assert!(instance_id("gce://p/z/i").is_err());
        assert!(instance_id("aws:///us-east-1a/").is_err());
    }

    #[test]
    fn instance_states_stay_distinct() {
        for (name, state) in [
            ("pending", InstanceState::Creating),
            ("running", InstanceState::Ready),
            ("shutting-down", InstanceState::Terminating),
            ("stopping", InstanceState::Stopped),
            ("stopped", InstanceState::Stopped),
            ("terminated", InstanceState::Terminated),
        ] {
            assert_eq!(state_of(Some(name)), state, "{name}");
        }
        assert_eq!(state_of(Some("rebooting")), InstanceState::Unknown);
        assert_eq!(state_of(None), InstanceState::Unknown);
    }
}
