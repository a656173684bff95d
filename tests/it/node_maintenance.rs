//! NodeMaintenance against the real control plane: kwok nodes, the real
//! scheduler and controllers, PodDisruptionBudgets enforced by the API server.

use crate::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::api::node_maintenance::{MaintenancePhase, kubevirt, medik8s};
use nodewarden::controllers::node_maintenance::MaintenanceConfig;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);

fn maintenance(env: &TestEnv, name: &str, node: &str, extra: serde_json::Value) -> medik8s::NodeMaintenance {
    let mut spec = json!({"nodeName": node, "reason": "test"});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.name(name), "labels": {RUN_LABEL: env.id}},
        "spec": spec,
    }))
    .expect("a NodeMaintenance")
}

async fn create_nm(env: &TestEnv, nm: &medik8s::NodeMaintenance) {
    Api::<medik8s::NodeMaintenance>::all(env.client.clone())
        .create(&PostParams::default(), nm)
        .await
        .expect("creating a NodeMaintenance");
}

async fn wait_phase(client: &Client, name: &str, phase: MaintenancePhase) -> medik8s::NodeMaintenance {
    let api: Api<medik8s::NodeMaintenance> = Api::all(client.clone());
    wait_for(&format!("{name} to reach {phase:?}"), TIMEOUT, || async {
        match api.get(name).await {
            Ok(nm) => match nm.status.as_ref().and_then(|s| s.phase) {
                Some(p) if p == phase => Probe::Done(nm),
                _ => Probe::NotYet(format!("status {:?}", nm.status)),
            },
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

async fn wait_gone(client: &Client, name: &str) {
    let api: Api<medik8s::NodeMaintenance> = Api::all(client.clone());
    wait_for(&format!("{name} to be gone"), TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(nm)) => Probe::NotYet(format!("finalizers {:?}", nm.finalizers())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

/// Pods of the test's namespace on `node`.
async fn pods_on(env: &TestEnv, node: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn deployment(env: &TestEnv, name: &str, replicas: i32) {
    env.create_deployment(name, replicas, json!({RUN_LABEL: env.id}))
        .await;
}

async fn bare_pod(env: &TestEnv, name: &str, node: &str) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &p)
        .await
        .expect("creating a pod");
}

async fn pdb(env: &TestEnv, name: &str, app: &str, min_available: i32) {
    let b: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }))
    .expect("a pdb");
    Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &b)
        .await
        .expect("creating a pdb");
}

/// Waits until `count` Ready pods of the namespace run on `node`.
async fn wait_ready_pods(env: &TestEnv, node: &str, count: usize) {
    wait_for(&format!("{count} Ready pods on {node}"), TIMEOUT, || async {
        let pods = pods_on(env, node).await;
        let n = pods.iter().filter(|p| ready(p)).count();
        if n == count {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("{n} Ready of {}", pods.len()))
        }
    })
    .await
}

async fn node(env: &TestEnv, name: &str) -> Node {
    Api::<Node>::all(env.client.clone())
        .get(name)
        .await
        .expect("getting the node")
}

fn taint_keys(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// Events recorded for the NodeMaintenance `name`: reason and note.
async fn events_of(env: &TestEnv, name: &str) -> Vec<(String, String)> {
    let events: Api<Event> = Api::all(env.client.clone());
    events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|e| Some((e.reason?, e.note.unwrap_or_default())))
                .collect()
        })
        .unwrap_or_default()
}

/// Event reasons recorded for the NodeMaintenance `name`.
async fn event_reasons(env: &TestEnv, name: &str) -> BTreeSet<String> {
    events_of(env, name).await.into_iter().map(|(r, _)| r).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_drains_the_node_and_deleting_it_restores_the_node() {
    let env = TestEnv::new("nm-drain").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    // Only the target exists at first, so every workload lands on it.
    let target = env.create_kwok_nodes(1, &[]).await.remove(0);
    deployment(&env, "web", 4).await;
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {RUN_LABEL: env.id},
                    "containers": [{"name": "c", "image": "registry.invalid/agent:1"}],
                },
            },
        },
    }))
    .expect("a daemonset");
    Api::<DaemonSet>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &ds)
        .await
        .expect("creating a daemonset");
    bare_pod(&env, "lonely", &target).await;
    bare_pod(&env, "finished", &target).await;
    wait_ready_pods(&env, &target, 7).await;
    // A bare pod that ran to completion: kubectl drain removes it too.
    let finished =
        json!({"status": {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}});
    Api::<Pod>::namespaced(env.client.clone(), &env.namespace)
        .patch_status("finished", &PatchParams::default(), &Patch::Merge(&finished))
        .await
        .expect("the pod finished");
    wait_ready_pods(&env, &target, 6).await;
    let others = env.create_kwok_nodes(2, &[]).await;

    let nm = maintenance(&env, "m", &target, json!({}));
    let name = nm.name_any();
    create_nm(&env, &nm).await;
    let done = wait_phase(&env.client, &name, MaintenancePhase::Succeeded).await;
    let status = done.status.expect("a status");
    assert_eq!(status.drain_progress, Some(100));
    assert_eq!(
        status.total_pods,
        Some(7),
        "4 web + 1 daemonset + 1 bare pod + 1 finished pod"
    );
    assert_eq!(status.eviction_pods, Some(6), "the daemonset pod stays");
    assert_eq!(status.pending_pods.as_deref().map(<[String]>::len), Some(0));
    let condition = &status.conditions.expect("conditions")[0];
    assert_eq!(
        (condition.type_.as_str(), condition.status.as_str()),
        ("Drained", "True")
    );
    assert_eq!(condition.observed_generation, done.metadata.generation);

    // The Deployment's pods moved to the other nodes; the DaemonSet pod stayed;
    // the bare pod and the finished one are gone.
    wait_for("4 web pods Ready on the other nodes", TIMEOUT, || async {
        let mut ready_elsewhere = 0;
        for n in &others {
            ready_elsewhere += pods_on(&env, n)
                .await
                .iter()
                .filter(|p| ready(p) && p.labels().get("app").is_some_and(|a| a == "web"))
                .count();
        }
        if ready_elsewhere == 4 {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("{ready_elsewhere} Ready"))
        }
    })
    .await;
    let left: Vec<String> = pods_on(&env, &target)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(
        left.len(),
        1,
        "only the daemonset pod stays on the node: {left:?}"
    );
    assert!(left[0].starts_with("agent-"), "{left:?}");

    let held = node(&env, &target).await;
    assert!(cordoned(&held));
    let taints = taint_keys(&held);
    assert!(
        taints.contains("medik8s.io/drain") && taints.contains("node.kubernetes.io/unschedulable"),
        "{taints:?}"
    );
    assert_eq!(
        held.labels()
            .get("remediation.medik8s.io/exclude-from-remediation")
            .map(String::as_str),
        Some("true")
    );
    let lease = Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases")
        .get(&format!("node-{target}"))
        .await
        .expect("the per-node lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("node-maintenance")
    );
    let nm_now: medik8s::NodeMaintenance = Api::all(env.client.clone())
        .get(&name)
        .await
        .expect("the NodeMaintenance");
    assert_eq!(
        nm_now.owner_references().first().map(|r| r.name.as_str()),
        Some(target.as_str())
    );

    // Deleting it undoes everything maintenance did.
    Api::<medik8s::NodeMaintenance>::all(env.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleting the NodeMaintenance");
    wait_gone(&env.client, &name).await;
    let restored = node(&env, &target).await;
    assert!(!cordoned(&restored));
    wait_for(
        "the unschedulable taint to go",
        Duration::from_secs(30),
        || async {
            let taints = taint_keys(&node(&env, &target).await);
            if taints.is_empty() {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("{taints:?}"))
            }
        },
    )
    .await;
    assert!(
        !restored
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );
    let lease = Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases")
        .get_opt(&format!("node-{target}"))
        .await
        .expect("reading the lease");
    assert!(lease.is_none(), "the per-node lease is released");
    let reasons = event_reasons(&env, &name).await;
    for reason in ["BeginMaintenance", "SucceedMaintenance", "RemovedMaintenance"] {
        assert!(
            reasons.contains(reason),
            "event {reason} missing from {reasons:?}"
        );
    }
    // The maintenance begins before the node's pods are counted: its Event
    // says so, or the count if it came first, never a count of nothing.
    let begun: Vec<String> = events_of(&env, &name)
        .await
        .into_iter()
        .filter(|(r, _)| r == "BeginMaintenance")
        .map(|(_, note)| note)
        .collect();
    let begins = format!("node {target}: the drain begins (the node's pods are being counted)");
    let counted = format!("node {target}: 6 of 6 pods to evict left");
    assert!(
        begun.iter().all(|n| *n == begins || *n == counted) && !begun.is_empty(),
        "BeginMaintenance says what is true as it begins: {begun:?}"
    );
    op.stop().await;
    env.cleanup().await;
}

/// A node running two pods of an app whose budget allows no disruption.
async fn guarded_node(env: &TestEnv) -> String {
    let target = env.create_kwok_nodes(1, &[]).await.remove(0);
    deployment(env, "guarded", 2).await;
    wait_ready_pods(env, &target, 2).await;
    pdb(env, "guarded-pdb", "guarded", 2).await;
    env.create_kwok_nodes(1, &[]).await;
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_pdb_is_named_and_relaxing_it_lets_the_drain_finish() {
    let env = TestEnv::new("nm-pdb").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let target = guarded_node(&env).await;
    let nm = maintenance(&env, "m", &target, json!({}));
    let name = nm.name_any();
    create_nm(&env, &nm).await;

    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let pdb_name = format!("{}/guarded-pdb", env.namespace);
    let blocked = wait_for("the PDB named in status", TIMEOUT, || async {
        match api.get(&name).await {
            Ok(nm) => {
                let s = nm.status.clone().unwrap_or_default();
                let named = s
                    .blocked_by
                    .as_ref()
                    .is_some_and(|b| b.iter().all(|b| b.pdb == pdb_name) && b.len() == 2);
                if named && s.phase == Some(MaintenancePhase::Running) {
                    Probe::Done(s)
                } else {
                    Probe::NotYet(format!("{s:?}"))
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let condition = &blocked.conditions.expect("conditions")[0];
    assert_eq!(condition.reason, "BlockedByPDB");
    assert!(condition.message.contains(&pdb_name), "{}", condition.message);
    assert_eq!(blocked.drain_progress, Some(0));

    // Still blocked a while later: nodewarden never breaks the budget.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = api
        .get(&name)
        .await
        .expect("the NodeMaintenance")
        .status
        .unwrap_or_default();
    assert_eq!(still.phase, Some(MaintenancePhase::Running));
    assert_eq!(pods_on(&env, &target).await.len(), 2);

    let relax = json!({"spec": {"minAvailable": 0}});
    Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.namespace)
        .patch("guarded-pdb", &PatchParams::default(), &Patch::Merge(&relax))
        .await
        .expect("relaxing the pdb");
    let done = wait_phase(&env.client, &name, MaintenancePhase::Succeeded).await;
    let status = done.status.unwrap_or_default();
    assert_eq!(status.drain_progress, Some(100));
    // Done: the refusals met on the way are not reported any more.
    assert_eq!(status.blocked_by, None, "a finished drain lists no blockers");
    assert_eq!(status.last_error, None);
    op.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_fails_naming_the_blockers_or_deletes_as_configured() {
    let env = TestEnv::new("nm-timeout").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let target = guarded_node(&env).await;
    let nm = maintenance(&env, "fail", &target, json!({"drainTimeout": "3s"}));
    let name = nm.name_any();
    create_nm(&env, &nm).await;
    let failed = wait_phase(&env.client, &name, MaintenancePhase::Failed).await;
    let err = failed.status.and_then(|s| s.last_error).expect("lastError");
    assert!(
        err.contains("spec.drainTimeout") && err.contains("guarded-pdb"),
        "{err}"
    );
    assert_eq!(
        pods_on(&env, &target).await.len(),
        2,
        "Fail leaves the pods alone"
    );
    assert!(event_reasons(&env, &name).await.contains("FailedMaintenance"));

    // The same drain with DeletePods: the pods go, the maintenance succeeds.
    Api::<medik8s::NodeMaintenance>::all(env.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleting");
    wait_gone(&env.client, &name).await;
    let force = maintenance(
        &env,
        "force",
        &target,
        json!({"drainTimeout": "3s", "onDrainTimeout": "DeletePods"}),
    );
    create_nm(&env, &force).await;
    wait_phase(&env.client, &force.name_any(), MaintenancePhase::Succeeded).await;
    let guarded_left = pods_on(&env, &target)
        .await
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    assert_eq!(guarded_left, 0);
    op.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_admin_cordoned_stays_cordoned_after_maintenance() {
    let env = TestEnv::new("nm-admin").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let target = env.create_kwok_nodes(1, &[]).await.remove(0);
    let cordon = json!({"spec": {"unschedulable": true}});
    Api::<Node>::all(env.client.clone())
        .patch(&target, &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .expect("cordoning as the admin");
    let nm = maintenance(&env, "m", &target, json!({}));
    create_nm(&env, &nm).await;
    wait_phase(&env.client, &nm.name_any(), MaintenancePhase::Succeeded).await;
    assert!(taint_keys(&node(&env, &target).await).contains("medik8s.io/drain"));
    Api::<medik8s::NodeMaintenance>::all(env.client.clone())
        .delete(&nm.name_any(), &DeleteParams::default())
        .await
        .expect("deleting");
    wait_gone(&env.client, &nm.name_any()).await;
    let after = node(&env, &target).await;
    assert!(cordoned(&after), "the admin's cordon must survive");
    assert!(
        !taint_keys(&after).contains("medik8s.io/drain"),
        "our taint is removed"
    );
    op.stop().await;
    env.cleanup().await;
}

/// Waits until every maintenance of `names` is draining and blocked by its
/// budget. A blocked drain stays blocked until its budget is lifted, so all
/// of them seen blocked were blocked at once: drains run one at a time (as
/// NMO runs them) never are, however slow or loaded the machine.
async fn wait_all_blocked(env: &TestEnv, names: &[String]) {
    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let what = format!("{} maintenances blocked by their budgets at once", names.len());
    wait_for(&what, TIMEOUT, || async {
        let mut blocked = 0;
        for name in names {
            let status = match api.get(name).await {
                Ok(nm) => nm.status.unwrap_or_default(),
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let draining = status.phase == Some(MaintenancePhase::Running);
            if draining && status.blocked_by.as_ref().is_some_and(|b| !b.is_empty()) {
                blocked += 1;
            }
        }
        match blocked == names.len() {
            true => Probe::Done(()),
            false => Probe::NotYet(format!("{blocked} of {} blocked", names.len())),
        }
    })
    .await;
}

/// Creates one NodeMaintenance per node, waits until all are blocked by
/// their budgets at once, lifts each budget after `hold`, and returns how
/// long until all succeeded.
async fn maintain_all(env: &TestEnv, nodes: &[(usize, String)], hold: Duration) -> Duration {
    let start = Instant::now();
    let names: Vec<String> = futures::future::join_all(nodes.iter().map(|(i, n)| async move {
        let nm = maintenance(env, &format!("busy-{i}"), n, json!({}));
        create_nm(env, &nm).await;
        nm.name_any()
    }))
    .await;
    wait_all_blocked(env, &names).await;
    tokio::time::sleep(hold).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
    for (i, _) in nodes {
        budgets
            .delete(&format!("hold-{i}"), &DeleteParams::default())
            .await
            .expect("lifting a budget");
    }
    for name in &names {
        wait_phase(&env.client, name, MaintenancePhase::Succeeded).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_maintenances_drain_side_by_side() {
    let env = TestEnv::new("nm-twenty").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    // 21 busy nodes, each running 3 pods held by a budget that allows no
    // disruption; each drain is blocked until its budget is lifted after 3 s,
    // like a workload that takes its time to be ready elsewhere.
    let busy: Vec<(usize, String)> = env
        .create_kwok_nodes(21, &[("role", "busy")])
        .await
        .into_iter()
        .enumerate()
        .collect();
    for (i, n) in &busy {
        for k in 0..3 {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("busy-{i}-{k}"), "labels": {"app": format!("busy-{i}")}},
                "spec": {"nodeName": n, "containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
            }))
            .expect("a pod");
            Api::<Pod>::namespaced(env.client.clone(), &env.namespace)
                .create(&PostParams::default(), &p)
                .await
                .expect("creating a pod");
        }
        pdb(&env, &format!("hold-{i}"), &format!("busy-{i}"), 3).await;
    }
    for (_, n) in &busy {
        wait_ready_pods(&env, n, 3).await;
    }
    let hold = Duration::from_secs(3);
    let one = maintain_all(&env, &busy[..1], hold).await;
    let twenty = maintain_all(&env, &busy[1..], hold).await;
    println!(
        "NodeMaintenance: 1 node drained in {one:?}; 20 nodes at once in {twenty:?} (each blocked {hold:?})"
    );
    // Side by side is asserted by maintain_all (all 20 blocked at once); the
    // times are a figure, not a bound: a loaded machine stretches both.
    op.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_answer() {
    let env = TestEnv::new("nm-bad").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());

    // Rejected at admission by the CRD's CEL rules.
    let empty = maintenance(&env, "empty", "", json!({}));
    let err = api
        .create(&PostParams::default(), &empty)
        .await
        .expect_err("empty nodeName is refused");
    assert!(err.to_string().contains("nodeName must not be empty"), "{err}");
    let bad_timeout = maintenance(&env, "badtimeout", "x", json!({"drainTimeout": "soon"}));
    let err = api
        .create(&PostParams::default(), &bad_timeout)
        .await
        .expect_err("a bad duration is refused");
    assert!(err.to_string().contains("drainTimeout"), "{err}");

    // A node that does not exist: Failed, saying so.
    let missing = maintenance(&env, "missing", &env.name("no-such-node"), json!({}));
    create_nm(&env, &missing).await;
    let failed = wait_phase(&env.client, &missing.name_any(), MaintenancePhase::Failed).await;
    let err = failed.status.and_then(|s| s.last_error).expect("lastError");
    assert!(
        err.contains("spec.nodeName") && err.contains("not found"),
        "{err}"
    );

    // nodeName cannot change.
    let moved = json!({"spec": {"nodeName": "elsewhere"}});
    let err = api
        .patch(
            &missing.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&moved),
        )
        .await
        .expect_err("nodeName is immutable");
    // The Node Maintenance Operator's words.
    assert!(
        err.to_string().contains("updating spec.NodeName isn't allowed"),
        "{err}"
    );

    // A second NodeMaintenance for a node: Failed, naming the first.
    let target = env.create_kwok_nodes(1, &[]).await.remove(0);
    let first = maintenance(&env, "first", &target, json!({}));
    create_nm(&env, &first).await;
    wait_phase(&env.client, &first.name_any(), MaintenancePhase::Succeeded).await;
    let second = maintenance(&env, "second", &target, json!({}));
    create_nm(&env, &second).await;
    let failed = wait_phase(&env.client, &second.name_any(), MaintenancePhase::Failed).await;
    let err = failed.status.and_then(|s| s.last_error).expect("lastError");
    assert!(err.contains(&first.name_any()), "{err}");
    // Deleting the failed second one leaves the first one's maintenance alone.
    api.delete(&second.name_any(), &DeleteParams::default())
        .await
        .expect("deleting");
    wait_gone(&env.client, &second.name_any()).await;
    assert!(
        cordoned(&node(&env, &target).await),
        "the first maintenance still holds the node"
    );
    op.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_example_applies_unchanged_and_works() {
    let env = TestEnv::new("nm-seed").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    // The seed names node02: create it (for this test only).
    env.create_kwok_node("node02", &[]).await;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/samples/nodemaintenance-kubevirt.yaml"
    ))
    .expect("the sample");
    let seed: kubevirt::NodeMaintenance = serde_norway::from_str(&text).expect("the seed parses");
    let api: Api<kubevirt::NodeMaintenance> = Api::all(env.client.clone());
    let _ = api.delete("nodemaintenance-xyz", &DeleteParams::default()).await;
    api.create(&PostParams::default(), &seed)
        .await
        .expect("the seed example applies unchanged");
    // The label only scopes this test's operator to it (tests share one cluster).
    let label = json!({"metadata": {"labels": {RUN_LABEL: env.id}}});
    api.patch(
        "nodemaintenance-xyz",
        &PatchParams::default(),
        &Patch::Merge(&label),
    )
    .await
    .expect("labelling");
    let done = wait_for("the seed NodeMaintenance to succeed", TIMEOUT, || async {
        match api.get("nodemaintenance-xyz").await {
            Ok(nm) if nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) => {
                Probe::Done(nm)
            }
            Ok(nm) => Probe::NotYet(format!("{:?}", nm.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    assert_eq!(done.spec.reason.as_deref(), Some("Test node maintenance"));
    assert!(cordoned(&node(&env, "node02").await));
    api.delete("nodemaintenance-xyz", &DeleteParams::default())
        .await
        .expect("deleting");
    wait_for("the seed NodeMaintenance to be gone", TIMEOUT, || async {
        match api.get_opt("nodemaintenance-xyz").await {
            Ok(None) => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    assert!(!cordoned(&node(&env, "node02").await));
    op.stop().await;
    env.cleanup().await;
}

/// A maintenance starts draining a guarded node (its PDB keeps it draining);
/// right after (within the same second, where creation times tie) and again
/// a few seconds later, a second one names the same node. The first keeps
/// the node; each later one is Failed naming it and never touches the node,
/// also once the first is deleted, which ends the maintenance completely.
async fn first_come_keeps_the_node(test: &str, first: &str, later: &str) {
    let env = TestEnv::new(test).await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let target = guarded_node(&env).await;
    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let original = maintenance(&env, first, &target, json!({}));
    create_nm(&env, &original).await;
    let original = original.name_any();
    wait_for("the first maintenance draining", TIMEOUT, || async {
        match api.get(&original).await {
            Ok(nm) if nm.status.as_ref().and_then(|s| s.eviction_pods).is_some() => Probe::Done(()),
            Ok(nm) => Probe::NotYet(format!("{:?}", nm.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let duplicate = maintenance(&env, later, &target, json!({}));
    create_nm(&env, &duplicate).await;
    let duplicate = duplicate.name_any();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let late = maintenance(&env, &format!("{later}-late"), &target, json!({}));
    create_nm(&env, &late).await;
    let late = late.name_any();
    for name in [&duplicate, &late] {
        let failed = wait_phase(&env.client, name, MaintenancePhase::Failed).await;
        let err = failed.status.and_then(|s| s.last_error).unwrap_or_default();
        assert!(
            err.contains(&original),
            "{name} fails naming the first, {original}: {err}"
        );
    }
    // A while later the first still holds the node.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = api.get(&original).await.expect("the first maintenance");
    assert_eq!(
        held.status.as_ref().and_then(|s| s.phase),
        Some(MaintenancePhase::Running),
        "the first maintenance keeps draining: {:?}",
        held.status
    );
    assert!(cordoned(&node(&env, &target).await));

    // Deleting the first ends the maintenance though the duplicates exist.
    api.delete(&original, &DeleteParams::default())
        .await
        .expect("deleting the first maintenance");
    wait_gone(&env.client, &original).await;
    wait_for("the node released", TIMEOUT, || async {
        let n = node(&env, &target).await;
        let lease = Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases")
            .get_opt(&format!("node-{target}"))
            .await;
        match (cordoned(&n), taint_keys(&n).is_empty(), lease) {
            (false, true, Ok(None)) => Probe::Done(()),
            (cordon, untainted, lease) => Probe::NotYet(format!(
                "cordoned {cordon}, untainted {untainted}, lease {:?}",
                lease.map(|l| l.map(|l| l.spec))
            )),
        }
    })
    .await;
    // And stays released: the duplicates do not take the node over.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = node(&env, &target).await;
    assert!(!cordoned(&n), "a duplicate cordoned the node again");
    for name in [&duplicate, &late] {
        let nm = api.get(name).await.expect("the duplicate");
        assert_eq!(
            nm.status.as_ref().and_then(|s| s.phase),
            Some(MaintenancePhase::Failed),
            "{name} stays Failed"
        );
    }
    op.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_maintenance_keeps_the_node_when_the_duplicate_sorts_first() {
    first_come_keeps_the_node("nm-first", "test-maintenance", "test-duplicate").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_maintenance_keeps_the_node_when_the_duplicate_sorts_last() {
    first_come_keeps_the_node("nm-first-b", "test-duplicate", "test-maintenance").await;
}

/// The NoSchedule taints of `node` other than the unschedulable one, as written.
fn drain_taints(node: &Node) -> Vec<k8s_openapi::api::core::v1::Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        // node.kubernetes.io/* are the node lifecycle controller's (a new
        // kwok node is not-ready until kwok reports it, slower under load).
        .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
        .collect()
}

/// Parity with the Node Maintenance Operator: each group taints with its own
/// key (`medik8s.io/drain`, `kubevirt.io/drain`), with no value and no
/// timeAdded, exactly; `nm` names only the medik8s resource; Events are
/// found by `--field-selector involvedObject.kind=NodeMaintenance`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_group_taints_as_the_node_maintenance_operator_does() {
    let env = TestEnv::new("nm-taints").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let nodes = env.create_kwok_nodes(2, &[]).await;
    let m = maintenance(&env, "medik8s", &nodes[0], json!({}));
    create_nm(&env, &m).await;
    let kv: kubevirt::NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.kubevirt.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": env.name("kubevirt"), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": nodes[1], "reason": "test"},
    }))
    .expect("a kubevirt NodeMaintenance");
    let kv_api: Api<kubevirt::NodeMaintenance> = Api::all(env.client.clone());
    kv_api
        .create(&PostParams::default(), &kv)
        .await
        .expect("creating");
    wait_phase(&env.client, &m.name_any(), MaintenancePhase::Succeeded).await;
    wait_for("the kubevirt maintenance to succeed", TIMEOUT, || async {
        match kv_api.get(&kv.name_any()).await {
            Ok(nm) if nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) => {
                Probe::Done(())
            }
            Ok(nm) => Probe::NotYet(format!("{:?}", nm.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    for (node_name, key) in [(&nodes[0], "medik8s.io/drain"), (&nodes[1], "kubevirt.io/drain")] {
        let want = vec![k8s_openapi::api::core::v1::Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        }];
        assert_eq!(drain_taints(&node(&env, node_name).await), want, "{node_name}");
    }

    // Short names: `nm` is medik8s's alone.
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(env.client.clone());
    for (crd, want) in [
        ("nodemaintenances.nodemaintenance.medik8s.io", "nm"),
        ("nodemaintenances.nodemaintenance.kubevirt.io", "nmkv"),
    ] {
        let got = crds.get(crd).await.expect("the CRD").spec.names.short_names;
        assert_eq!(got, Some(vec![want.to_string()]), "{crd}");
    }

    // Events, as `kubectl get events --field-selector involvedObject.kind=NodeMaintenance` lists them.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(env.client.clone(), "default");
    let selector = format!(
        "involvedObject.kind=NodeMaintenance,involvedObject.name={}",
        m.name_any()
    );
    wait_for(
        "the maintenance's Events by involvedObject.kind",
        TIMEOUT,
        || async {
            match events.list(&ListParams::default().fields(&selector)).await {
                Ok(l) => {
                    let reasons: BTreeSet<String> = l.items.into_iter().filter_map(|e| e.reason).collect();
                    match reasons.contains("BeginMaintenance") && reasons.contains("SucceedMaintenance") {
                        true => Probe::Done(()),
                        false => Probe::NotYet(format!("{reasons:?}")),
                    }
                }
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    op.stop().await;
    env.cleanup().await;
}

/// Another remediation tool holds the node's Lease: the maintenance waits
/// (Running, LeaseHeld naming the holder, errorOnLeaseCount counting the
/// tries) without touching the node, and proceeds once the Lease is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_by_another_tool_makes_the_maintenance_wait() {
    let env = TestEnv::new("nm-lease").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let target = env.create_kwok_nodes(1, &[]).await.remove(0);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "medik8s-leases");
    let lease_name = format!("node-{target}");
    let held: Lease = serde_json::from_value(json!({
        "metadata": {"name": lease_name, "labels": {RUN_LABEL: env.id}},
        "spec": {
            "holderIdentity": "self-node-remediation",
            "leaseDurationSeconds": 3600,
            "acquireTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            "renewTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        },
    }))
    .expect("a Lease");
    // The namespace exists once any maintenance made a lease; make sure here.
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "medik8s-leases"}})).expect("a namespace");
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    leases
        .create(&PostParams::default(), &held)
        .await
        .expect("the other tool's lease");

    let m = maintenance(&env, "m", &target, json!({}));
    create_nm(&env, &m).await;
    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let waiting = wait_for("two tries refused by the held lease", TIMEOUT, || async {
        match api.get(&m.name_any()).await {
            Ok(nm) => {
                let s = nm.status.clone().unwrap_or_default();
                match (s.phase, s.error_on_lease_count) {
                    (Some(MaintenancePhase::Running), Some(n)) if n >= 2 => Probe::Done(s),
                    _ => Probe::NotYet(format!("{s:?}")),
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let err = waiting.last_error.unwrap_or_default();
    assert!(err.contains("self-node-remediation"), "{err}");
    let reason = waiting
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.reason)
        .collect::<Vec<_>>();
    assert!(reason.iter().any(|r| r == "LeaseHeld"), "{reason:?}");
    assert!(
        !cordoned(&node(&env, &target).await),
        "the node is left alone while waiting"
    );

    // The other tool is done: the maintenance takes the lease and drains.
    leases
        .delete(&lease_name, &DeleteParams::default())
        .await
        .expect("releasing the other tool's lease");
    wait_phase(&env.client, &m.name_any(), MaintenancePhase::Succeeded).await;
    assert!(cordoned(&node(&env, &target).await));
    let ours = leases.get(&lease_name).await.expect("the lease");
    assert_eq!(
        ours.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("node-maintenance")
    );
    api.delete(&m.name_any(), &DeleteParams::default())
        .await
        .expect("deleting");
    wait_gone(&env.client, &m.name_any()).await;
    op.stop().await;
    env.cleanup().await;
}

/// Chaos for maintenances: 50 NodeMaintenances on 20 PDB-guarded nodes
/// (two or three per node, so duplicates race), deleted and recreated at
/// random from a seeded schedule for 20 s. Sampled throughout: no node is
/// held by two live maintenances, and a node whose live maintenance
/// Succeeded is cordoned. After all are deleted: no finalizer, cordon,
/// taint or lease of nodewarden is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_maintenances_deleted_and_recreated_at_random_leaves_nothing_behind() {
    use rand::{Rng, SeedableRng};

    const NODES: usize = 20;
    const MAINTENANCES: usize = 50;
    let env = TestEnv::new("nm-storm").await;
    let op = env.start_operator(MaintenanceConfig::default()).await;
    let nodes = env.create_kwok_nodes(NODES, &[]).await;
    deployment(&env, "storm", 40).await;
    pdb(&env, "storm", "storm", 36).await;
    let seed = support::seed("maintenance storm");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let target = |i: usize| nodes[i % NODES].clone();
    let name = |i: usize| env.name(&format!("storm-{i}"));
    for i in 0..MAINTENANCES {
        create_nm(
            &env,
            &maintenance(&env, &format!("storm-{i}"), &target(i), json!({})),
        )
        .await;
    }

    // The sampler: live (not being deleted) maintenances per node.
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn(support::maintenances::sample_maintenances(
        env.client.clone(),
        nodes.iter().cloned().collect(),
        stop.clone(),
    ));

    // The storm: every 100 ms one maintenance is deleted, or created again.
    let storm_end = Instant::now() + Duration::from_secs(20);
    let (mut deleted, mut recreated) = (0, 0);
    while Instant::now() < storm_end {
        let i = rng.random_range(0..MAINTENANCES);
        let live = match api.get_opt(&name(i)).await {
            Ok(Some(m)) => Some(m.metadata.deletion_timestamp.is_none()),
            Ok(None) => None,
            Err(_) => Some(false),
        };
        match live {
            Some(true) => {
                deleted += usize::from(api.delete(&name(i), &DeleteParams::default()).await.is_ok())
            }
            Some(false) => {}
            None => {
                let nm = maintenance(&env, &format!("storm-{i}"), &target(i), json!({}));
                recreated += usize::from(api.create(&PostParams::default(), &nm).await.is_ok());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let phases = api
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .map(|l| {
            let mut counts = std::collections::BTreeMap::new();
            for m in l.items {
                *counts
                    .entry(format!("{:?}", m.status.and_then(|s| s.phase)))
                    .or_insert(0) += 1;
            }
            counts
        })
        .unwrap_or_default();
    println!("maintenance storm: {deleted} deleted, {recreated} created again; phases at the end {phases:?}");

    // Everything deleted: nothing of nodewarden's is left.
    let _ = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&env.run_selector()),
        )
        .await;
    wait_for("every maintenance gone (finalizers done)", TIMEOUT, || async {
        match api.list(&ListParams::default().labels(&env.run_selector())).await {
            Ok(l) if l.items.is_empty() => Probe::Done(()),
            Ok(l) => Probe::NotYet(format!("{} left", l.items.len())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    stop.cancel();
    let (samples, breaches) = sampler.await.expect("the sampler");
    let leases = Api::<Lease>::namespaced(env.client.clone(), "medik8s-leases");
    wait_for("every node released", TIMEOUT, || async {
        let mut held = Vec::new();
        for n in &nodes {
            let node = node(&env, n).await;
            let lease = leases.get_opt(&format!("node-{n}")).await.ok().flatten();
            if cordoned(&node) || !taint_keys(&node).is_empty() || lease.is_some() {
                held.push(n.clone());
            }
        }
        if held.is_empty() {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("still held: {held:?}"))
        }
    })
    .await;
    println!("maintenance storm: {samples} samples, breaches {breaches:?}");
    assert!(samples > 20, "the sampler ran ({samples} samples)");
    assert!(breaches.is_empty(), "{breaches:#?}");
    assert!(op.is_running(), "the operator kept running");
    op.stop().await;
    env.cleanup().await;
}

/// A drain that succeeded keeps watching its node's pods for a while, and a
/// rollout about to delete the node reads them there instead of listing the
/// node's pods again: a pod bound after the drain shows up, and none shows
/// once the drain is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_succeeded_drain_still_shows_the_pods_bound_since() {
    use nodewarden::drain::{DrainEngine, DrainOptions, DrainOutcome};
    use nodewarden::runtime::leader::{LeaderElectionConfig, LeaderElector};
    use tokio_util::sync::CancellationToken;

    let env = TestEnv::new("drain-watch").await;
    let elector = LeaderElector::new(
        env.client.clone(),
        LeaderElectionConfig::new(env.namespace.clone(), "drain-watch", "only"),
    )
    .expect("a valid config");
    let leader = elector.handle();
    let shutdown = CancellationToken::new();
    tokio::spawn(elector.run(shutdown.clone()));
    wait_for("leadership", TIMEOUT, || async {
        if leader.is_leader() {
            Probe::Done(())
        } else {
            Probe::NotYet("not leading yet".into())
        }
    })
    .await;

    let node = env.create_kwok_nodes(1, &[]).await.remove(0);
    let engine = DrainEngine::new(env.client.clone(), leader);
    let owner = "test/drain-watch";
    assert!(engine.pods_since_success(&node).is_none(), "no drain yet");
    engine.ensure(&node, owner, DrainOptions::default(), std::sync::Arc::new(|| {}));
    wait_for("the empty node drained", TIMEOUT, || async {
        match engine.status(&node).map(|s| s.outcome) {
            Some(DrainOutcome::Succeeded) => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        engine.pods_since_success(&node).map(|p| p.len()),
        Some(0),
        "the drain's watch shows the node empty"
    );

    bare_pod(&env, "late", &node).await;
    wait_for("the late pod in the drain's watch", TIMEOUT, || async {
        let names: Vec<String> = engine
            .pods_since_success(&node)
            .unwrap_or_default()
            .iter()
            .map(|p| p.name_any())
            .collect();
        if names == ["late"] {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("{names:?}"))
        }
    })
    .await;

    engine.stop(&node, owner);
    assert!(
        engine.pods_since_success(&node).is_none(),
        "a stopped drain shows nothing: the caller lists the pods"
    );
    shutdown.cancel();
}

/// The finalizer the Node Maintenance Operator puts on every NodeMaintenance it begins.
const NMO_FINALIZER: &str = "foregroundDeleteNodeMaintenance";

/// Leaves `node` as the Node Maintenance Operator leaves a node in
/// maintenance (cordoned, both taints, the exclude label), and creates a
/// NodeMaintenance for it as that operator writes it: its finalizer, and a
/// `Succeeded` status.
async fn as_nmo_left_it(env: &TestEnv, name: &str, node_name: &str) -> medik8s::NodeMaintenance {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut taints: Vec<serde_json::Value> = node(env, node_name)
        .await
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .map(|t| json!(t))
        .collect();
    taints.push(json!({"key": "medik8s.io/drain", "effect": "NoSchedule"}));
    taints.push(json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}));
    let patch = json!({
        "metadata": {"labels": {"remediation.medik8s.io/exclude-from-remediation": "true"}},
        "spec": {"unschedulable": true, "taints": taints},
    });
    nodes
        .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the node as NMO leaves it");
    let mut nm = maintenance(env, name, node_name, json!({}));
    nm.metadata.finalizers = Some(vec![NMO_FINALIZER.to_string()]);
    create_nm(env, &nm).await;
    let status = json!({"status": {
        "phase": "Succeeded", "drainProgress": 100, "totalpods": 0, "evictionPods": 0,
        "pendingPods": [], "lastUpdate": "2026-01-01T00:00:00Z",
    }});
    Api::<medik8s::NodeMaintenance>::all(env.client.clone())
        .patch_status(&nm.name_any(), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the status as NMO writes it")
}

/// The node carries nothing of a maintenance: schedulable, neither taint,
/// no exclude label.
fn restored(node: &Node) -> Result<(), String> {
    let keys = taint_keys(node);
    let excluded = node
        .labels()
        .contains_key("remediation.medik8s.io/exclude-from-remediation");
    match cordoned(node)
        || keys.contains("medik8s.io/drain")
        || keys.contains("node.kubernetes.io/unschedulable")
        || excluded
    {
        false => Ok(()),
        true => Err(format!(
            "cordoned {}, taints {keys:?}, excluded {excluded}",
            cordoned(node)
        )),
    }
}

async fn wait_restored(env: &TestEnv, node_name: &str) {
    wait_for(&format!("{node_name} restored"), TIMEOUT, || async {
        match restored(&node(env, node_name).await) {
            Ok(()) => Probe::Done(()),
            Err(e) => Probe::NotYet(e),
        }
    })
    .await
}

/// After a switch from the Node Maintenance Operator, its NodeMaintenances
/// are finished by nodewarden: one it was still holding is taken over and,
/// once deleted, undone whole and let go (both finalizers); one deleted
/// while no operator ran (Terminating on NMO's finalizer alone) is undone
/// and let go as soon as nodewarden starts. The uncordon is an
/// `UncordonNode` Event on the node, as NMO records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenances_the_node_maintenance_operator_began_are_undone_and_deleted() {
    let env = TestEnv::new("nm-nmo").await;
    support::install_crds(&env.client).await;
    let nodes = env.create_kwok_nodes(2, &[]).await;
    let (held, deleted) = (&nodes[0], &nodes[1]);
    let api: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let kept = as_nmo_left_it(&env, "held", held).await;
    let gone = as_nmo_left_it(&env, "deleted", deleted).await;
    api.delete(&gone.name_any(), &DeleteParams::default())
        .await
        .expect("deleting");
    let terminating = api.get(&gone.name_any()).await.expect("held by NMO's finalizer");
    assert!(terminating.metadata.deletion_timestamp.is_some());

    let op = env.start_operator(MaintenanceConfig::default()).await;
    wait_gone(&env.client, &gone.name_any()).await;
    wait_restored(&env, deleted).await;

    // Taken over: nodewarden's finalizer beside NMO's, the node still held.
    wait_for("the held maintenance taken over", TIMEOUT, || async {
        match api.get(&kept.name_any()).await {
            Ok(nm)
                if nm
                    .finalizers()
                    .iter()
                    .any(|f| f == "nodewarden.dev/node-maintenance")
                    && nm.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) =>
            {
                Probe::Done(())
            }
            Ok(nm) => Probe::NotYet(format!(
                "finalizers {:?}, status {:?}",
                nm.finalizers(),
                nm.status
            )),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    assert!(restored(&node(&env, held).await).is_err(), "still in maintenance");
    api.delete(&kept.name_any(), &DeleteParams::default())
        .await
        .expect("deleting");
    wait_gone(&env.client, &kept.name_any()).await;
    wait_restored(&env, held).await;

    for node_name in [held, deleted] {
        env.wait_events("Node", node_name, &["UncordonNode"]).await;
    }
    for nm in [&kept, &gone] {
        env.wait_events("NodeMaintenance", &nm.name_any(), &["RemovedMaintenance"])
            .await;
    }
    env.wait_events("NodeMaintenance", &kept.name_any(), &["TakenOverMaintenance"])
        .await;
    op.stop().await;
    env.cleanup().await;
}
