//! The NodeVersion controller: replaces every node whose image or Kubernetes
//! components differ from its NodeVersion, within the rollout's budgets.
//!
//! It gathers facts from its stores (Nodes, ScalingGroups, PendingNodes,
//! NodeMaintenances) and asks the cloud only for what nodes lack (their group
//! and image, then cached in annotations, as Constellation does). The plan
//! itself is [`crate::rollout::plan`], a pure function. Event-driven: every
//! change of a watched object reconciles the NodeVersions again.
//!
//! Creating an instance never leaks one: the PendingNode that tracks it is
//! written first, and its UID is the idempotency key of the cloud call, so a
//! leader that dies in between leaves a PendingNode its successor completes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::App;
use super::pending_node::{CREATED_IMAGE_ANNOTATION, REQUEST_KEY_ANNOTATION, created_patch, request_key};
use super::replacement_trace::{
    FinishedReplacement, SentRoots, TRACE_FLUSH_TIMEOUT, drain_annotations, trace_create,
    trace_delete_instance, trace_etcd_member, trace_join, trace_node_deleted, trace_replacement,
    trace_rollout_end, trace_surplus, trace_transfer,
};
use super::{delete_if_present, node_maintenance, same_object};
use crate::api::conditions::set_condition;
use crate::api::node_maintenance::{MaintenancePhase, medik8s};
use crate::api::update::rollout::SettingSource;
use crate::api::update::{
    AutoscalingStrategy, NodeCounts, NodeVersion, NodeVersionStatus, PendingNode, PendingNodeGoal,
    PendingNodeSpec, Rollout, ScalingGroup, StatusList, condition, message, reason,
};
use crate::cloud::{CloudProvider, CreateNodeRequest};
use crate::error::{Error, Result};
use crate::etcd::{Decision, EtcdClient, EtcdError, Removed, decide, to_check};
use crate::node::node_is_ready;
use crate::rollout::{self, DrainState, Facts, GroupFacts, JoinFacts, NodeFacts, Role, Step};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source, always};
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::runtime::workqueue::WorkQueue;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{NodeState, NodeStateLabels, NodeVersionLabels};
use crate::telemetry::trace::{
    self, ROLLOUT_TRACEPARENT_ANNOTATION, TRACE_STARTED_ANNOTATION, TRACEPARENT_ANNOTATION, TraceParent,
};

/// Steps of one rollout pass carried out at once (see `carry_out_all`).
const STEPS_AT_ONCE: usize = 16;

pub use crate::api::update::annotations::{
    COMPONENTS_ANNOTATION, DONOR_ANNOTATION, GROUP_ANNOTATION, HEIR_ANNOTATION, IMAGE_ANNOTATION,
    OBSOLETE_ANNOTATION, PAUSED_BY_ANNOTATION,
};
/// NodeMaintenances a rollout creates are named with this prefix.
pub const DRAIN_PREFIX: &str = "nodewarden-replace-";
/// How long a leaving instance is tracked.
const LEAVE_DEADLINE_SECS: i64 = 600;

/// The name of the NodeMaintenance that drains `node` for a rollout.
pub fn drain_name(node: &str) -> String {
    format!("{DRAIN_PREFIX}{node}")
}

/// The NodeVersion controller. Few NodeVersions exist, so any relevant
/// change of a Node, PendingNode, ScalingGroup or rollout drain looks at all
/// of them; Node updates only when they change what a rollout reads.
pub fn register(manager: &mut Manager, app: &App) {
    let Some(cloud) = app.cloud.clone() else {
        return;
    };
    let mut c = manager.controller::<NodeVersion>("nodeversion", &app.objects);
    let versions = c.store();
    let all = move || versions.keys();
    let every = all.clone();
    let nodes = c.watches(&app.nodes, super::node_changed(), move |_: &Node| every());
    let every = all.clone();
    let pending = c.watches(&app.objects, always(), move |_: &PendingNode| every());
    let every = all.clone();
    let groups = c.watches(&app.objects, always(), move |_: &ScalingGroup| every());
    let every = all;
    let maintenances = c.watches(&app.objects, always(), move |m: &medik8s::NodeMaintenance| {
        if m.name_any().starts_with(DRAIN_PREFIX) {
            every()
        } else {
            Vec::new()
        }
    });
    // Read, not watched: the autoscaler's strategies.
    let strategies = c.reads::<AutoscalingStrategy>(&app.objects);
    c.on_failure(app.report_failures());
    let queue = c.queue();
    c.register(NodeVersionReconciler {
        client: app.client.clone(),
        cloud,
        leader: app.leader.clone(),
        groups,
        nodes,
        pending,
        maintenances,
        strategies,
        metrics: app.metrics.clone(),
        recorder: app.recorder.clone(),
        sent_roots: SentRoots::default(),
        status_writes: StatusWrites::default(),
        queue,
        drains: app.drains.clone(),
        retired: Retired::default(),
        node_source: app.nodes.clone(),
        object_source: app.objects.clone(),
        rollout_defaults: app.rollout.clone(),
        etcd: app.etcd.clone(),
        etcd_turn: Default::default(),
    });
}

/// Replaces outdated nodes of one NodeVersion (see the module docs).
pub struct NodeVersionReconciler {
    /// The API client.
    pub client: Client,
    /// The cloud that creates and deletes instances.
    pub cloud: Arc<dyn CloudProvider>,
    /// This replica's leadership, checked before anything disruptive.
    pub leader: LeaderHandle,
    /// The ScalingGroups.
    pub groups: Store<ScalingGroup>,
    /// The managed Nodes.
    pub nodes: Store<Node>,
    /// The PendingNodes that track joining and leaving instances.
    pub pending: Store<PendingNode>,
    /// The NodeMaintenances (the rollout drains through them).
    pub maintenances: Store<medik8s::NodeMaintenance>,
    /// The autoscaler's strategies (paused during a rollout).
    pub strategies: Store<AutoscalingStrategy>,
    /// Rollout metrics.
    pub metrics: Metrics,
    /// Publishes the rollout's Events on its NodeVersion.
    pub recorder: kube::runtime::events::Recorder,
    /// Replacement roots this replica sent.
    pub sent_roots: SentRoots,
    /// Status writes in flight.
    pub status_writes: StatusWrites,
    /// The drains of this replica: a drained node's pods as its drain's
    /// watch sees them (see `evict_stragglers`).
    pub drains: crate::drain::DrainEngine,
    /// Nodes this replica deleted that the store may still show.
    pub retired: Retired,
    /// This controller's queue (a failed status write queues its object).
    pub queue: WorkQueue<Key<NodeVersion>>,
    /// The Nodes the `nodes` store watches, for a fresh read.
    pub node_source: Source,
    /// The PendingNodes the `pending` store watches, for a fresh read.
    pub object_source: Source,
    /// The rollout settings a NodeVersion that leaves a field out gets.
    pub rollout_defaults: Rollout,
    /// etcd, whose member a control-plane node loses before it is
    /// retired; None: etcd is not nodewarden's to touch.
    pub etcd: Option<Arc<EtcdClient>>,
    /// One member removal at a time: each is judged on a member list that
    /// another in flight would change.
    pub etcd_turn: tokio::sync::Mutex<()>,
}

/// How soon a retirement waiting for etcd looks again: etcd's health is
/// not watched, so nothing else would wake it.
const ETCD_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// The node's InternalIP, which its etcd member's peer URL carries.
fn internal_ip(node: &Node) -> Option<std::net::IpAddr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse().ok())
}

/// The label kubeadm puts on control-plane nodes.
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// Why `donor` and `heir` (as read fresh) cannot be paired: either already
/// names another partner. None when they are free or name each other (a
/// pairing half written, or written whole, is finished again harmlessly).
fn pairing_taken(donor: &Node, heir: &Node) -> Option<String> {
    let (donor_name, heir_name) = (donor.name_any(), heir.name_any());
    match (
        annotation(heir, DONOR_ANNOTATION),
        annotation(donor, HEIR_ANNOTATION),
    ) {
        (Some(other), _) if other != donor_name => {
            Some(format!("it is already the heir of {other}, not of {donor_name}"))
        }
        (_, Some(other)) if other != heir_name => {
            Some(format!("its donor {donor_name} already has the heir {other}"))
        }
        _ => None,
    }
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Labels an heir inherits: everything but Kubernetes' own and nodewarden's
/// bookkeeping (reserved domains are set by the kubelet or the cloud).
pub fn inheritable_labels(donor: &Node) -> BTreeMap<String, String> {
    donor
        .labels()
        .iter()
        .filter(|(k, _)| {
            let domain = k.split_once('/').map(|(d, _)| d).unwrap_or("");
            !(domain.ends_with("kubernetes.io")
                || domain.ends_with("k8s.io")
                || domain.starts_with("nodewarden.dev"))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The groups following one NodeVersion, with their nodes and PendingNodes.
struct Scope {
    groups: Vec<GroupFacts>,
    nodes: Vec<Arc<Node>>,
    pending: Vec<Arc<PendingNode>>,
}

impl Scope {
    /// The nodes and PendingNodes of `groups`, from any listing of them.
    fn of(
        groups: Vec<GroupFacts>,
        nodes: impl IntoIterator<Item = Arc<Node>>,
        pending: impl IntoIterator<Item = Arc<PendingNode>>,
    ) -> Scope {
        let in_scope = |group: &str| groups.iter().any(|g| g.id == group);
        let nodes = nodes
            .into_iter()
            .filter(|n| annotation(n, GROUP_ANNOTATION).is_some_and(in_scope))
            .collect();
        let pending = pending
            .into_iter()
            .filter(|p| in_scope(&p.spec.group_id))
            .collect();
        Scope {
            groups,
            nodes,
            pending,
        }
    }
}

/// The Join PendingNodes of a scope, sorted (see `settle_joins`).
#[derive(Default)]
struct Joins {
    /// Nodes that joined and wait to be paired.
    joining: Vec<String>,
    /// Nodes that joined for an older target, now marked surplus.
    surplus: Vec<String>,
    /// Creates whose node has not joined yet.
    pending: Vec<JoinFacts>,
}

/// Sorts the Join PendingNodes of `scope` (pure): nodes still joining, nodes
/// that joined for an older target (surplus), creates not joined yet; and
/// the names of the PendingNodes whose node is paired already or marked
/// surplus (a leader died between that and deleting them), to be deleted:
/// counting one as joining would pair that heir with a second donor.
fn sort_joins(nv: &NodeVersion, scope: &Scope) -> (Joins, Vec<String>) {
    let mut joins = Joins::default();
    let mut settled = Vec::new();
    for p in scope
        .pending
        .iter()
        .filter(|p| p.spec.goal == Some(PendingNodeGoal::Join))
    {
        match scope.nodes.iter().find(|n| n.name_any() == p.spec.node_name) {
            Some(n)
                if annotation(n, DONOR_ANNOTATION).is_some()
                    || annotation(n, OBSOLETE_ANNOTATION).is_some() =>
            {
                settled.push(p.name_any());
            }
            // Judged only once annotated: a node that just joined gets its
            // components annotation from its JoiningNode a moment later.
            Some(n) if annotated(nv, n) && !is_current(nv, n) => joins.surplus.push(n.name_any()),
            Some(_) => joins.joining.push(p.spec.node_name.clone()),
            None => joins.pending.push(JoinFacts {
                pending: p.name_any(),
                group: p.spec.group_id.clone(),
            }),
        }
    }
    (joins, settled)
}

/// What the planner looks at: the scope's groups, its nodes' facts, the
/// joins on their way and the budgets of `nv`.
fn facts<'a>(rollout: &Rollout, scope: &'a Scope, nodes: &'a [NodeFacts], joins: &'a Joins) -> Facts<'a> {
    let limits = rollout.limits_for(nodes.len(), 1);
    Facts {
        groups: &scope.groups,
        nodes,
        joins: &joins.pending,
        max_surge: limits.max_surge,
        max_unavailable: limits.max_unavailable,
        control_plane_first: rollout.control_plane_first(),
    }
}

/// Has `n` the annotations `is_current` judges by: its image, and its
/// components when `nv` names components (set by its JoiningNode).
fn annotated(nv: &NodeVersion, n: &Node) -> bool {
    annotation(n, IMAGE_ANNOTATION).is_some()
        && (nv.spec.kubernetes_components_reference.is_empty()
            || annotation(n, COMPONENTS_ANNOTATION).is_some())
}

/// Does `n` run what `nv` asks for (image, and components when set)?
fn is_current(nv: &NodeVersion, n: &Node) -> bool {
    let components = nv.spec.kubernetes_components_reference.as_str();
    annotation(n, IMAGE_ANNOTATION) == Some(nv.spec.image.as_str())
        && (components.is_empty() || annotation(n, COMPONENTS_ANNOTATION) == Some(components))
}

/// Object lists in the status hold at most this many entries: at thousands
/// of nodes whole lists would outgrow etcd's object size limit. The counts
/// (`nodes`, `upToDateNodes`, `outdatedNodes`, `replacing`) stay exact.
pub const STATUS_LIST_LIMIT: usize = 100;

/// What is wrong besides drains, for the Degraded condition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Problems {
    /// Instances whose join deadline passed (their PendingNodes, leaving).
    pub join_timeouts: Vec<String>,
    /// Managed nodes that belong to no ScalingGroup (no provider ID, or a
    /// group no ScalingGroup names).
    pub invalid_nodes: Vec<String>,
    /// Control-plane retirements waiting for their etcd member's removal:
    /// why, naming the members.
    pub etcd_waits: Vec<String>,
}

/// `names` joined for a message: the first few, then how many more.
fn name_list(names: &[&str]) -> String {
    const SHOWN: usize = 5;
    let mut text = names.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// Whether outdated worker nodes wait for the control plane (the planner's
/// own rule, [`rollout::workers_wait_for_control_plane`]).
fn waiting_for_control_plane(facts: &Facts<'_>) -> bool {
    let worker_outdated = facts.nodes.iter().any(|n| {
        !n.up_to_date
            && facts
                .groups
                .iter()
                .any(|g| g.id == n.group && g.role == Role::Worker)
    });
    worker_outdated && rollout::workers_wait_for_control_plane(facts)
}

/// Constellation's one condition, Outdated, with its reasons and messages
/// (its CLI shows the message as the cluster's status). Only Outdated is
/// kept: the CLI refuses a NodeVersion with any other (pure).
fn outdated_condition(
    existing: &[Condition],
    counts: &rollout::Counts,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = existing
        .iter()
        .filter(|c| c.type_ == condition::OUTDATED)
        .take(1)
        .cloned()
        .collect();
    let outdated = counts.outdated > 0;
    let (reason, message) = match outdated {
        true => (
            reason::NODE_VERSIONS_OUT_OF_DATE,
            message::NODE_VERSIONS_OUT_OF_DATE,
        ),
        false => (
            reason::NODE_VERSIONS_UP_TO_DATE,
            message::NODE_VERSIONS_UP_TO_DATE,
        ),
    };
    set_condition(
        &mut conditions,
        condition::OUTDATED,
        outdated,
        reason,
        message,
        generation,
        now,
    );
    conditions
}

/// RolloutSettings: the settings in force and where each comes from (pure).
fn settings_condition(
    conditions: &mut Vec<Condition>,
    own: &Rollout,
    defaults: &Rollout,
    generation: Option<i64>,
    now: Timestamp,
) {
    let described = Rollout::describe(own, defaults);
    let all_own = described
        .iter()
        .all(|(_, _, from)| *from == SettingSource::NodeVersion);
    let from = |source: SettingSource| match source {
        SettingSource::NodeVersion => "spec",
        SettingSource::Operator => "operator",
        SettingSource::Builtin => "built in",
    };
    let message = described
        .iter()
        .map(|(name, value, source)| format!("{name} {value} ({})", from(*source)))
        .collect::<Vec<_>>()
        .join(", ");
    let reason = match all_own {
        true => reason::FROM_NODE_VERSION,
        false => reason::FROM_OPERATOR,
    };
    set_condition(
        conditions,
        condition::ROLLOUT_SETTINGS,
        true,
        reason,
        message,
        generation,
        now,
    );
}

/// Progressing and Degraded as the counts, the plan and the problems say (pure).
fn rollout_conditions(
    mut conditions: Vec<Condition>,
    facts: &Facts<'_>,
    counts: &rollout::Counts,
    steps: &[Step],
    problems: &Problems,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let outdated = counts.outdated > 0;
    let waiting_for_group = facts.groups.iter().any(|g| !g.image_ready);
    let progressing_reason = if !outdated {
        reason::ROLLOUT_COMPLETE
    } else if waiting_for_group && steps.is_empty() {
        reason::WAITING_FOR_SCALING_GROUP
    } else if waiting_for_control_plane(facts) {
        reason::WAITING_FOR_CONTROL_PLANE
    } else {
        reason::REPLACING_NODES
    };
    set_condition(
        &mut conditions,
        condition::PROGRESSING,
        outdated,
        progressing_reason,
        format!(
            "{} of {} nodes outdated, {} in flight",
            counts.outdated,
            counts.nodes,
            counts.surge + counts.unavailable
        ),
        generation,
        now,
    );
    let failed_drains: Vec<&str> = facts
        .nodes
        .iter()
        .filter(|n| n.drain == DrainState::Failed)
        .map(|n| n.name.as_str())
        .collect();
    fn as_strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    // The most pressing problem names the reason; the message lists them all.
    let mut found: Vec<(&str, String)> = Vec::new();
    if !problems.etcd_waits.is_empty() {
        found.push((
            reason::ETCD_MEMBER_REMOVAL_BLOCKED,
            problems.etcd_waits.join("; "),
        ));
    }
    if !failed_drains.is_empty() {
        found.push((
            reason::DRAIN_TIMEOUT,
            format!("drains failed: {}", name_list(&failed_drains)),
        ));
    }
    if !problems.join_timeouts.is_empty() {
        found.push((
            reason::JOIN_TIMEOUT,
            format!(
                "not joined within spec.rollout.joinTimeout, deleted and replaced: {}",
                name_list(&as_strs(&problems.join_timeouts))
            ),
        ));
    }
    if !problems.invalid_nodes.is_empty() {
        found.push((
            reason::INVALID_NODES,
            format!(
                "{} node(s) belong to no ScalingGroup (no provider ID, or a group no ScalingGroup names), see status.invalid: {}",
                problems.invalid_nodes.len(),
                name_list(&as_strs(&problems.invalid_nodes))
            ),
        ));
    }
    let (degraded_reason, message) = match found.first() {
        None => (reason::AS_EXPECTED, "no problem".to_string()),
        Some((first, _)) => (
            *first,
            found
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    set_condition(
        &mut conditions,
        condition::DEGRADED,
        !found.is_empty(),
        degraded_reason,
        message,
        generation,
        now,
    );
    conditions
}

/// The trace annotations a replacement carries from object to object.
/// The pairing's two merge patches, (heir's, donor's), each conditioned on
/// the version of the node as read (`donor`, `heir`): the heir inherits the
/// donor's labels, both name each other and carry the replacement's trace
/// (taken from `trace_from`: the PendingNode's annotations, or the heir's).
pub fn pairing_patches(
    donor: &Node,
    heir: &Node,
    trace_from: Option<&BTreeMap<String, String>>,
) -> (serde_json::Value, serde_json::Value) {
    let carried = carried_trace(trace_from);
    let mut heir_annotations = json!(carried);
    heir_annotations[DONOR_ANNOTATION] = json!(donor.name_any());
    let heir_patch = json!({"metadata": {
        "labels": inheritable_labels(donor),
        "annotations": heir_annotations,
        "resourceVersion": heir.resource_version(),
    }});
    let mut donor_annotations = json!(carried);
    donor_annotations[HEIR_ANNOTATION] = json!(heir.name_any());
    let donor_patch = json!({"metadata": {
        "annotations": donor_annotations,
        "resourceVersion": donor.resource_version(),
    }});
    (heir_patch, donor_patch)
}

fn carried_trace(annotations: Option<&BTreeMap<String, String>>) -> BTreeMap<&'static str, &String> {
    annotations
        .map(|a| {
            [
                TRACEPARENT_ANNOTATION,
                TRACE_STARTED_ANNOTATION,
                ROLLOUT_TRACEPARENT_ANNOTATION,
            ]
            .into_iter()
            .filter_map(|k| a.get(k).map(|v| (k, v)))
            .collect()
        })
        .unwrap_or_default()
}

impl Reconciler for NodeVersionReconciler {
    type Object = NodeVersion;
    type Error = Error;

    async fn reconcile(&self, key: &Key<NodeVersion>, nv: Option<Arc<NodeVersion>>) -> Result<Action> {
        let Some(nv) = nv else {
            self.forget_metrics(&key.name);
            return Ok(Action::Done);
        };
        match self.roll_out(&nv).await {
            // Say so on the object: the retry alone is only in the logs.
            Err(Error::Cloud(e)) => {
                self.report_error(&nv, reason::CLOUD_ERROR, e.to_string()).await?;
                Err(Error::Cloud(e))
            }
            Err(Error::Etcd(e)) => {
                self.report_error(&nv, reason::ETCD_ERROR, e.to_string()).await?;
                Err(Error::Etcd(e))
            }
            done => done,
        }
    }
}

impl NodeVersionReconciler {
    /// An Event on `nv` (in the background: never a reason to fail).
    fn event(&self, nv: &NodeVersion, type_: EventType, reason: &str, note: String) {
        use kube::Resource;
        let event = super::event(type_, reason, "Rollout", &note);
        super::spawn_event(&self.recorder, event, nv.object_ref(&()));
    }

    /// One pass of the rollout: gather (reads and the bookkeeping of joins),
    /// plan (pure), carry out step by step, report.
    async fn roll_out(&self, nv: &Arc<NodeVersion>) -> Result<Action> {
        let nv_name = nv.name_any();
        let annotated = self.annotate_unknown_nodes().await?;
        let scope = self.scope(nv, annotated);
        let joins = self.settle_joins(nv, &scope).await?;
        let node_facts = self.node_facts(nv, &scope, &joins);
        let in_force = self.rollout(nv);
        let facts = facts(&in_force, &scope, &node_facts, &joins);
        let steps = rollout::plan(&facts);
        let counts = rollout::counts(&facts);
        let rollout_trace = self.trace_rollout(nv, &counts).await?;
        let etcd_waits = self.carry_out_all(nv, &steps, &scope, rollout_trace).await?;
        self.record_metrics(nv, &counts, !steps.is_empty());
        self.pause_autoscaling(&nv_name, counts.outdated > 0).await?;
        let problems = Problems {
            join_timeouts: scope
                .pending
                .iter()
                .filter(|p| {
                    p.annotations()
                        .contains_key(super::pending_node::JOIN_TIMED_OUT_ANNOTATION)
                })
                .map(|p| p.spec.node_name.clone())
                .collect(),
            invalid_nodes: self.invalid_nodes(),
            etcd_waits,
        };
        self.write_status(nv, &facts, &counts, &steps, &problems).await?;
        if problems.etcd_waits.is_empty() {
            Ok(Action::Done)
        } else {
            Ok(Action::RequeueAfter(ETCD_RECHECK))
        }
    }

    /// Managed nodes no ScalingGroup covers: no provider ID, or a group
    /// annotation that names no ScalingGroup (the cloud did not know them,
    /// or their group has no ScalingGroup yet).
    fn invalid_nodes(&self) -> Vec<String> {
        let groups: std::collections::BTreeSet<String> = self
            .groups
            .list()
            .iter()
            .map(|g| g.spec.group_id.clone())
            .collect();
        self.nodes
            .list()
            .iter()
            .filter(|n| {
                let has_provider = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .is_some_and(|p| !p.is_empty());
                !has_provider || !annotation(n, GROUP_ANNOTATION).is_some_and(|g| groups.contains(g))
            })
            .map(|n| n.name_any())
            .collect()
    }

    /// The groups following `nv`, and their nodes and PendingNodes (reads
    /// only). `annotated`: nodes this pass just wrote, as the API server
    /// answered, in place of the store's older copies: a node annotated now
    /// can be paired in this pass, not only in the one its watch event starts.
    fn scope(&self, nv: &NodeVersion, annotated: Vec<Node>) -> Scope {
        let nv_name = nv.name_any();
        let groups: Vec<GroupFacts> = self
            .groups
            .list()
            .iter()
            .filter(|g| g.spec.node_version() == nv_name)
            .map(|g| GroupFacts {
                id: g.spec.group_id.clone(),
                role: if g.spec.is_control_plane() {
                    Role::ControlPlane
                } else {
                    Role::Worker
                },
                image_ready: g.status.as_ref().map(|s| s.image_reference.as_str())
                    == Some(nv.spec.image.as_str()),
            })
            .collect();
        let mut nodes = self.nodes.list();
        self.retired.forget_gone(&nodes);
        nodes.retain(|n| !self.retired.contains(n));
        for written in annotated {
            let name = written.name_any();
            if let Some(slot) = nodes.iter_mut().find(|n| n.name_any() == name) {
                *slot = Arc::new(written);
            }
        }
        Scope::of(groups, nodes, self.pending.list())
    }

    /// Sorts the Join PendingNodes: nodes still joining, nodes that joined
    /// for an older target (surplus: marked for removal), creates not joined
    /// yet. A PendingNode whose node is paired already (a leader died between
    /// pairing and deleting it) or marked surplus is deleted: counting it as
    /// joining would pair that heir with a second donor.
    async fn settle_joins(&self, nv: &NodeVersion, scope: &Scope) -> Result<Joins> {
        let pending_api: Api<PendingNode> = Api::all(self.client.clone());
        let (joins, settled) = sort_joins(nv, scope);
        for p in scope.pending.iter().filter(|p| settled.contains(&p.name_any())) {
            delete_if_present(&pending_api, &p.name_any(), &same_object(&p.metadata)).await?;
        }
        for node in &joins.surplus {
            if let Some(n) = scope.nodes.iter().find(|n| n.name_any() == *node) {
                self.mark_surplus(n, "it joined on an image the rollout no longer wants")
                    .await?;
            }
        }
        Ok(joins)
    }

    /// The creates of `group` (at most `planned`) that a plan made from a
    /// fresh read of the Nodes and PendingNodes agrees with.
    ///
    /// Why: a create is the one step that waiting cannot undo, and the stores
    /// come from separate watches, each in order only within itself. A leader
    /// elected just after its predecessor paired an heir can see that heir's
    /// PendingNode deleted before it sees the pairing on the Node; the heir
    /// then counts as neither joining nor paired, and one instance too many
    /// would be made. Creates are few (one per replaced node), so one list of
    /// each kind before them is cheap.
    async fn confirmed_creates(
        &self,
        nv: &NodeVersion,
        scope: &Scope,
        group: &str,
        planned: usize,
    ) -> Result<usize> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        let fresh = Scope::of(
            scope.groups.clone(),
            nodes
                .list(&self.node_source.list_params())
                .await?
                .items
                .into_iter()
                .map(Arc::new),
            pending
                .list(&self.object_source.list_params())
                .await?
                .items
                .into_iter()
                .map(Arc::new),
        );
        let (joins, _) = sort_joins(nv, &fresh);
        let node_facts = self.node_facts(nv, &fresh, &joins);
        let in_force = self.rollout(nv);
        let facts = facts(&in_force, &fresh, &node_facts, &joins);
        let confirmed = rollout::plan(&facts)
            .into_iter()
            .find_map(|step| match step {
                Step::Create { group: g, count } if g == group => Some(count),
                _ => None,
            })
            .unwrap_or(0);
        if confirmed < planned {
            tracing::info!(
                group,
                planned,
                confirmed,
                "a fresh read allows fewer creates than the stores did"
            );
        }
        Ok(confirmed.min(planned))
    }

    /// What the planner needs to know of each node (reads only).
    /// The rollout settings in force for `nv`.
    fn rollout(&self, nv: &NodeVersion) -> Rollout {
        nv.spec.rollout_in_force(&self.rollout_defaults)
    }

    fn node_facts(&self, nv: &NodeVersion, scope: &Scope, joins: &Joins) -> Vec<NodeFacts> {
        let exists = |name: &str| scope.nodes.iter().any(|n| n.name_any() == name);
        scope
            .nodes
            .iter()
            .map(|n| {
                let name = n.name_any();
                // A joining node not annotated yet is a replacement on its
                // way: neither outdated (no donor, nothing to replace) nor
                // Ready to be paired until its annotations say what it runs.
                let awaiting = joins.joining.contains(&name) && !annotated(nv, n);
                NodeFacts {
                    group: annotation(n, GROUP_ANNOTATION).unwrap_or_default().to_string(),
                    up_to_date: awaiting || is_current(nv, n),
                    ready: !awaiting && node_is_ready(n),
                    // A pairing ends when its donor is gone: the heir is then
                    // an ordinary node (and may itself be replaced later).
                    heir_of: annotation(n, DONOR_ANNOTATION)
                        .filter(|d| exists(d))
                        .map(str::to_string),
                    donor_to: annotation(n, HEIR_ANNOTATION)
                        .filter(|h| exists(h))
                        .map(str::to_string),
                    drain: self.drain_state(&name),
                    joining: joins.joining.contains(&name),
                    obsolete: annotation(n, OBSOLETE_ANNOTATION).is_some() || joins.surplus.contains(&name),
                    name,
                }
            })
            .collect()
    }

    /// Where the rollout's drain of `node` stands.
    fn drain_state(&self, node: &str) -> DrainState {
        match self.maintenances.get(&ObjectKey::cluster(&drain_name(node))) {
            None => DrainState::None,
            Some(m) => match m.status.as_ref().and_then(|s| s.phase) {
                None | Some(MaintenancePhase::Running) => DrainState::Running,
                Some(MaintenancePhase::Succeeded) => DrainState::Succeeded,
                Some(MaintenancePhase::Failed) => DrainState::Failed,
            },
        }
    }

    /// Degraded=True with `reason` and the error's message (cleared by the
    /// next pass that gets through).
    async fn report_error(&self, nv: &NodeVersion, reason: &str, message: String) -> Result<()> {
        // After the last pass's status (that write would undo this one), and
        // built on it.
        let mut status = self.status_writes.latest(nv).await;
        let before = status.rollout_conditions.clone();
        set_condition(
            &mut status.rollout_conditions,
            condition::DEGRADED,
            true,
            reason,
            message,
            nv.metadata.generation,
            Timestamp::now(),
        );
        if status.rollout_conditions == before {
            return Ok(());
        }
        let api: Api<NodeVersion> = Api::all(self.client.clone());
        let written = api
            .patch_status(
                &nv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"rolloutConditions": &status.rollout_conditions}})),
            )
            .await?;
        self.status_writes
            .written(&nv.name_any(), status, written.metadata.resource_version);
        Ok(())
    }
    /// Nodes with a provider ID but no group or image annotation: ask the
    /// cloud once. A node this operator created is in the group its
    /// PendingNode names, on the image the cloud's answer to its create named
    /// (when it did): only what is not known is asked, since every call
    /// spends the cloud budget that a rollout at a high surge is bound by.
    /// Returns the nodes as written.
    async fn annotate_unknown_nodes(&self) -> Result<Vec<Node>> {
        let unknown: Vec<Arc<Node>> = self
            .nodes
            .list()
            .into_iter()
            .filter(|node| {
                let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
                provider_id.is_some_and(|p| !p.is_empty())
                    && (annotation(node, GROUP_ANNOTATION).is_none()
                        || annotation(node, IMAGE_ANNOTATION).is_none())
            })
            .collect();
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let created: HashMap<String, Known> = self
            .pending
            .list()
            .iter()
            .filter(|p| p.spec.goal.unwrap_or(PendingNodeGoal::Join) == PendingNodeGoal::Join)
            .map(|p| {
                let image = p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(CREATED_IMAGE_ANNOTATION))
                    .filter(|i| !i.is_empty())
                    .cloned();
                let known = Known {
                    group: (!p.spec.group_id.is_empty()).then(|| p.spec.group_id.clone()),
                    image,
                };
                (p.spec.node_name.clone(), known)
            })
            .collect();
        // One after another: with the cloud down, the first failure ends the
        // pass, and the backoff (not the number of new nodes) sets how often
        // the cloud is asked.
        let mut annotated = Vec::new();
        for node in unknown {
            let known = created.get(&node.name_any()).cloned().unwrap_or_default();
            annotated.extend(self.annotate(node, known).await?);
        }
        Ok(annotated)
    }

    /// Writes a node's group and image annotations, asking the cloud for
    /// what is not known.
    /// Returns the node as written (None: not a node of this cloud).
    async fn annotate(&self, node: Arc<Node>, known: Known) -> Result<Option<Node>> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default();
        let group = match known.group {
            Some(g) => g,
            None => match self.cloud.node_group(provider_id).await {
                Ok(g) => g,
                // Not a node of this cloud: it stays unmanaged.
                Err(e) if !e.retryable() => return Ok(None),
                Err(e) => return Err(e.into()),
            },
        };
        let image = match known.image {
            Some(image) => image,
            None => self.cloud.node_image(provider_id).await?,
        };
        let patch = json!({"metadata": {"annotations": {GROUP_ANNOTATION: group, IMAGE_ANNOTATION: image}}});
        let nodes: Api<Node> = Api::all(self.client.clone());
        let written = nodes
            .patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(Some(written))
    }

    /// Carries out a pass's steps side by side. The planner gives a node at
    /// most one step, so steps touch distinct nodes; run one after another,
    /// a pass at a high surge spent seconds on the API and cloud round trips
    /// of every retirement before the first pairing. Every step runs even
    /// when another fails (a conflict on one node holds up no other); the
    /// first error fails the pass, which is retried.
    /// Returns why retirements wait for etcd, if any do.
    async fn carry_out_all(
        &self,
        nv: &NodeVersion,
        steps: &[Step],
        scope: &Scope,
        rollout_trace: Option<TraceParent>,
    ) -> Result<Vec<String>> {
        let nv_name = nv.name_any();
        let at_once = &tokio::sync::Semaphore::new(STEPS_AT_ONCE);
        let nv_name = &nv_name;
        let steps = steps.iter().map(|step| async move {
            let _turn = at_once.acquire().await;
            tracing::info!(nodeversion = %nv_name, ?step, "rollout step");
            self.carry_out(nv, step, scope, rollout_trace).await
        });
        let waits: Vec<Option<String>> = futures::future::join_all(steps)
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        Ok(waits.into_iter().flatten().collect())
    }

    /// Carries out one planned step: one small function per kind of step.
    /// Returns why a retirement waits for etcd, if it does.
    async fn carry_out(
        &self,
        nv: &NodeVersion,
        step: &Step,
        scope: &Scope,
        rollout_trace: Option<TraceParent>,
    ) -> Result<Option<String>> {
        let find = |name: &str| scope.nodes.iter().find(|n| n.name_any() == name).cloned();
        let done: Result<()> = match step {
            Step::Pair { donor, heir } => match find(donor) {
                Some(donor_node) => {
                    if find(heir).is_some_and(|h| node_is_ready(&h)) {
                        // Its drain follows the pairing: the node's pods are
                        // listed meanwhile.
                        self.drains.prepare(donor);
                    }
                    let (paired_heir, paired_donor) = self.pair(&donor_node, heir, find(heir)).await?;
                    // With a Ready heir the next pass would only request the
                    // donor's drain: request it now, a pass earlier (a wave
                    // at maxSurge 1 waited a whole pass for it).
                    if node_is_ready(&paired_heir) {
                        self.drain(nv, donor, Some(&paired_donor)).await?;
                    }
                    self.release_join(heir).await
                }
                None => Ok(()),
            },
            Step::MarkObsolete { node } => match find(node) {
                Some(n) => {
                    self.mark_surplus(&n, "no outdated node of its group is left to replace")
                        .await
                }
                None => Ok(()),
            },
            Step::Drain { node } => self.drain(nv, node, find(node).as_deref()).await,
            Step::Retire { node } => match find(node) {
                Some(n) => return self.retire(nv, &n).await,
                None => Ok(()),
            },
            Step::Create { group, count } => {
                let count = self.confirmed_creates(nv, scope, group, *count).await?;
                let deadline = Timestamp::now()
                    .checked_add(
                        SignedDuration::try_from(self.rollout(nv).join_timeout())
                            .unwrap_or(SignedDuration::from_secs(1800)),
                    )
                    .unwrap_or(Timestamp::now());
                // Side by side too; none is cancelled by another's failure
                // (an interrupted create would be finished by the
                // PendingNode controller, but need not be).
                let creates = (0..count).map(|_| self.create_instance(nv, group, deadline, rollout_trace));
                futures::future::join_all(creates).await.into_iter().collect()
            }
        };
        done.map(|()| None)
    }

    /// Pairs a joined heir with its donor: the heir inherits the donor's
    /// labels, and both carry the replacement's trace and name each other.
    ///
    /// The pairing is decided on the cache, which can lag: a leader that just
    /// took over with a watch still reconnecting would pair an heir its
    /// predecessor already gave to another donor, and both donors would be
    /// deleted for one heir. So both nodes are read fresh, the pairing is
    /// refused when either already belongs to another, and each write is
    /// conditional on the version read.
    /// Returns the heir and the donor as written.
    async fn pair(
        &self,
        donor_node: &Node,
        heir: &str,
        heir_node: Option<Arc<Node>>,
    ) -> Result<(Node, Node)> {
        let node_api: Api<Node> = Api::all(self.client.clone());
        let donor = donor_node.name_any();
        let (fresh_donor, fresh_heir) = tokio::try_join!(node_api.get(&donor), node_api.get(heir))?;
        if let Some(reason) = pairing_taken(&fresh_donor, &fresh_heir) {
            return Err(Error::Changed {
                kind: "Node",
                name: heir.to_owned(),
                reason,
            });
        }
        let donor_node = &fresh_donor;
        let joined = self.pending.list().into_iter().find(|p| p.spec.node_name == heir);
        let replacement = joined
            .as_ref()
            .and_then(|p| trace::from_annotations(p.metadata.annotations.as_ref()));
        if let (Some((tp, _)), Some(p), Some(h)) = (replacement, &joined, &heir_node) {
            trace_join(&tp, p, h);
            // Sent before the pairing is recorded: a successor does
            // not emit these phases again.
            trace::flush(TRACE_FLUSH_TIMEOUT).await;
        }
        let transfer_started = SystemTime::now();
        // The replacement's trace moves from the PendingNode to both nodes.
        // (From the heir itself when finishing a half-written pairing
        // whose PendingNode is gone.)
        let trace_from = joined
            .as_ref()
            .and_then(|p| p.metadata.annotations.as_ref())
            .or(fresh_heir.metadata.annotations.as_ref());
        let (heir_patch, donor_patch) = pairing_patches(donor_node, &fresh_heir, trace_from);
        let paired_heir = node_api
            .patch(heir, &PatchParams::default(), &Patch::Merge(&heir_patch))
            .await?;
        let paired_donor = node_api
            .patch(&donor, &PatchParams::default(), &Patch::Merge(&donor_patch))
            .await?;
        if let Some((tp, _)) = replacement {
            let labels = inheritable_labels(donor_node).len();
            trace_transfer(&tp, transfer_started, heir, &donor, labels).await;
        }
        Ok((paired_heir, paired_donor))
    }

    /// The heir joined and is paired: its PendingNode has done its job. (A
    /// leader that stops before this leaves it to `settle_joins`.)
    async fn release_join(&self, heir: &str) -> Result<()> {
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        for p in self.pending.list().iter().filter(|p| p.spec.node_name == heir) {
            delete_if_present(&pending, &p.name_any(), &same_object(&p.metadata)).await?;
        }
        Ok(())
    }

    /// Drains `node` through a NodeMaintenance of its own (created once).
    async fn drain(&self, nv: &NodeVersion, node: &str, found: Option<&Node>) -> Result<()> {
        if self
            .maintenances
            .get(&ObjectKey::cluster(&drain_name(node)))
            .is_some()
        {
            return Ok(());
        }
        // The drain's pod list starts now, while the maintenance is written
        // and taken up.
        self.drains.prepare(node);
        let mut spec = json!({"nodeName": node, "reason": format!("replaced by nodewarden (NodeVersion {})", nv.name_any())});
        if let Some(timeout) = &self.rollout(nv).drain_timeout {
            spec["drainTimeout"] = json!(timeout);
        }
        let mut metadata = json!({
            "name": drain_name(node),
            // The NodeVersion's labels: an operator scoped by an object
            // selector sees the maintenances its rollouts create.
            "labels": nv.labels(),
            "annotations": drain_annotations(found),
            // What the maintenance controller would write first (two writes
            // and a watch event less before the drain starts).
            "finalizers": [node_maintenance::FINALIZER],
        });
        if let Some(uid) = found.and_then(|n| n.metadata.uid.as_deref()) {
            metadata["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]);
        }
        let nm: medik8s::NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": metadata,
            "spec": spec,
        }))?;
        let maintenances: Api<medik8s::NodeMaintenance> = Api::all(self.client.clone());
        match maintenances.create(&PostParams::default(), &nm).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a drained node's instance, then the node (the leaving
    /// instance is tracked first, so it is deleted even if we die now). A
    /// control-plane node loses its etcd member first; returns why it waits
    /// for that, if it does (then nothing else is done).
    async fn retire(&self, nv: &NodeVersion, n: &Node) -> Result<Option<String>> {
        let node = n.name_any();
        let provider_id = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        let group = annotation(n, GROUP_ANNOTATION).unwrap_or_default().to_string();
        let replacement = trace::from_annotations(n.metadata.annotations.as_ref());
        self.leader.ensure_leader()?;
        let began = std::time::Instant::now();
        self.evict_stragglers(&node).await?;
        if let Some(wait) = self.remove_etcd_member(nv, n, replacement.as_ref()).await? {
            return Ok(Some(wait));
        }
        let stragglers_checked = began.elapsed();
        self.track_leave(&node, &provider_id, &group).await?;
        let leave_tracked = began.elapsed();
        self.leader.ensure_leader()?;
        let deleting_instance = SystemTime::now();
        let known = match self.cloud.delete_node(&provider_id).await {
            Ok(()) => true,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e.into()),
        };
        let deleting_node = SystemTime::now();
        if let Some((tp, _)) = &replacement {
            trace_delete_instance(tp, deleting_instance, deleting_node, &provider_id, known);
        }
        let nv_name = nv.name_any();
        let finished = FinishedReplacement {
            donor: n,
            heir: annotation(n, HEIR_ANNOTATION).unwrap_or_default(),
            group: &group,
            role: self.role_of(&group),
            old_image: annotation(n, IMAGE_ANNOTATION).unwrap_or_default(),
            new_image: &nv.spec.image,
            nodeversion: &nv_name,
        };
        if let Some(trace) = &replacement
            && self.sent_roots.first_time(&trace.0)
        {
            trace_replacement(&finished, trace).await;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: n.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        // A stale store can show a retired node once more: only the
        // call that deleted it finishes the replacement.
        let node_api: Api<Node> = Api::all(self.client.clone());
        if delete_if_present(&node_api, &node, &params).await? {
            self.retired.add(n);
            self.finish_replacement(nv, &finished, replacement.as_ref(), deleting_node);
        }
        // Where a retirement's time goes (each figure counts from its start).
        tracing::debug!(%node, ?stragglers_checked, ?leave_tracked, took = ?began.elapsed(), "retired");
        Ok(None)
    }

    /// Removes the etcd member of control-plane node `n` (the one whose
    /// peer URL is on the node's InternalIP), when the rules allow it now
    /// (`etcd::decide`). Returns why the retirement waits, if it does. A
    /// node with no member (external etcd, or removed by an earlier pass)
    /// is retired as it is.
    async fn remove_etcd_member(
        &self,
        nv: &NodeVersion,
        n: &Node,
        replacement: Option<&(TraceParent, Option<SystemTime>)>,
    ) -> Result<Option<String>> {
        let Some(etcd) = &self.etcd else {
            return Ok(None);
        };
        let group = annotation(n, GROUP_ANNOTATION).unwrap_or_default();
        if !n.labels().contains_key(CONTROL_PLANE_LABEL) && self.role_of(group) != "control-plane" {
            return Ok(None);
        }
        let node = n.name_any();
        // The store keeps no addresses (`strip_node`): read them fresh.
        let fresh = Api::<Node>::all(self.client.clone()).get(&node).await?;
        let Some(ip) = internal_ip(&fresh) else {
            let why = format!(
                "node {node} has no InternalIP, so its etcd member cannot be told: it is not retired"
            );
            tracing::warn!(%node, "{why}");
            self.event(nv, EventType::Warning, "EtcdMemberRemovalBlocked", why.clone());
            return Ok(Some(why));
        };
        let heir = match annotation(n, HEIR_ANNOTATION) {
            Some(heir) => Api::<Node>::all(self.client.clone())
                .get_opt(heir)
                .await?
                .as_ref()
                .and_then(internal_ip),
            None => None,
        };
        let _turn = self.etcd_turn.lock().await;
        let started = SystemTime::now();
        let members = etcd.members().await?;
        let health = etcd.health_of(&to_check(ip, &members)).await;
        let (member, outcome) = match decide(ip, heir, &members, &health) {
            Decision::Wait(blocked) => {
                let why = format!("node {node} waits for the removal of its etcd member: {blocked}");
                tracing::warn!(%node, %ip, %blocked, "etcd member removal waits");
                self.event(nv, EventType::Warning, "EtcdMemberRemovalBlocked", why.clone());
                return Ok(Some(why));
            }
            Decision::NoMember => {
                tracing::info!(%node, %ip, "no etcd member on the node: external etcd, or removed already");
                self.event(
                    nv,
                    EventType::Normal,
                    "NoEtcdMember",
                    format!(
                        "no etcd member has a peer URL on {ip} (node {node}): etcd runs elsewhere or the member was removed already; the node is retired"
                    ),
                );
                (None, "no member")
            }
            Decision::Remove(member) => {
                self.leader.ensure_leader()?;
                let removed = match etcd.remove_member(member.id).await {
                    Err(EtcdError::ClusterUnhealthy(answer)) => {
                        let why = format!(
                            "node {node} waits for the removal of its etcd member {}: etcd refused it ({answer}): a member is down, or joined moments ago",
                            member.label()
                        );
                        self.event(nv, EventType::Warning, "EtcdMemberRemovalBlocked", why.clone());
                        return Ok(Some(why));
                    }
                    removed => removed?,
                };
                let (outcome, note) = match removed {
                    Removed::Now => ("removed", "removed"),
                    Removed::Already => ("removed already", "was removed already"),
                };
                tracing::info!(%node, %ip, member = %member.label(), outcome, "etcd member removed");
                self.event(
                    nv,
                    EventType::Normal,
                    "EtcdMemberRemoved",
                    format!("etcd member {} of node {node} {note}", member.label()),
                );
                (Some(member), outcome)
            }
        };
        if let Some((tp, _)) = replacement {
            trace_etcd_member(tp, started, &node, ip, member.as_ref(), outcome).await;
        }
        Ok(None)
    }

    /// The last look before a drained node goes: a pod bound after the drain
    /// ended (a scheduler whose cache had not seen the cordon yet, say after
    /// an API server restart) would go down with the Node. Such pods are
    /// evicted (budgets still apply) and the node is retired on a later
    /// pass, once none is left. The pods are those the drain's own watch
    /// shows, while it is connected; else they are listed, read fresh (a
    /// read that waits up to 0.1 s for the API server's pod cache).
    async fn evict_stragglers(&self, node: &str) -> Result<()> {
        use crate::drain::pods::{PodClass, classify};
        let left: Vec<Arc<Pod>> = match self.drains.pods_since_success(node) {
            Some(watched) => watched,
            None => {
                let pods: Api<Pod> = Api::all(self.client.clone());
                let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
                pods.list(&on_node)
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| classify(p) == PodClass::Evict)
                    .map(Arc::new)
                    .collect()
            }
        };
        if left.is_empty() {
            return Ok(());
        }
        for p in left.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &p.namespace().unwrap_or_default());
            // This pod, not one made since under its name (a StatefulSet's
            // on another node). A budget refusing (429) is retried with the
            // reconcile.
            let params = EvictParams {
                delete_options: Some(same_object(&p.metadata)),
                ..Default::default()
            };
            if let Err(e) = api.evict(&p.name_any(), &params).await {
                tracing::debug!(pod = %p.name_any(), error = %e, "evicting a pod left on a drained node");
            }
        }
        Err(Error::PodsLeft {
            node: node.to_string(),
            pods: left
                .iter()
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                .collect(),
        })
    }

    /// A PendingNode first (its UID is the cloud call's idempotency key),
    /// then the instance; the PendingNode controller finishes a create that
    /// was interrupted.
    async fn create_instance(
        &self,
        nv: &NodeVersion,
        group: &str,
        deadline: Timestamp,
        rollout_trace: Option<TraceParent>,
    ) -> Result<()> {
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        let name = format!("join-{:08x}", rand::random::<u32>());
        // The replacement's trace begins here; its context rides on the objects.
        let started = SystemTime::now();
        let replacement = TraceParent::new_root();
        let mut annotations = BTreeMap::from([
            (TRACEPARENT_ANNOTATION.to_string(), replacement.header()),
            (TRACE_STARTED_ANNOTATION.to_string(), trace::format_time(started)),
            (REQUEST_KEY_ANNOTATION.to_string(), "uid".to_string()),
        ]);
        if let Some(r) = rollout_trace {
            annotations.insert(ROLLOUT_TRACEPARENT_ANNOTATION.to_string(), r.header());
        }
        let pn = PendingNode {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(nv.labels().clone()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: PendingNodeSpec {
                provider_id: String::new(),
                group_id: group.to_string(),
                node_name: String::new(),
                goal: Some(PendingNodeGoal::Join),
                deadline: Some(Time(deadline)),
            },
            status: None,
        };
        let written = pending.create(&PostParams::default(), &pn).await?;
        let key = request_key(&written)?;
        self.leader.ensure_leader()?;
        let created = self
            .cloud
            .create_node(&CreateNodeRequest {
                group_id: group.to_string(),
                request_id: Some(key.clone()),
            })
            .await?;
        let accepted = SystemTime::now();
        trace_create(
            &replacement,
            started,
            accepted,
            group,
            &key,
            &created.provider_id,
            false,
        );
        trace::flush(TRACE_FLUSH_TIMEOUT).await;
        // The join timeout counts from the cloud's answer (see join_deadline).
        let patch = created_patch(&written, &created, accepted);
        pending
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// A new node nobody needs any more: marked for removal, its PendingNode
    /// let go, and its trace closed (a root span `surplus node`, so the
    /// phases it already has are not left without one).
    ///
    /// The mark is conditioned on the node's version as judged: landing
    /// late, after another leader paired the node as an heir, it would
    /// retire that heir.
    async fn mark_surplus(&self, n: &Node, why: &str) -> Result<()> {
        let node = n.name_any();
        let node_api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {
            "annotations": {OBSOLETE_ANNOTATION: "true"},
            "resourceVersion": n.resource_version(),
        }});
        node_api
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        for p in self.pending.list().iter().filter(|p| p.spec.node_name == node) {
            trace_surplus(p, &node, why).await;
            delete_if_present(&pending, &p.name_any(), &same_object(&p.metadata)).await?;
        }
        Ok(())
    }

    /// The role of the scaling group `group`, for the replacement's span.
    fn role_of(&self, group: &str) -> &'static str {
        self.groups
            .list()
            .iter()
            .find(|g| g.spec.group_id == group)
            .map(|g| {
                if g.spec.is_control_plane() {
                    "control-plane"
                } else {
                    "worker"
                }
            })
            .unwrap_or("unknown")
    }

    /// The old Node is gone: count it, close its trace, tell the NodeVersion.
    fn finish_replacement(
        &self,
        nv: &NodeVersion,
        finished: &FinishedReplacement<'_>,
        trace: Option<&(TraceParent, Option<SystemTime>)>,
        deleting: SystemTime,
    ) {
        self.metrics
            .replacements
            .get_or_create(&NodeVersionLabels {
                nodeversion: finished.nodeversion.to_string(),
            })
            .inc();
        if let Some(trace) = trace {
            trace_node_deleted(finished, trace, deleting);
        }
        self.event(
            nv,
            EventType::Normal,
            "NodeReplaced",
            format!(
                "node {} replaced by {} (scaling group {})",
                finished.donor.name_any(),
                finished.heir,
                finished.group
            ),
        );
    }

    /// One trace per rollout: started (on the NodeVersion) when nodes are
    /// outdated, its root span sent when none are left. Returns the trace
    /// replacements link to.
    async fn trace_rollout(&self, nv: &NodeVersion, counts: &rollout::Counts) -> Result<Option<TraceParent>> {
        let api: Api<NodeVersion> = Api::all(self.client.clone());
        let current = trace::from_annotations(nv.metadata.annotations.as_ref());
        match (current, counts.outdated > 0) {
            (Some((tp, _)), true) => Ok(Some(tp)),
            (None, true) => {
                let tp = TraceParent::new_root();
                let patch = json!({"metadata": {"annotations": {
                    TRACEPARENT_ANNOTATION: tp.header(),
                    TRACE_STARTED_ANNOTATION: trace::format_time(SystemTime::now()),
                }}});
                api.patch(&nv.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                self.event(
                    nv,
                    EventType::Normal,
                    "RolloutStarted",
                    format!(
                        "replacing {} of {} nodes to run image {}",
                        counts.outdated, counts.nodes, nv.spec.image
                    ),
                );
                Ok(Some(tp))
            }
            (Some((tp, started)), false) => {
                let surge = self.rollout(nv).limits_for(counts.nodes, 1).max_surge;
                let (started, now) = trace_rollout_end(&tp, started, nv, counts.nodes, surge).await;
                let patch = json!({"metadata": {"annotations": {
                    TRACEPARENT_ANNOTATION: null,
                    TRACE_STARTED_ANNOTATION: null,
                }}});
                api.patch(&nv.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                let seconds = now.duration_since(started).unwrap_or_default().as_secs_f64();
                tracing::info!(
                    trace_id = %tp.trace_id,
                    nodeversion = %nv.name_any(),
                    seconds,
                    "rollout finished"
                );
                self.event(
                    nv,
                    EventType::Normal,
                    "RolloutFinished",
                    format!(
                        "all {} nodes run image {} ({seconds:.0} s)",
                        counts.nodes, nv.spec.image
                    ),
                );
                Ok(None)
            }
            (None, false) => Ok(None),
        }
    }

    fn record_metrics(&self, nv: &NodeVersion, counts: &rollout::Counts, stepped: bool) {
        let nodeversion = nv.name_any();
        // Progress: a step taken, or a node changed from outdated to up to date.
        let mut progressed = stepped;
        for (state, n) in [
            (NodeState::UpToDate, counts.up_to_date),
            (NodeState::Outdated, counts.outdated),
            (NodeState::Replacing, counts.surge + counts.unavailable),
        ] {
            let labels = NodeStateLabels {
                nodeversion: nodeversion.clone(),
                state,
            };
            let before = self.metrics.nodes.get_or_create(&labels).set(n as i64);
            progressed |= before != n as i64 && state != NodeState::Replacing;
        }
        let ratio = if counts.nodes == 0 {
            1.0
        } else {
            counts.up_to_date as f64 / counts.nodes as f64
        };
        let labels = NodeVersionLabels { nodeversion };
        self.metrics.rollout_progress.get_or_create(&labels).set(ratio);
        if progressed || self.metrics.rollout_last_progress.get(&labels).is_none() {
            self.mark_progress(&labels.nodeversion);
        }
    }

    fn mark_progress(&self, nodeversion: &str) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.metrics
            .rollout_last_progress
            .get_or_create(&NodeVersionLabels {
                nodeversion: nodeversion.to_string(),
            })
            .set(now);
    }

    fn forget_metrics(&self, nodeversion: &str) {
        let labels = NodeVersionLabels {
            nodeversion: nodeversion.to_string(),
        };
        self.metrics.rollout_progress.remove(&labels);
        self.metrics.rollout_last_progress.remove(&labels);
        for state in NodeState::ALL {
            self.metrics.nodes.remove(&NodeStateLabels {
                nodeversion: nodeversion.to_string(),
                state,
            });
        }
    }

    async fn track_leave(&self, node: &str, provider_id: &str, group: &str) -> Result<()> {
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        let name = format!("leave-{node}");
        if self.pending.get(&ObjectKey::cluster(&name)).is_some() {
            return Ok(());
        }
        let deadline = Timestamp::now()
            .checked_add(SignedDuration::from_secs(LEAVE_DEADLINE_SECS))
            .unwrap_or(Timestamp::now());
        let labels = self
            .pending
            .list()
            .iter()
            .find(|p| p.spec.group_id == group)
            .map(|p| p.labels().clone())
            .unwrap_or_default();
        let pn = PendingNode {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(labels),
                ..Default::default()
            },
            spec: PendingNodeSpec {
                provider_id: provider_id.to_string(),
                group_id: group.to_string(),
                node_name: node.to_string(),
                goal: Some(PendingNodeGoal::Leave),
                deadline: Some(Time(deadline)),
            },
            status: None,
        };
        match pending.create(&PostParams::default(), &pn).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Pauses the cluster autoscaler while nodes are outdated; resumes only
    /// what this NodeVersion paused.
    async fn pause_autoscaling(&self, nv: &str, outdated: bool) -> Result<()> {
        let api: Api<AutoscalingStrategy> = Api::all(self.client.clone());
        for s in self.strategies.list() {
            let paused_by_us = s.annotations().get(PAUSED_BY_ANNOTATION).map(String::as_str) == Some(nv);
            // Conditioned on the version judged: a pause landing late, after
            // another leader resumed at the rollout's end, is refused (as is
            // a late resume in a rollout that began again).
            let version = s.resource_version();
            let patch = if outdated && s.spec.enabled {
                json!({"metadata": {"annotations": {PAUSED_BY_ANNOTATION: nv}, "resourceVersion": version}, "spec": {"enabled": false}})
            } else if !outdated && paused_by_us {
                json!({"metadata": {"annotations": {PAUSED_BY_ANNOTATION: null}, "resourceVersion": version}, "spec": {"enabled": true}})
            } else {
                continue;
            };
            api.patch(&s.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Ok(())
    }

    async fn write_status(
        &self,
        nv: &NodeVersion,
        facts: &Facts<'_>,
        counts: &rollout::Counts,
        steps: &[Step],
        problems: &Problems,
    ) -> Result<()> {
        // The last write landed first (merge patches land in order), and
        // the status is built on it.
        let base = self.status_writes.latest(nv).await;
        let mut status = base.clone();
        let nodes = |f: fn(&NodeFacts) -> bool| {
            facts
                .nodes
                .iter()
                .filter(move |n| f(n))
                .map(|n| reference(&n.name))
        };
        use StatusList::*;
        status.set_list(
            Outdated,
            STATUS_LIST_LIMIT,
            nodes(|n| !n.up_to_date && n.donor_to.is_none()),
        );
        status.set_list(
            UpToDate,
            STATUS_LIST_LIMIT,
            nodes(|n| n.up_to_date && n.heir_of.is_none() && !n.joining),
        );
        status.set_list(
            Donors,
            STATUS_LIST_LIMIT,
            nodes(|n| !n.up_to_date && n.donor_to.is_some()),
        );
        status.set_list(Heirs, STATUS_LIST_LIMIT, nodes(|n| n.heir_of.is_some()));
        status.set_list(
            Mints,
            STATUS_LIST_LIMIT,
            nodes(|n| n.up_to_date && n.joining && n.heir_of.is_none()),
        );
        status.set_list(
            Invalid,
            STATUS_LIST_LIMIT,
            problems.invalid_nodes.iter().map(|n| reference(n)),
        );
        status.set_list(
            Pending,
            STATUS_LIST_LIMIT,
            facts.joins.iter().map(|j| ObjectReference {
                kind: Some("PendingNode".into()),
                name: Some(j.pending.clone()),
                ..Default::default()
            }),
        );
        status.budget = u32::try_from(facts.max_surge.saturating_sub(counts.surge)).unwrap_or(0);
        status.set_counts(NodeCounts {
            nodes: counts.nodes as u32,
            up_to_date: counts.up_to_date as u32,
            outdated: counts.outdated as u32,
            replacing: (counts.surge + counts.unavailable) as u32,
        });
        let now = Timestamp::now();
        status.conditions = outdated_condition(&status.conditions, counts, nv.metadata.generation, now);
        status.rollout_conditions = rollout_conditions(
            std::mem::take(&mut status.rollout_conditions),
            facts,
            counts,
            steps,
            problems,
            nv.metadata.generation,
            now,
        );
        settings_condition(
            &mut status.rollout_conditions,
            &nv.spec.own_rollout(),
            &self.rollout_defaults,
            nv.metadata.generation,
            now,
        );
        if status == base {
            return Ok(());
        }
        self.status_writes
            .start(self.client.clone(), &self.queue, nv, status.clone());
        let degraded = |conditions: &[Condition]| {
            conditions
                .iter()
                .find(|c| c.type_ == condition::DEGRADED && c.status == "True")
                .map(|c| (c.reason.clone(), c.message.clone()))
        };
        let settings = |conditions: &[Condition]| {
            conditions
                .iter()
                .find(|c| c.type_ == condition::ROLLOUT_SETTINGS)
                .map(|c| c.message.clone())
        };
        if let Some(message) = settings(&status.rollout_conditions)
            && settings(&base.rollout_conditions).as_ref() != Some(&message)
        {
            self.event(
                nv,
                EventType::Normal,
                "RolloutSettings",
                format!("in force: {message}"),
            );
        }
        let before = degraded(&base.rollout_conditions);
        if let Some((reason, message)) = degraded(&status.rollout_conditions)
            && before.as_ref().map(|b| &b.0) != Some(&reason)
        {
            self.event(
                nv,
                EventType::Warning,
                "RolloutBlocked",
                format!("{reason}: {message}"),
            );
        }
        Ok(())
    }
}

/// Each NodeVersion's last status write, carried out while the next pass
/// runs: a pass that waited for its write held up the next one (a write takes
/// 5 to 20 ms, and every step of a replacement waits for a pass). Passes of
/// one NodeVersion never overlap, and each waits for the last write before
/// its own, so writes land in order. A failed write queues the NodeVersion
/// again, whose next pass writes the status anew.
///
/// A pass builds on the status last written, not on the store's copy while
/// the store has not caught up with that write: built on a copy one write
/// behind, conditions took their transition times from it, each pass undid
/// the last one's, and every write woke the next pass (dozens of writes a
/// second, while nothing changed, in a rollout's busiest moments).
#[derive(Default)]
pub struct StatusWrites(std::sync::Mutex<HashMap<String, StatusWrite>>);

struct StatusWrite {
    status: NodeVersionStatus,
    state: WriteState,
}

enum WriteState {
    /// Being written; the task answers the resourceVersion written.
    InFlight(tokio::task::JoinHandle<Option<String>>),
    /// Written as this resourceVersion, at this time.
    Written(String, std::time::Instant),
}

/// How long a status written is preferred to a store that does not show it
/// yet (a watch lagging longer than this is no longer a lag).
const STORE_CATCHES_UP: std::time::Duration = std::time::Duration::from_secs(5);

impl StatusWrites {
    /// The status `nv` has now as far as this replica knows: its last write
    /// (once landed) while the store does not show it yet, else the store's.
    async fn latest(&self, nv: &NodeVersion) -> NodeVersionStatus {
        let name = nv.name_any();
        let last = crate::runtime::sync::lock(&self.0).remove(&name);
        let Some(mut last) = last else {
            return nv.status_or_default();
        };
        if let WriteState::InFlight(task) = last.state {
            match task.await {
                Ok(Some(rv)) => last.state = WriteState::Written(rv, std::time::Instant::now()),
                _ => return nv.status_or_default(),
            }
        }
        match &last.state {
            WriteState::Written(rv, at)
                if nv.metadata.resource_version.as_ref() != Some(rv) && at.elapsed() < STORE_CATCHES_UP =>
            {
                let status = last.status.clone();
                crate::runtime::sync::lock(&self.0).insert(name, last);
                status
            }
            _ => nv.status_or_default(),
        }
    }

    /// Records a status written as `resource_version`.
    fn written(&self, name: &str, status: NodeVersionStatus, resource_version: Option<String>) {
        if let Some(rv) = resource_version {
            let state = WriteState::Written(rv, std::time::Instant::now());
            crate::runtime::sync::lock(&self.0).insert(name.to_string(), StatusWrite { status, state });
        }
    }

    /// Writes `status` onto `nv` in the background.
    fn start(
        &self,
        client: Client,
        queue: &WorkQueue<Key<NodeVersion>>,
        nv: &NodeVersion,
        status: NodeVersionStatus,
    ) {
        let name = nv.name_any();
        let (queue, key) = (queue.clone(), Key::<NodeVersion>::cluster(&name));
        let patch = json!({"status": &status});
        let write_name = name.clone();
        let task = tokio::spawn(async move {
            let api: Api<NodeVersion> = Api::all(client);
            match api
                .patch_status(&write_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => written.metadata.resource_version,
                Err(e) => {
                    tracing::warn!(nodeversion = %write_name, error = %e, "writing the rollout's status failed; looking again");
                    queue.add(key);
                    None
                }
            }
        });
        let state = WriteState::InFlight(task);
        crate::runtime::sync::lock(&self.0).insert(name, StatusWrite { status, state });
    }
}

/// Nodes this replica deleted, by UID, until the store no longer shows them:
/// a pass that began before the deletion's watch event arrived would take
/// the node for one still to retire, and retire it again (a tenth of a
/// second of reads and writes that held up the next create).
#[derive(Default)]
pub struct Retired(std::sync::Mutex<std::collections::HashSet<String>>);

impl Retired {
    fn add(&self, node: &Node) {
        if let Some(uid) = &node.metadata.uid {
            crate::runtime::sync::lock(&self.0).insert(uid.clone());
        }
    }

    fn contains(&self, node: &Node) -> bool {
        node.metadata
            .uid
            .as_ref()
            .is_some_and(|uid| crate::runtime::sync::lock(&self.0).contains(uid))
    }

    /// Forgets the nodes `shown` no longer has.
    fn forget_gone(&self, shown: &[Arc<Node>]) {
        let mut retired = crate::runtime::sync::lock(&self.0);
        if retired.is_empty() {
            return;
        }
        let present: std::collections::HashSet<&str> =
            shown.iter().filter_map(|n| n.metadata.uid.as_deref()).collect();
        retired.retain(|uid| present.contains(uid.as_str()));
    }
}

/// What nodewarden knows of a node it created, from its PendingNode: no
/// need to ask the cloud for it.
#[derive(Clone, Debug, Default)]
struct Known {
    group: Option<String>,
    image: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(id: &str, role: Role) -> GroupFacts {
        GroupFacts {
            id: id.into(),
            role,
            image_ready: true,
        }
    }

    fn node(name: &str, group: &str, up_to_date: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            group: group.into(),
            up_to_date,
            ready: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_pass_builds_on_the_status_last_written_until_the_store_shows_it() {
        let nv_at = |rv: &str, budget: u32| -> NodeVersion {
            let mut nv: NodeVersion = serde_json::from_value(json!({
                "apiVersion": "update.edgeless.systems/v1alpha1",
                "kind": "NodeVersion",
                "metadata": {"name": "v", "resourceVersion": rv},
                "spec": {"image": "img"},
            }))
            .expect("a NodeVersion");
            nv.status = Some(NodeVersionStatus {
                budget,
                ..Default::default()
            });
            nv
        };
        let writes = StatusWrites::default();
        assert_eq!(
            writes.latest(&nv_at("1", 1)).await.budget,
            1,
            "nothing written: the store's"
        );
        let ours = NodeVersionStatus {
            budget: 7,
            ..Default::default()
        };
        writes.written("v", ours, Some("2".into()));
        assert_eq!(
            writes.latest(&nv_at("1", 1)).await.budget,
            7,
            "the store is a write behind: ours"
        );
        assert_eq!(
            writes.latest(&nv_at("2", 7)).await.budget,
            7,
            "the store shows our write"
        );
        assert_eq!(
            writes.latest(&nv_at("1", 1)).await.budget,
            1,
            "once the store caught up, it is the store's again"
        );
    }

    #[test]
    fn a_retired_node_is_hidden_until_the_store_drops_it() {
        let node = |name: &str, uid: &str| -> Arc<Node> {
            Arc::new(serde_json::from_value(json!({"metadata": {"name": name, "uid": uid}})).expect("a Node"))
        };
        let (old, other) = (node("old-1", "u-1"), node("old-2", "u-2"));
        let retired = Retired::default();
        retired.add(&old);
        assert!(retired.contains(&old));
        assert!(!retired.contains(&other));
        // A new node of the same name is another node.
        assert!(!retired.contains(&node("old-1", "u-9")));
        retired.forget_gone(&[old.clone(), other.clone()]);
        assert!(retired.contains(&old), "the store still shows it");
        retired.forget_gone(std::slice::from_ref(&other));
        assert!(!retired.contains(&old), "forgotten once the store dropped it");
    }

    #[test]
    fn the_pairing_is_written_on_the_versions_read() {
        let node = |name: &str, rv: &str, labels: serde_json::Value| -> Node {
            serde_json::from_value(
                json!({"metadata": {"name": name, "resourceVersion": rv, "labels": labels}}),
            )
            .expect("a Node")
        };
        let donor = node("old", "10", json!({"team": "a", "kubernetes.io/hostname": "old"}));
        let heir = node("new", "20", json!({}));
        let trace = BTreeMap::from([(TRACEPARENT_ANNOTATION.to_string(), "00-t-s-01".to_string())]);
        let (heir_patch, donor_patch) = pairing_patches(&donor, &heir, Some(&trace));
        assert_eq!(heir_patch["metadata"]["resourceVersion"], "20");
        assert_eq!(heir_patch["metadata"]["labels"], json!({"team": "a"}));
        assert_eq!(heir_patch["metadata"]["annotations"][DONOR_ANNOTATION], "old");
        assert_eq!(donor_patch["metadata"]["resourceVersion"], "10");
        assert_eq!(donor_patch["metadata"]["annotations"][HEIR_ANNOTATION], "new");
        for patch in [&heir_patch, &donor_patch] {
            assert_eq!(
                patch["metadata"]["annotations"][TRACEPARENT_ANNOTATION],
                "00-t-s-01"
            );
        }
    }

    #[test]
    fn a_node_paired_with_another_is_not_paired_again() {
        let kube_node = |name: &str, key: &str, partner: Option<&str>| -> Node {
            let annotations = partner.map(|p| json!({key: p})).unwrap_or(json!({}));
            serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}}))
                .expect("a Node")
        };
        // (heir names as donor, donor names as heir, refused)
        let cases = [
            (None, None, false),
            (Some("old-1"), None, false), // half written: finished
            (Some("old-1"), Some("new-1"), false),
            (Some("old-2"), None, true), // a stale cache's choice
            (None, Some("new-2"), true),
            (Some("old-1"), Some("new-2"), true),
        ];
        for (heir_of, donor_to, refused) in cases {
            let donor = kube_node("old-1", HEIR_ANNOTATION, donor_to);
            let heir = kube_node("new-1", DONOR_ANNOTATION, heir_of);
            let got = pairing_taken(&donor, &heir);
            assert_eq!(
                got.is_some(),
                refused,
                "heir of {heir_of:?}, donor to {donor_to:?}: {got:?}"
            );
        }
    }

    #[test]
    fn joins_are_sorted_by_what_their_node_shows() {
        let nv: NodeVersion = serde_json::from_value(json!({
            "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "NodeVersion",
            "metadata": {"name": "v"}, "spec": {"image": "new"},
        }))
        .expect("a NodeVersion");
        let kube_node = |name: &str, annotations: serde_json::Value| -> Arc<Node> {
            Arc::new(
                serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}}))
                    .expect("a Node"),
            )
        };
        let join = |name: &str, node: &str| -> Arc<PendingNode> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "PendingNode",
                    "metadata": {"name": name},
                    "spec": {"groupID": "g", "nodeName": node, "goal": "Join"},
                }))
                .expect("a PendingNode"),
            )
        };
        let scope = Scope {
            groups: vec![group("g", Role::Worker)],
            nodes: vec![
                kube_node(
                    "paired",
                    json!({DONOR_ANNOTATION: "old-1", IMAGE_ANNOTATION: "new"}),
                ),
                kube_node("stale", json!({IMAGE_ANNOTATION: "older"})),
                kube_node("fresh", json!({})),
                kube_node("new", json!({IMAGE_ANNOTATION: "new"})),
            ],
            pending: vec![
                join("p-paired", "paired"),
                join("p-stale", "stale"),
                join("p-fresh", "fresh"),
                join("p-new", "new"),
                join("p-flight", ""),
            ],
        };
        let (joins, settled) = sort_joins(&nv, &scope);
        assert_eq!(settled, vec!["p-paired".to_string()]);
        assert_eq!(joins.surplus, vec!["stale".to_string()]);
        assert_eq!(joins.joining, vec!["fresh".to_string(), "new".to_string()]);
        assert_eq!(
            joins
                .pending
                .iter()
                .map(|j| j.pending.as_str())
                .collect::<Vec<_>>(),
            vec!["p-flight"]
        );
    }

    fn reasons(conditions: &[Condition]) -> BTreeMap<String, (String, String)> {
        conditions
            .iter()
            .map(|c| (c.type_.clone(), (c.status.clone(), c.reason.clone())))
            .collect()
    }

    #[test]
    fn every_declared_reason_is_set_when_it_happens() {
        let groups = [group("cp", Role::ControlPlane), group("w", Role::Worker)];
        let cp_outdated = [node("c1", "cp", false), node("w1", "w", false)];
        let workers_outdated = [node("c1", "cp", true), node("w1", "w", false)];
        let all_current = [node("c1", "cp", true), node("w1", "w", true)];
        let drain_failed = [NodeFacts {
            drain: DrainState::Failed,
            ..node("w1", "w", false)
        }];
        let timeouts = Problems {
            join_timeouts: vec!["w-new".into()],
            ..Default::default()
        };
        let invalid = Problems {
            invalid_nodes: vec!["stray".into()],
            ..Default::default()
        };
        let etcd = Problems {
            etcd_waits: vec!["node c1 waits for the removal of its etcd member: ...".into()],
            join_timeouts: vec!["w-new".into()],
            ..Default::default()
        };
        let none = Problems::default();
        // (what, nodes, control-plane first, problems, Progressing reason, Degraded reason)
        type Case<'a> = (&'a str, &'a [NodeFacts], bool, &'a Problems, &'a str, &'a str);
        let cases: [Case; 8] = [
            (
                "complete",
                &all_current,
                true,
                &none,
                reason::ROLLOUT_COMPLETE,
                reason::AS_EXPECTED,
            ),
            (
                "workers wait",
                &cp_outdated,
                true,
                &none,
                reason::WAITING_FOR_CONTROL_PLANE,
                reason::AS_EXPECTED,
            ),
            (
                "both at once",
                &cp_outdated,
                false,
                &none,
                reason::REPLACING_NODES,
                reason::AS_EXPECTED,
            ),
            (
                "workers' turn",
                &workers_outdated,
                true,
                &none,
                reason::REPLACING_NODES,
                reason::AS_EXPECTED,
            ),
            (
                "drain failed",
                &drain_failed,
                true,
                &none,
                reason::REPLACING_NODES,
                reason::DRAIN_TIMEOUT,
            ),
            (
                "join timeout",
                &workers_outdated,
                true,
                &timeouts,
                reason::REPLACING_NODES,
                reason::JOIN_TIMEOUT,
            ),
            (
                "invalid nodes",
                &all_current,
                true,
                &invalid,
                reason::ROLLOUT_COMPLETE,
                reason::INVALID_NODES,
            ),
            // A control-plane node held by etcd comes first: it stops the rollout.
            (
                "etcd member removal waits",
                &cp_outdated,
                true,
                &etcd,
                reason::WAITING_FOR_CONTROL_PLANE,
                reason::ETCD_MEMBER_REMOVAL_BLOCKED,
            ),
        ];
        for (what, nodes, cp_first, problems, progressing, degraded) in cases {
            let facts = Facts {
                groups: &groups,
                nodes,
                joins: &[],
                max_surge: 1,
                max_unavailable: 0,
                control_plane_first: cp_first,
            };
            let counts = rollout::counts(&facts);
            let steps = rollout::plan(&facts);
            let got = rollout_conditions(
                Vec::new(),
                &facts,
                &counts,
                &steps,
                problems,
                Some(3),
                Timestamp::now(),
            );
            let got = reasons(&got);
            assert_eq!(got[condition::PROGRESSING].1, progressing, "{what}");
            assert_eq!(got[condition::DEGRADED].1, degraded, "{what}");
            assert_eq!(
                got[condition::DEGRADED].0,
                if degraded == reason::AS_EXPECTED {
                    "False"
                } else {
                    "True"
                },
                "{what}"
            );
        }
    }

    /// What the constellation CLI's `NewNodeVersion` requires: exactly one
    /// condition, whose message it shows as the cluster's status. Older
    /// nodewarden statuses (three conditions there) are brought down to it.
    #[test]
    fn constellations_cli_reads_exactly_one_condition() {
        let older = [condition::OUTDATED, condition::PROGRESSING, condition::DEGRADED]
            .iter()
            .map(|t| Condition {
                type_: t.to_string(),
                status: "True".into(),
                reason: "Old".into(),
                message: "old".into(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            })
            .collect::<Vec<_>>();
        for (outdated, want_status, want_reason, want_message) in [
            (
                3,
                "True",
                reason::NODE_VERSIONS_OUT_OF_DATE,
                "Some node versions are out of date",
            ),
            (
                0,
                "False",
                reason::NODE_VERSIONS_UP_TO_DATE,
                "Node version of every node is up to date",
            ),
        ] {
            let counts = rollout::Counts {
                nodes: 5,
                outdated,
                ..Default::default()
            };
            for existing in [&older[..], &[]] {
                let got = outdated_condition(existing, &counts, Some(2), Timestamp::now());
                assert_eq!(got.len(), 1, "{got:?}");
                let c = &got[0];
                assert_eq!(
                    (
                        c.type_.as_str(),
                        c.status.as_str(),
                        c.reason.as_str(),
                        c.message.as_str()
                    ),
                    (condition::OUTDATED, want_status, want_reason, want_message)
                );
                assert_eq!(c.observed_generation, Some(2));
            }
        }
    }

    #[test]
    fn the_settings_in_force_are_named_with_their_source() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let operator = Rollout {
            max_surge: Some(IntOrString::Int(3)),
            ..Rollout::default()
        };
        let own = Rollout {
            max_unavailable: Some(IntOrString::String("10%".into())),
            ..Rollout::default()
        };
        let mut conditions = Vec::new();
        settings_condition(&mut conditions, &own, &operator, Some(4), Timestamp::now());
        let c = &conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.reason.as_str()),
            (condition::ROLLOUT_SETTINGS, reason::FROM_OPERATOR)
        );
        assert_eq!(
            c.message,
            "maxSurge 3 (operator), maxUnavailable 10% (spec), controlPlaneFirst true (built in), \
             joinTimeout 30m (built in), drainTimeout none (built in)"
        );
        let all = Rollout {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
            control_plane_first: Some(true),
            join_timeout: Some("5m".into()),
            drain_timeout: Some("1h".into()),
        };
        let mut conditions = Vec::new();
        settings_condition(&mut conditions, &all, &operator, Some(4), Timestamp::now());
        assert_eq!(conditions[0].reason, reason::FROM_NODE_VERSION);
    }

    #[test]
    fn long_name_lists_are_cut_in_messages() {
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(name_list(&names[..2]), "n0, n1");
        assert_eq!(name_list(&names), "n0, n1, n2, n3, n4 and 3 more");
    }
}
