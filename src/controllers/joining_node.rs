//! The JoiningNode controller: when the Node a JoiningNode announces appears,
//! annotate it with the Kubernetes components it was given, then delete the
//! JoiningNode. A JoiningNode whose node did not appear by its deadline is
//! deleted too (the join failed; the rollout notices on its own).
//!
//! [`decide`] is pure and table tested; `reconcile` gathers the facts from
//! the stores and carries the decision out.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::App;
use crate::api::update::{JoiningNode, JoiningNodeSpec};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::Manager;
use crate::runtime::store::{Key, ObjectKey, Store};

/// The Node annotation naming its Kubernetes components (Constellation's).
pub const COMPONENTS_ANNOTATION: &str = "constellation.edgeless.systems/kubernetes-components";
/// Index of JoiningNode stores: `spec.name`.
pub const NODE_INDEX: &str = "node";

/// What to do with a JoiningNode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The node is there: annotate it (unless it already says so), then
    /// delete the JoiningNode.
    Complete {
        /// Whether the Node's components annotation must be set first.
        annotate: bool,
    },
    /// The node did not appear by the deadline: delete the JoiningNode.
    Expire,
    /// Wait for the node; look again after this long (at the deadline).
    WaitUntil(Duration),
    /// Wait for the node (no deadline): its appearance triggers a reconcile.
    Wait,
}

/// `node_components`: None when the Node does not exist, else the value of
/// its components annotation (Some("") when unset).
pub fn decide(spec: &JoiningNodeSpec, node_components: Option<&str>, now: Timestamp) -> Decision {
    if let Some(current) = node_components {
        let wanted = spec.components_reference.as_str();
        return Decision::Complete {
            annotate: !wanted.is_empty() && current != wanted,
        };
    }
    match &spec.deadline {
        _ if spec.deadline_passed(now) => Decision::Expire,
        Some(deadline) => {
            let left = now.duration_until(deadline.0);
            let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
            // A little after the deadline, so the next look finds it passed.
            Decision::WaitUntil(left + Duration::from_millis(100))
        }
        None => Decision::Wait,
    }
}

/// Adds the node index to a JoiningNode store (the reconciler's constructor
/// does this for its own store).
pub fn index_by_node(store: &Store<JoiningNode>) {
    store.add_index(NODE_INDEX, |j: &JoiningNode| {
        (!j.spec.name.is_empty())
            .then(|| j.spec.name.clone())
            .into_iter()
            .collect()
    });
}

/// The JoiningNodes announcing `node` (for watching Nodes).
pub fn keys_for_node(store: &Store<JoiningNode>, node: &Node) -> Vec<Key<JoiningNode>> {
    store.keys_by_index(NODE_INDEX, &node.name_any())
}

fn components_of(node: &Node) -> &str {
    node.annotations()
        .get(COMPONENTS_ANNOTATION)
        .map_or("", String::as_str)
}

/// The JoiningNode controller: its JoiningNodes, and the Nodes they announce.
pub fn register(manager: &mut Manager, app: &App) {
    let mut c = manager.controller::<JoiningNode>("joiningnode", &app.objects);
    let joining = c.store();
    let by_node = joining.clone();
    let nodes = c.watches(&app.nodes, super::node_changed(), move |n: &Node| {
        keys_for_node(&by_node, n)
    });
    c.on_failure(app.report_failures());
    c.register(JoiningNodeReconciler::new(
        app.client.clone(),
        app.leader.clone(),
        joining,
        nodes,
    ));
}

/// Reconciles JoiningNodes (key: the JoiningNode's name).
pub struct JoiningNodeReconciler {
    client: Client,
    leader: LeaderHandle,
    nodes: Store<Node>,
}

impl JoiningNodeReconciler {
    /// Adds the node index to `joining`, for [`keys_for_node`].
    pub fn new(
        client: Client,
        leader: LeaderHandle,
        joining: Store<JoiningNode>,
        nodes: Store<Node>,
    ) -> Self {
        index_by_node(&joining);
        JoiningNodeReconciler {
            client,
            leader,
            nodes,
        }
    }

    /// Deletes the JoiningNode as read (uid and resourceVersion): a changed
    /// one is looked at again rather than deleted unseen.
    async fn delete(&self, jn: &JoiningNode) -> Result<()> {
        let api: Api<JoiningNode> = Api::all(self.client.clone());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: jn.metadata.resource_version.clone(),
                uid: jn.metadata.uid.clone(),
            }),
            ..Default::default()
        };
        self.leader.ensure_leader()?;
        super::delete_if_present(&api, &jn.name_any(), &params)
            .await
            .map(drop)
    }
}

impl Reconciler for JoiningNodeReconciler {
    type Object = JoiningNode;
    type Error = Error;

    async fn reconcile(&self, _key: &Key<JoiningNode>, jn: Option<Arc<JoiningNode>>) -> Result<Action> {
        let Some(jn) = jn else {
            return Ok(Action::Done);
        };
        if jn.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        if !self.nodes.is_synced() {
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let node = (!jn.spec.name.is_empty())
            .then(|| self.nodes.get(&ObjectKey::cluster(&jn.spec.name)))
            .flatten();
        match decide(&jn.spec, node.as_deref().map(components_of), Timestamp::now()) {
            Decision::Complete { annotate } => {
                if annotate {
                    let nodes: Api<Node> = Api::all(self.client.clone());
                    let patch = json!({"metadata": {"annotations": {
                        COMPONENTS_ANNOTATION: jn.spec.components_reference,
                    }}});
                    self.leader.ensure_leader()?;
                    match nodes
                        .patch(&jn.spec.name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {}
                        // Gone since the store saw it: the next look decides again.
                        Err(kube::Error::Api(s)) if s.code == 404 => {
                            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
                        }
                        Err(e) => return Err(e.into()),
                    }
                    tracing::info!(node = %jn.spec.name, components = %jn.spec.components_reference, "annotated a joined node");
                }
                self.delete(&jn).await?;
                Ok(Action::Done)
            }
            Decision::Expire => {
                tracing::warn!(joining_node = %jn.name_any(), node = %jn.spec.name, "node did not join by the deadline");
                self.delete(&jn).await?;
                Ok(Action::Done)
            }
            Decision::WaitUntil(after) => Ok(Action::RequeueAfter(after)),
            Decision::Wait => Ok(Action::Done),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::sync::Arc;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("a time")
    }

    fn spec(components: &str, deadline: Option<i64>) -> JoiningNodeSpec {
        JoiningNodeSpec {
            name: "n1".into(),
            components_reference: components.into(),
            is_control_plane: false,
            deadline: deadline.map(|s| Time(ts(s))),
        }
    }

    #[test]
    fn decisions() {
        let now = ts(1000);
        // (name, spec, node annotation, decision)
        let cases = [
            (
                "node there: annotate, then delete",
                spec("k8s-a", Some(2000)),
                Some(""),
                Decision::Complete { annotate: true },
            ),
            (
                "node there with other components: annotate",
                spec("k8s-a", None),
                Some("k8s-old"),
                Decision::Complete { annotate: true },
            ),
            (
                "already annotated: just delete",
                spec("k8s-a", None),
                Some("k8s-a"),
                Decision::Complete { annotate: false },
            ),
            (
                "node there after the deadline still completes",
                spec("k8s-a", Some(10)),
                Some(""),
                Decision::Complete { annotate: true },
            ),
            (
                "no components: nothing to annotate",
                spec("", None),
                Some("k8s-a"),
                Decision::Complete { annotate: false },
            ),
            (
                "deadline passed, no node",
                spec("k8s-a", Some(999)),
                None,
                Decision::Expire,
            ),
            (
                "deadline now, no node",
                spec("k8s-a", Some(1000)),
                None,
                Decision::Expire,
            ),
            (
                "wait until the deadline",
                spec("k8s-a", Some(1060)),
                None,
                Decision::WaitUntil(Duration::from_millis(60_100)),
            ),
            (
                "no deadline: wait for the node",
                spec("k8s-a", None),
                None,
                Decision::Wait,
            ),
        ];
        for (name, spec, node, want) in cases {
            assert_eq!(decide(&spec, node, now), want, "{name}");
        }
    }

    #[test]
    fn nodes_map_to_their_joining_nodes() {
        let store: crate::runtime::store::Writer<JoiningNode> = crate::runtime::store::Writer::new();
        index_by_node(&store);
        for (name, node) in [("j1", "n1"), ("j2", "n2"), ("j3", "")] {
            let j = JoiningNode::new(
                name,
                JoiningNodeSpec {
                    name: node.into(),
                    ..spec("k", None)
                },
            );
            store.insert(ObjectKey::cluster(name), Arc::new(j));
        }
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        assert_eq!(keys_for_node(&store, &node), [Key::cluster("j1")]);
        node.metadata.name = Some("n3".into());
        assert!(keys_for_node(&store, &node).is_empty());
    }
}
