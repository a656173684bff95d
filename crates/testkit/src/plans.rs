//! Plans (`upgrade.cattle.io/v1`) in tests: create, wait for, check.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::api::node_maintenance::medik8s::NodeMaintenance;
use nodewarden::api::plan::{Plan, node_label};
use serde_json::{Value, json};

use super::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};

pub const TIMEOUT: Duration = Duration::from_secs(90);

pub fn plans(env: &TestEnv, ns: &str) -> Api<Plan> {
    Api::namespaced(env.client.clone(), ns)
}

/// A Plan of the test (run label) in its namespace.
pub async fn create_plan(
    env: &TestEnv,
    name: &str,
    labels: Value,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let mut all = json!({ RUN_LABEL: env.id });
    if let (Some(all), Some(extra)) = (all.as_object_mut(), labels.as_object()) {
        all.extend(extra.clone());
    }
    // Untyped, so specs the Rust type would refuse reach the API server.
    let plan: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "upgrade.cattle.io/v1",
        "kind": "Plan",
        "metadata": {"name": name, "namespace": env.namespace, "labels": all},
        "spec": spec,
    }))
    .expect("a plan");
    let resource = ApiResource::erase::<Plan>(&());
    Api::<DynamicObject>::namespaced_with(env.client.clone(), &env.namespace, &resource)
        .create(&PostParams::default(), &plan)
        .await
}

pub async fn node(env: &TestEnv, name: &str) -> Node {
    Api::<Node>::all(env.client.clone())
        .get(name)
        .await
        .expect("reading a node")
}

pub fn cordoned(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

/// Waits until every node carries `plan`'s label with the plan's latest hash; returns the hash.
pub async fn wait_upgraded(
    env: &TestEnv,
    ns: &str,
    plan: &str,
    nodes: &[String],
    timeout: Duration,
) -> String {
    wait_for(&format!("{nodes:?} upgraded by {plan}"), timeout, || async {
        let p = match plans(env, ns).get(plan).await {
            Ok(p) => p,
            Err(e) => return Probe::NotYet(seen(e)),
        };
        let Some(hash) = p.status.as_ref().and_then(|s| s.latest_hash.clone()) else {
            return Probe::NotYet(format!("no hash yet: {:?}", p.status));
        };
        let mut behind = Vec::new();
        for n in nodes {
            let got = node(env, n).await.labels().get(&node_label(plan)).cloned();
            if got.as_deref() != Some(hash.as_str()) {
                behind.push(format!("{n}={got:?}"));
            }
        }
        if behind.is_empty() {
            Probe::Done(hash)
        } else {
            Probe::NotYet(format!("behind: {behind:?}; status {:?}", p.status))
        }
    })
    .await
}

/// Waits for the Plan's condition `type_` to have `status` and returns its message.
pub async fn wait_condition(env: &TestEnv, plan: &str, type_: &str, status: &str, reason: &str) -> String {
    super::wait::wait_for_condition(
        &plans(env, &env.namespace),
        plan,
        (type_, status, reason),
        TIMEOUT,
    )
    .await
}

pub async fn delete_plan_and_wait(env: &TestEnv, ns: &str, name: &str) {
    let api = plans(env, ns);
    let _ = api.delete(name, &DeleteParams::default()).await;
    wait_for(&format!("plan {name} gone"), TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(p)) => Probe::NotYet(format!("finalizers {:?}", p.finalizers())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

/// A PodDisruptionBudget over the pods labelled `app: <app>`.
pub async fn create_pdb(env: &TestEnv, name: &str, app: &str, max_unavailable: i32) {
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}},
    }))
    .expect("a pdb");
    Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("creating a pdb");
}

/// `nodewarden run` flags for Plans in a test's namespace: settled after
/// 2 s, a failed Job not retried.
pub fn replica_plan_flags(namespace: &str) -> [&str; 6] {
    [
        "--plan-namespace",
        namespace,
        "--plan-settle",
        "2",
        "--plan-job-backoff-limit",
        "0",
    ]
}

pub fn upgrade(image: &str) -> Value {
    json!({"image": image, "command": ["upgrade"], "args": ["--now"]})
}

/// Everything a checker saw breach.
#[derive(Default)]
pub struct Breaches(pub Mutex<Vec<String>>);

/// Plays the upgrade's reboot: each Job of `plan` reboots its node — NotReady
/// for 4 s (kwok Stage on `nodewarden.dev/kwok-reboot`) — once its pod runs
/// (or it has completed), as an upgrade reboots the node before its Job is
/// done. Rebooting only after completion raced the plan's health gate: under
/// load kwok could turn the node NotReady after the plan had seen it Ready
/// and settled. Returns the nodes it rebooted.
pub async fn reboot_after_job(
    client: Client,
    ns: String,
    plan: &'static str,
    stop: tokio_util::sync::CancellationToken,
) -> BTreeSet<String> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let node_api: Api<Node> = Api::all(client);
    let reboot = json!({"metadata": {"annotations": {"nodewarden.dev/kwok-reboot": "4"}}});
    let mut rebooted = BTreeSet::new();
    let mut done_jobs: BTreeSet<String> = BTreeSet::new();
    while !stop.is_cancelled() {
        let lp = ListParams::default().labels(&format!("upgrade.cattle.io/plan={plan}"));
        for job in jobs.list(&lp).await.map(|l| l.items).unwrap_or_default() {
            let complete = job
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Complete" && c.status == "True");
            let running = job.status.as_ref().and_then(|s| s.active).unwrap_or(0) > 0;
            let Some(node) = job.labels().get("upgrade.cattle.io/node").cloned() else {
                continue;
            };
            let uid = job.uid().unwrap_or_default();
            if (running || complete) && !done_jobs.contains(&uid) {
                // Not `expect`: a storm may delete the node's test objects meanwhile.
                if node_api
                    .patch(&node, &PatchParams::default(), &Patch::Merge(&reboot))
                    .await
                    .is_ok()
                {
                    done_jobs.insert(uid);
                    rebooted.insert(node);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    rebooted
}

/// Polls the plan, its Jobs and NodeMaintenances, the nodes and the PDB
/// `web` until stopped: never more than 2 applying (in the status, nor
/// nodes with a drain or an unfinished Job), never a node started while an
/// earlier one is not Ready, the PDB never broken. Returns how many samples
/// it took.
pub async fn check_plan(
    client: Client,
    ns: String,
    plan: &'static str,
    nodes: Vec<String>,
    breaches: Arc<Breaches>,
    stop: tokio_util::sync::CancellationToken,
) -> usize {
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let plan_jobs = ListParams::default().labels(&format!("upgrade.cattle.io/plan={plan}"));
    let plan_drains = ListParams::default().labels(&format!(
        "upgrade.cattle.io/plan={plan},nodewarden.dev/plan-namespace={ns}"
    ));
    let plans: Api<Plan> = Api::namespaced(client.clone(), &ns);
    let node_api: Api<Node> = Api::all(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let mut started: BTreeMap<String, usize> = BTreeMap::new();
    let mut samples = 0;
    while !stop.is_cancelled() {
        samples += 1;
        let breach = |what: String| breaches.0.lock().expect("breaches").push(what);
        if let (Ok(j), Ok(m)) = (jobs.list(&plan_jobs).await, maintenances.list(&plan_drains).await) {
            let unfinished = j.items.iter().filter(|j| !job_finished(j));
            let busy: BTreeSet<String> = unfinished
                .filter_map(|j| j.labels().get("upgrade.cattle.io/node").cloned())
                .chain(m.items.iter().map(|m| m.spec.node_name.clone()))
                .collect();
            if busy.len() > 2 {
                breach(format!("sample {samples}: {} nodes busy: {busy:?}", busy.len()));
            }
        }
        if let Ok(p) = plans.get(plan).await {
            let applying = p.status.map(|s| s.applying).unwrap_or_default();
            if applying.len() > 2 {
                breach(format!(
                    "sample {samples}: {} applying: {applying:?}",
                    applying.len()
                ));
            }
            let mut not_ready = Vec::new();
            for n in &nodes {
                if let Ok(node) = node_api.get(n).await
                    && !node_is_ready(&node)
                {
                    not_ready.push(n.clone());
                }
            }
            for n in &applying {
                if !started.contains_key(n) {
                    // A node starts: every node that finished must be Ready.
                    let finished_not_ready: Vec<&String> = not_ready
                        .iter()
                        .filter(|m| started.contains_key(*m) && !applying.contains(m))
                        .collect();
                    if !finished_not_ready.is_empty() {
                        breach(format!("{n} started while {finished_not_ready:?} not Ready"));
                    }
                    started.insert(n.clone(), samples);
                }
            }
        }
        if let Ok(b) = pdbs.get("web").await
            && let Some(s) = b.status
            && s.current_healthy < s.desired_healthy
        {
            breach(format!("PDB broken: {s:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    samples
}

/// Complete or Failed.
pub fn job_finished(job: &Job) -> bool {
    job.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
}

/// Records every Job of `plan` the API server ever shows (a watch, so one
/// created and deleted between two polls is seen too) until stopped:
/// node → the UIDs of its Jobs.
pub async fn record_jobs(
    client: Client,
    ns: String,
    plan: &'static str,
    stop: tokio_util::sync::CancellationToken,
) -> BTreeMap<String, BTreeSet<String>> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let jobs: Api<Job> = Api::namespaced(client, &ns);
    let config = watcher::Config::default().labels(&format!("upgrade.cattle.io/plan={plan}"));
    let mut events = std::pin::pin!(watcher(jobs, config));
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return seen,
            e = events.next() => e,
        };
        let job = match event {
            Some(Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j))) => j,
            Some(_) => continue,
            None => return seen,
        };
        if let (Some(node), Some(uid)) = (job.labels().get("upgrade.cattle.io/node"), job.uid()) {
            seen.entry(node.clone()).or_default().insert(uid);
        }
    }
}
