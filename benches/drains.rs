//! Maintenance drains side by side with the Node Maintenance Operator.
//!
//! On the local control plane, 25 kwok nodes run 20 two-pod Deployments,
//! each guarded by a PodDisruptionBudget of `maxUnavailable: 1`. One
//! NodeMaintenance, then 20 at once, are created and timed until every one
//! reports `phase: Succeeded` — first served by one `nodewarden run` process
//! (production's flags, its ServiceAccount), then by the Node Maintenance
//! Operator v0.17.0's manager built from its Go module (`e2e/nmo/build.sh`),
//! out of cluster with the admin kubeconfig and its webhook registered with
//! no one. Between rounds every maintenance is deleted and the workloads are
//! back up to their budgets. During each round of 20 the bench records
//! every program's CPU seconds and how often the cores were saturated
//! (`support::procstat`): where the machine's time went.
//!
//! `cargo bench --bench drains` (or `just bench-drains`) prints the figures;
//! under `cargo test` (`just test`) it runs 3 at once for each operator, so
//! the command cannot rot.

use nodewarden_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::nmo::{Nmo, maintenances, release_peer_finalizers};
use support::plans::create_pdb;
use support::procstat::{BusySampler, CpuSnapshot, describe, json_by_program, saturated_share};
use support::replicas::*;
use support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

const SPARE_NODES: usize = 5;
const TIMEOUT: Duration = Duration::from_secs(600);

/// The two operators measured.
#[derive(Clone, Copy, Debug)]
enum Operator {
    Nodewarden,
    Nmo,
}

/// Creates a NodeMaintenance on each of `nodes` at once and waits until all
/// report Succeeded; how long that took.
async fn drain(env: &TestEnv, round: &str, nodes: &[String]) -> Duration {
    let api = maintenances(env);
    let started = Instant::now();
    for (i, node) in nodes.iter().enumerate() {
        let nm: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": env.name(&format!("{round}-{i}")), "labels": {RUN_LABEL: env.id}},
            "spec": {"nodeName": node, "reason": "bench"},
        }))
        .expect("a NodeMaintenance");
        api.create(&PostParams::default(), &nm)
            .await
            .expect("creating a NodeMaintenance");
    }
    let selector = env.run_selector();
    wait_for(
        &format!("{} maintenances Succeeded", nodes.len()),
        TIMEOUT,
        || async {
            let list = match api.list(&ListParams::default().labels(&selector)).await {
                Ok(l) => l.items,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let done = list
                .iter()
                .filter(|m| m.data["status"]["phase"] == "Succeeded")
                .count();
            if done == nodes.len() {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("{done} of {} Succeeded", nodes.len()))
            }
        },
    )
    .await;
    started.elapsed()
}

/// Deletes every maintenance and waits until they are gone, no node is
/// cordoned and every budget is met again.
async fn reset(env: &TestEnv, nodes: &[String]) {
    let api = maintenances(env);
    let selector = env.run_selector();
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))
        .await;
    let node_api: Api<Node> = Api::all(env.client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for("maintenances gone, nodes back, budgets met", TIMEOUT, || async {
        let left = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(l) => l.items.len(),
            Err(e) => return Probe::NotYet(seen(e)),
        };
        let mut cordoned = 0;
        for n in nodes {
            if let Ok(node) = node_api.get(n).await
                && node.spec.and_then(|s| s.unschedulable) == Some(true)
            {
                cordoned += 1;
            }
        }
        let short = match pdbs.list(&ListParams::default()).await {
            Ok(l) => l
                .items
                .iter()
                .filter(|b| {
                    b.status
                        .as_ref()
                        .is_none_or(|s| s.current_healthy < s.desired_healthy || s.expected_pods == Some(0))
                })
                .count(),
            Err(e) => return Probe::NotYet(seen(e)),
        };
        if left == 0 && cordoned == 0 && short == 0 {
            Probe::Done(())
        } else {
            Probe::NotYet(format!(
                "{left} maintenances, {cordoned} cordoned, {short} budgets short"
            ))
        }
    })
    .await;
}

/// One drain, then `many` at once; both times. The round of `many` is
/// recorded (evictions and budgets) to say where its time went.
async fn rounds(env: &TestEnv, operator: Operator, nodes: &[String], many: usize) -> Round {
    let one = drain(env, &format!("{operator:?}-one").to_lowercase(), &nodes[..1]).await;
    reset(env, nodes).await;
    let recorder = Recorder::start(env).await;
    let (cpu_before, sampler) = (CpuSnapshot::take(), BusySampler::start());
    let all = drain(env, &format!("{operator:?}-many").to_lowercase(), &nodes[..many]).await;
    let (cpu, busy) = (CpuSnapshot::take().used_since(&cpu_before), sampler.stop());
    let seen = recorder.stop();
    reset(env, nodes).await;
    println!("drains: {operator:?}: 1 drain {one:.2?}, {many} at once {all:.2?}");
    let went = WhereTimeWent::of(&seen);
    println!("drains: {operator:?}: {many} at once: {}", went.describe());
    println!(
        "drains: {operator:?}: {many} at once: {}",
        describe(&cpu, all, &busy, CPU_PROGRAMS_SHOWN)
    );
    Round {
        one,
        all,
        went,
        cpu: json_by_program(&cpu, CPU_PROGRAMS_SHOWN),
        saturated: saturated_share(&busy),
    }
}

/// One operator's figures.
struct Round {
    one: Duration,
    all: Duration,
    went: WhereTimeWent,
    /// CPU seconds by program during the round of many.
    cpu: serde_json::Value,
    /// The share of that round's tenths of a second with the cores saturated.
    saturated: f64,
}

/// Programs named in the CPU breakdown, most CPU first.
const CPU_PROGRAMS_SHOWN: usize = 7;

impl Round {
    fn json(&self) -> serde_json::Value {
        let median = |mut v: Vec<Duration>| {
            v.sort();
            v.get(v.len() / 2).map(|d| d.as_secs_f64())
        };
        json!({
            "one_drain_seconds": self.one.as_secs_f64(),
            "all_at_once_seconds": self.all.as_secs_f64(),
            "all_over_one": self.all.as_secs_f64() / self.one.as_secs_f64().max(1e-9),
            "evictions": self.went.evictions,
            "evictions_that_waited_for_a_budget": self.went.waited.len(),
            "cluster_allowed_after_previous_eviction_median_seconds":
                median(self.went.waited.iter().map(|w| w.0).collect()),
            "evicted_after_allowed_median_seconds":
                median(self.went.waited.iter().map(|w| w.1).collect()),
            "cpu_seconds_by_program_all_at_once": self.cpu,
            "machine_saturated_share_all_at_once": self.saturated,
        })
    }
}

/// What happened during a round, by app (each app has one Deployment and
/// one budget of the same name).
#[derive(Clone, Debug)]
enum Seen {
    /// A pod of the app began terminating (evicted).
    Evicted { app: String, at: Duration },
    /// The app's budget went from allowing no disruption to allowing one.
    Allowed { app: String, at: Duration },
}

/// Watches the namespace's pods and budgets while a round runs.
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    /// Starts both watches and returns once each has listed.
    async fn start(env: &TestEnv) -> Recorder {
        let started = Instant::now();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(2);
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
        let pod_task = {
            let seen = seen.clone();
            let mut terminating = BTreeSet::new();
            record(pods, ready_tx.clone(), move |pod: Pod| {
                if pod.metadata.deletion_timestamp.is_some()
                    && terminating.insert(pod.uid().unwrap_or_default())
                {
                    let app = pod.labels().get("app").cloned().unwrap_or_default();
                    let at = started.elapsed();
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Seen::Evicted { app, at });
                }
            })
        };
        let pdb_task = {
            let seen = seen.clone();
            let mut allowed: BTreeMap<String, i32> = BTreeMap::new();
            record(pdbs, ready_tx, move |pdb: PodDisruptionBudget| {
                let now = pdb
                    .status
                    .as_ref()
                    .and_then(|s| s.disruptions_allowed)
                    .unwrap_or(0);
                let before = allowed.insert(pdb.name_any(), now);
                if now > 0 && before == Some(0) {
                    let at = started.elapsed();
                    let app = pdb.name_any();
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Seen::Allowed { app, at });
                }
            })
        };
        for _ in 0..2 {
            let _ = ready_rx.recv().await;
        }
        Recorder {
            seen,
            tasks: vec![pod_task, pdb_task],
        }
    }

    fn stop(self) -> Vec<Seen> {
        for t in &self.tasks {
            t.abort();
        }
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Watches `api`, says on `ready` once it has listed, and hands every object
/// it sees (added, changed or deleted) to `on_object`.
fn record<K>(
    api: Api<K>,
    ready: tokio::sync::mpsc::Sender<()>,
    mut on_object: impl FnMut(K) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    let _ = ready.send(()).await;
                }
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o)) => {
                    on_object(o)
                }
                _ => {}
            }
        }
    })
}

/// Where a round's time went: for every eviction that had to wait for its
/// budget, how long the cluster took to allow it again after the app's
/// previous eviction (the ReplicaSet's new pod created, scheduled, Ready,
/// the budget recounted), and how long the operator then took to evict.
#[derive(Debug, Default, PartialEq)]
struct WhereTimeWent {
    evictions: usize,
    /// Per waiting eviction: (cluster's share, operator's share).
    waited: Vec<(Duration, Duration)>,
    last_eviction: Duration,
}

impl WhereTimeWent {
    fn of(seen: &[Seen]) -> WhereTimeWent {
        let mut by_app: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
        for s in seen {
            let (Seen::Evicted { app, .. } | Seen::Allowed { app, .. }) = s;
            by_app.entry(app.as_str()).or_default().push(s);
        }
        let mut out = WhereTimeWent::default();
        for events in by_app.values_mut() {
            events.sort_by_key(|s| match s {
                Seen::Evicted { at, .. } | Seen::Allowed { at, .. } => *at,
            });
            let (mut previous_eviction, mut allowed) = (None, None);
            for s in events.iter() {
                match **s {
                    Seen::Allowed { at, .. } => allowed = Some(at),
                    Seen::Evicted { at, .. } => {
                        out.evictions += 1;
                        out.last_eviction = out.last_eviction.max(at);
                        if let (Some(previous), Some(allowed)) = (previous_eviction, allowed)
                            && allowed > previous
                        {
                            out.waited.push((allowed - previous, at - allowed));
                        }
                        previous_eviction = Some(at);
                        allowed = None;
                    }
                }
            }
        }
        out
    }

    fn describe(&self) -> String {
        let stats = |mut v: Vec<Duration>| {
            v.sort();
            match (v.get(v.len() / 2), v.last()) {
                (Some(median), Some(max)) => format!("median {median:.2?}, max {max:.2?}"),
                _ => "none".to_string(),
            }
        };
        format!(
            "{} evictions, the last {:.2?} after the maintenances were created; {} waited for a budget: the cluster allowed each {} after the app's previous eviction, and the operator evicted {} after it was allowed",
            self.evictions,
            self.last_eviction,
            self.waited.len(),
            stats(self.waited.iter().map(|w| w.0).collect()),
            stats(self.waited.iter().map(|w| w.1).collect()),
        )
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(if full { 20 } else { 3 }));
}

async fn run(many: usize) {
    let env = TestEnv::new("drains").await;
    // Its own control plane may be fresh: the CRDs go in first.
    support::install_crds(&env.client).await;
    let nodes = env
        .create_kwok_nodes(many + SPARE_NODES, &[("bench", "drains")])
        .await;
    for i in 0..many {
        let app = format!("app-{i}");
        env.create_deployment(&app, 2, json!({"bench": "drains"})).await;
        create_pdb(&env, &app, &app, 1).await;
    }
    reset(&env, &nodes).await;
    let dir = replica_log_dir(&env.id);

    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let replicas =
        Replicas::start_default_election(1, &env, &kubeconfig, &lease_name, "http://127.0.0.1:9", &[], &dir);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    wait_for("nodewarden leads", Duration::from_secs(60), || async {
        match holder(&leases, &lease_name).await {
            Some(h) => Probe::Done(h),
            None => Probe::NotYet("no holder".into()),
        }
    })
    .await;
    let ours = rounds(&env, Operator::Nodewarden, &nodes, many).await;
    drop(replicas);
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;

    let nmo = Nmo::start(&dir);
    let theirs = rounds(&env, Operator::Nmo, &nodes, many).await;
    drop(nmo);
    release_peer_finalizers(&env).await;

    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "drains: {many} NodeMaintenances at once on PDB-guarded nodes: nodewarden {:.2?} ({:.2} × its one drain of {:.2?}), Node Maintenance Operator v0.17.0 {:.2?} ({:.2} × its one of {:.2?}); the peer takes {:.1} × as long",
        ours.all,
        ratio(ours.all, ours.one),
        ours.one,
        theirs.all,
        ratio(theirs.all, theirs.one),
        theirs.one,
        ratio(theirs.all, ours.all),
    );
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run/bench-drains");
    let report = json!({
        "command": "cargo bench --bench drains",
        "maintenances_at_once": many,
        "nodewarden": ours.json(),
        "node_maintenance_operator": theirs.json(),
        "peer_over_nodewarden": ratio(theirs.all, ours.all),
    });
    if let Err(e) = std::fs::create_dir_all(&out).and_then(|()| {
        std::fs::write(
            out.join("drains.json"),
            serde_json::to_string_pretty(&report).unwrap_or_default(),
        )
    }) {
        println!("drains: writing {}/drains.json: {e}", out.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The peer's finalizer is gone with it: remove any maintenance left.
    let _ = maintenances(&env)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&env.run_selector()),
        )
        .await;
    env.cleanup().await;
}
