//! The steps that change the world, retiring aside (`retire`): pairing an
//! heir with its donor, requesting drains, creating instances, marking
//! surplus nodes, settling joins, and pausing the autoscaler.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use super::decide::{
    Joins, facts, inheritable_labels, node_facts, pairing_patches, pairing_taken, sort_joins,
};
use super::gather::Scope;
use super::{NodeVersionReconciler, drain_name};
use crate::api::node_maintenance::{DRAIN_FOR_LABEL, DRAIN_FOR_ROLLOUT, medik8s};
use crate::api::update::annotations::{OBSOLETE_ANNOTATION, PAUSED_BY_ANNOTATION};
use crate::api::update::halt::TARGET_ANNOTATION;
use crate::api::update::{AutoscalingStrategy, NodeVersion, PendingNode, PendingNodeGoal, PendingNodeSpec};
use crate::cloud::CreateNodeRequest;
use crate::controllers::pending_node::{REQUEST_KEY_ANNOTATION, created_patch, request_key};
use crate::controllers::replacement_trace::{
    TRACE_FLUSH_TIMEOUT, drain_annotations, trace_create, trace_join, trace_surplus, trace_transfer,
};
use crate::controllers::{delete_if_present, node_maintenance, same_object};
use crate::error::{Error, Result};
use crate::node::node_is_ready;
use crate::rollout::{self, Step};
use crate::runtime::store::ObjectKey;
use crate::telemetry::trace::{
    self, ROLLOUT_TRACEPARENT_ANNOTATION, TRACE_STARTED_ANNOTATION, TRACEPARENT_ANNOTATION, TraceParent,
};

/// Steps of one rollout pass carried out at once (see `carry_out_all`).
const STEPS_AT_ONCE: usize = 16;

impl NodeVersionReconciler {
    /// Sorts the Join PendingNodes: nodes still joining, nodes that joined
    /// for an older target (surplus: marked for removal), creates not joined
    /// yet. A PendingNode whose node is paired already (a leader died between
    /// pairing and deleting it) or marked surplus is deleted: counting it as
    /// joining would pair that heir with a second donor.
    pub(super) async fn settle_joins(&self, nv: &NodeVersion, scope: &Scope) -> Result<Joins> {
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

    /// Carries out a pass's steps side by side. The planner gives a node at
    /// most one step, so steps touch distinct nodes; run one after another,
    /// a pass at a high surge spent seconds on the API and cloud round trips
    /// of every retirement before the first pairing. Every step runs even
    /// when another fails (a conflict on one node holds up no other); the
    /// first error fails the pass, which is retried.
    /// Returns why retirements wait for etcd, if any do.
    pub(super) async fn carry_out_all(
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
                Some(donor_node) => self.pair_and_drain(nv, &donor_node, heir, find(heir)).await,
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
                self.create_instances(nv, group, count, rollout_trace).await
            }
        };
        done.map(|()| None)
    }

    /// Pairs `heir` with its donor, requests the donor's drain when the heir
    /// is Ready, and lets the heir's PendingNode go.
    async fn pair_and_drain(
        &self,
        nv: &NodeVersion,
        donor_node: &Node,
        heir: &str,
        heir_node: Option<Arc<Node>>,
    ) -> Result<()> {
        let donor = donor_node.name_any();
        if heir_node.as_deref().is_some_and(node_is_ready) {
            // Its drain follows the pairing: the node's pods are
            // listed meanwhile.
            self.drains.prepare(&donor);
        }
        let (paired_heir, paired_donor) = self.pair(donor_node, heir, heir_node).await?;
        // With a Ready heir the next pass would only request the
        // donor's drain: request it now, a pass earlier (a wave
        // at maxSurge 1 waited a whole pass for it).
        if node_is_ready(&paired_heir) {
            self.drain(nv, &donor, Some(&paired_donor)).await?;
        }
        self.release_join(heir).await
    }

    /// Creates `count` instances in `group`, side by side; none is cancelled
    /// by another's failure (an interrupted create would be finished by the
    /// PendingNode controller, but need not be).
    async fn create_instances(
        &self,
        nv: &NodeVersion,
        group: &str,
        count: usize,
        rollout_trace: Option<TraceParent>,
    ) -> Result<()> {
        let deadline = Timestamp::now()
            .checked_add(
                SignedDuration::try_from(self.rollout(nv).join_timeout())
                    .unwrap_or(SignedDuration::from_secs(1800)),
            )
            .unwrap_or(Timestamp::now());
        let creates = (0..count).map(|_| self.create_instance(nv, group, deadline, rollout_trace));
        futures::future::join_all(creates).await.into_iter().collect()
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
        let own = || self.maintenances.get(&ObjectKey::cluster(&drain_name(node)));
        if found.map_or_else(|| own().is_some(), |n| self.drain_of(n).is_some()) {
            return Ok(());
        }
        // The drain's pod list starts now, while the maintenance is written
        // and taken up.
        self.drains.prepare(node);
        let mut spec = json!({"nodeName": node, "reason": format!("replaced by nodewarden (NodeVersion {})", nv.name_any())});
        if let Some(timeout) = &self.rollout(nv).drain_timeout {
            spec["drainTimeout"] = json!(timeout);
        }
        // The NodeVersion's labels: an operator scoped by an object selector
        // sees the maintenances its rollouts create. The webhook judges a
        // rollout's drain by its own rule (the label).
        let mut labels = nv.labels().clone();
        labels.insert(DRAIN_FOR_LABEL.into(), DRAIN_FOR_ROLLOUT.into());
        let mut metadata = json!({
            "name": drain_name(node),
            "labels": labels,
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
        let in_force = self.rollout(nv);
        let topology_key = in_force.topology_key.as_deref();
        let node_facts = node_facts(nv, &fresh, &joins, topology_key, |node| self.drain_state(node));
        // Not halted: the creates planned were (a halted plan has none), and
        // this read only lowers their count.
        let facts = facts(&in_force, &fresh, &node_facts, &joins, false);
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
        // A join given up counts against this target only (see rollout::halt).
        annotations.insert(TARGET_ANNOTATION.to_string(), super::decide::rollout_target(nv));
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

    /// Pauses the cluster autoscaler while nodes are outdated; resumes only
    /// what this NodeVersion paused.
    pub(super) async fn pause_autoscaling(&self, nv: &str, outdated: bool) -> Result<()> {
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
}
