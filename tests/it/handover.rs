//! The way back to the upstream operators: nodewarden acts (a maintenance
//! someone made, a Plan's cordon, a Plan's drain), its pods go (as with
//! `helm uninstall`), `nodewarden handover` runs as the README says, and
//! nothing of nodewarden's is left on any object: no finalizer nobody
//! removes, no cordon only nodewarden would lift.

use crate::support;

use std::process::Command;
use std::time::Duration;

use crate::support::admission::maintenance;
use crate::support::plans::{TIMEOUT, create_plan, plans, upgrade};
use crate::support::{Probe, TestEnv, seen, wait_for};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use nodewarden::api::node_maintenance::{MaintenancePhase, medik8s};
use serde_json::json;

/// Pods of a Job that do not tolerate it stay Pending: the Job runs on.
async fn hold(env: &TestEnv, node: &str) {
    let taints = json!({"spec": {"taints": [{"key": "example.com/hold", "effect": "NoSchedule"}]}});
    Api::<Node>::all(env.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&taints))
        .await
        .expect("tainting");
}

fn cordoned(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// What of nodewarden's `o` still carries: its finalizers, annotations and labels.
fn marks<K: Resource>(o: &K) -> Vec<String> {
    let own = |k: &String| k.starts_with("nodewarden.dev/");
    o.finalizers()
        .iter()
        .chain(o.annotations().keys())
        .chain(o.labels().keys())
        .filter(|k| own(k))
        .cloned()
        .collect()
}

/// Waits until node `name` satisfies `ok`, described by `what`.
async fn wait_node(env: &TestEnv, name: &str, what: &str, ok: fn(&Node) -> bool) -> Node {
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_for(&format!("{name}: {what}"), TIMEOUT, || async {
        match nodes.get(name).await {
            Ok(n) if ok(&n) => Probe::Done(n),
            Ok(n) => Probe::NotYet(format!("{:?}", n.metadata.annotations)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_handover_nothing_of_nodewarden_is_left_on_any_object() {
    let env = TestEnv::new("handover").await;
    let nodes = env.create_kwok_nodes(3, &[]).await;
    let (by_hand, by_cordon, by_drain) = (&nodes[0], &nodes[1], &nodes[2]);
    for n in [by_cordon, by_drain] {
        hold(&env, n).await;
    }
    let label = |n: &str, role: &str| {
        let patch = json!({"metadata": {"labels": {"handover": role}}});
        let api: Api<Node> = Api::all(env.client.clone());
        let n = n.to_string();
        async move {
            api.patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("labelling")
        }
    };
    label(by_cordon, "cordon").await;
    label(by_drain, "drain").await;
    let operator = env.start_operator(Default::default()).await;

    // Acting: a maintenance someone made, a Plan's cordon, a Plan's drain.
    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    nms.create(&PostParams::default(), &maintenance(&env, "by-hand", by_hand))
        .await
        .expect("a maintenance");
    for (name, role, prep) in [
        ("cordon", "cordon", json!({"cordon": true})),
        ("drain", "drain", json!({"drain": {"force": true}})),
    ] {
        let mut spec = json!({
            "concurrency": 1, "version": "v2",
            "nodeSelector": {"matchLabels": {"handover": role}},
            "upgrade": upgrade("example.invalid/upgrade"),
        });
        for (k, v) in prep.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        create_plan(&env, name, json!({}), spec).await.expect("a plan");
    }
    wait_node(&env, by_hand, "in maintenance", cordoned).await;
    wait_node(&env, by_cordon, "cordoned by its Plan", cordoned).await;
    wait_node(&env, by_drain, "drained by its Plan", cordoned).await;
    wait_for("the maintenance Succeeded", TIMEOUT, || async {
        match nms.get(&env.name("by-hand")).await {
            Ok(m) if m.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) => {
                Probe::Done(())
            }
            Ok(m) => Probe::NotYet(format!("{:?}", m.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;

    // nodewarden's pods go; then the handover, scoped as this nodewarden was.
    operator.stop().await;
    let selector = env.run_selector();
    let out = Command::new(support::nodewarden_binary())
        .args(["handover", "--namespace", &env.namespace])
        .args(["--node-selector", &selector, "--object-selector", &selector])
        .env("KUBECONFIG", &support::control_plane().kubeconfig)
        .output()
        .expect("running nodewarden handover");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{said}");

    // Nothing of nodewarden's left, on every kind it touched.
    let list = ListParams::default().labels(&selector);
    let mut left: Vec<String> = Vec::new();
    let node_api: Api<Node> = Api::all(env.client.clone());
    for n in node_api.list(&list).await.expect("nodes").items {
        left.extend(
            marks(&n)
                .into_iter()
                .map(|m| format!("Node {}: {m}", n.name_any())),
        );
    }
    for m in nms.list(&list).await.expect("maintenances").items {
        left.extend(
            marks(&m)
                .into_iter()
                .map(|k| format!("NodeMaintenance {}: {k}", m.name_any())),
        );
    }
    for p in plans(&env, &env.namespace)
        .list(&list)
        .await
        .expect("plans")
        .items
    {
        left.extend(
            marks(&p)
                .into_iter()
                .map(|k| format!("Plan {}: {k}", p.name_any())),
        );
    }
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    for j in jobs.list(&list).await.expect("jobs").items {
        left.extend(
            marks(&j)
                .into_iter()
                .map(|k| format!("Job {}: {k}", j.name_any())),
        );
    }
    assert!(left.is_empty(), "nodewarden's marks left: {left:#?}");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    assert!(
        leases.get_opt("nodewarden").await.expect("the Lease").is_none(),
        "the leader Lease is gone"
    );

    // The Plans' nodes are schedulable again (upstream's Jobs cordon and drain
    // themselves); nodewarden's own drain is gone.
    for n in [by_cordon, by_drain] {
        let node = node_api.get(n).await.expect("the node");
        assert!(!cordoned(&node), "{n} uncordoned");
    }
    let own: Vec<String> = nms
        .list(&list)
        .await
        .expect("maintenances")
        .items
        .iter()
        .map(|m| m.name_any())
        .filter(|m| m.starts_with("plan-"))
        .collect();
    assert!(own.is_empty(), "the Plan's own drain is deleted: {own:?}");
    // The maintenance someone made goes on for the upstream operator (its node
    // cordoned), and nothing holds its deletion.
    assert!(cordoned(&node_api.get(by_hand).await.expect("the node")));
    nms.delete(&env.name("by-hand"), &DeleteParams::default())
        .await
        .expect("deleting the maintenance");
    wait_for("the maintenance gone", Duration::from_secs(10), || async {
        match nms.get_opt(&env.name("by-hand")).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(m)) => Probe::NotYet(format!("finalizers {:?}", m.finalizers())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    env.cleanup().await;
}

/// A nodewarden run with `--lease-name` and `--webhook-secret` of its own:
/// the handover given the same names deletes those, and leaves objects of the
/// default names alone (another nodewarden's, in the same namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_deletes_the_lease_and_secret_it_is_named() {
    let env = TestEnv::new("handover-names").await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    for name in ["nodewarden", "nodewarden-blue"] {
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Lease");
        leases
            .create(&PostParams::default(), &lease)
            .await
            .expect("creating a Lease");
    }
    for name in ["nodewarden-webhook-tls", "nodewarden-blue-tls"] {
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Secret");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating a Secret");
    }
    // Scoped to nothing of the cluster's: only its own state is at stake.
    let nothing = "nodewarden.dev/handover-names=none";
    let out = Command::new(support::nodewarden_binary())
        .args(["handover", "--namespace", &env.namespace])
        .args([
            "--lease-name",
            "nodewarden-blue",
            "--webhook-secret",
            "nodewarden-blue-tls",
        ])
        .args(["--node-selector", nothing, "--object-selector", nothing])
        .env("KUBECONFIG", &support::control_plane().kubeconfig)
        .output()
        .expect("running nodewarden handover");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ns = &env.namespace;
    assert!(
        said.contains(&format!("Lease {ns}/nodewarden-blue deleted")),
        "{said}"
    );
    assert!(
        said.contains(&format!("Secret {ns}/nodewarden-blue-tls deleted")),
        "{said}"
    );
    assert!(
        leases
            .get_opt("nodewarden-blue")
            .await
            .expect("the Lease")
            .is_none()
    );
    assert!(
        secrets
            .get_opt("nodewarden-blue-tls")
            .await
            .expect("the Secret")
            .is_none()
    );
    assert!(
        leases.get_opt("nodewarden").await.expect("the Lease").is_some(),
        "another's Lease kept"
    );
    assert!(
        secrets
            .get_opt("nodewarden-webhook-tls")
            .await
            .expect("the Secret")
            .is_some(),
        "another's Secret kept"
    );
    env.cleanup().await;
}
