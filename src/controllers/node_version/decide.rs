//! The pass's pure decisions besides the plan itself (`crate::rollout`):
//! which joins are settled, what the planner is told, whether a node runs
//! what its NodeVersion asks for, whether a pairing is still free, and the
//! pairing's patches.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use serde_json::json;

use super::gather::{Scope, annotation};
use crate::api::update::annotations::{
    COMPONENTS_ANNOTATION, DONOR_ANNOTATION, GROUP_ANNOTATION, HEIR_ANNOTATION, IMAGE_ANNOTATION,
    OBSOLETE_ANNOTATION,
};
use crate::api::update::halt::TARGET_ANNOTATION;
use crate::api::update::{DomainStatus, NodeVersion, PendingNodeGoal, Rollout};
use crate::controllers::pending_node::JOIN_TIMED_OUT_ANNOTATION;
use crate::node::node_is_ready;
use crate::rollout::domains::Domains;
use crate::rollout::halt::JoinOutcomes;
use crate::rollout::{DrainState, Facts, JoinFacts, NodeFacts};
use crate::telemetry::trace::{
    ROLLOUT_TRACEPARENT_ANNOTATION, TRACE_STARTED_ANNOTATION, TRACEPARENT_ANNOTATION,
};

/// The Join PendingNodes of a scope, sorted (see `settle_joins`).
#[derive(Default)]
pub(super) struct Joins {
    /// Nodes that joined and wait to be paired.
    pub(super) joining: Vec<String>,
    /// Nodes that joined for an older target, now marked surplus.
    pub(super) surplus: Vec<String>,
    /// Creates whose node has not joined yet.
    pub(super) pending: Vec<JoinFacts>,
}

/// Sorts the Join PendingNodes of `scope` (pure): nodes still joining, nodes
/// that joined for an older target (surplus), creates not joined yet; and
/// the names of the PendingNodes whose node is paired already or marked
/// surplus (a leader died between that and deleting them), to be deleted:
/// counting one as joining would pair that heir with a second donor.
pub(super) fn sort_joins(nv: &NodeVersion, scope: &Scope) -> (Joins, Vec<String>) {
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

/// What the planner needs to know of each node of `scope`; `drain` says
/// where the rollout's drain of a node stands, `topology_key` names the
/// label of the nodes' failure domains (when the rollout has them).
pub(super) fn node_facts(
    nv: &NodeVersion,
    scope: &Scope,
    joins: &Joins,
    topology_key: Option<&str>,
    drain: impl Fn(&Node) -> DrainState,
) -> Vec<NodeFacts> {
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
                domain: topology_key
                    .and_then(|key| n.labels().get(key))
                    .cloned()
                    .unwrap_or_default(),
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
                drain: drain(n),
                joining: joins.joining.contains(&name),
                obsolete: annotation(n, OBSOLETE_ANNOTATION).is_some() || joins.surplus.contains(&name),
                name,
            }
        })
        .collect()
}

/// What the planner looks at: the scope's groups, its nodes' facts, the
/// joins on their way, the budgets `rollout` sets and whether it `halted`.
pub(super) fn facts<'a>(
    rollout: &Rollout,
    scope: &'a Scope,
    nodes: &'a [NodeFacts],
    joins: &'a Joins,
    halted: bool,
) -> Facts<'a> {
    let limits = rollout.limits_for(nodes.len(), 1);
    Facts {
        groups: &scope.groups,
        nodes,
        joins: &joins.pending,
        max_surge: limits.max_surge,
        max_unavailable: limits.max_unavailable,
        control_plane_first: rollout.control_plane_first(),
        halted,
        wave_starts: None,
        one_domain_at_a_time: rollout.topology_key.is_some(),
        unready_pods: 0,
    }
}

/// `status.domain` for the domains of the label `key`, the current
/// domain's start kept from `before` while it stays current.
pub(super) fn domain_status((key, domains): (&str, &Domains), before: Option<&DomainStatus>) -> DomainStatus {
    let since = match before {
        Some(b) if b.current == domains.current => b.since.clone(),
        _ => domains
            .current
            .as_ref()
            .map(|_| MicroTime(k8s_openapi::jiff::Timestamp::now())),
    };
    DomainStatus {
        key: key.to_string(),
        current: domains.current.clone(),
        since,
        done: domains.done.clone(),
        waiting: domains.waiting.clone(),
    }
}

/// The rollout's target as a halt record names it: the image, and the
/// components reference when the NodeVersion names one.
pub(super) fn rollout_target(nv: &NodeVersion) -> String {
    match nv.spec.kubernetes_components_reference.as_str() {
        "" => nv.spec.image.clone(),
        components => format!("{} {components}", nv.spec.image),
    }
}

/// What the PendingNodes of `scope` created for `target` say of its new
/// nodes: the ones given up (by node name, else PendingNode name), and
/// whether one joined (its Node exists while its PendingNode still tracks it).
pub(super) fn join_outcomes(scope: &Scope, target: &str) -> JoinOutcomes {
    let mut seen = JoinOutcomes::default();
    for p in scope
        .pending
        .iter()
        .filter(|p| p.annotations().get(TARGET_ANNOTATION).map(String::as_str) == Some(target))
    {
        if p.annotations().contains_key(JOIN_TIMED_OUT_ANNOTATION) {
            seen.failed.push(match p.spec.node_name.as_str() {
                "" => p.name_any(),
                node => node.to_string(),
            });
        } else if p.spec.goal == Some(PendingNodeGoal::Join)
            && !p.spec.node_name.is_empty()
            && scope.nodes.iter().any(|n| n.name_any() == p.spec.node_name)
        {
            seen.joined = true;
        }
    }
    seen.failed.sort();
    seen
}

/// The image most outdated nodes of `scope` run (the way back from a halt).
pub(super) fn previous_image(nv: &NodeVersion, scope: &Scope) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in scope.nodes.iter().filter(|n| !is_current(nv, n)) {
        if let Some(image) = annotation(n, IMAGE_ANNOTATION).filter(|i| *i != nv.spec.image) {
            *counts.entry(image).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, count)| *count)
        .map(|(image, _)| image.to_string())
}

/// Has `n` the annotations `is_current` judges by: its image, and its
/// components when `nv` names components (set by its JoiningNode).
fn annotated(nv: &NodeVersion, n: &Node) -> bool {
    annotation(n, IMAGE_ANNOTATION).is_some()
        && (nv.spec.kubernetes_components_reference.is_empty()
            || annotation(n, COMPONENTS_ANNOTATION).is_some())
}

/// Does `n` run what `nv` asks for (image, and components when set)?
pub(super) fn is_current(nv: &NodeVersion, n: &Node) -> bool {
    let components = nv.spec.kubernetes_components_reference.as_str();
    annotation(n, IMAGE_ANNOTATION) == Some(nv.spec.image.as_str())
        && (components.is_empty() || annotation(n, COMPONENTS_ANNOTATION) == Some(components))
}

/// Why `donor` and `heir` (as read fresh) cannot be paired: either already
/// names another partner. None when they are free or name each other (a
/// pairing half written, or written whole, is finished again harmlessly).
pub(super) fn pairing_taken(donor: &Node, heir: &Node) -> Option<String> {
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
    // The target the heir was made for: its pods are watched for it.
    if let Some(target) = trace_from.and_then(|a| a.get(TARGET_ANNOTATION)) {
        heir_annotations[TARGET_ANNOTATION] = json!(target);
    }
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

/// The trace annotations a replacement carries from object to object.
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Node;

    use super::*;
    use crate::api::update::PendingNode;
    use crate::rollout::{GroupFacts, Role};

    fn group(id: &str, role: Role) -> GroupFacts {
        GroupFacts {
            id: id.into(),
            role,
            image_ready: true,
        }
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
}
