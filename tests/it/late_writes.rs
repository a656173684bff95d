//! Writes that land late, after a leader change, are refused by the API
//! server: the fence abandons a leader's stuck write when its term lapses,
//! but cannot recall it, so each write that matters carries the precondition
//! that makes its late arrival harmless.
//!
//! Each test makes a write exactly as its controller builds it (the same pure
//! builders), from the object as that leader read it; the leader is cut off
//! mid-write (its write held on the way), a successor takes the lease and
//! acts, then the held write is delivered: the API server answers 409
//! Conflict, and the object shows the successor's state.

use crate::support;

use std::future::Future;

use crate::support::late::{FadingLeader, assert_refused, successor};
use crate::support::{RUN_LABEL, TestEnv};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::node_maintenance::{MaintenancePhase, NodeMaintenanceStatus, medik8s};
use nodewarden::api::plan::{Plan, PlanStatus};
use nodewarden::api::sip::{SIPCluster, labels};
use nodewarden::controllers::node_maintenance::status_patch;
use nodewarden::controllers::node_version::{DONOR_ANNOTATION, pairing_patches};
use nodewarden::controllers::plan::plan_status_write;
use nodewarden::controllers::sip_cluster::{claim_labels, host_patch};
use nodewarden::runtime::store::Key;
use nodewarden::sip::schedule::HostState;
use serde_json::json;

/// The successor's own write: read, decide, write, again on a conflict (a
/// kwok node's heartbeat may change it between the read and the write).
async fn act<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    for _ in 0..20 {
        match attempt().await {
            Ok(done) => return done,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("{what}: {e}"),
        }
    }
    panic!("{what}: conflicted 20 times in a row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_pairing_is_refused_after_the_successor_paired_the_heir() {
    let env = TestEnv::new("late-pairing").await;
    let names = env.create_kwok_nodes(3, &[]).await;
    let (donor, other_donor, heir) = (&names[0], &names[1], &names[2]);
    let nodes: Api<Node> = Api::all(env.client.clone());
    let read = |name: &String| {
        let nodes = nodes.clone();
        let name = name.clone();
        async move { nodes.get(&name).await.expect("reading a node") }
    };
    let (donor_seen, heir_seen) = (read(donor).await, read(heir).await);

    let old = FadingLeader::start(&env.namespace, "old").await;
    let (heir_patch, _) = pairing_patches(&donor_seen, &heir_seen, None);
    let old_nodes: Api<Node> = Api::all(old.client());
    old.write_abandoned(
        "pairing",
        old_nodes.patch(heir, &PatchParams::default(), &Patch::Merge(&heir_patch)),
    )
    .await;

    let (client, task) = successor(&env.namespace, "new").await;
    let new_nodes: Api<Node> = Api::all(client);
    act("the successor's pairing", || async {
        let (other, heir_now) = (read(other_donor).await, read(heir).await);
        let (patch, _) = pairing_patches(&other, &heir_now, None);
        new_nodes
            .patch(heir, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    })
    .await;

    assert_refused("pairing", &old.deliver_late().await, 1);
    let heir_now = read(heir).await;
    assert_eq!(
        heir_now.annotations().get(DONOR_ANNOTATION),
        Some(other_donor),
        "the heir keeps the successor's pairing"
    );
    task.abort();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_node_maintenance_status_is_refused_after_the_successor_wrote_one() {
    let env = TestEnv::new("late-nm").await;
    support::install_crds(&env.client).await;
    let name = env.name("maintenance");
    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let nm: medik8s::NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": env.name("node"), "reason": "late writes"},
    }))
    .expect("a NodeMaintenance");
    let seen = nms
        .create(&PostParams::default(), &nm)
        .await
        .expect("creating it");
    let status = |phase: MaintenancePhase, error: Option<&str>| NodeMaintenanceStatus {
        phase: Some(phase),
        last_error: error.map(str::to_owned),
        ..Default::default()
    };

    let old = FadingLeader::start(&env.namespace, "old").await;
    let old_nms: Api<medik8s::NodeMaintenance> = Api::all(old.client());
    let late = status_patch(
        &status(MaintenancePhase::Failed, Some("drain timed out")),
        seen.resource_version().as_deref(),
    );
    old.write_abandoned(
        "NodeMaintenance status",
        old_nms.patch_status(&name, &PatchParams::default(), &Patch::Merge(&late)),
    )
    .await;

    let (client, task) = successor(&env.namespace, "new").await;
    let new_nms: Api<medik8s::NodeMaintenance> = Api::all(client);
    act("the successor's status", || async {
        let now = nms.get(&name).await?;
        let patch = status_patch(
            &status(MaintenancePhase::Succeeded, None),
            now.resource_version().as_deref(),
        );
        new_nms
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
    })
    .await;

    assert_refused("NodeMaintenance status", &old.deliver_late().await, 1);
    let now = nms.get(&name).await.expect("reading it");
    let now = now.status.expect("a status");
    assert_eq!(
        now.phase,
        Some(MaintenancePhase::Succeeded),
        "the successor's phase stays"
    );
    assert_eq!(now.last_error, None, "and nothing of the late status");
    nms.delete(&name, &Default::default()).await.expect("deleting it");
    task.abort();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_plan_status_is_refused_after_the_successor_wrote_one() {
    let env = TestEnv::new("late-plan").await;
    support::install_crds(&env.client).await;
    let spec = json!({
        "concurrency": 1, "version": "v2",
        "nodeSelector": {"matchLabels": {"late": "writes"}},
        "upgrade": support::plans::upgrade("example.invalid/upgrade"),
    });
    support::plans::create_plan(&env, "fleet", json!({}), spec)
        .await
        .expect("creating the plan");
    let plans: Api<Plan> = Api::namespaced(env.client.clone(), &env.namespace);
    let seen = plans.get("fleet").await.expect("reading the plan");
    let applying = |node: &str| PlanStatus {
        applying: vec![node.to_owned()],
        ..Default::default()
    };

    let old = FadingLeader::start(&env.namespace, "old").await;
    let old_plans: Api<Plan> = Api::namespaced(old.client(), &env.namespace);
    let late = plan_status_write(&seen, applying("node-a"));
    old.write_abandoned(
        "Plan status",
        old_plans.replace_status("fleet", &PostParams::default(), &late),
    )
    .await;

    let (client, task) = successor(&env.namespace, "new").await;
    let new_plans: Api<Plan> = Api::namespaced(client, &env.namespace);
    act("the successor's status", || async {
        let now = plans.get("fleet").await?;
        new_plans
            .replace_status(
                "fleet",
                &PostParams::default(),
                &plan_status_write(&now, applying("node-b")),
            )
            .await
    })
    .await;

    assert_refused("Plan status", &old.deliver_late().await, 1);
    let now = plans.get("fleet").await.expect("reading the plan");
    assert_eq!(
        now.status.expect("a status").applying,
        vec!["node-b".to_owned()],
        "the successor's choice of node stays"
    );
    task.abort();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_host_claim_is_refused_after_the_successor_claimed_the_host() {
    let env = TestEnv::new("late-claim").await;
    support::install_crds(&env.client).await;
    support::metal3::install_metal3_crd(&env.client).await;
    support::sip::create_host(&env, "host-0", "r1", "worker", "10.0.0.10").await;
    let hosts = support::sip::hosts_api(&env);
    let seen = hosts.get("host-0").await.expect("reading the host");
    let claim = |cluster: &str, version: Option<String>| {
        let key: Key<SIPCluster> = Key::new(Some(&env.namespace), cluster);
        host_patch(
            claim_labels(&key, "worker", HostState::Active),
            version.as_deref(),
        )
    };

    let old = FadingLeader::start(&env.namespace, "old").await;
    let old_hosts: Api<BareMetalHost> = Api::namespaced(old.client(), &env.namespace);
    let late = claim("cluster-a", seen.resource_version());
    old.write_abandoned(
        "host claim",
        old_hosts.patch("host-0", &PatchParams::default(), &Patch::Merge(&late)),
    )
    .await;

    let (client, task) = successor(&env.namespace, "new").await;
    let new_hosts: Api<BareMetalHost> = Api::namespaced(client, &env.namespace);
    act("the successor's claim", || async {
        let now = hosts.get("host-0").await?;
        new_hosts
            .patch(
                "host-0",
                &PatchParams::default(),
                &Patch::Merge(&claim("cluster-b", now.resource_version())),
            )
            .await
    })
    .await;

    assert_refused("host claim", &old.deliver_late().await, 1);
    let now = hosts.get("host-0").await.expect("reading the host");
    assert_eq!(
        now.labels().get(labels::CLUSTER_NAME).map(String::as_str),
        Some("cluster-b"),
        "the host stays claimed by the successor's cluster"
    );
    task.abort();
    env.cleanup().await;
}
