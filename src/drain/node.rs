//! Quarantining a node — cordon, taints, labels — and undoing exactly that.
//!
//! What a drain owner added is recorded on the Node itself in the annotation
//! `nodewarden.dev/drain-changes`, written in the same update as the change.
//! Undo removes only what the record lists: a node that an admin cordoned (or
//! tainted, or labelled) before stays so. Both functions here are pure: they
//! compute the new Node; the caller writes it with a resourceVersion
//! precondition, so a concurrent change is a conflict, never a lost update.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use serde::{Deserialize, Serialize};

/// The taint a NodeMaintenance puts on its node (NMO's).
pub const DRAIN_TAINT: &str = "medik8s.io/drain";

/// The annotation holding the [`NodeChanges`] record (JSON).
pub const CHANGES_ANNOTATION: &str = "nodewarden.dev/drain-changes";

/// What a quarantine consists of.
#[derive(Clone, Debug, PartialEq)]
pub struct Quarantine {
    /// Mark the node unschedulable.
    pub cordon: bool,
    /// Taints by key and effect (values are not compared).
    pub taints: Vec<Taint>,
    /// Labels to add (a key already present is left as it is).
    pub labels: BTreeMap<String, String>,
}

/// The record of what one owner changed on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeChanges {
    /// Who holds the node; only they may undo.
    pub owner: String,
    /// Whether the owner cordoned the node (false: it was cordoned before).
    #[serde(default)]
    pub cordoned: bool,
    /// `key:effect` of each taint the owner added.
    #[serde(default)]
    pub taints: Vec<String>,
    /// Keys of the labels the owner added.
    #[serde(default)]
    pub labels: Vec<String>,
}

/// Why a quarantine cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuarantineError {
    /// Another owner's record is on the node: it is theirs until they undo.
    #[error("node {node} is already held by {owner}")]
    HeldByOther {
        /// The node's name.
        node: String,
        /// The owner the record names.
        owner: String,
    },
}

fn taint_id(t: &Taint) -> String {
    format!("{}:{}", t.key, t.effect)
}

/// The record on `node`, if any (an unreadable record counts as none: it
/// cannot be ours).
pub fn recorded_changes(node: &Node) -> Option<NodeChanges> {
    let raw = node.metadata.annotations.as_ref()?.get(CHANGES_ANNOTATION)?;
    serde_json::from_str(raw).ok()
}

/// The node with `want` applied on behalf of `owner`, or None when nothing
/// needs to change. Only what was not there already is recorded as ours.
pub fn apply(node: &Node, want: &Quarantine, owner: &str) -> Result<Option<Node>, QuarantineError> {
    let mut record = match recorded_changes(node) {
        Some(r) if r.owner != owner => {
            return Err(QuarantineError::HeldByOther {
                node: node.metadata.name.clone().unwrap_or_default(),
                owner: r.owner,
            });
        }
        Some(r) => r,
        None => NodeChanges {
            owner: owner.to_string(),
            ..Default::default()
        },
    };
    let mut out = node.clone();
    let mut changed = false;

    let spec = out.spec.get_or_insert_with(Default::default);
    if want.cordon && spec.unschedulable != Some(true) {
        spec.unschedulable = Some(true);
        record.cordoned = true;
        changed = true;
    }
    let taints = spec.taints.get_or_insert_with(Vec::new);
    for t in &want.taints {
        if !taints
            .iter()
            .any(|have| have.key == t.key && have.effect == t.effect)
        {
            taints.push(t.clone());
            record.taints.push(taint_id(t));
            changed = true;
        }
    }
    let labels = out.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &want.labels {
        if !labels.contains_key(k) {
            labels.insert(k.clone(), v.clone());
            record.labels.push(k.clone());
            changed = true;
        }
    }
    let has_record = recorded_changes(node).is_some();
    if !changed && has_record {
        return Ok(None);
    }
    // The record is written even when nothing changed, so the node is held.
    let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        CHANGES_ANNOTATION.to_string(),
        serde_json::to_string(&record).unwrap_or_default(),
    );
    Ok(Some(out))
}

/// The node with `owner`'s recorded changes removed, or None when there is
/// nothing of `owner`'s to undo.
pub fn undo(node: &Node, owner: &str) -> Option<Node> {
    let record = recorded_changes(node).filter(|r| r.owner == owner)?;
    let mut out = node.clone();
    if let Some(spec) = out.spec.as_mut() {
        if record.cordoned {
            spec.unschedulable = None;
        }
        if let Some(taints) = spec.taints.as_mut() {
            taints.retain(|t| !record.taints.contains(&taint_id(t)));
            if taints.is_empty() {
                spec.taints = None;
            }
        }
    }
    if let Some(labels) = out.metadata.labels.as_mut() {
        for k in &record.labels {
            labels.remove(k);
        }
    }
    if let Some(annotations) = out.metadata.annotations.as_mut() {
        annotations.remove(CHANGES_ANNOTATION);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).expect("a node")
    }

    fn quarantine() -> Quarantine {
        Quarantine {
            cordon: true,
            taints: vec![
                Taint {
                    key: "medik8s.io/drain".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                },
                Taint {
                    key: "node.kubernetes.io/unschedulable".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                },
            ],
            labels: BTreeMap::from([(
                "remediation.medik8s.io/exclude-from-remediation".to_string(),
                "true".to_string(),
            )]),
        }
    }

    fn taint_keys(n: &Node) -> Vec<String> {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| ts.iter().map(taint_id).collect())
            .unwrap_or_default()
    }

    #[test]
    fn apply_then_undo_restores_a_clean_node() {
        let clean = node(json!({"metadata": {"name": "n1", "labels": {"a": "b"}}, "spec": {}}));
        let held = apply(&clean, &quarantine(), "nm/x")
            .expect("free")
            .expect("changed");
        assert_eq!(held.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert_eq!(taint_keys(&held).len(), 2);
        let record = recorded_changes(&held).expect("recorded");
        assert!(record.cordoned);
        assert_eq!(record.labels, ["remediation.medik8s.io/exclude-from-remediation"]);
        // Applying again changes nothing.
        assert_eq!(apply(&held, &quarantine(), "nm/x"), Ok(None));
        let back = undo(&held, "nm/x").expect("ours");
        assert_eq!(back.spec.as_ref().and_then(|s| s.unschedulable), None);
        assert!(taint_keys(&back).is_empty());
        assert_eq!(back.metadata.labels, clean.metadata.labels);
        assert!(recorded_changes(&back).is_none());
    }

    #[test]
    fn what_was_there_before_stays() {
        let admin = node(json!({
            "metadata": {"name": "n1", "labels": {"remediation.medik8s.io/exclude-from-remediation": "true"}},
            "spec": {"unschedulable": true, "taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]}
        }));
        let held = apply(&admin, &quarantine(), "nm/x")
            .expect("free")
            .expect("recorded");
        let record = recorded_changes(&held).expect("recorded");
        assert!(!record.cordoned, "already cordoned by the admin");
        assert_eq!(record.taints, ["node.kubernetes.io/unschedulable:NoSchedule"]);
        assert!(record.labels.is_empty());
        let back = undo(&held, "nm/x").expect("ours");
        assert_eq!(back.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert_eq!(taint_keys(&back), ["medik8s.io/drain:NoSchedule"]);
        assert!(
            back.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("remediation.medik8s.io/exclude-from-remediation"))
        );
    }

    #[test]
    fn another_owner_keeps_the_node() {
        let clean = node(json!({"metadata": {"name": "n1"}}));
        let held = apply(&clean, &quarantine(), "nm/x")
            .expect("free")
            .expect("changed");
        assert_eq!(
            apply(&held, &quarantine(), "nm/y"),
            Err(QuarantineError::HeldByOther {
                node: "n1".into(),
                owner: "nm/x".into()
            })
        );
        assert_eq!(undo(&held, "nm/y"), None, "only the owner undoes");
    }
}
