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
//! back up to their budgets.
//!
//! `cargo bench --bench drains` (or `just bench-drains`) prints the figures;
//! under `cargo test` (`just test`) it runs 3 at once for each operator, so
//! the command cannot rot.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::json;
use support::nmo::{Nmo, maintenances, release_peer_finalizers};
use support::plans::create_pdb;
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

/// One drain, then `many` at once; both times.
async fn rounds(env: &TestEnv, operator: Operator, nodes: &[String], many: usize) -> (Duration, Duration) {
    let one = drain(env, &format!("{operator:?}-one").to_lowercase(), &nodes[..1]).await;
    reset(env, nodes).await;
    let all = drain(env, &format!("{operator:?}-many").to_lowercase(), &nodes[..many]).await;
    reset(env, nodes).await;
    println!("drains: {operator:?}: 1 drain {one:.2?}, {many} at once {all:.2?}");
    (one, all)
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
        ours.1,
        ratio(ours.1, ours.0),
        ours.0,
        theirs.1,
        ratio(theirs.1, theirs.0),
        theirs.0,
        ratio(theirs.1, ours.1),
    );
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
