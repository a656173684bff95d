//! The way back: `nodewarden handover`, run once nodewarden's pods are gone
//! (`helm uninstall`, or its Deployment scaled to 0) and before the upstream
//! operator starts, leaves nothing of nodewarden's on any object and no
//! finalizer nobody will remove:
//!
//! - a NodeMaintenance someone else made keeps its node in maintenance (its
//!   cordon, taints and label are the Node Maintenance Operator's to lift now);
//!   nodewarden's finalizer and its record on the node go;
//! - nodewarden's own drains (a rollout's, a Plan's) end: what they changed on
//!   the node is undone, and they are deleted (upstream drains in its own way);
//! - a Plan's cordon is undone (upstream's Job cordons and drains itself);
//!   its finalizer goes; a Plan's prepare Jobs (nodewarden's, upstream prepares
//!   in the upgrade Job) are deleted;
//! - every `nodewarden.dev/` annotation and label goes from Nodes, the
//!   upstream kinds and the Plans' Jobs; the leader Lease and the webhook's
//!   Secret go from nodewarden's namespace.
//!
//! `decide` is pure (what each record, object and mark becomes); the rest reads
//! and writes, each write conditioned on the version read.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::api::node_maintenance::{DRAIN_FOR_LABEL, MaintenanceObject, kubevirt, medik8s};
use crate::api::plan::Plan;
use crate::api::update::{AutoscalingStrategy, JoiningNode, NodeVersion, PendingNode, ScalingGroup};
use crate::controllers::{delete_if_present, node_maintenance, plan};
use crate::drain::node::{recorded_changes, undo};
use crate::error::{Error, Result};

/// The prefix of nodewarden's own annotations, labels and finalizers.
pub const PREFIX: &str = "nodewarden.dev/";

/// What becomes of a node's record of what a drain owner changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRecord {
    /// Undo what the owner changed (nodewarden's own drain, a Plan's cordon,
    /// or an owner that is gone).
    Undo,
    /// Keep the changes, drop the record: the maintenance goes on under the
    /// upstream operator, which lifts them when it ends.
    Forget,
}

/// The record of `owner`, given the maintenances there are (owner → whether
/// it is one of nodewarden's own drains).
pub fn node_record(owner: &str, maintenances: &BTreeMap<String, bool>) -> NodeRecord {
    match maintenances.get(owner) {
        Some(false) => NodeRecord::Forget,
        Some(true) | None => NodeRecord::Undo,
    }
}

/// The merge patch that removes nodewarden's annotations and labels from an
/// object with these, or None when it has none.
pub fn marks_patch(
    annotations: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> Option<serde_json::Value> {
    let nulls = |m: &BTreeMap<String, String>| -> serde_json::Map<String, serde_json::Value> {
        m.keys()
            .filter(|k| k.starts_with(PREFIX))
            .map(|k| (k.clone(), serde_json::Value::Null))
            .collect()
    };
    let (a, l) = (nulls(annotations), nulls(labels));
    (!a.is_empty() || !l.is_empty()).then(|| json!({"metadata": {"annotations": a, "labels": l}}))
}

/// Which objects are handed over: nodewarden's `--node-selector` and
/// `--object-selector`, for a nodewarden that managed a share of the cluster.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Nodes matching this label selector (None: all).
    pub nodes: Option<String>,
    /// nodewarden's and the upstream kinds' objects matching this one (None: all).
    pub objects: Option<String>,
}

impl Scope {
    fn nodes(&self) -> ListParams {
        selected(self.nodes.as_deref())
    }

    fn objects(&self) -> ListParams {
        selected(self.objects.as_deref())
    }
}

fn selected(selector: Option<&str>) -> ListParams {
    match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    }
}

/// nodewarden's own objects the handover deletes: its leader Lease and its
/// webhook's Secret, by the names its `run` was given (`--lease-name`,
/// `--webhook-secret`), in its namespace.
#[derive(Clone, Debug)]
pub struct OwnState {
    /// nodewarden's namespace.
    pub namespace: String,
    /// The leader Lease's name.
    pub lease: String,
    /// The webhook Secret's name.
    pub secret: String,
}

/// What the handover did, for the report it prints.
#[derive(Debug, Default)]
pub struct Report {
    /// One line per change.
    pub done: Vec<String>,
}

impl Report {
    fn note(&mut self, line: String) {
        self.done.push(line);
    }
}

/// Whether `e` passes (the API server restarting, throttling, a dropped
/// connection): every step is repeatable, so the whole handover runs again.
pub fn is_transient(e: &Error) -> bool {
    match e {
        Error::Kube(kube::Error::Api(s)) => s.code == 429 || s.code >= 500,
        Error::Kube(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
        _ => false,
    }
}

/// [`hand_over`], run again after a transient failure (up to `attempts`
/// times, backing off from 1 s); the reports of every run are joined.
pub async fn hand_over_retrying(
    client: &Client,
    scope: &Scope,
    own: &OwnState,
    attempts: usize,
) -> Result<Report> {
    use backon::{BackoffBuilder, ExponentialBuilder};
    let mut pauses = ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_secs(1))
        .with_max_delay(std::time::Duration::from_secs(10))
        .with_max_times(attempts.saturating_sub(1))
        .build();
    let mut done = Vec::new();
    loop {
        match hand_over(client, scope, own).await {
            Ok(report) => {
                done.extend(report.done);
                return Ok(Report { done });
            }
            Err(e) if is_transient(&e) => match pauses.next() {
                Some(pause) => {
                    tracing::warn!(error = %e, ?pause, "handover interrupted; running it again");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(e),
            },
            Err(e) => return Err(e),
        }
    }
}

/// Hands everything over (see the module docs).
pub async fn hand_over(client: &Client, scope: &Scope, own: &OwnState) -> Result<Report> {
    let mut report = Report::default();
    let mut maintenances = BTreeMap::new();
    maintenances.extend(release_maintenances::<medik8s::NodeMaintenance>(client, scope, &mut report).await?);
    maintenances.extend(release_maintenances::<kubevirt::NodeMaintenance>(client, scope, &mut report).await?);
    release_plans(client, scope, &mut report).await?;
    release_nodes(client, scope, &maintenances, &mut report).await?;
    let objects = scope.objects();
    strip_kind::<NodeVersion>(client, &objects, &mut report).await?;
    strip_kind::<ScalingGroup>(client, &objects, &mut report).await?;
    strip_kind::<PendingNode>(client, &objects, &mut report).await?;
    strip_kind::<AutoscalingStrategy>(client, &objects, &mut report).await?;
    strip_kind::<JoiningNode>(client, &objects, &mut report).await?;
    strip_kind::<Job>(client, &objects, &mut report).await?;
    remove_own_state(client, own, &mut report).await?;
    Ok(report)
}

/// Every NodeMaintenance of one group nodewarden holds: others' lose only its
/// finalizer and marks, its own are deleted once their finalizer is gone.
/// Returns each one's owner (as node records name it) and whether it is own.
async fn release_maintenances<M: MaintenanceObject>(
    client: &Client,
    scope: &Scope,
    report: &mut Report,
) -> Result<BTreeMap<String, bool>> {
    let api: Api<M> = Api::all(client.clone());
    let mut owners = BTreeMap::new();
    for m in api.list(&scope.objects()).await?.items {
        let own = m.labels().contains_key(DRAIN_FOR_LABEL);
        owners.insert(node_maintenance::owner_of(&m), own);
        let kept: Vec<String> = m
            .finalizers()
            .iter()
            .filter(|f| !f.starts_with(PREFIX))
            .cloned()
            .collect();
        if kept.len() != m.finalizers().len() {
            let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": m.resource_version()}});
            api.patch(&m.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            report.note(format!(
                "NodeMaintenance {}: nodewarden's finalizer removed",
                m.name_any()
            ));
        }
        if own {
            if delete_if_present(&api, &m.name_any(), &DeleteParams::default()).await? {
                report.note(format!(
                    "NodeMaintenance {}: nodewarden's own drain deleted",
                    m.name_any()
                ));
            }
        } else {
            strip(&api, &m, "NodeMaintenance", report).await?;
        }
    }
    Ok(owners)
}

/// Plans lose nodewarden's finalizer and marks; their prepare Jobs go.
async fn release_plans(client: &Client, scope: &Scope, report: &mut Report) -> Result<()> {
    let api: Api<Plan> = Api::all(client.clone());
    for p in api.list(&scope.objects()).await?.items {
        let namespaced: Api<Plan> = Api::namespaced(client.clone(), &p.namespace().unwrap_or_default());
        if p.finalizers().iter().any(|f| f == plan::FINALIZER) {
            let kept: Vec<&String> = p.finalizers().iter().filter(|f| *f != plan::FINALIZER).collect();
            let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": p.resource_version()}});
            namespaced
                .patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            report.note(format!("Plan {}: nodewarden's finalizer removed", p.key()));
        }
        strip(&namespaced, &p, "Plan", report).await?;
    }
    let jobs: Api<Job> = Api::all(client.clone());
    let prepares = match &scope.objects {
        Some(selector) => format!("{selector},{}", crate::upgrade::job::STEP_LABEL),
        None => crate::upgrade::job::STEP_LABEL.to_string(),
    };
    let prepares = ListParams::default().labels(&prepares);
    for j in jobs.list(&prepares).await?.items {
        let namespaced: Api<Job> = Api::namespaced(client.clone(), &j.namespace().unwrap_or_default());
        let background = DeleteParams::background();
        if namespaced.delete(&j.name_any(), &background).await.is_ok() {
            report.note(format!("Job {}: a Plan's prepare Job deleted", j.name_any()));
        }
    }
    Ok(())
}

/// Each node's record: undone or forgotten ([`node_record`]); then its marks go.
async fn release_nodes(
    client: &Client,
    scope: &Scope,
    maintenances: &BTreeMap<String, bool>,
    report: &mut Report,
) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for n in api.list(&scope.nodes()).await?.items {
        let node = match recorded_changes(&n).map(|r| (node_record(&r.owner, maintenances), r.owner)) {
            Some((NodeRecord::Undo, owner)) => match undo(&n, &owner) {
                Some(undone) => {
                    let written = api
                        .replace(&n.name_any(), &PostParams::default(), &undone)
                        .await?;
                    report.note(format!("Node {}: what {owner} changed undone", n.name_any()));
                    written
                }
                None => n,
            },
            Some((NodeRecord::Forget, owner)) => {
                report.note(format!(
                    "Node {}: left in maintenance {owner} (its cordon, taints and label now upstream's)",
                    n.name_any()
                ));
                n
            }
            None => n,
        };
        strip(&api, &node, "Node", report).await?;
    }
    Ok(())
}

/// Every object of kind `K` loses nodewarden's marks.
async fn strip_kind<K>(client: &Client, selected: &ListParams, report: &mut Report) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let resource = ApiResource::erase::<K>(&());
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    for o in all.list(selected).await?.items {
        let api: Api<DynamicObject> = match o.namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        strip(&api, &o, &resource.kind, report).await?;
    }
    Ok(())
}

/// `o` without nodewarden's annotations and labels (when it has any).
async fn strip<K>(api: &Api<K>, o: &K, kind: &str, report: &mut Report) -> Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(patch) = marks_patch(o.annotations(), o.labels()) else {
        return Ok(());
    };
    api.patch(&o.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    report.note(format!(
        "{kind} {}: nodewarden's annotations and labels removed",
        o.name_any()
    ));
    Ok(())
}

/// The leader Lease and the webhook's Secret in nodewarden's namespace.
async fn remove_own_state(client: &Client, own: &OwnState, report: &mut Report) -> Result<()> {
    let namespace = &own.namespace;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if delete_if_present(&leases, &own.lease, &DeleteParams::default()).await? {
        report.note(format!("Lease {namespace}/{} deleted", own.lease));
    }
    if delete_if_present(&secrets, &own.secret, &DeleteParams::default()).await? {
        report.note(format!("Secret {namespace}/{} deleted", own.secret));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_marks() {
        let maintenances = BTreeMap::from([
            ("nodemaintenance.medik8s.io/by-hand".to_string(), false),
            (
                "nodemaintenance.medik8s.io/nodewarden-replace-a".to_string(),
                true,
            ),
        ]);
        let cases = [
            (
                "a maintenance someone made goes on",
                "nodemaintenance.medik8s.io/by-hand",
                NodeRecord::Forget,
            ),
            (
                "nodewarden's own drain ends",
                "nodemaintenance.medik8s.io/nodewarden-replace-a",
                NodeRecord::Undo,
            ),
            ("a Plan's cordon is undone", "plan/ns/p", NodeRecord::Undo),
            (
                "an owner that is gone",
                "nodemaintenance.medik8s.io/gone",
                NodeRecord::Undo,
            ),
        ];
        for (what, owner, want) in cases {
            assert_eq!(node_record(owner, &maintenances), want, "{what}");
        }
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let patch = marks_patch(
            &map(&[("nodewarden.dev/drain-changes", "{}"), ("keep", "x")]),
            &map(&[
                ("nodewarden.dev/drain-for", "plan"),
                ("upgrade.cattle.io/plan", "p"),
            ]),
        )
        .expect("marks to remove");
        assert_eq!(
            patch,
            json!({"metadata": {"annotations": {"nodewarden.dev/drain-changes": null},
                                "labels": {"nodewarden.dev/drain-for": null}}})
        );
        assert_eq!(marks_patch(&map(&[("keep", "x")]), &BTreeMap::new()), None);
        let status = |code: u16| {
            Error::Kube(kube::Error::Api(Box::new(
                kube::core::Status::failure("x", "y").with_code(code),
            )))
        };
        assert!(is_transient(&status(429)) && is_transient(&status(503)));
        assert!(!is_transient(&status(403)) && !is_transient(&status(409)));
    }
}
