//! The shipped Deployment on AWS: three `nodewarden run` processes started
//! with exactly the container arguments and environment the
//! `manifests/aws` overlay renders (its ConfigMap; the cluster tag, the region, the
//! NodeVersion to discover for and the endpoint set as a user's overlay
//! would), authenticated to Kubernetes as the ServiceAccount and to AWS by
//! web identity from the role the overlay annotates (moto's STS plays IRSA).
//! A rollout over moto's Auto Scaling groups survives a SIGKILLed leader
//! and moto paused for 15 s: the outage shows in the cloud error metrics and
//! the NodeVersion's Degraded condition, and the rollout resumes after it.

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::support::aws::*;
use crate::support::cloud_chaos::spawn_faults;
use crate::support::manifests::{find, generated_config_map, kustomize, shipped_container};
use crate::support::replicas::*;
use crate::support::rollout::*;
use crate::support::{Probe, TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use nodewarden::api::update::{NodeVersion, PendingNode, condition, reason};
use serde_json::Value;

/// The `nodewarden run` arguments and environment of the overlay's
/// Deployment. `POD_NAME`/`POD_NAMESPACE` (from the downward API) are what
/// `Replicas` passes as `--identity` and `--lease-namespace`; `--http-addr`
/// is per replica.
fn shipped_args_and_env(docs: &[Value]) -> (Vec<String>, BTreeMap<String, String>) {
    let (c, args, from) = shipped_container(docs);
    // Per replica here (the webhook has its own tests: three local
    // processes cannot share its port).
    let args = args
        .into_iter()
        .filter(|a| a != "run" && !a.starts_with("--http-addr") && !a.starts_with("--webhook-addr"))
        .collect();
    let mut env = BTreeMap::new();
    for name in &from {
        let (found, data) = generated_config_map(docs, name);
        assert_eq!(&found, name, "the Deployment reads the overlay's ConfigMap");
        for (k, v) in data {
            env.insert(k, v.as_str().unwrap_or_default().to_string());
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
            env.insert(k.to_string(), v.to_string());
        }
    }
    (args, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_aws_deployment_rolls_through_a_leader_kill_and_a_cloud_outage() {
    let moto = Moto::start();
    let env = TestEnv::new("aws-ha").await;
    support::install_crds(&env.client).await;
    let cluster = AwsCluster::start(&env, &moto, "ami-00000001").await;
    create_budget_node_version(&env, "ami-00000001", 2).await;
    workload(&env, "web", 4).await;

    let overlay = kustomize(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/aws"));
    let role_arn = find(&overlay, "ServiceAccount", "nodewarden")["metadata"]["annotations"]
        ["eks.amazonaws.com/role-arn"]
        .as_str()
        .expect("the overlay's IRSA annotation")
        .to_string();
    assert!(
        role_arn.starts_with("arn:aws:iam::111122223333:role/"),
        "{role_arn}"
    );
    let (args, mut shipped_env) = shipped_args_and_env(&overlay);
    assert_eq!(
        shipped_env.get("NODEWARDEN_CLOUD").map(String::as_str),
        Some("aws")
    );
    // Placeholders the user's overlay fills: nodewarden refuses to start without them.
    for key in ["AWS_REGION", "NODEWARDEN_AWS_CLUSTER_UID"] {
        assert_eq!(shipped_env.get(key).map(String::as_str), Some(""), "{key}");
    }

    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    // IRSA: the pod identity webhook sets these from the ServiceAccount's
    // annotation and a projected token; nodewarden trades the token for keys
    // at STS (here moto's, through AWS_ENDPOINT_URL like every service).
    let token: Value = serde_json::from_slice(&std::fs::read(&kubeconfig).expect("the kubeconfig"))
        .expect("a JSON kubeconfig");
    let token_file = dir.join("web-identity-token");
    std::fs::write(
        &token_file,
        token["users"][0]["user"]["token"].as_str().expect("a token"),
    )
    .expect("writing the token");
    for (k, v) in [
        ("NODEWARDEN_AWS_CLUSTER_UID", cluster.uid.clone()),
        ("AWS_REGION", REGION.to_string()),
        ("NODEWARDEN_DISCOVER_SCALING_GROUPS", env.name("version")),
        ("AWS_ENDPOINT_URL", moto.endpoint.clone()),
        // The user's overlay names a role of their account: moto keeps
        // each account's resources apart, and the groups are in its default one.
        (
            "AWS_ROLE_ARN",
            role_arn.replace(":111122223333:", ":123456789012:"),
        ),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            token_file.to_string_lossy().into_owned(),
        ),
        ("AWS_ROLE_SESSION_NAME", "nodewarden".into()),
        // Calls into a paused moto fail after 3 s instead of 10.
        ("NODEWARDEN_AWS_CALL_TIMEOUT", "3".into()),
        // The shipped exporter stays off: no collector in this test.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", String::new()),
    ] {
        shipped_env.insert(k.into(), v);
    }
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let envs: Vec<(String, String)> = shipped_env.into_iter().collect();
    let replicas = Replicas::start_with_env(
        3,
        &env,
        Shared {
            kubeconfig: &kubeconfig,
            lease_name: &lease_name,
            otlp_endpoint: "",
            extra: &args,
            logs: &dir,
        },
        &envs,
    );
    wait_for("a leader", Duration::from_secs(30), || async {
        match holder(&leases, &lease_name).await {
            Some(h) => Probe::Done(h),
            None => Probe::NotYet("no holder".into()),
        }
    })
    .await;
    wait_discovered(&env, &cluster).await;

    let checker = Checker::start(&env, 9, 2);
    let replicas = Arc::new(tokio::sync::Mutex::new(replicas));
    // moto paused (SIGSTOP) for 15 s while instances are on their way. A
    // read gives up after three attempts of 3 s each: a pass whose first
    // call is a read says Degraded about 9.5 s after it began, and with a
    // 10 s pause CI once saw that land after the resume.
    let faults = spawn_faults(
        &env,
        replicas.clone(),
        &lease_name,
        "ami-00000002",
        moto.pid(),
        Duration::from_secs(15),
    );
    let took = roll_nodes(&env, 9, "ami-00000002", None).await;
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
        "the NodeVersion said Degraded=True CloudError while moto was paused\n{}",
        replicas.tail_logs()
    );
    assert!(
        seen.cloud_errors > 0.0,
        "the leader counted cloud errors while moto was paused"
    );
    println!(
        "9 nodes replaced by the shipped AWS Deployment through a leader kill and a 10 s outage in {took:?}"
    );

    // Back to normal: Degraded cleared, nothing leaked, templates on the new image.
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    support::wait_for_condition(
        &versions,
        &env.name("version"),
        (condition::DEGRADED, "False", reason::AS_EXPECTED),
        Duration::from_secs(30),
    )
    .await;
    cluster.wait_instances_equal_nodes(&env).await;
    cluster.assert_templates_default_to("ami-00000002").await;
    wait_none_left::<PendingNode>(&env).await;
    wait_none_left::<nodewarden::api::node_maintenance::medik8s::NodeMaintenance>(&env).await;
    drop(replicas);
    cluster.stop().await;
    env.cleanup().await;
}
