//! The chaos rollout on GCP and on Azure: three `nodewarden run` replicas
//! (as the chart's Deployment runs them: `--cloud gcp|azure` with its
//! flags, tokens from the metadata server or Azure AD) roll nine nodes of
//! discovered groups on the clouds' fakes while the leader is SIGKILLed
//! with an instance on its way and the cloud is paused for 15 s. The
//! outage shows in the NodeVersion's Degraded condition and the leader's
//! cloud error metric; afterwards the rollout completes, Degraded clears,
//! and nothing leaked.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use nodewarden::api::update::{NodeVersion, PendingNode, condition, reason};

use crate::support::TestEnv;
use crate::support::cloud_chaos::{Seen, spawn_faults, start_replicas};
use crate::support::discovery::{create_budget_node_version, wait_discovered};
use crate::support::replicas::Replicas;
use crate::support::rollout::*;

/// What every replica's environment has: no trace exporter (no collector here).
fn base_env() -> Vec<(String, String)> {
    vec![("OTEL_EXPORTER_OTLP_ENDPOINT".into(), String::new())]
}

/// Rolls the test's 9 nodes to `image` through the faults; returns what the
/// faults showed, the checker's findings asserted empty.
async fn roll_through_faults(
    env: &TestEnv,
    replicas: Replicas,
    lease: &str,
    image: &str,
    cloud_pid: u32,
) -> (Seen, Replicas) {
    let checker = Checker::start(env, 9, 2);
    let replicas = Arc::new(tokio::sync::Mutex::new(replicas));
    let faults = spawn_faults(
        env,
        replicas.clone(),
        lease,
        image,
        cloud_pid,
        Duration::from_secs(15),
    );
    let took = roll_nodes(env, 9, image, None).await;
    let seen = faults.await.expect("the fault task");
    let found = checker.finish().await;
    let replicas = Arc::try_unwrap(replicas)
        .ok()
        .expect("the fault task is done")
        .into_inner();
    assert!(
        found.is_empty(),
        "invariants breached: {found:#?}\n{}",
        replicas.tail_logs()
    );
    assert!(
        seen.degraded.is_some(),
        "the NodeVersion said Degraded=True CloudError while the cloud was paused\n{}",
        replicas.tail_logs()
    );
    assert!(
        seen.cloud_errors > 0.0,
        "the leader counted cloud errors while the cloud was paused"
    );
    println!("9 nodes replaced through a leader kill and a 15 s cloud outage in {took:?}");
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    support::wait_for_condition(
        &versions,
        &env.name("version"),
        (condition::DEGRADED, "False", reason::AS_EXPECTED),
        Duration::from_secs(30),
    )
    .await;
    wait_none_left::<PendingNode>(env).await;
    (seen, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_rolls_through_a_leader_kill_and_a_compute_outage() {
    use crate::support::gcp::*;
    const OLD: &str = "projects/constellation-images/global/images/constellation-v2-23-0";
    const NEW: &str = "projects/constellation-images/global/images/constellation-v2-24-0";
    let fake = GceFake::start();
    let env = TestEnv::new("gcp-ha").await;
    support::install_crds(&env.client).await;
    let cluster = GcpCluster::start(&env, &fake, OLD).await;
    create_budget_node_version(&env, OLD, 2).await;
    workload(&env, "web", 4).await;

    let (lease, version) = (format!("nodewarden-{}", env.id), env.name("version"));
    let args = [
        "--cloud",
        "gcp",
        "--gcp-endpoint",
        &fake.endpoint,
        "--gcp-project",
        PROJECT,
        "--gcp-cluster-uid",
        &cluster.uid,
        "--gcp-call-timeout",
        "3",
        "--discover-scaling-groups",
        &version,
    ];
    // Tokens from the metadata server, as on a GCE VM.
    let mut envs = base_env();
    envs.extend([
        ("GCE_METADATA_HOST".into(), fake.host().to_string()),
        ("HOME".into(), "/nonexistent".into()),
    ]);
    let replicas = start_replicas(&env, &lease, &args, &envs).await;
    wait_discovered(&env, &cluster.groups).await;
    let (seen, replicas) = roll_through_faults(&env, replicas, &lease, NEW, fake.pid()).await;
    println!("GCP: {seen:?}");
    cluster.wait_instances_equal_nodes(&env).await;
    cluster.assert_templates_on(NEW).await;
    drop(replicas);
    cluster.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_rolls_through_a_leader_kill_and_an_arm_outage() {
    use crate::support::azure::*;
    let gallery = |version: &str| {
        format!("/communityGalleries/ConstellationCVM-b3782fa0/images/constellation/versions/{version}")
    };
    let (old, new) = (gallery("2.23.0"), gallery("2.24.0"));
    let fake = AzureFake::start();
    let env = TestEnv::new("azure-ha").await;
    support::install_crds(&env.client).await;
    let cluster = AzureCluster::start(&env, &fake, &old).await;
    create_budget_node_version(&env, &old, 2).await;
    workload(&env, "web", 4).await;

    let (lease, version) = (format!("nodewarden-{}", env.id), env.name("version"));
    let args = [
        "--cloud",
        "azure",
        "--azure-endpoint",
        &fake.endpoint,
        "--azure-subscription",
        SUBSCRIPTION,
        "--azure-resource-group",
        RESOURCE_GROUP,
        "--azure-cluster-uid",
        &cluster.uid,
        "--azure-call-timeout",
        "3",
        "--discover-scaling-groups",
        &version,
    ];
    // Tokens from Azure AD by a client secret, as the chart's Secret gives it.
    let mut envs = base_env();
    envs.extend(
        [
            ("AZURE_TENANT_ID", "tenant"),
            ("AZURE_CLIENT_ID", "nodewarden"),
            ("AZURE_CLIENT_SECRET", SECRET),
            ("AZURE_AUTHORITY_HOST", fake.endpoint.as_str()),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let replicas = start_replicas(&env, &lease, &args, &envs).await;
    wait_discovered(&env, &cluster.groups).await;
    let (seen, replicas) = roll_through_faults(&env, replicas, &lease, &new, fake.pid()).await;
    println!("Azure: {seen:?}");
    cluster.wait_instances_equal_nodes(&env).await;
    cluster.assert_models_on(&new).await;
    drop(replicas);
    cluster.stop().await;
    env.cleanup().await;
}
