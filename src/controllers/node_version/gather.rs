//! Gathering a pass's facts: the stores (Nodes, ScalingGroups, PendingNodes,
//! the rollout's NodeMaintenances), and the cloud only for what a node lacks
//! (its group and image, then kept in its annotations).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::status::Problems;
use super::{NodeVersionReconciler, drain_name};
use crate::api::node_maintenance::{MaintenancePhase, medik8s};
use crate::api::update::annotations::{GROUP_ANNOTATION, HEIR_ANNOTATION, IMAGE_ANNOTATION};
use crate::api::update::{NodeVersion, PendingNode, PendingNodeGoal, Rollout};
use crate::controllers::pending_node::{
    CREATE_FAILED_ANNOTATION, CREATED_IMAGE_ANNOTATION, JOIN_TIMED_OUT_ANNOTATION,
};
use crate::error::Result;
use crate::rollout::{DrainState, GroupFacts, Role};
use crate::runtime::store::ObjectKey;

/// The value of `node`'s annotation `key`.
pub(super) fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether `m` is a drain Constellation's operator made for a donor: named
/// as the node it drains, and not on its way out.
pub(super) fn is_upstreams_drain(m: &medik8s::NodeMaintenance) -> bool {
    m.name_any() == m.spec.node_name && m.metadata.deletion_timestamp.is_none()
}

/// The groups following one NodeVersion, with their nodes and PendingNodes.
pub(super) struct Scope {
    /// The groups, as the planner sees them.
    pub(super) groups: Vec<GroupFacts>,
    /// Their Nodes (by group annotation).
    pub(super) nodes: Vec<Arc<Node>>,
    /// Their PendingNodes.
    pub(super) pending: Vec<Arc<PendingNode>>,
}

impl Scope {
    /// The nodes and PendingNodes of `groups`, from any listing of them.
    pub(super) fn of(
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

/// What nodewarden knows of a node it created, from its PendingNode: no
/// need to ask the cloud for it.
#[derive(Clone, Debug, Default)]
struct Known {
    group: Option<String>,
    image: Option<String>,
}

/// Nodes this replica deleted, by UID, until the store no longer shows them:
/// a pass that began before the deletion's watch event arrived would take
/// the node for one still to retire, and retire it again (a tenth of a
/// second of reads and writes that held up the next create).
#[derive(Default)]
pub struct Retired(std::sync::Mutex<std::collections::HashSet<String>>);

impl Retired {
    pub(super) fn add(&self, node: &Node) {
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

impl NodeVersionReconciler {
    /// The groups following `nv`, and their nodes and PendingNodes (reads
    /// only). `annotated`: nodes this pass just wrote, as the API server
    /// answered, in place of the store's older copies: a node annotated now
    /// can be paired in this pass, not only in the one its watch event starts.
    pub(super) fn scope(&self, nv: &NodeVersion, annotated: Vec<Node>) -> Scope {
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

    /// What is wrong besides drains: joins that timed out, nodes of no
    /// ScalingGroup, and retirements waiting for etcd (`etcd_waits`).
    pub(super) fn problems(&self, scope: &Scope, etcd_waits: Vec<String>) -> Problems {
        Problems {
            join_timeouts: scope
                .pending
                .iter()
                .filter(|p| p.annotations().contains_key(JOIN_TIMED_OUT_ANNOTATION))
                .map(|p| p.spec.node_name.clone())
                .collect(),
            create_failures: scope
                .pending
                .iter()
                .filter_map(|p| {
                    Some(format!(
                        "{}: {}",
                        p.name_any(),
                        p.annotations().get(CREATE_FAILED_ANNOTATION)?
                    ))
                })
                .collect(),
            invalid_nodes: self.invalid_nodes(),
            etcd_waits,
            control_plane_failed: None,
            halted: None,
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

    /// The rollout settings in force for `nv`.
    pub(super) fn rollout(&self, nv: &NodeVersion) -> Rollout {
        nv.spec.rollout_in_force(&self.rollout_defaults)
    }

    /// The NodeMaintenance that drains `node` for the rollout: nodewarden's
    /// own (`nodewarden-replace-<node>`), or, for a donor, the one
    /// Constellation's operator creates for a node it replaces (named as the
    /// node). A switch mid-rollout leaves one: it is adopted as the donor's
    /// drain, not refused as a second maintenance of the node.
    pub(super) fn drain_of(&self, node: &Node) -> Option<Arc<medik8s::NodeMaintenance>> {
        let name = node.name_any();
        if let Some(own) = self.maintenances.get(&ObjectKey::cluster(&drain_name(&name))) {
            return Some(own);
        }
        annotation(node, HEIR_ANNOTATION)?;
        self.maintenances
            .get(&ObjectKey::cluster(&name))
            .filter(|m| is_upstreams_drain(m))
    }

    /// Where the rollout's drain of `node` stands.
    pub(super) fn drain_state(&self, node: &Node) -> DrainState {
        match self.drain_of(node) {
            None => DrainState::None,
            Some(m) => match m.status.as_ref().and_then(|s| s.phase) {
                None | Some(MaintenancePhase::Running) => DrainState::Running,
                Some(MaintenancePhase::Succeeded) => DrainState::Succeeded,
                Some(MaintenancePhase::Failed) => DrainState::Failed,
            },
        }
    }

    /// The role of the scaling group `group`, for the replacement's span.
    pub(super) fn role_of(&self, group: &str) -> &'static str {
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

    /// Nodes with a provider ID but no group or image annotation: ask the
    /// cloud once. A node this operator created is in the group its
    /// PendingNode names, on the image the cloud's answer to its create named
    /// (when it did): only what is not known is asked, since every call
    /// spends the cloud budget that a rollout at a high surge is bound by.
    /// Returns the nodes as written.
    pub(super) async fn annotate_unknown_nodes(&self) -> Result<Vec<Node>> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
