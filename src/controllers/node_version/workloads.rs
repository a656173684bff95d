//! The workloads on a rollout's new nodes: a pod of a workload that stays
//! unready on a node of the new target while the same workload's pods are
//! Ready on other nodes says the new image breaks workloads (the rollout
//! halts on `haltAfterUnreadyPods` of them), and waves and domains wait
//! while pods on new nodes are unready.
//!
//! The new nodes are the target's own: nodes on the target that carry the
//! target annotation their PendingNode gave them. Their pods are listed
//! per node (the API server indexes pods by node), the newest nodes first
//! and at most [`NODES_LOOKED_AT`]; a workload's other pods only for the
//! few pods past their timeout. A look is reused for [`REUSED_FOR`]: a
//! rollout's passes come many a second.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::NodeVersionReconciler;
use super::gather::{Scope, annotation};
use crate::api::update::halt::TARGET_ANNOTATION;
use crate::api::update::{NodeVersion, Rollout};
use crate::error::Result;

/// Most new nodes whose pods one look lists.
pub(super) const NODES_LOOKED_AT: usize = 50;

/// How long a look stands for the passes after it.
const REUSED_FOR: Duration = Duration::from_secs(2);

/// How soon to look again while pods on new nodes are unready (nothing
/// watched wakes the rollout when a pod turns Ready).
const RECHECK: Duration = Duration::from_secs(5);

/// What the pods on the target's new nodes say.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PodTrial {
    /// Workload pods on new nodes not Ready now.
    pub(super) unready_now: usize,
    /// Those past podReadyTimeout whose workload has Ready pods on other
    /// nodes: `<namespace>/<pod> on <node> (<Kind> <name>)`.
    pub(super) failing: Vec<String>,
    /// When to look again, while pods are unready.
    pub(super) recheck: Option<Duration>,
}

/// The workload that owns `pod` (its controller): kind, name and UID.
fn workload(pod: &Pod) -> Option<(&str, &str, &str)> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    Some((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()))
}

/// Whether `pod`'s Ready condition is True.
fn is_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Since when `pod`, a live workload pod, has been unready; None when it is
/// Ready, finished, on its way out or no workload's.
fn unready_since(pod: &Pod) -> Option<Timestamp> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if is_ready(pod)
        || pod.metadata.deletion_timestamp.is_some()
        || matches!(phase, Some("Succeeded" | "Failed"))
        || workload(pod).is_none()
    {
        return None;
    }
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let ready_false = conditions
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .and_then(|c| c.last_transition_time.as_ref());
    ready_false
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
}

/// The verdict on `on_new` (the pods of the target's new nodes) at `now`:
/// `ready_elsewhere` says whether a workload (by UID) has Ready pods on
/// other nodes (pure).
pub(super) fn judge(
    on_new: &[Pod],
    ready_elsewhere: impl Fn(&str) -> bool,
    timeout: Duration,
    now: Timestamp,
) -> PodTrial {
    let mut trial = PodTrial::default();
    for pod in on_new {
        let Some(since) = unready_since(pod) else { continue };
        trial.unready_now += 1;
        let unready_for = now.duration_since(since).unsigned_abs();
        let left = timeout.saturating_sub(unready_for);
        let (kind, name, uid) = workload(pod).unwrap_or_default();
        if left.is_zero() && ready_elsewhere(uid) {
            trial.failing.push(format!(
                "{}/{} on {} ({kind} {name})",
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or_default(),
            ));
        }
        // Past due: looked at again as any unready pod is (a halted
        // rollout's pods may stay unready for good).
        let again = match left.is_zero() {
            true => RECHECK,
            false => left.clamp(Duration::from_millis(100), RECHECK),
        };
        trial.recheck = Some(trial.recheck.map_or(again, |r| r.min(again)));
    }
    trial.failing.sort();
    trial
}

/// The target's new nodes in `scope`, newest first, at most NODES_LOOKED_AT.
fn new_nodes<'a>(scope: &'a Scope, target: &str, on_target: impl Fn(&Node) -> bool) -> Vec<&'a Node> {
    let mut nodes: Vec<&Node> = scope
        .nodes
        .iter()
        .map(|n| &**n)
        .filter(|n| annotation(n, TARGET_ANNOTATION) == Some(target) && on_target(n))
        .collect();
    nodes.sort_by(|a, b| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp));
    nodes.truncate(NODES_LOOKED_AT);
    nodes
}

/// Looks reused by NodeVersion name: when taken, and what they said.
#[derive(Default)]
pub(crate) struct PodTrials(Mutex<HashMap<String, (Instant, PodTrial)>>);

impl PodTrials {
    fn recent(&self, nv: &str) -> Option<PodTrial> {
        let looks = self.0.lock().ok()?;
        looks
            .get(nv)
            .filter(|(at, _)| at.elapsed() < REUSED_FOR)
            .map(|(_, trial)| trial.clone())
    }

    fn keep(&self, nv: &str, trial: &PodTrial) {
        if let Ok(mut looks) = self.0.lock() {
            looks.insert(nv.to_string(), (Instant::now(), trial.clone()));
        }
    }
}

impl NodeVersionReconciler {
    /// What the pods on `nv`'s new nodes say; nothing to say when neither a
    /// halt on them nor waves or domains need it.
    pub(super) async fn pods_on_new_nodes(
        &self,
        nv: &NodeVersion,
        scope: &Scope,
        in_force: &Rollout,
    ) -> Result<PodTrial> {
        let needed = in_force.halt_after_unready_pods() > 0
            || in_force.waves.as_ref().is_some_and(|w| !w.is_empty())
            || in_force.topology_key.is_some();
        if !needed {
            return Ok(PodTrial::default());
        }
        let target = super::decide::rollout_target(nv);
        self.pod_trial(nv, scope, &target, in_force.pod_ready_timeout())
            .await
    }

    /// [`Self::pods_on_new_nodes`] for `target`, a recent look reused.
    async fn pod_trial(
        &self,
        nv: &NodeVersion,
        scope: &Scope,
        target: &str,
        timeout: Duration,
    ) -> Result<PodTrial> {
        if let Some(trial) = self.pod_trials.recent(&nv.name_any()) {
            return Ok(trial);
        }
        let nodes = new_nodes(scope, target, |n| super::decide::is_current(nv, n));
        let names: BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut on_new = Vec::new();
        for node in &names {
            let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
            on_new.extend(pods.list(&params).await?.items);
        }
        let now = Timestamp::now();
        let first = judge(&on_new, |_| true, timeout, now);
        let trial = match first.failing.is_empty() {
            true => first,
            false => {
                let elsewhere = self.ready_elsewhere(&on_new, &names).await?;
                judge(&on_new, |uid| elsewhere.contains(uid), timeout, now)
            }
        };
        self.pod_trials.keep(&nv.name_any(), &trial);
        Ok(trial)
    }

    /// The workloads (by UID) of `on_new`'s namespaces with a Ready pod on
    /// a node not in `new_nodes`.
    async fn ready_elsewhere(
        &self,
        on_new: &[Pod],
        new_nodes: &BTreeSet<String>,
    ) -> Result<BTreeSet<String>> {
        let namespaces: BTreeMap<String, ()> = on_new
            .iter()
            .filter_map(|p| p.namespace())
            .map(|ns| (ns, ()))
            .collect();
        let mut ready = BTreeSet::new();
        for namespace in namespaces.keys() {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            for pod in pods.list(&ListParams::default()).await?.items {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                if is_ready(&pod) && !node.is_empty() && !new_nodes.contains(&node) {
                    ready.extend(workload(&pod).map(|(_, _, uid)| uid.to_string()));
                }
            }
        }
        Ok(ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ready: Option<(bool, i64)>, owner: Option<&str>) -> Pod {
        let mut conditions = vec![];
        if let Some((ready, since)) = ready {
            let at = Timestamp::from_second(since).expect("a time").to_string();
            conditions.push(json!({"type": "Ready", "status": if ready {"True"} else {"False"}, "lastTransitionTime": at}));
        }
        let owners: Vec<_> = owner
            .map(|uid| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": uid, "controller": true}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "ownerReferences": owners,
                          "creationTimestamp": Timestamp::from_second(0).expect("a time").to_string()},
            "spec": {"nodeName": "new-1", "containers": []},
            "status": {"phase": "Running", "conditions": conditions},
        }))
        .expect("a pod")
    }

    #[test]
    fn workload_pods_unready_past_the_timeout_with_ready_siblings_fail() {
        let now = Timestamp::from_second(1000).expect("a time");
        let timeout = Duration::from_secs(300);
        let pods = [
            pod("ready", Some((true, 100)), Some("rs")),
            pod("long-unready", Some((false, 600)), Some("rs")),
            pod("fresh-unready", Some((false, 900)), Some("rs")),
            pod("no-condition-yet", None, Some("rs")),
            pod("bare", Some((false, 100)), None),
            pod("other-workload", Some((false, 100)), Some("lonely")),
        ];
        let trial = judge(&pods, |uid| uid == "rs", timeout, now);
        assert_eq!(
            trial.failing,
            [
                "ns/long-unready on new-1 (ReplicaSet web-1)",
                "ns/no-condition-yet on new-1 (ReplicaSet web-1)"
            ],
            "unready since its creation at 0 counts; a bare pod is no workload's; a workload with no Ready pod elsewhere is no evidence"
        );
        assert_eq!(trial.unready_now, 4);
        assert_eq!(trial.recheck, Some(RECHECK));
        let nearly = [pod("nearly", Some((false, 702)), Some("rs"))];
        let trial = judge(&nearly, |_| true, timeout, now);
        assert!(trial.failing.is_empty());
        assert_eq!(trial.recheck, Some(Duration::from_secs(2)), "at its deadline");
        assert_eq!(
            judge(&[pods[0].clone()], |_| true, timeout, now),
            PodTrial::default()
        );
    }

    #[test]
    fn finished_and_leaving_pods_are_not_judged() {
        let now = Timestamp::from_second(1000).expect("a time");
        let mut done = pod("done", Some((false, 0)), Some("rs"));
        if let Some(s) = done.status.as_mut() {
            s.phase = Some("Succeeded".into());
        }
        let mut leaving = pod("leaving", Some((false, 0)), Some("rs"));
        leaving.metadata.deletion_timestamp = leaving.metadata.creation_timestamp.clone();
        assert_eq!(
            judge(&[done, leaving], |_| true, Duration::from_secs(1), now),
            PodTrial::default()
        );
    }
}
