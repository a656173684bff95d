//! A Plan's drain: `kubectl drain`'s rules (pure), as the System Upgrade
//! Controller runs it with the Plan's `spec.drain` options. A
//! NodeMaintenance without these options keeps its own drain rules
//! ([`super::pods::classify`]); the two never mix.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use super::pods::{PodClass, classify, reference, selects};
use crate::api::plan::DrainSpec;

/// The annotation on a Plan's NodeMaintenance carrying its [`KubectlDrain`] (JSON).
pub const ANNOTATION: &str = "nodewarden.dev/plan-drain";

/// kubectl drain's options, with the defaults upstream passes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubectlDrain {
    /// `--force`: pods with no controller are deleted; else they block.
    pub force: bool,
    /// `--ignore-daemonsets`: DaemonSet pods stay; else they block.
    pub ignore_daemon_sets: bool,
    /// `--delete-emptydir-data`: pods with an emptyDir go; else they block.
    pub delete_emptydir_data: bool,
    /// `--disable-eviction`: delete, bypassing PodDisruptionBudgets.
    pub disable_eviction: bool,
    /// `--grace-period` (seconds); None: each pod's own.
    pub grace_period: Option<i64>,
    /// `--skip-wait-for-delete-timeout` (seconds; 0: off): a pod
    /// terminating longer than this is not waited for.
    pub skip_wait_for_delete_timeout: i64,
    /// `--pod-selector`: only these pods are drained.
    pub pod_selector: Option<LabelSelector>,
}

impl Default for KubectlDrain {
    /// `kubectl drain` with no flags: the strictest.
    fn default() -> Self {
        KubectlDrain {
            force: false,
            ignore_daemon_sets: false,
            delete_emptydir_data: false,
            disable_eviction: false,
            grace_period: None,
            skip_wait_for_delete_timeout: 0,
            pod_selector: None,
        }
    }
}

impl KubectlDrain {
    /// The flags upstream gives kubectl for `spec.drain`: ignoreDaemonSets
    /// and deleteEmptydirData (or the older deleteLocalData) default to true.
    pub fn of(spec: &DrainSpec) -> Self {
        KubectlDrain {
            force: spec.force.unwrap_or(false),
            ignore_daemon_sets: spec.ignore_daemon_sets.unwrap_or(true),
            delete_emptydir_data: spec.delete_local_data.unwrap_or(true)
                && spec.delete_emptydir_data.unwrap_or(true),
            disable_eviction: spec.disable_eviction.unwrap_or(false),
            grace_period: spec.grace_period.map(i64::from),
            skip_wait_for_delete_timeout: spec.skip_wait_for_delete_timeout.unwrap_or(0).max(0),
            pod_selector: spec.pod_selector.clone(),
        }
    }
}

/// What kubectl drain does with a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Evicted (or deleted with `disableEviction`), and waited for.
    Remove,
    /// Left on the node, not waited for.
    Skip,
    /// Blocks the whole drain: nothing is removed (kubectl's wording).
    Refuse(&'static str),
}

const DAEMONSET: &str = "DaemonSet-managed Pods (use --ignore-daemonsets to ignore)";
const LOCAL_STORAGE: &str = "Pods with local storage (use --delete-emptydir-data to override)";
const UNMANAGED: &str = "Pods that declare no controller (use --force to override)";

/// kubectl's filters in its order: outside the pod selector, then pods
/// terminating past the skip timeout, DaemonSet, mirror, local storage,
/// no controller. Pods labelled `upgrade.cattle.io/controller` are never
/// drained: upstream's drain selects `!upgrade.cattle.io/controller` (its
/// own Jobs' pods, and the controller itself, whose manifest carries the
/// label to avoid drains). A DaemonSet pod counts as managed whether or
/// not its DaemonSet still exists.
pub fn verdict(pod: &Pod, opts: &KubectlDrain, now: Timestamp) -> Verdict {
    if opts.pod_selector.as_ref().is_some_and(|s| !selects(s, pod)) {
        return Verdict::Skip;
    }
    if pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(crate::api::plan::labels::CONTROLLER))
    {
        return Verdict::Skip;
    }
    let class = classify(pod);
    if class == PodClass::Upgrade {
        return Verdict::Skip;
    }
    if let Some(deleted) = &pod.metadata.deletion_timestamp
        && opts.skip_wait_for_delete_timeout > 0
        && now.duration_since(deleted.0).as_secs() > opts.skip_wait_for_delete_timeout
    {
        return Verdict::Skip;
    }
    let finished = class == PodClass::Finished;
    let controlled = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true));
    if class == PodClass::DaemonSet && !finished {
        return match opts.ignore_daemon_sets {
            true => Verdict::Skip,
            false => Verdict::Refuse(DAEMONSET),
        };
    }
    if class == PodClass::Mirror {
        return Verdict::Skip;
    }
    let empty_dir = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| v.empty_dir.is_some());
    if empty_dir && !finished && !opts.delete_emptydir_data {
        return Verdict::Refuse(LOCAL_STORAGE);
    }
    if !controlled && !finished && !opts.force {
        return Verdict::Refuse(UNMANAGED);
    }
    Verdict::Remove
}

/// Why the drain cannot go on, as kubectl says it (`cannot delete <what>:
/// <ns/pod>, ...`, one clause per reason), or None.
pub fn refusal(pods: &[&Pod], opts: &KubectlDrain, now: Timestamp) -> Option<String> {
    let mut by_reason: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for pod in pods {
        if let Verdict::Refuse(why) = verdict(pod, opts, now) {
            let r = reference(pod);
            by_reason
                .entry(why)
                .or_default()
                .push(format!("{}/{}", r.namespace, r.name));
        }
    }
    let clauses: Vec<String> = by_reason
        .into_iter()
        .map(|(why, mut pods)| {
            pods.sort();
            format!("cannot delete {why}: {}", pods.join(", "))
        })
        .collect();
    (!clauses.is_empty()).then(|| clauses.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("a pod")
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("a time")
    }

    #[test]
    fn kubectl_drain_table() {
        let owned = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "u", "controller": true}]);
        let ds = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]);
        let bare = pod(json!({"metadata": {"name": "bare", "namespace": "a", "labels": {"app": "web"}}}));
        let rs = pod(json!({"metadata": {"name": "rs", "namespace": "a", "ownerReferences": owned}}));
        let daemon = pod(json!({"metadata": {"name": "ds", "namespace": "a", "ownerReferences": ds}}));
        let mirror =
            pod(json!({"metadata": {"name": "static", "annotations": {"kubernetes.io/config.mirror": "x"}}}));
        let scratch = pod(
            json!({"metadata": {"name": "scratch", "namespace": "a", "ownerReferences": owned},
            "spec": {"containers": [], "volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        );
        let done = pod(json!({"metadata": {"name": "done"}, "status": {"phase": "Succeeded"}}));
        let stuck = pod(json!({"metadata": {"name": "stuck", "ownerReferences": owned,
            "deletionTimestamp": t(0).to_string()}}));
        let upgrade = pod(
            json!({"metadata": {"name": "apply", "labels": {"upgrade.cattle.io/plan": "p"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u", "controller": true}]}}),
        );
        let controller = pod(json!({"metadata": {"name": "suc", "namespace": "system-upgrade",
            "labels": {"upgrade.cattle.io/controller": "system-upgrade-controller"}}}));
        let defaults = KubectlDrain::of(&DrainSpec::default());
        let force = KubectlDrain {
            force: true,
            ..defaults.clone()
        };
        let keep_dirs = KubectlDrain {
            delete_emptydir_data: false,
            ..defaults.clone()
        };
        let strict_ds = KubectlDrain {
            ignore_daemon_sets: false,
            ..defaults.clone()
        };
        let only_web = KubectlDrain {
            pod_selector: Some(
                serde_json::from_value(json!({"matchLabels": {"app": "web"}})).expect("a selector"),
            ),
            ..force.clone()
        };
        let skip_stuck = KubectlDrain {
            skip_wait_for_delete_timeout: 30,
            ..defaults.clone()
        };
        let table = [
            (
                "bare pod, force false: blocks",
                &bare,
                &defaults,
                Verdict::Refuse(UNMANAGED),
            ),
            ("bare pod, force true: removed", &bare, &force, Verdict::Remove),
            (
                "a pod labelled upgrade.cattle.io/controller is never drained",
                &controller,
                &force,
                Verdict::Skip,
            ),
            ("controlled pod", &rs, &defaults, Verdict::Remove),
            (
                "DaemonSet pod, ignored by default",
                &daemon,
                &defaults,
                Verdict::Skip,
            ),
            (
                "DaemonSet pod, ignoreDaemonSets false",
                &daemon,
                &strict_ds,
                Verdict::Refuse(DAEMONSET),
            ),
            ("mirror pod", &mirror, &force, Verdict::Skip),
            (
                "emptyDir, deleted by default",
                &scratch,
                &defaults,
                Verdict::Remove,
            ),
            (
                "emptyDir, deleteEmptydirData false",
                &scratch,
                &keep_dirs,
                Verdict::Refuse(LOCAL_STORAGE),
            ),
            ("finished bare pod", &done, &defaults, Verdict::Remove),
            ("podSelector leaves the others", &rs, &only_web, Verdict::Skip),
            ("podSelector picks its own", &bare, &only_web, Verdict::Remove),
            (
                "terminating 60s, skip after 30s",
                &stuck,
                &skip_stuck,
                Verdict::Skip,
            ),
            (
                "terminating 60s, no skip timeout",
                &stuck,
                &defaults,
                Verdict::Remove,
            ),
            ("a plan's upgrade pod", &upgrade, &defaults, Verdict::Skip),
        ];
        for (what, p, opts, want) in table {
            assert_eq!(verdict(p, opts, t(60)), want, "{what}");
        }
    }

    #[test]
    fn defaults_follow_upstream() {
        let d = KubectlDrain::of(&DrainSpec::default());
        assert!(!d.force && d.ignore_daemon_sets && d.delete_emptydir_data && !d.disable_eviction);
        let old = DrainSpec {
            delete_local_data: Some(false),
            ..Default::default()
        };
        assert!(
            !KubectlDrain::of(&old).delete_emptydir_data,
            "deleteLocalData false counts"
        );
    }

    #[test]
    fn refusals_read_as_kubectl_writes_them() {
        let a = pod(json!({"metadata": {"name": "b", "namespace": "ns"}}));
        let b = pod(json!({"metadata": {"name": "a", "namespace": "ns"}}));
        let msg = refusal(&[&a, &b], &KubectlDrain::default(), t(0));
        assert_eq!(
            msg.as_deref(),
            Some("cannot delete Pods that declare no controller (use --force to override): ns/a, ns/b")
        );
        assert_eq!(refusal(&[], &KubectlDrain::default(), t(0)), None);
    }
}
