//! The ScalingGroup controller: keeps the image new instances of a cloud
//! scaling group boot (its instance template, launch template or scale set
//! model) equal to the image of the NodeVersion the ScalingGroup follows, and
//! reports it in `status.imageReference` with an `Outdated` condition.
//!
//! Also scaling-group discovery: [`discover`] (pure) finds the cloud groups
//! that have no ScalingGroup yet, [`discover_and_create`] creates them.
//!
//! Cloud failures that may pass (throttling, 5xx, timeouts) fail the
//! reconcile, so the work queue retries with backoff; refusals are reported
//! in the condition and looked at again only after [`REFUSED_REQUEUE`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::App;
use crate::api::update::{
    NodeRole, NodeVersion, ScalingGroup, ScalingGroupSpec, ScalingGroupStatus, condition,
};
use crate::cloud::{self, CloudError, CloudProvider, GroupRole};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, changed};
use crate::runtime::store::{Key, ObjectKey, Store};

/// Outdated=False: the group boots the NodeVersion's image.
pub const REASON_IMAGE_UP_TO_DATE: &str = "ImageUpToDate";
/// Outdated=True: the group boots another image.
pub const REASON_IMAGE_OUTDATED: &str = "ImageOutdated";
/// Outdated=Unknown: the NodeVersion named by `spec.nodeImage` does not exist.
pub const REASON_NODE_VERSION_NOT_FOUND: &str = "NodeVersionNotFound";
/// The cloud refused a call (asking again unchanged will not help).
pub const REASON_CLOUD_ERROR: &str = crate::api::update::reason::CLOUD_ERROR;
/// The spec cannot be acted on.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";

/// A refused cloud call is tried again after this long (the spec, the cloud
/// or its configuration may have been fixed meanwhile).
pub const REFUSED_REQUEUE: Duration = Duration::from_secs(300);
/// While the cloud has not taken the image yet, look again after this long.
pub const PENDING_REQUEUE: Duration = Duration::from_secs(10);

/// What the reconciler found, for [`status_for`].
#[derive(Clone, Debug, PartialEq)]
pub enum Observation<'a> {
    /// The NodeVersion `name` does not exist.
    NodeVersionMissing {
        /// The name in `spec.nodeImage`.
        name: &'a str,
    },
    /// The group boots `current`; it should boot `desired`.
    Image {
        /// The image the cloud group boots now.
        current: &'a str,
        /// The NodeVersion's image.
        desired: &'a str,
    },
    /// Something that retrying will not fix; `current` when it is known.
    Failed {
        /// The condition's reason, e.g. [`REASON_CLOUD_ERROR`].
        reason: &'static str,
        /// What went wrong, for the condition's message.
        message: String,
        /// The image the cloud group boots, if it could be read.
        current: Option<&'a str>,
        /// The NodeVersion's image.
        desired: &'a str,
    },
}

/// Does the cloud group need its image changed?
pub fn needs_image_change(current: &str, desired: &str) -> bool {
    current != desired
}

/// How a failed cloud call is handled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloudFailure {
    /// Fail the reconcile: the queue retries with backoff.
    Retry,
    /// Report it in the condition; look again after [`REFUSED_REQUEUE`].
    Report(String),
}

/// Retry what may pass (see [`CloudError::retryable`]); report the rest.
pub fn classify(err: &CloudError) -> CloudFailure {
    if err.retryable() {
        CloudFailure::Retry
    } else {
        CloudFailure::Report(err.to_string())
    }
}

/// Sets condition `type_` to `status` ("True", "False" or "Unknown"),
/// keeping lastTransitionTime unless the status changes.
fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.to_string();
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// The status a ScalingGroup should show after `observation`.
pub fn status_for(
    prev: Option<&ScalingGroupStatus>,
    observation: &Observation,
    generation: Option<i64>,
    now: Timestamp,
) -> ScalingGroupStatus {
    let mut s = prev.cloned().unwrap_or_default();
    let (status, reason, message) = match observation {
        Observation::NodeVersionMissing { name } => (
            "Unknown",
            REASON_NODE_VERSION_NOT_FOUND,
            format!("spec.nodeImage: NodeVersion {name:?} not found"),
        ),
        Observation::Image { current, desired } => {
            s.image_reference = current.to_string();
            if needs_image_change(current, desired) {
                (
                    "True",
                    REASON_IMAGE_OUTDATED,
                    format!("the group boots {current:?}, its NodeVersion wants {desired:?}"),
                )
            } else {
                (
                    "False",
                    REASON_IMAGE_UP_TO_DATE,
                    format!("the group boots {desired:?}"),
                )
            }
        }
        Observation::Failed {
            reason,
            message,
            current,
            desired,
        } => {
            let status = match current {
                Some(current) => {
                    s.image_reference = current.to_string();
                    if needs_image_change(current, desired) {
                        "True"
                    } else {
                        "False"
                    }
                }
                None => "Unknown",
            };
            (status, *reason, message.clone())
        }
    };
    set(
        &mut s.conditions,
        condition::OUTDATED,
        status,
        reason,
        message,
        generation,
        now,
    );
    s
}

/// A ScalingGroup discovery would create.
#[derive(Clone, Debug, PartialEq)]
pub struct NewScalingGroup {
    /// The object's name, derived from the group ID (see [`object_name`]).
    pub name: String,
    /// Its spec: the cloud group, its role and the NodeVersion it follows.
    pub spec: ScalingGroupSpec,
}

/// A short stable hash (FNV-1a) to keep derived names apart.
fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", h as u32)
}

/// The object name for a cloud group ID: the ID itself when it is a valid
/// name, else lowercased with every other character turned into '-'
/// (`projects/p/zones/z/instanceGroupManagers/g` →
/// `projects-p-zones-z-instancegroupmanagers-g`).
pub fn object_name(group_id: &str) -> String {
    const MAX: usize = 253;
    let mut name = String::with_capacity(group_id.len());
    for c in group_id.chars().map(|c| c.to_ascii_lowercase()) {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
            c
        } else {
            '-'
        };
        if !(c == '-' && name.ends_with('-')) {
            name.push(c);
        }
    }
    let name = name
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    if name.is_empty() || name.len() > MAX {
        let keep: String = name.chars().take(MAX - 9).collect();
        let keep = keep.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        let hash = short_hash(group_id);
        return if keep.is_empty() {
            format!("group-{hash}")
        } else {
            format!("{keep}-{hash}")
        };
    }
    name
}

/// ScalingGroups to create for cloud groups that have none yet (matched by
/// `spec.groupId`), named after the group ID, following `node_version`.
pub fn discover(
    groups: &[cloud::ScalingGroup],
    existing: &[ScalingGroup],
    node_version: &str,
) -> Vec<NewScalingGroup> {
    let known: BTreeSet<&str> = existing.iter().map(|g| g.spec.group_id.as_str()).collect();
    let mut taken: BTreeSet<String> = existing.iter().map(|g| g.name_any()).collect();
    let mut out = Vec::new();
    for group in groups {
        if group.id.is_empty() || known.contains(group.id.as_str()) {
            continue;
        }
        if out.iter().any(|n: &NewScalingGroup| n.spec.group_id == group.id) {
            continue;
        }
        let mut name = object_name(&group.id);
        if taken.contains(&name) {
            let base: String = name.chars().take(253 - 9).collect();
            name = format!("{}-{}", base.trim_end_matches('-'), short_hash(&group.id));
        }
        taken.insert(name.clone());
        let role = match group.role {
            GroupRole::Worker => NodeRole::Worker,
            GroupRole::ControlPlane => NodeRole::ControlPlane,
        };
        out.push(NewScalingGroup {
            name,
            spec: ScalingGroupSpec {
                node_image: node_version.to_string(),
                group_id: group.id.clone(),
                autoscaler_group_name: group.id.clone(),
                node_group_name: group.name.clone(),
                // Never granted by discovery: whoever configures the
                // autoscaler turns it on (and sets min/max).
                autoscaling: false,
                min: None,
                max: None,
                role,
            },
        });
    }
    out
}

/// Lists the cloud's groups and creates a ScalingGroup (with `labels`) for
/// each that has none. Waits (up to 30 s) for `store` to be synced. Returns
/// the names created; one created meanwhile by someone else is skipped.
pub async fn discover_and_create(
    client: &Client,
    cloud: &dyn CloudProvider,
    store: &Store<ScalingGroup>,
    node_version: &str,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<String>> {
    let wait = Duration::from_secs(30);
    tokio::time::timeout(wait, store.wait_synced())
        .await
        .map_err(|_| Error::Timeout {
            what: "the ScalingGroup store's first list".into(),
            after: wait,
        })?;
    let groups = cloud.list_groups().await?;
    let existing: Vec<ScalingGroup> = store.list().iter().map(|g| (**g).clone()).collect();
    let api: Api<ScalingGroup> = Api::all(client.clone());
    let mut created = Vec::new();
    for new in discover(&groups, &existing, node_version) {
        let obj = ScalingGroup {
            metadata: ObjectMeta {
                name: Some(new.name.clone()),
                labels: (!labels.is_empty()).then(|| labels.clone()),
                ..Default::default()
            },
            spec: new.spec,
            status: None,
        };
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {
                tracing::info!(scaling_group = %new.name, group = %obj.spec.group_id, "discovered a scaling group");
                created.push(new.name);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(created)
}

/// The ScalingGroups following `nv` (for watching NodeVersions). A scan:
/// clusters have a handful of groups.
pub fn keys_for_node_version(store: &Store<ScalingGroup>, nv: &NodeVersion) -> Vec<Key<ScalingGroup>> {
    let name = nv.name_any();
    store
        .list()
        .iter()
        .filter(|g| g.spec.node_image == name)
        .filter_map(|g| Key::of(g.as_ref()))
        .collect()
}

/// The ScalingGroup controller: its groups, and the NodeVersions they follow.
pub fn register(manager: &mut Manager, app: &App) {
    let Some(cloud) = app.cloud.clone() else {
        return;
    };
    let mut c = manager.controller::<ScalingGroup>("scalinggroup", &app.objects);
    let by_version = c.store();
    // A group follows its NodeVersion's image alone: the many status writes
    // of a rollout each cost a group image read at the cloud otherwise
    // (about five per replaced node at maxSurge 1).
    let image_of = |v: &NodeVersion| (v.spec.image.clone(), v.metadata.deletion_timestamp.is_some());
    let versions = c.watches(&app.objects, changed(image_of), move |v: &NodeVersion| {
        keys_for_node_version(&by_version, v)
    });
    c.on_failure(app.report_failures());
    c.register(ScalingGroupReconciler::new(
        app.client.clone(),
        app.leader.clone(),
        cloud,
        versions,
    ));
}

/// Reconciles ScalingGroups (key: the ScalingGroup's name).
pub struct ScalingGroupReconciler {
    client: Client,
    leader: LeaderHandle,
    cloud: Arc<dyn CloudProvider>,
    node_versions: Store<NodeVersion>,
}

impl ScalingGroupReconciler {
    /// A reconciler that reads NodeVersions from `node_versions`.
    pub fn new(
        client: Client,
        leader: LeaderHandle,
        cloud: Arc<dyn CloudProvider>,
        node_versions: Store<NodeVersion>,
    ) -> Self {
        ScalingGroupReconciler {
            client,
            leader,
            cloud,
            node_versions,
        }
    }

    /// Writes the status `observation` leads to, when it differs, conditioned
    /// on the version the observation was made from.
    async fn report(&self, group: &ScalingGroup, observation: &Observation<'_>) -> Result<()> {
        let status = status_for(
            group.status.as_ref(),
            observation,
            group.metadata.generation,
            Timestamp::now(),
        );
        if group.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"resourceVersion": group.resource_version()},
            "status": {"imageReference": status.image_reference, "conditions": status.conditions},
        });
        let api: Api<ScalingGroup> = Api::all(self.client.clone());
        api.patch_status(&group.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// A failed cloud call: retried through the queue, or reported.
    async fn cloud_failed(
        &self,
        group: &ScalingGroup,
        err: CloudError,
        current: Option<&str>,
        desired: &str,
    ) -> Result<Action> {
        match classify(&err) {
            CloudFailure::Retry => Err(err.into()),
            CloudFailure::Report(message) => {
                tracing::warn!(scaling_group = %group.name_any(), error = %err, "the cloud refused a call");
                self.report(
                    group,
                    &Observation::Failed {
                        reason: REASON_CLOUD_ERROR,
                        message,
                        current,
                        desired,
                    },
                )
                .await?;
                Ok(Action::RequeueAfter(REFUSED_REQUEUE))
            }
        }
    }
}

impl Reconciler for ScalingGroupReconciler {
    type Object = ScalingGroup;
    type Error = Error;

    async fn reconcile(&self, _key: &Key<ScalingGroup>, group: Option<Arc<ScalingGroup>>) -> Result<Action> {
        let Some(group) = group else {
            return Ok(Action::Done);
        };
        if group.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        if !self.node_versions.is_synced() {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let nv_name = group.spec.node_version();
        let Some(nv) = self.node_versions.get(&ObjectKey::cluster(nv_name)) else {
            self.report(&group, &Observation::NodeVersionMissing { name: nv_name })
                .await?;
            return Ok(Action::Done);
        };
        let desired = nv.spec.image.as_str();
        let group_id = group.spec.group_id.as_str();
        if group_id.is_empty() {
            self.report(
                &group,
                &Observation::Failed {
                    reason: REASON_INVALID_SPEC,
                    message: "spec.groupId must not be empty".into(),
                    current: None,
                    desired,
                },
            )
            .await?;
            return Ok(Action::Done);
        }
        let mut current = match self.cloud.group_image(group_id).await {
            Ok(image) => image,
            Err(e) => return self.cloud_failed(&group, e, None, desired).await,
        };
        if needs_image_change(&current, desired) {
            self.leader.ensure_leader()?;
            if let Err(e) = self.cloud.set_group_image(group_id, desired).await {
                return self.cloud_failed(&group, e, Some(&current), desired).await;
            }
            tracing::info!(scaling_group = %group.name_any(), group = group_id, from = %current, to = desired, "set the group's image");
            // What the cloud says now, not what we asked for.
            current = match self.cloud.group_image(group_id).await {
                Ok(image) => image,
                Err(e) => return self.cloud_failed(&group, e, None, desired).await,
            };
        }
        self.report(
            &group,
            &Observation::Image {
                current: &current,
                desired,
            },
        )
        .await?;
        Ok(if needs_image_change(&current, desired) {
            Action::RequeueAfter(PENDING_REQUEUE)
        } else {
            Action::Done
        })
    }
}

/// Event reason: discovery waits for the NodeVersion its groups would follow.
pub const REASON_NODE_VERSION_MISSING: &str = "NodeVersionMissing";
/// Event reason: discovery created ScalingGroups.
pub const REASON_SCALING_GROUPS_DISCOVERED: &str = "ScalingGroupsDiscovered";

/// How a discovery round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryOutcome {
    /// The NodeVersion to follow does not exist (or is not selected): the
    /// webhook would refuse every ScalingGroup naming it, so none is created.
    NodeVersionMissing,
    /// Listing the cloud or creating an object failed.
    Failed,
    /// Every cloud group has its ScalingGroup.
    Done,
}

/// When discovery runs again after `outcome`. A missing NodeVersion is
/// looked for in the cache, so often: its groups follow within seconds of
/// its creation. New cloud groups are rare, so a done round waits long.
pub fn discovery_pause(outcome: DiscoveryOutcome) -> Duration {
    match outcome {
        DiscoveryOutcome::NodeVersionMissing => Duration::from_secs(2),
        DiscoveryOutcome::Failed => Duration::from_secs(30),
        DiscoveryOutcome::Done => Duration::from_secs(600),
    }
}

/// How often the wait for a missing NodeVersion is reported again (an Event
/// and a log line), so a long wait stays visible without flooding.
const MISSING_REPORT_EVERY: Duration = Duration::from_secs(600);

/// While leading: create ScalingGroups for cloud groups that have none, once
/// the NodeVersion they follow exists, then every 10 minutes (Constellation
/// runs this outside leader election; here only the leader writes).
pub fn register_discovery(manager: &mut Manager, app: &App, node_version: String) {
    let Some(cloud) = app.cloud.clone() else {
        return;
    };
    let discovery = Discovery {
        client: app.client.clone(),
        cloud,
        groups: manager.store::<ScalingGroup>(&app.objects),
        versions: manager.store::<NodeVersion>(&app.objects),
        // A discovered group must match --object-selector, or no controller
        // (and not the next discovery) would ever see it.
        labels: app.objects.required_labels(),
        selector: app.objects.label_selector.clone(),
        recorder: app.recorder.clone(),
        node_version,
    };
    manager.add_task(Box::new(move |leader, stop| {
        Box::pin(discovery.run(leader, stop))
    }));
}

/// Scaling-group discovery's task: what it reads, writes and reports to.
struct Discovery {
    client: Client,
    cloud: Arc<dyn CloudProvider>,
    groups: Store<ScalingGroup>,
    versions: Store<NodeVersion>,
    labels: BTreeMap<String, String>,
    selector: Option<String>,
    recorder: kube::runtime::events::Recorder,
    node_version: String,
}

impl Discovery {
    async fn run(self, leader: LeaderHandle, stop: CancellationToken) {
        let mut leading = leader.subscribe();
        let mut last_missing_report: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = leading.wait_for(|l| *l) => if changed.is_err() { return },
            }
            let outcome = self.round(&mut last_missing_report).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(discovery_pause(outcome)) => {}
            }
        }
    }

    async fn round(&self, last_missing_report: &mut Option<tokio::time::Instant>) -> DiscoveryOutcome {
        let wait = Duration::from_secs(30);
        if tokio::time::timeout(wait, self.versions.wait_synced())
            .await
            .is_err()
        {
            tracing::warn!(after = ?wait, "scaling group discovery: the NodeVersion cache has no first list yet");
            return DiscoveryOutcome::Failed;
        }
        let Some(version) = self.versions.get(&ObjectKey::cluster(&self.node_version)) else {
            if last_missing_report.is_none_or(|at| at.elapsed() >= MISSING_REPORT_EVERY) {
                *last_missing_report = Some(tokio::time::Instant::now());
                self.report_missing();
            }
            return DiscoveryOutcome::NodeVersionMissing;
        };
        *last_missing_report = None;
        match discover_and_create(
            &self.client,
            self.cloud.as_ref(),
            &self.groups,
            &self.node_version,
            &self.labels,
        )
        .await
        {
            Ok(created) => {
                if !created.is_empty() {
                    tracing::info!(?created, node_version = %self.node_version, "discovered scaling groups");
                    let note = format!(
                        "created ScalingGroups following this NodeVersion: {}",
                        created.join(", ")
                    );
                    let event = super::event(
                        EventType::Normal,
                        REASON_SCALING_GROUPS_DISCOVERED,
                        "Discover",
                        &note,
                    );
                    super::spawn_event(&self.recorder, event, version.object_ref(&()));
                }
                DiscoveryOutcome::Done
            }
            Err(e) => {
                tracing::warn!(error = %e, "scaling group discovery failed; trying again in 30 s");
                DiscoveryOutcome::Failed
            }
        }
    }

    /// A Warning Event on the missing NodeVersion (found by
    /// `kubectl get events --field-selector involvedObject.name=<name>`) and
    /// a log line, both naming what to do.
    fn report_missing(&self) {
        let selected = match &self.selector {
            Some(selector) => format!(" matching --object-selector {selector}"),
            None => String::new(),
        };
        let note = format!(
            "scaling-group discovery waits for NodeVersion {name}{selected}: the cloud's groups get \
             ScalingGroups following it once it exists (create it, or point \
             --discover-scaling-groups at the NodeVersion to follow)",
            name = self.node_version
        );
        tracing::warn!(node_version = %self.node_version, "{note}");
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(NodeVersion::api_version(&()).into_owned()),
            kind: Some(NodeVersion::kind(&()).into_owned()),
            name: Some(self.node_version.clone()),
            ..Default::default()
        };
        let event = super::event(EventType::Warning, REASON_NODE_VERSION_MISSING, "Discover", &note);
        super::spawn_event(&self.recorder, event, reference);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("a time")
    }

    fn outdated(s: &ScalingGroupStatus) -> (&str, &str) {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::OUTDATED)
            .expect("an Outdated condition");
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn statuses() {
        let prev = ScalingGroupStatus {
            image_reference: "img-0".into(),
            conditions: vec![],
        };
        // (name, observation, imageReference, Outdated status, reason)
        let cases = [
            (
                "up to date",
                Observation::Image {
                    current: "img-2",
                    desired: "img-2",
                },
                "img-2",
                "False",
                REASON_IMAGE_UP_TO_DATE,
            ),
            (
                "cloud has not taken it yet",
                Observation::Image {
                    current: "img-1",
                    desired: "img-2",
                },
                "img-1",
                "True",
                REASON_IMAGE_OUTDATED,
            ),
            (
                "no NodeVersion: image kept, unknown",
                Observation::NodeVersionMissing { name: "nv" },
                "img-0",
                "Unknown",
                REASON_NODE_VERSION_NOT_FOUND,
            ),
            (
                "refused set: still outdated",
                Observation::Failed {
                    reason: REASON_CLOUD_ERROR,
                    message: "rejected".into(),
                    current: Some("img-1"),
                    desired: "img-2",
                },
                "img-1",
                "True",
                REASON_CLOUD_ERROR,
            ),
            (
                "refused read: unknown",
                Observation::Failed {
                    reason: REASON_CLOUD_ERROR,
                    message: "rejected".into(),
                    current: None,
                    desired: "img-2",
                },
                "img-0",
                "Unknown",
                REASON_CLOUD_ERROR,
            ),
        ];
        for (name, observation, image, status, reason) in cases {
            let s = status_for(Some(&prev), &observation, Some(4), ts(10));
            assert_eq!(s.image_reference, image, "{name}");
            assert_eq!(outdated(&s), (status, reason), "{name}");
            assert_eq!(s.conditions[0].observed_generation, Some(4), "{name}");
        }
    }

    #[test]
    fn transition_time_moves_only_on_a_flip_and_reports_are_stable() {
        let obs = Observation::Image {
            current: "a",
            desired: "b",
        };
        let first = status_for(None, &obs, Some(1), ts(10));
        let again = status_for(Some(&first), &obs, Some(1), ts(20));
        assert_eq!(first, again, "an unchanged observation writes nothing");
        let done = Observation::Image {
            current: "b",
            desired: "b",
        };
        let flipped = status_for(Some(&again), &done, Some(1), ts(30));
        assert_eq!(flipped.conditions[0].last_transition_time, Time(ts(30)));
        assert_eq!(flipped.conditions.len(), 1);
    }

    #[test]
    fn cloud_failures() {
        let cases = [
            (CloudError::Throttled { retry_after: None }, true),
            (CloudError::Transport("reset".into()), true),
            (
                CloudError::Server {
                    status: 503,
                    message: "x".into(),
                },
                true,
            ),
            (
                CloudError::Rejected {
                    status: 400,
                    message: "bad image".into(),
                },
                false,
            ),
            (
                CloudError::NotFound {
                    what: "group g".into(),
                },
                false,
            ),
            (
                CloudError::Unsupported {
                    provider: "metal".into(),
                    operation: "set a group image",
                },
                false,
            ),
        ];
        for (err, retry) in cases {
            match classify(&err) {
                CloudFailure::Retry => assert!(retry, "{err}"),
                CloudFailure::Report(message) => {
                    assert!(!retry, "{err}");
                    assert_eq!(message, err.to_string());
                }
            }
        }
    }

    #[test]
    fn object_names() {
        for (id, want) in [
            ("demo-workers", "demo-workers"),
            (
                "projects/p/zones/z/instanceGroupManagers/G_1",
                "projects-p-zones-z-instancegroupmanagers-g-1",
            ),
            ("/subscriptions//x/", "subscriptions-x"),
        ] {
            assert_eq!(object_name(id), want, "{id}");
        }
        let long = "a".repeat(300);
        let name = object_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(object_name(&long), object_name(&"a".repeat(301)));
        assert!(object_name("///").starts_with("group-"));
    }

    fn cloud_group(id: &str, role: GroupRole) -> cloud::ScalingGroup {
        cloud::ScalingGroup {
            id: id.into(),
            role,
            name: format!("{id}-name"),
            size: 1,
            image: "img".into(),
        }
    }

    fn existing(name: &str, group_id: &str) -> ScalingGroup {
        ScalingGroup::new(
            name,
            ScalingGroupSpec {
                group_id: group_id.into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn discovery_pauses() {
        for (outcome, pause) in [
            (DiscoveryOutcome::NodeVersionMissing, 2),
            (DiscoveryOutcome::Failed, 30),
            (DiscoveryOutcome::Done, 600),
        ] {
            assert_eq!(
                discovery_pause(outcome),
                Duration::from_secs(pause),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn discovery() {
        let groups = [
            cloud_group("cp", GroupRole::ControlPlane),
            cloud_group("workers", GroupRole::Worker),
            cloud_group("Other/Group", GroupRole::Worker),
        ];
        // (name, existing, created names)
        let cases: Vec<(&str, Vec<ScalingGroup>, Vec<String>)> = vec![
            (
                "none yet",
                vec![],
                vec!["cp".into(), "workers".into(), "other-group".into()],
            ),
            (
                "matched by group id, not by name",
                vec![existing("anything", "workers")],
                vec!["cp".into(), "other-group".into()],
            ),
            (
                "all known",
                vec![
                    existing("a", "cp"),
                    existing("b", "workers"),
                    existing("c", "Other/Group"),
                ],
                vec![],
            ),
            (
                "a name taken by another group gets a suffix",
                vec![existing("cp", "elsewhere")],
                vec![
                    format!("cp-{}", short_hash("cp")),
                    "workers".into(),
                    "other-group".into(),
                ],
            ),
        ];
        for (name, existing, want) in cases {
            let got: Vec<String> = discover(&groups, &existing, "nv")
                .into_iter()
                .map(|n| n.name)
                .collect();
            assert_eq!(got, want, "{name}");
        }
        let created = discover(&groups, &[], "constellation-version");
        assert_eq!(created[0].spec.role, NodeRole::ControlPlane);
        assert_eq!(created[1].spec.role, NodeRole::Worker);
        assert_eq!(created[1].spec.group_id, "workers");
        assert_eq!(created[1].spec.node_image, "constellation-version");
        assert_eq!(created[1].spec.node_group_name, "workers-name");
        assert!(!created[1].spec.autoscaling);
        let twice = [
            cloud_group("cp", GroupRole::ControlPlane),
            cloud_group("cp", GroupRole::ControlPlane),
        ];
        assert_eq!(
            discover(&twice, &[], "nv").len(),
            1,
            "a repeated cloud group once"
        );
    }

    #[test]
    fn node_versions_map_to_their_groups() {
        let store: crate::runtime::store::Writer<ScalingGroup> = crate::runtime::store::Writer::new();
        for (name, nv) in [("a", "v1"), ("b", "v2"), ("c", "v1")] {
            let g = ScalingGroup::new(
                name,
                ScalingGroupSpec {
                    node_image: nv.into(),
                    ..Default::default()
                },
            );
            store.insert(ObjectKey::cluster(name), Arc::new(g));
        }
        let nv = NodeVersion::new(
            "v1",
            serde_json::from_value(json!({"image": "img"})).expect("a spec"),
        );
        let mut keys = keys_for_node_version(&store, &nv);
        keys.sort();
        assert_eq!(keys, [Key::cluster("a"), Key::cluster("c")]);
    }
}
