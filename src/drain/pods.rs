//! Which pods a drain evicts (pure).

use std::borrow::Borrow;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::node_maintenance::PodReference;

/// What a drain does with a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodClass {
    /// Managed by a DaemonSet: it would come straight back; left in place.
    DaemonSet,
    /// A static pod mirrored from the kubelet: cannot be evicted.
    Mirror,
    /// Succeeded or Failed: holds no workload; evicted all the same, as
    /// `kubectl drain` (which the Node Maintenance Operator runs) does, so
    /// no finished pod stays behind on a drained node. A budget never holds
    /// it up: the API server lets a finished pod's eviction through.
    Finished,
    /// A Plan's upgrade Job: it runs on the drained node by design (and a
    /// drain resumed by a new leader must not evict it).
    Upgrade,
    /// Evicted through the Eviction API.
    Evict,
}

impl PodClass {
    /// Whether a drain by NodeMaintenance's rules evicts such a pod.
    pub fn evicted(self) -> bool {
        matches!(self, PodClass::Evict | PodClass::Finished)
    }
}

/// The pod's class: mirror and DaemonSet pods first (finished or not), then
/// finished ones; everything else is evicted.
pub fn classify(pod: &Pod) -> PodClass {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
    {
        return PodClass::Mirror;
    }
    if meta.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.kind == "DaemonSet" && r.controller == Some(true))
    }) {
        return PodClass::DaemonSet;
    }
    let job_owned = meta
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| r.kind == "Job" && r.controller == Some(true)));
    let of_plan = meta
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(crate::api::plan::labels::PLAN));
    if job_owned && of_plan {
        return PodClass::Upgrade;
    }
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") | Some("Failed") => PodClass::Finished,
        _ => PodClass::Evict,
    }
}

/// The pod's namespace and name (empty when missing).
pub fn reference(pod: &Pod) -> PodReference {
    PodReference {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

/// Does `selector` select `pod`? (matchLabels and matchExpressions; an empty
/// selector selects everything in a PodDisruptionBudget, as in policy/v1.)
pub fn selects(selector: &LabelSelector, pod: &Pod) -> bool {
    let empty = std::collections::BTreeMap::new();
    selector_matches(selector, pod.metadata.labels.as_ref().unwrap_or(&empty))
}

/// Does `selector` match an object with `labels`? (matchLabels and
/// matchExpressions ANDed; an empty selector matches everything.)
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let labels_match = selector
        .match_labels
        .as_ref()
        .is_none_or(|want| want.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let expressions_match = selector.match_expressions.as_ref().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
    });
    labels_match && expressions_match
}

/// The PodDisruptionBudgets (of the pod's namespace) that cover `pod`.
pub fn covering_budgets<'a, B: Borrow<PodDisruptionBudget>>(
    pod: &Pod,
    budgets: &'a [B],
) -> Vec<&'a PodDisruptionBudget> {
    budgets
        .iter()
        .map(Borrow::<PodDisruptionBudget>::borrow)
        .filter(|b| b.metadata.namespace == pod.metadata.namespace)
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| selects(sel, pod))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("a pod")
    }

    #[test]
    fn classification_table() {
        let cases = [
            (json!({"metadata": {"name": "bare"}}), PodClass::Evict),
            (
                json!({"metadata": {"name": "rs", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u", "controller": true}]}}),
                PodClass::Evict,
            ),
            (
                json!({"metadata": {"name": "ds", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]}}),
                PodClass::DaemonSet,
            ),
            (
                json!({"metadata": {"name": "static", "annotations": {"kubernetes.io/config.mirror": "abc"}}}),
                PodClass::Mirror,
            ),
            (
                json!({"metadata": {"name": "job"}, "status": {"phase": "Succeeded"}}),
                PodClass::Finished,
            ),
            (
                json!({"metadata": {"name": "crashed"}, "status": {"phase": "Failed"}}),
                PodClass::Finished,
            ),
            (
                json!({"metadata": {"name": "running"}, "status": {"phase": "Running"}}),
                PodClass::Evict,
            ),
            // A finished DaemonSet or mirror pod keeps its rule.
            (
                json!({"metadata": {"name": "ds-done", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]}, "status": {"phase": "Succeeded"}}),
                PodClass::DaemonSet,
            ),
            (
                json!({"metadata": {"name": "static-done", "annotations": {"kubernetes.io/config.mirror": "abc"}}, "status": {"phase": "Failed"}}),
                PodClass::Mirror,
            ),
        ];
        for (p, want) in cases {
            let p = pod(p);
            assert_eq!(classify(&p), want, "{:?}", p.metadata.name);
        }
        let evicted = [PodClass::Evict, PodClass::Finished];
        let kept = [PodClass::DaemonSet, PodClass::Mirror, PodClass::Upgrade];
        assert!(evicted.iter().all(|c| c.evicted()) && !kept.iter().any(|c| c.evicted()));
    }

    #[test]
    fn budgets_cover_by_namespace_and_selector() {
        let p =
            pod(json!({"metadata": {"name": "p", "namespace": "a", "labels": {"app": "web", "tier": "fe"}}}));
        let budgets: Vec<PodDisruptionBudget> = serde_json::from_value(json!([
            {"metadata": {"name": "match", "namespace": "a"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}},
            {"metadata": {"name": "other-ns", "namespace": "b"}, "spec": {"selector": {"matchLabels": {"app": "web"}}}},
            {"metadata": {"name": "other-app", "namespace": "a"}, "spec": {"selector": {"matchLabels": {"app": "db"}}}},
            {"metadata": {"name": "expr", "namespace": "a"}, "spec": {"selector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe", "be"]}]}}},
            {"metadata": {"name": "notin", "namespace": "a"}, "spec": {"selector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["fe"]}]}}}
        ]))
        .expect("budgets");
        let names: Vec<_> = covering_budgets(&p, &budgets)
            .iter()
            .filter_map(|b| b.metadata.name.clone())
            .collect();
        assert_eq!(names, ["match", "expr"]);
    }
}
