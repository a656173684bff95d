//! The PendingNode controller: follows instances between the cloud and the
//! cluster.
//!
//! Join: finish an interrupted create (same idempotency key: the PendingNode's
//! UID, see [`request_key`]), record the cloud state, mark the goal reached
//! once the Node is Ready, and past the deadline switch the goal to Leave and
//! delete the instance (a new instance is then created by the rollout). Leave: make sure the instance
//! is deleted, and forget the PendingNode once the cloud says it is gone.
//! The cloud has no watch, so this controller polls it — every few seconds,
//! and only while an instance is in flight.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::App;
use super::replacement_trace::{CREATED_AT_ANNOTATION, TRACE_FLUSH_TIMEOUT, trace_create};
use super::{delete_if_present, same_object, same_version};
use crate::api::update::annotations::HEIR_ANNOTATION;
use crate::api::update::{CspNodeState, PendingNode, PendingNodeGoal};
use crate::cloud::{CloudProvider, CreateNodeRequest, CreatedNode, InstanceState};
use crate::error::{Error, Result};
use crate::node::node_is_ready;
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::Manager;
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::runtime::sync::lock;
use crate::telemetry::trace;

const POLL: Duration = Duration::from_secs(1);
/// How often a joining instance's state is asked of the cloud. Its join is
/// decided by the Node watch and the deadline; the state only shows in
/// `status.cspState`, and each ask spends the cloud budget every controller
/// shares (at a high surge, polling each joining instance every second was
/// much of it). Until then, an instance the cloud accepted is taken to be
/// `Creating`, as the create's answer said.
const JOIN_STATE_EVERY: Duration = Duration::from_secs(5);
/// How often a leaving instance's state is asked, whatever wakes the
/// PendingNode: its state decides when it is forgotten, but this
/// controller's own status writes and the Node's changes woke it too, and
/// each look asked the cloud again (five asks per replaced node at maxSurge 3).
const LEAVE_STATE_EVERY: Duration = Duration::from_millis(800);
const LEAVE_DEADLINE_SECS: i64 = 600;
/// How long a create may take before a PendingNode without a provider ID
/// counts as interrupted (a leader died between writing it and the cloud's
/// answer). Completing it earlier would race the create itself.
const CREATE_GRACE: Duration = Duration::from_secs(10);

/// What to do with a PendingNode (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingStep {
    /// The create was interrupted before the cloud answered: ask again.
    FinishCreate,
    /// No provider ID yet, but the create may still be under way (the
    /// NodeVersion controller writes the PendingNode, then calls the cloud):
    /// look again when it would be overdue.
    CreateInFlight,
    /// Joined and Ready.
    ReachedJoin,
    /// Still on its way: look again later.
    Wait,
    /// Join deadline passed without a Node, or the instance failed or is
    /// gone (it will not start by itself): delete the instance, goal Leave
    /// (once a fresh read confirms there is no Node: the store may lag).
    GiveUp,
    /// Leaving: ask the cloud to delete (again, harmlessly).
    Delete,
    /// Gone from the cloud: forget the PendingNode.
    Forget,
}

/// How far the instance's Node has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSeen {
    /// No Node of its name.
    Absent,
    /// The Node registered; not Ready yet.
    Joined,
    /// The Node is Ready.
    Ready,
}

/// The step for a PendingNode with `goal`: whether it has a provider ID yet,
/// whether its create may still be under way, the instance's state at the
/// cloud (None: the cloud has no record), how far its Node has come and
/// whether the join deadline has passed.
///
/// A Node that registered has joined: the deadline no longer applies. Giving
/// up then would delete the instance under a Node the cluster already counts
/// (and may have scheduled pods on); readiness is the kubelet's, and the
/// rollout waits for it before it drains anything.
pub fn decide(
    goal: PendingNodeGoal,
    has_provider_id: bool,
    create_in_flight: bool,
    state: Option<InstanceState>,
    node: NodeSeen,
    deadline_passed: bool,
) -> PendingStep {
    match goal {
        PendingNodeGoal::Join if !has_provider_id && create_in_flight => PendingStep::CreateInFlight,
        PendingNodeGoal::Join if !has_provider_id => PendingStep::FinishCreate,
        PendingNodeGoal::Join if node == NodeSeen::Ready => PendingStep::ReachedJoin,
        PendingNodeGoal::Join if deadline_passed && node == NodeSeen::Absent => PendingStep::GiveUp,
        // Failed or terminated: waiting out the deadline would not help.
        PendingNodeGoal::Join if node == NodeSeen::Absent && state.is_some_and(InstanceState::is_final) => {
            PendingStep::GiveUp
        }
        PendingNodeGoal::Join => PendingStep::Wait,
        // None: the cloud has no record — never created, or long gone.
        PendingNodeGoal::Leave => match state {
            Some(InstanceState::Terminated) | None => PendingStep::Forget,
            Some(InstanceState::Terminating) => PendingStep::Wait,
            Some(_) => PendingStep::Delete,
        },
    }
}

/// When the cloud accepted `pn`'s create (its created-at annotation), as an
/// `Instant`, if that was less than `within` ago.
fn accepted_within(pn: &PendingNode, within: Duration) -> Option<Instant> {
    let accepted = pn
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CREATED_AT_ANNOTATION))
        .and_then(|t| trace::parse_time(t))?;
    let ago = std::time::SystemTime::now()
        .duration_since(accepted)
        .unwrap_or_default();
    (ago < within).then(|| Instant::now().checked_sub(ago)).flatten()
}

fn csp_state(state: Option<InstanceState>) -> CspNodeState {
    match state {
        Some(InstanceState::Creating) => CspNodeState::Creating,
        Some(InstanceState::Ready) => CspNodeState::Ready,
        Some(InstanceState::Stopped) => CspNodeState::Stopped,
        Some(InstanceState::Terminating) => CspNodeState::Terminating,
        Some(InstanceState::Terminated) => CspNodeState::Terminated,
        Some(InstanceState::Failed) => CspNodeState::Failed,
        Some(InstanceState::Unknown) | None => CspNodeState::Unknown,
    }
}

/// The join deadline of `pn`'s instance, made at `created`: the join timeout
/// counts from the cloud's answer, not from when the PendingNode was written,
/// so time lost to a failing or throttling cloud before the instance existed
/// is not held against the instance. The timeout is the one the PendingNode
/// was written with (its deadline less its creation).
pub fn join_deadline(pn: &PendingNode, created: std::time::SystemTime) -> Option<Time> {
    let written = pn.metadata.creation_timestamp.as_ref()?.0;
    let timeout = pn.spec.deadline.as_ref()?.0.duration_since(written);
    Timestamp::try_from(created)
        .ok()?
        .checked_add(timeout)
        .ok()
        .map(Time)
}

/// On a PendingNode: the image its instance boots from, as the cloud's
/// answer to the create said. Its Node is annotated with it on joining,
/// without asking the cloud again.
pub const CREATED_IMAGE_ANNOTATION: &str = "nodewarden.dev/instance-image";

/// The patch that records the cloud's answer to `pn`'s create, accepted at
/// `accepted`: the instance's provider ID and Node name, the join deadline
/// counted from the answer, and when (and on which image) it was made.
pub fn created_patch(
    pn: &PendingNode,
    created: &CreatedNode,
    accepted: std::time::SystemTime,
) -> serde_json::Value {
    // A failure said by an earlier attempt is over.
    let mut annotations = json!({
        CREATED_AT_ANNOTATION: trace::format_time(accepted),
        CREATE_FAILED_ANNOTATION: null,
    });
    if let Some(image) = created.image.as_deref().filter(|i| !i.is_empty()) {
        annotations[CREATED_IMAGE_ANNOTATION] = json!(image);
    }
    json!({
        "metadata": {"annotations": annotations},
        "spec": {
            "providerID": created.provider_id,
            "nodeName": created.node_name,
            "deadline": join_deadline(pn, accepted),
        },
    })
}

/// On a PendingNode whose create the cloud keeps failing: its last error, so
/// that its NodeVersion says Degraded with the cloud's words while it lasts
/// (the retries are the PendingNode controller's, out of the NodeVersion's
/// sight). Removed by the create's success.
pub const CREATE_FAILED_ANNOTATION: &str = "nodewarden.dev/create-failed";

/// The patch that records a failed create's `error` (cut to 1000
/// characters), conditioned on `version`, the PendingNode's version the
/// create was tried on (late, it must not undo the success's removal).
pub fn create_failed_patch(version: Option<&str>, error: &str) -> serde_json::Value {
    let said: String = error.chars().take(1000).collect();
    json!({"metadata": {"annotations": {CREATE_FAILED_ANNOTATION: said}, "resourceVersion": version}})
}

/// On a PendingNode: what its cloud create is keyed by. `uid` (what
/// nodewarden writes): its UID, so a create that reaches the cloud late, for
/// a PendingNode since deleted, is never taken for that of a new one of the
/// same name. Without it (PendingNodes written before, or by hand): its name.
pub const REQUEST_KEY_ANNOTATION: &str = "nodewarden.dev/request-key";

/// The idempotency key of `pn`'s cloud create (see [`REQUEST_KEY_ANNOTATION`]).
pub fn request_key(pn: &PendingNode) -> Result<String> {
    let by_uid = pn.annotations().get(REQUEST_KEY_ANNOTATION).map(String::as_str) == Some("uid");
    if !by_uid {
        return Ok(pn.name_any());
    }
    pn.metadata.uid.clone().ok_or_else(|| Error::InvalidObject {
        kind: "PendingNode",
        name: pn.name_any(),
        reason: "its create is keyed by its UID, but it has no metadata.uid".into(),
    })
}

/// On a PendingNode whose instance did not join in time (and is being
/// deleted): when that was decided.
pub const JOIN_TIMED_OUT_ANNOTATION: &str = "nodewarden.dev/join-timed-out";

/// The patch that gives up on a join at `now`: goal Leave (with the leave
/// deadline), marked so its NodeVersion says JoinTimeout while it goes, and
/// conditioned on `version`, the PendingNode's version the decision was made on.
pub fn give_up_patch(version: Option<&str>, now: Timestamp) -> serde_json::Value {
    let deadline = now
        .checked_add(SignedDuration::from_secs(LEAVE_DEADLINE_SECS))
        .unwrap_or(now);
    json!({
        "metadata": {
            "annotations": {JOIN_TIMED_OUT_ANNOTATION: now.to_string()},
            "resourceVersion": version,
        },
        "spec": {"goal": "Leave", "deadline": Time(deadline)},
    })
}

/// The PendingNode controller: its PendingNodes, and the Nodes they name.
pub fn register(manager: &mut Manager, app: &App) {
    let Some(cloud) = app.cloud.clone() else {
        return;
    };
    let mut c = manager.controller::<PendingNode>("pendingnode", &app.objects);
    let pending = c.store();
    let by_node = pending.clone();
    let nodes = c.watches(&app.nodes, super::node_changed(), move |n: &Node| {
        let name = n.name_any();
        by_node
            .list()
            .iter()
            .filter(|p| p.spec.node_name == name)
            .filter_map(|p| Key::of(p.as_ref()))
            .collect()
    });
    c.on_failure(app.report_failures());
    c.register(PendingNodeReconciler {
        client: app.client.clone(),
        cloud,
        leader: app.leader.clone(),
        pending,
        nodes,
        asked: InstanceStates::default(),
    });
}

/// Reconciles PendingNodes (key: the PendingNode's name).
pub struct PendingNodeReconciler {
    /// The API client.
    pub client: Client,
    /// The cloud the instances live in.
    pub cloud: Arc<dyn CloudProvider>,
    /// Checked before every cloud create or delete.
    pub leader: LeaderHandle,
    /// The PendingNodes.
    pub pending: Store<PendingNode>,
    /// The Nodes, to see whether an instance joined and is Ready.
    pub nodes: Store<Node>,
    /// The cloud's last answers about the instances.
    pub asked: InstanceStates,
}

/// The cloud's last answer about each instance, by PendingNode, and when
/// each leaving instance was first looked at.
#[derive(Default)]
pub struct InstanceStates {
    answers: std::sync::Mutex<HashMap<String, (Instant, Option<InstanceState>)>>,
    leaves_looked_at: std::sync::Mutex<HashSet<String>>,
}

impl InstanceStates {
    /// The answer about `pending` if it is younger than `fresh`.
    fn recent(&self, pending: &str, fresh: Duration) -> Option<Option<InstanceState>> {
        let asked = lock(&self.answers);
        asked
            .get(pending)
            .filter(|(at, _)| at.elapsed() < fresh)
            .map(|(_, state)| *state)
    }

    fn remember(&self, pending: &str, state: Option<InstanceState>) {
        self.remember_at(pending, Instant::now(), state);
    }

    fn remember_at(&self, pending: &str, at: Instant, state: Option<InstanceState>) {
        let mut asked = lock(&self.answers);
        asked.insert(pending.to_string(), (at, state));
    }

    /// True on the first look at the leaving `pending` (recorded now).
    fn first_look(&self, pending: &str) -> bool {
        let mut seen = lock(&self.leaves_looked_at);
        seen.insert(pending.to_string())
    }

    fn forget(&self, pending: &str) {
        lock(&self.answers).remove(pending);
        lock(&self.leaves_looked_at).remove(pending);
    }
}

impl Reconciler for PendingNodeReconciler {
    type Object = PendingNode;
    type Error = Error;

    async fn reconcile(&self, key: &Key<PendingNode>, pn: Option<Arc<PendingNode>>) -> Result<Action> {
        let Some(pn) = pn else {
            self.asked.forget(&key.untyped().name);
            return Ok(Action::Done);
        };
        let api: Api<PendingNode> = Api::all(self.client.clone());
        let name = pn.name_any();
        let goal = pn.spec.goal.unwrap_or(PendingNodeGoal::Join);
        let provider_id = pn.spec.provider_id.as_str();
        // A leaving instance is deleted by whoever wrote its PendingNode,
        // right after writing it: the first look waits a poll for that
        // delete instead of asking at once and deleting it a second time. It
        // stays a look for an instance whose delete was interrupted.
        if goal == PendingNodeGoal::Leave && self.asked.first_look(&name) {
            return Ok(Action::RequeueAfter(POLL));
        }
        let state = match goal {
            PendingNodeGoal::Join => self.joining_state(&pn).await?,
            PendingNodeGoal::Leave => self.leaving_state(&name, provider_id).await?,
        };
        let node = self.nodes.get(&ObjectKey::cluster(&pn.spec.node_name));
        let age = age(&pn);
        let step = decide(
            goal,
            !provider_id.is_empty(),
            age < CREATE_GRACE,
            state,
            node_seen(node.as_deref()),
            pn.spec.deadline_passed(Timestamp::now()),
        );
        // The version the decision was made on, or the status write's own.
        let version = self
            .write_status(&api, &pn, state, step == PendingStep::ReachedJoin)
            .await?;
        match step {
            PendingStep::FinishCreate => match self.finish_create(&api, &pn).await {
                Err(Error::Cloud(e)) => {
                    let patch = create_failed_patch(version.as_deref(), &e.to_string());
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    Err(Error::Cloud(e))
                }
                done => done,
            },
            PendingStep::ReachedJoin => Ok(Action::Done),
            PendingStep::CreateInFlight => Ok(Action::RequeueAfter(CREATE_GRACE.saturating_sub(age))),
            PendingStep::Wait => Ok(Action::RequeueAfter(next_look(&pn))),
            PendingStep::GiveUp => self.give_up(&api, &pn, version.as_deref()).await,
            PendingStep::Delete => {
                self.delete_instance(provider_id).await?;
                Ok(Action::RequeueAfter(POLL))
            }
            PendingStep::Forget => self.forget(&api, &pn, node.as_deref()).await,
        }
    }
}

/// How far the Node of `node` (None: no Node of the instance's name) has come.
fn node_seen(node: Option<&Node>) -> NodeSeen {
    match node {
        None => NodeSeen::Absent,
        Some(n) if node_is_ready(n) => NodeSeen::Ready,
        Some(_) => NodeSeen::Joined,
    }
}

/// How long ago `pn` was written.
fn age(pn: &PendingNode) -> Duration {
    pn.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).ok())
        .unwrap_or_default()
}

/// When a joining instance is looked at again: after a poll, or at its
/// deadline when that comes first (yet not sooner than 50 ms).
fn next_look(pn: &PendingNode) -> Duration {
    let until_deadline = pn
        .spec
        .deadline
        .as_ref()
        .and_then(|d| Duration::try_from(d.0.duration_since(Timestamp::now())).ok())
        .unwrap_or(POLL);
    POLL.min(until_deadline.max(Duration::from_millis(50)))
}

impl PendingNodeReconciler {
    /// Records the instance's cloud `state` and whether the join is
    /// `reached`, unless the status says so already. Returns the
    /// PendingNode's version after it: the one judged, or the write's own.
    async fn write_status(
        &self,
        api: &Api<PendingNode>,
        pn: &PendingNode,
        state: Option<InstanceState>,
        reached: bool,
    ) -> Result<Option<String>> {
        if pn.status.as_ref().map(|s| (s.csp_state, s.reached_goal))
            == Some((Some(csp_state(state)), reached))
        {
            return Ok(pn.resource_version());
        }
        let status = json!({"status": {"cspState": csp_state(state), "reachedGoal": reached}});
        let written = api
            .patch_status(&pn.name_any(), &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(written.resource_version())
    }

    /// The join deadline passed without a Node: goal Leave, then the
    /// instance deleted. `version`: the PendingNode's version judged.
    async fn give_up(
        &self,
        api: &Api<PendingNode>,
        pn: &PendingNode,
        version: Option<&str>,
    ) -> Result<Action> {
        let name = pn.name_any();
        // The Node may have registered a moment ago, unseen by the store yet.
        let nodes: Api<Node> = Api::all(self.client.clone());
        if nodes.get_opt(&pn.spec.node_name).await?.is_some() {
            return Ok(Action::RequeueAfter(POLL));
        }
        tracing::warn!(pending = %name, node = %pn.spec.node_name, "join deadline passed: deleting the instance");
        // The goal first, conditioned on the version judged: a
        // decision that lands late (another leader saw the Node join
        // meanwhile) is refused, and no instance is deleted for it.
        let patch = give_up_patch(version, Timestamp::now());
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.delete_instance(&pn.spec.provider_id).await?;
        Ok(Action::RequeueAfter(POLL))
    }

    /// The instance is gone from the cloud: the PendingNode goes, and the
    /// Node it left behind (`node`, as judged) with it.
    async fn forget(&self, api: &Api<PendingNode>, pn: &PendingNode, node: Option<&Node>) -> Result<Action> {
        // A Node left behind by a gone instance goes too — unless it
        // is a replacement's donor: the NodeVersion controller retires
        // it, sending the replacement's root span before the Node
        // goes (deleted here, that trace would lose its root).
        let donor = node.is_some_and(|n| n.annotations().contains_key(HEIR_ANNOTATION));
        // The Node as judged (not a donor by then): a delete landing
        // after another leader paired it is refused.
        if let Some(n) = node.filter(|_| !donor) {
            let nodes: Api<Node> = Api::all(self.client.clone());
            delete_if_present(&nodes, &pn.spec.node_name, &same_version(&n.metadata)).await?;
        }
        delete_if_present(api, &pn.name_any(), &same_object(&pn.metadata)).await?;
        Ok(Action::Done)
    }
}

impl PendingNodeReconciler {
    /// The instance's state at the cloud; None without a provider ID or
    /// when the cloud has no record of it.
    async fn instance_state(&self, provider_id: &str) -> Result<Option<InstanceState>> {
        if provider_id.is_empty() {
            return Ok(None);
        }
        match self.cloud.node_state(provider_id).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A joining instance's state: the cloud's answer of the last
    /// [`JOIN_STATE_EVERY`], else `Creating` within that of the cloud
    /// accepting the create, else a new answer.
    async fn joining_state(&self, pn: &PendingNode) -> Result<Option<InstanceState>> {
        let (pending, provider_id) = (pn.name_any(), pn.spec.provider_id.as_str());
        if provider_id.is_empty() {
            return Ok(None);
        }
        if let Some(state) = self.asked.recent(&pending, JOIN_STATE_EVERY) {
            return Ok(state);
        }
        if let Some(accepted) = accepted_within(pn, JOIN_STATE_EVERY) {
            self.asked
                .remember_at(&pending, accepted, Some(InstanceState::Creating));
            return Ok(Some(InstanceState::Creating));
        }
        let state = self.instance_state(provider_id).await?;
        self.asked.remember(&pending, state);
        Ok(state)
    }

    /// A leaving instance's state: the cloud's answer of the last
    /// [`LEAVE_STATE_EVERY`], else a new one.
    async fn leaving_state(&self, pending: &str, provider_id: &str) -> Result<Option<InstanceState>> {
        if let Some(state) = self.asked.recent(pending, LEAVE_STATE_EVERY) {
            return Ok(state);
        }
        let state = self.instance_state(provider_id).await?;
        self.asked.remember(pending, state);
        Ok(state)
    }

    /// Deletes the instance; one already gone counts as deleted.
    async fn delete_instance(&self, provider_id: &str) -> Result<()> {
        self.leader.ensure_leader()?;
        match self.cloud.delete_node(provider_id).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Finishes a create the previous leader began: under the same
    /// idempotency key ([`request_key`]) the cloud returns the instance it
    /// made (or makes it now), and its phase of the trace ends in the same trace.
    async fn finish_create(&self, api: &Api<PendingNode>, pn: &PendingNode) -> Result<Action> {
        let name = pn.name_any();
        let key = request_key(pn)?;
        self.leader.ensure_leader()?;
        let created = self
            .cloud
            .create_node(&CreateNodeRequest {
                group_id: pn.spec.group_id.clone(),
                request_id: Some(key.clone()),
            })
            .await?;
        let accepted = std::time::SystemTime::now();
        if let Some((tp, started)) = trace::from_annotations(pn.metadata.annotations.as_ref()) {
            let started = started.unwrap_or(accepted);
            let group = &pn.spec.group_id;
            trace_create(&tp, started, accepted, group, &key, &created.provider_id, true);
            trace::flush(TRACE_FLUSH_TIMEOUT).await;
        }
        let patch = created_patch(pn, &created, accepted);
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(Action::RequeueAfter(POLL))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstanceState::{Creating, Terminated, Terminating};
    use NodeSeen::{Absent, Joined, Ready};
    use PendingNodeGoal::*;

    #[test]
    fn a_create_is_keyed_by_the_uid_when_its_pending_node_says_so_else_by_its_name() {
        let spec = crate::api::update::PendingNodeSpec {
            provider_id: String::new(),
            group_id: "g".into(),
            node_name: String::new(),
            goal: Some(Join),
            deadline: None,
        };
        let mut pn = PendingNode::new("join-1", spec);
        pn.metadata.uid = Some("0b6d-uid".into());
        assert_eq!(
            request_key(&pn).ok(),
            Some("join-1".into()),
            "written before, or by hand"
        );
        pn.metadata.annotations = Some([(REQUEST_KEY_ANNOTATION.to_string(), "uid".to_string())].into());
        assert_eq!(request_key(&pn).ok(), Some("0b6d-uid".into()));
        pn.metadata.uid = None;
        assert!(
            matches!(request_key(&pn), Err(Error::InvalidObject { .. })),
            "no UID to key by"
        );
    }

    #[test]
    fn giving_up_is_conditioned_on_the_version_judged() {
        let now = Timestamp::from_second(1_000).expect("a time");
        let patch = give_up_patch(Some("7"), now);
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["spec"]["goal"], "Leave");
        assert_eq!(
            patch["metadata"]["annotations"][JOIN_TIMED_OUT_ANNOTATION],
            now.to_string()
        );
        assert_eq!(
            patch["spec"]["deadline"],
            json!(Time(Timestamp::from_second(1_600).expect("a time")))
        );
    }

    #[test]
    fn a_joining_instance_answer_is_reused_only_while_fresh() {
        let asked = InstanceStates::default();
        assert_eq!(asked.recent("pn", Duration::from_secs(60)), None, "never asked");
        asked.remember("pn", Some(Creating));
        asked.remember("gone", None);
        assert_eq!(asked.recent("pn", Duration::from_secs(60)), Some(Some(Creating)));
        assert_eq!(
            asked.recent("gone", Duration::from_secs(60)),
            Some(None),
            "no record is an answer too"
        );
        assert_eq!(asked.recent("pn", Duration::ZERO), None, "stale");
        asked.forget("pn");
        assert_eq!(asked.recent("pn", Duration::from_secs(60)), None, "forgotten");
    }

    #[test]
    fn a_leaving_instance_is_first_looked_at_once() {
        let asked = InstanceStates::default();
        assert!(asked.first_look("leave-a"));
        assert!(!asked.first_look("leave-a"), "seen already");
        assert!(asked.first_look("leave-b"), "each PendingNode on its own");
        asked.forget("leave-a");
        assert!(asked.first_look("leave-a"), "forgotten with its PendingNode");
    }

    #[test]
    fn an_instance_counts_as_creating_only_shortly_after_the_cloud_accepted_it() {
        let bare = || {
            let spec = crate::api::update::PendingNodeSpec {
                provider_id: "sim://g/i".into(),
                group_id: "g".into(),
                node_name: "i".into(),
                goal: None,
                deadline: None,
            };
            PendingNode::new("pn", spec)
        };
        let with_created_at = |ago: Duration| {
            let at = std::time::SystemTime::now() - ago;
            let mut pn = bare();
            pn.metadata.annotations =
                Some([(CREATED_AT_ANNOTATION.to_string(), trace::format_time(at))].into());
            pn
        };
        let within = Duration::from_secs(5);
        let accepted = accepted_within(&with_created_at(Duration::from_secs(1)), within);
        let age = accepted.map(|a| a.elapsed());
        assert!(
            age.is_some_and(|a| a >= Duration::from_millis(900) && a < Duration::from_secs(2)),
            "accepted a second ago: {age:?}"
        );
        assert_eq!(
            accepted_within(&with_created_at(Duration::from_secs(6)), within),
            None
        );
        assert_eq!(accepted_within(&bare(), within), None);
    }

    #[test]
    fn the_answer_to_a_create_is_recorded_with_its_image_when_the_cloud_named_one() {
        let written = Timestamp::from_second(1_000).expect("a time");
        let mut pn = PendingNode::new(
            "join-1",
            crate::api::update::PendingNodeSpec {
                provider_id: String::new(),
                group_id: "g".into(),
                node_name: String::new(),
                goal: Some(Join),
                deadline: Some(Time(
                    written
                        .checked_add(SignedDuration::from_secs(600))
                        .expect("a time"),
                )),
            },
        );
        pn.metadata.creation_timestamp = Some(Time(written));
        let accepted = std::time::SystemTime::from(written) + Duration::from_secs(30);
        let answer = |image: Option<&str>| CreatedNode {
            node_name: "i-1".into(),
            provider_id: "sim://g/i-1".into(),
            image: image.map(str::to_string),
        };
        let cases = [
            (Some("img-2"), Some("img-2")),
            (None, None),
            // An empty image is no answer: the Node's image is read at the cloud.
            (Some(""), None),
        ];
        for (image, recorded) in cases {
            let patch = created_patch(&pn, &answer(image), accepted);
            assert_eq!(
                patch["metadata"]["annotations"][CREATED_IMAGE_ANNOTATION].as_str(),
                recorded,
                "{image:?}"
            );
            assert_eq!(patch["spec"]["providerID"], "sim://g/i-1");
            assert_eq!(patch["spec"]["nodeName"], "i-1");
            assert_eq!(
                patch["spec"]["deadline"],
                json!(Time(
                    written
                        .checked_add(SignedDuration::from_secs(630))
                        .expect("a time")
                )),
                "the join timeout counts from the answer"
            );
        }
    }

    #[test]
    fn decisions() {
        let cases = [
            (Join, false, None, Absent, false, PendingStep::FinishCreate),
            (Join, false, None, Ready, true, PendingStep::FinishCreate),
            (Join, true, Some(Creating), Absent, false, PendingStep::Wait),
            (
                Join,
                true,
                Some(InstanceState::Ready),
                Joined,
                false,
                PendingStep::Wait,
            ),
            (
                Join,
                true,
                Some(InstanceState::Ready),
                Ready,
                false,
                PendingStep::ReachedJoin,
            ),
            (
                Join,
                true,
                Some(InstanceState::Ready),
                Ready,
                true,
                PendingStep::ReachedJoin,
            ),
            (Join, true, Some(Creating), Absent, true, PendingStep::GiveUp),
            (Join, true, None, Absent, true, PendingStep::GiveUp),
            // An instance that never starts is given up on before the deadline.
            (
                Join,
                true,
                Some(InstanceState::Failed),
                Absent,
                false,
                PendingStep::GiveUp,
            ),
            (Join, true, Some(Terminated), Absent, false, PendingStep::GiveUp),
            (
                Join,
                true,
                Some(InstanceState::Failed),
                Joined,
                false,
                PendingStep::Wait,
            ),
            // Registered just as the deadline passed: joined, never given up on.
            (
                Join,
                true,
                Some(InstanceState::Ready),
                Joined,
                true,
                PendingStep::Wait,
            ),
            (
                Leave,
                true,
                Some(InstanceState::Ready),
                Absent,
                false,
                PendingStep::Delete,
            ),
            (Leave, true, Some(Terminating), Absent, false, PendingStep::Wait),
            (Leave, true, Some(Terminated), Joined, false, PendingStep::Forget),
            (Leave, true, None, Absent, false, PendingStep::Forget),
        ];
        for (goal, has_id, state, node, late, want) in cases {
            assert_eq!(
                decide(goal, has_id, false, state, node, late),
                want,
                "{goal:?} {has_id} {state:?} {node:?} {late}"
            );
        }
        // A young PendingNode without a provider ID: its create may be under way.
        assert_eq!(
            decide(Join, false, true, None, Absent, false),
            PendingStep::CreateInFlight
        );
        assert_eq!(
            decide(Join, true, true, Some(Creating), Absent, false),
            PendingStep::Wait
        );
    }

    #[test]
    fn the_join_timeout_counts_from_the_clouds_answer() {
        let pn: PendingNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "PendingNode",
            "metadata": {"name": "join-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"groupID": "g", "nodeName": "", "goal": "Join", "deadline": "2026-01-01T00:10:00Z"},
        }))
        .expect("a PendingNode");
        // The cloud answered 25 minutes late: the ten minutes start then.
        let created: Timestamp = "2026-01-01T00:25:00Z".parse().expect("a time");
        let created = std::time::SystemTime::from(created);
        let deadline = join_deadline(&pn, created).expect("a deadline");
        assert_eq!(
            deadline.0,
            "2026-01-01T00:35:00Z".parse::<Timestamp>().expect("a time")
        );
        // Without a deadline there is none to move.
        let mut open = pn.clone();
        open.spec.deadline = None;
        assert_eq!(join_deadline(&open, created), None);
    }
}
