//! The `aws` provider: Auto Scaling groups and EC2, on the official SDK
//! (rustls with ring, no C crypto), mapped the way Constellation maps them.
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
//! Calls do not retry inside (the SDK's retries are off): the work queue's
//! backoff is in charge and every retry shows in its metrics.

mod doubt;
mod errors;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_autoscaling::types::{AutoScalingGroup, Filter as AsgFilter, Tag as AsgTag};
use aws_sdk_ec2::types::{Filter, InstanceStateName, RequestLaunchTemplateData, Tag};

use super::{
    CloudError, CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, GroupRole, InstanceState,
    ScalingGroup,
};
use doubt::{Change, InDoubt, Seen, Verdict};
use errors::sdk_error;

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
    /// Another endpoint for every service (moto, LocalStack); else the
    /// SDK's (`AWS_ENDPOINT_URL` is honoured by the SDK too).
    pub endpoint: Option<String>,
    /// The region; else the SDK's chain (`AWS_REGION`, profile, IMDS).
    pub region: Option<String>,
    /// Fixed credentials (access key id, secret) for an emulator; else the
    /// SDK's chain (env, web identity / IRSA, profile, instance profile).
    pub static_credentials: Option<(String, String)>,
    /// How long one call may take; None: [`errors::DEFAULT_CALL_TIMEOUT`].
    pub call_timeout: Option<Duration>,
}

/// Auto Scaling groups and EC2 instances of one cluster.
pub struct AwsProvider {
    asg: aws_sdk_autoscaling::Client,
    ec2: aws_sdk_ec2::Client,
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
    /// The SDK's operation timeout (reported in timeout errors).
    call_timeout: Duration,
}

impl AwsProvider {
    /// A provider from the SDK's standard chains (credentials: env, web
    /// identity / IRSA, profile, instance profile; region likewise).
    pub async fn new(config: AwsConfig) -> Result<AwsProvider, CloudError> {
        use aws_smithy_http_client::tls;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
            .build_https();
        let call_timeout = config.call_timeout.unwrap_or(errors::DEFAULT_CALL_TIMEOUT);
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_timeout(call_timeout)
                    .connect_timeout(Duration::from_secs(5))
                    .build(),
            );
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some((id, secret)) = &config.static_credentials {
            let credentials =
                aws_sdk_ec2::config::Credentials::new(id, secret, None, None, "nodewarden-static");
            loader = loader.credentials_provider(credentials);
        }
        if let Some(region) = &config.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(CloudError::Config(
                "no AWS region: set AWS_REGION or --aws-region".into(),
            ));
        }
        if config.cluster_uid.is_empty() {
            return Err(CloudError::Config("no cluster uid (--aws-cluster-uid)".into()));
        }
        Ok(AwsProvider {
            asg: aws_sdk_autoscaling::Client::new(&sdk),
            ec2: aws_sdk_ec2::Client::new(&sdk),
            cluster_uid: config.cluster_uid,
            create_locks: std::sync::Mutex::default(),
            capacity: tokio::sync::Mutex::default(),
            appear_timeout: Duration::from_secs(60),
            call_timeout,
        })
    }

    /// One failed SDK call about `what`, as a [`CloudError`].
    fn failed<E>(&self, e: aws_sdk_ec2::error::SdkError<E>, what: &str) -> CloudError
    where
        E: aws_sdk_ec2::error::ProvideErrorMetadata + std::fmt::Debug,
    {
        sdk_error(e, what, self.call_timeout)
    }

    async fn group(&self, name: &str) -> Result<AutoScalingGroup, CloudError> {
        let out = self
            .asg
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(name)
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("Auto Scaling group {name}")))?;
        first(out.auto_scaling_groups, || format!("Auto Scaling group {name}"))
    }

    /// The group's launch template: (id, version as the group names it).
    fn template_of(group: &AutoScalingGroup) -> Result<(String, String), CloudError> {
        let spec = group
            .launch_template
            .as_ref()
            .or_else(|| {
                group
                    .mixed_instances_policy
                    .as_ref()
                    .and_then(|m| m.launch_template.as_ref())
                    .and_then(|t| t.launch_template_specification.as_ref())
            })
            .ok_or_else(|| {
                CloudError::InvalidResponse(format!(
                    "Auto Scaling group {} has no launch template",
                    group.auto_scaling_group_name.as_deref().unwrap_or("?")
                ))
            })?;
        let id = spec
            .launch_template_id
            .clone()
            .or_else(|| spec.launch_template_name.clone())
            .unwrap_or_default();
        Ok((id, spec.version.clone().unwrap_or_else(|| "$Default".into())))
    }

    async fn template_version(
        &self,
        template: &str,
        version: &str,
    ) -> Result<aws_sdk_ec2::types::LaunchTemplateVersion, CloudError> {
        let request = self.ec2.describe_launch_template_versions().versions(version);
        let request = if template.starts_with("lt-") {
            request.launch_template_id(template)
        } else {
            request.launch_template_name(template)
        };
        let out = request
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("launch template {template}")))?;
        first(out.launch_template_versions, || {
            format!("launch template {template} version {version}")
        })
    }

    async fn instance(&self, id: &str) -> Result<aws_sdk_ec2::types::Instance, CloudError> {
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(id)
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("instance {id}")))?;
        first(Some(instances_of(out)), || format!("instance {id}"))
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
        let desired = group.desired_capacity.unwrap_or(0);
        let sent = tokio::time::Instant::now();
        let set = self
            .asg
            .set_desired_capacity()
            .auto_scaling_group_name(&request.group_id)
            .desired_capacity(desired + 1)
            .honor_cooldown(false)
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("Auto Scaling group {}", request.group_id)));
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
                Change::Desired { group, .. } => {
                    Seen::Desired(self.group(group).await?.desired_capacity.unwrap_or(0))
                }
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
    async fn memberships(
        &self,
        id: &str,
    ) -> Result<Vec<aws_sdk_autoscaling::types::AutoScalingInstanceDetails>, CloudError> {
        let out = self
            .asg
            .describe_auto_scaling_instances()
            .instance_ids(id)
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("instance {id}")))?;
        Ok(out.auto_scaling_instances.unwrap_or_default())
    }

    /// Whether the instance is in a group and not leaving it.
    async fn in_service(&self, id: &str) -> Result<bool, CloudError> {
        Ok(self.memberships(id).await?.iter().any(|i| {
            let state = i.lifecycle_state().unwrap_or_default();
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
        self.ec2
            .create_tags()
            .resources(id)
            .tags(Tag::builder().key(REQUEST_TAG).value(request_id).build())
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("instance {id}")))?;
        self.set_launch_key(group, None).await?;
        self.created(id).await
    }

    /// Puts (Some) or takes off (None) the group's request tag: the
    /// instances it starts meanwhile carry the request's key from launch.
    async fn set_launch_key(&self, group: &str, key: Option<&str>) -> Result<(), CloudError> {
        let tag = AsgTag::builder()
            .resource_id(group)
            .resource_type("auto-scaling-group")
            .key(REQUEST_TAG)
            .value(key.unwrap_or_default())
            .propagate_at_launch(true)
            .build();
        let what = format!("tags of Auto Scaling group {group}");
        match key {
            Some(_) => self
                .asg
                .create_or_update_tags()
                .tags(tag)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| self.failed(e, &what)),
            None => self
                .asg
                .delete_tags()
                .tags(tag)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| self.failed(e, &what)),
        }
    }

    async fn tagged_instance(
        &self,
        members: &BTreeSet<String>,
        request_id: &str,
    ) -> Result<Option<String>, CloudError> {
        if members.is_empty() {
            return Ok(None);
        }
        let out = self
            .ec2
            .describe_instances()
            .set_instance_ids(Some(members.iter().cloned().collect()))
            .filters(
                Filter::builder()
                    .name(format!("tag:{REQUEST_TAG}"))
                    .values(request_id)
                    .build(),
            )
            .send()
            .await
            .map_err(|e| self.failed(e, "the group's instances"))?;
        Ok(instances_of(out).into_iter().find_map(|i| i.instance_id))
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
        let zone = instance
            .placement
            .as_ref()
            .and_then(|p| p.availability_zone.clone())
            .unwrap_or_default();
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
        v.launch_template_data
            .and_then(|d| d.image_id)
            .ok_or_else(|| CloudError::InvalidResponse(format!("launch template {template} has no ImageId")))
    }

    async fn set_image(&self, name: &str, image: &str) -> Result<(), CloudError> {
        let group = self.group(name).await?;
        let (template, version) = Self::template_of(&group)?;
        let current = self.template_version(&template, &version).await?;
        let data = current
            .launch_template_data
            .clone()
            .unwrap_or_else(|| aws_sdk_ec2::types::ResponseLaunchTemplateData::builder().build());
        if data.image_id.as_deref() == Some(image) {
            return Ok(());
        }
        let request = self
            .ec2
            .create_launch_template_version()
            .source_version(current.version_number.unwrap_or(1).to_string())
            .launch_template_data(request_data(&data, image))
            .version_description(format!("nodewarden: image {image}"));
        let request = if template.starts_with("lt-") {
            request.launch_template_id(&template)
        } else {
            request.launch_template_name(&template)
        };
        let created = request
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("launch template {template}")))?;
        let number = created
            .launch_template_version
            .and_then(|v| v.version_number)
            .ok_or_else(|| CloudError::InvalidResponse("a new template version without a number".into()))?;
        let modify = self
            .ec2
            .modify_launch_template()
            .default_version(number.to_string());
        let modify = if template.starts_with("lt-") {
            modify.launch_template_id(&template)
        } else {
            modify.launch_template_name(&template)
        };
        modify
            .send()
            .await
            .map_err(|e| self.failed(e, &format!("launch template {template}")))?;
        Ok(())
    }

    async fn groups(&self) -> Result<Vec<ScalingGroup>, CloudError> {
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = self
                .asg
                .describe_auto_scaling_groups()
                .filters(
                    AsgFilter::builder()
                        .name(format!("tag:{CLUSTER_TAG}"))
                        .values(&self.cluster_uid)
                        .build(),
                )
                .set_next_token(next.clone())
                .send()
                .await
                .map_err(|e| self.failed(e, "Auto Scaling groups"))?;
            for g in page.auto_scaling_groups.unwrap_or_default() {
                let name = g.auto_scaling_group_name.clone().unwrap_or_default();
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
            next = page.next_token;
            if next.is_none() {
                return Ok(out);
            }
        }
    }
}

/// The first item of a list answer, or NotFound naming `what`.
fn first<T>(items: Option<Vec<T>>, what: impl FnOnce() -> String) -> Result<T, CloudError> {
    items
        .unwrap_or_default()
        .into_iter()
        .next()
        .ok_or_else(|| CloudError::NotFound { what: what() })
}

/// The instances of a DescribeInstances answer.
fn instances_of(
    out: aws_sdk_ec2::operation::describe_instances::DescribeInstancesOutput,
) -> Vec<aws_sdk_ec2::types::Instance> {
    out.reservations
        .unwrap_or_default()
        .into_iter()
        .flat_map(|r| r.instances.unwrap_or_default())
        .collect()
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
pub fn state_of(name: Option<&InstanceStateName>) -> InstanceState {
    match name {
        Some(InstanceStateName::Pending) => InstanceState::Creating,
        Some(InstanceStateName::Running) => InstanceState::Ready,
        Some(InstanceStateName::ShuttingDown) => InstanceState::Terminating,
        Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => InstanceState::Stopped,
        Some(InstanceStateName::Terminated) => InstanceState::Terminated,
        _ => InstanceState::Unknown,
    }
}

/// The group's instances not on their way out.
fn instance_ids(group: &AutoScalingGroup) -> BTreeSet<String> {
    group
        .instances()
        .iter()
        .filter(|i| {
            !i.lifecycle_state()
                .is_some_and(|s| s.as_str().starts_with("Terminat"))
        })
        .filter_map(|i| i.instance_id.clone())
        .collect()
}

fn group_tag(group: &AutoScalingGroup, key: &str) -> Option<String> {
    group
        .tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value.clone())
}

/// The name the instance's Node gets: its private DNS name (what the AWS
/// cloud provider names nodes), else its id.
fn node_name(instance: &aws_sdk_ec2::types::Instance) -> String {
    instance
        .private_dns_name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| instance.instance_id.clone())
        .unwrap_or_default()
}

/// A new template version's data: the current settings with a new image.
/// SourceVersion carries the rest on AWS; the settings an instance needs
/// are sent in full too, for endpoints that ignore SourceVersion.
fn request_data(
    data: &aws_sdk_ec2::types::ResponseLaunchTemplateData,
    image: &str,
) -> RequestLaunchTemplateData {
    RequestLaunchTemplateData::builder()
        .image_id(image)
        .set_instance_type(data.instance_type.clone())
        .set_key_name(data.key_name.clone())
        .set_user_data(data.user_data.clone())
        .set_security_group_ids(data.security_group_ids.clone())
        .set_iam_instance_profile(data.iam_instance_profile.as_ref().map(|p| {
            aws_sdk_ec2::types::LaunchTemplateIamInstanceProfileSpecificationRequest::builder()
                .set_arn(p.arn.clone())
                .set_name(p.name.clone())
                .build()
        }))
        .build()
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
            let result = self
                .asg
                .terminate_instance_in_auto_scaling_group()
                .instance_id(id)
                .should_decrement_desired_capacity(true)
                .send()
                .await;
            match result.map_err(|e| self.failed(e, &format!("instance {id}"))) {
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
            let out = self
                .ec2
                .describe_instance_status()
                .instance_ids(id)
                .include_all_instances(true)
                .send()
                .await
                .map_err(|e| self.failed(e, &format!("instance {id}")))?;
            let status = out.instance_statuses.unwrap_or_default().into_iter().next();
            match status {
                Some(s) => Ok(state_of(s.instance_state.and_then(|s| s.name).as_ref())),
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
                .find_map(|i| i.auto_scaling_group_name)
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
            (InstanceStateName::Pending, InstanceState::Creating),
            (InstanceStateName::Running, InstanceState::Ready),
            (InstanceStateName::ShuttingDown, InstanceState::Terminating),
            (InstanceStateName::Stopped, InstanceState::Stopped),
            (InstanceStateName::Terminated, InstanceState::Terminated),
        ] {
            assert_eq!(state_of(Some(&name)), state, "{name:?}");
        }
        assert_eq!(state_of(None), InstanceState::Unknown);
    }
}
