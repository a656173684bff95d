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
    apply_as(node, want, owner, false)
}

/// [`apply`] for a quarantine another tool began and would lift whole when
/// it ends (a NodeMaintenance the Node Maintenance Operator started): what of
/// `want` is on the node already is recorded as `owner`'s too, so [`undo`]
/// lifts it as that tool would have.
pub fn take_over(node: &Node, want: &Quarantine, owner: &str) -> Result<Option<Node>, QuarantineError> {
    apply_as(node, want, owner, true)
}

fn apply_as(
    node: &Node,
    want: &Quarantine,
    owner: &str,
    adopt: bool,
) -> Result<Option<Node>, QuarantineError> {
    let before = recorded_changes(node);
    let mut record = match &before {
        Some(r) if r.owner != owner => {
            return Err(QuarantineError::HeldByOther {
                node: node.metadata.name.clone().unwrap_or_default(),
                owner: r.owner.clone(),
            });
        }
        Some(r) => r.clone(),
        None => NodeChanges {
            owner: owner.to_string(),
            ..Default::default()
        },
    };
    let mut out = node.clone();
    let mut changed = false;

    let spec = out.spec.get_or_insert_with(Default::default);
    if want.cordon && (adopt || spec.unschedulable != Some(true)) {
        changed |= spec.unschedulable != Some(true);
        spec.unschedulable = Some(true);
        record.cordoned = true;
    }
    let taints = spec.taints.get_or_insert_with(Vec::new);
    for t in &want.taints {
        let present = taints
            .iter()
            .any(|have| have.key == t.key && have.effect == t.effect);
        if !present {
            taints.push(t.clone());
            changed = true;
        }
        if (!present || adopt) && !record.taints.contains(&taint_id(t)) {
            record.taints.push(taint_id(t));
        }
    }
    let labels = out.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &want.labels {
        let adoptable = adopt && labels.get(k) == Some(v);
        if !labels.contains_key(k) {
            labels.insert(k.clone(), v.clone());
            changed = true;
        } else if !adoptable {
            continue;
        }
        if !record.labels.contains(k) {
            record.labels.push(k.clone());
        }
    }
    // The record is written even when the node is not changed otherwise,
    // so the node is held.
    if !changed && before.as_ref() == Some(&record) {
        return Ok(None);
    }
    let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        CHANGES_ANNOTATION.to_string(),
        serde_json::to_string(&record).unwrap_or_default(),
    );
    Ok(Some(out))
}

/// The node with `want` lifted whoever applied it, or None when nothing of
/// it is there or anyone's record is on the node (then that owner undoes its
/// own). For a quarantine another tool made and nodewarden never took over,
/// on a maintenance that tool would have ended by lifting it whole.
pub fn lift_unrecorded(node: &Node, want: &Quarantine) -> Option<Node> {
    if recorded_changes(node).is_some() {
        return None;
    }
    let mut out = node.clone();
    if let Some(spec) = out.spec.as_mut() {
        if want.cordon && spec.unschedulable == Some(true) {
            spec.unschedulable = None;
        }
        if let Some(taints) = spec.taints.as_mut() {
            taints.retain(|t| !want.taints.iter().any(|w| w.key == t.key && w.effect == t.effect));
            if taints.is_empty() {
                spec.taints = None;
            }
        }
    }
    if let Some(labels) = out.metadata.labels.as_mut() {
        labels.retain(|k, v| want.labels.get(k) != Some(v));
    }
    (out != *node).then_some(out)
}

/// Whether `after` is the node uncordoned (it was unschedulable in `before`).
pub fn uncordoned(before: &Node, after: &Node) -> bool {
    let unschedulable = |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    unschedulable(before) && !unschedulable(after)
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
        // Uncordoned by someone else while held: cordoned again.
        let mut lifted = held.clone();
        lifted.spec.as_mut().expect("a spec").unschedulable = None;
        let again = apply(&lifted, &quarantine(), "nm/x")
            .expect("ours")
            .expect("changed");
        assert_eq!(again, held);
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

    /// The node as the Node Maintenance Operator leaves it in maintenance.
    fn as_nmo_left_it() -> Node {
        node(json!({
            "metadata": {"name": "n1", "labels": {
                "remediation.medik8s.io/exclude-from-remediation": "true", "keep": "me"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "medik8s.io/drain", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": "dedicated", "effect": "NoSchedule"}]}
        }))
    }

    #[test]
    fn a_quarantine_taken_over_is_undone_whole() {
        let nmo = as_nmo_left_it();
        let held = take_over(&nmo, &quarantine(), "nm/x")
            .expect("free")
            .expect("recorded");
        assert_eq!(held.spec, nmo.spec, "nothing on the node changes");
        let record = recorded_changes(&held).expect("recorded");
        assert!(record.cordoned);
        assert_eq!(record.taints.len(), 2);
        assert_eq!(record.labels.len(), 1);
        // Taken over once: again changes nothing.
        assert_eq!(take_over(&held, &quarantine(), "nm/x"), Ok(None));
        let back = undo(&held, "nm/x").expect("ours");
        assert!(!uncordoned(&back, &back) && uncordoned(&held, &back));
        assert_eq!(taint_keys(&back), ["dedicated:NoSchedule"]);
        assert_eq!(
            back.metadata.labels,
            Some(BTreeMap::from([("keep".to_string(), "me".to_string())]))
        );
        // A plain apply keeps what was there before.
        let plain = apply(&nmo, &quarantine(), "nm/x")
            .expect("free")
            .expect("recorded");
        let back = undo(&plain, "nm/x").expect("ours");
        assert_eq!(back.spec, nmo.spec);
    }

    #[test]
    fn an_unrecorded_quarantine_is_lifted_only_where_no_one_holds_the_node() {
        // (node, lifted: (cordoned after, taints after), or None)
        let clean = node(json!({"metadata": {"name": "n1"}, "spec": {}}));
        let held = apply(&clean, &quarantine(), "plan/p")
            .expect("free")
            .expect("held");
        type Lifted<'a> = Option<(bool, Vec<&'a str>)>;
        let cases: [(&str, Node, Lifted); 3] = [
            (
                "as NMO left it",
                as_nmo_left_it(),
                Some((false, vec!["dedicated:NoSchedule"])),
            ),
            ("nothing to lift", clean, None),
            ("another owner holds it", held, None),
        ];
        for (what, n, want) in cases {
            let got = lift_unrecorded(&n, &quarantine()).map(|after| {
                let cordoned = after.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                (cordoned, taint_keys(&after))
            });
            let want = want.map(|(c, t)| (c, t.iter().map(|s| s.to_string()).collect::<Vec<_>>()));
            assert_eq!(got, want, "{what}");
        }
        let lifted = lift_unrecorded(&as_nmo_left_it(), &quarantine()).expect("lifted");
        assert!(uncordoned(&as_nmo_left_it(), &lifted));
        assert!(
            !lifted
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("remediation.medik8s.io/exclude-from-remediation"))
        );
    }
}
