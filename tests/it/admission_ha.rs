//! Admission does not wait for a leader: three replicas, as the
//! ServiceAccount of manifests/base/rbac.yaml, each serve the webhook behind
//! a balancer (the webhook Service in a cluster); the leader is SIGKILLed
//! and every admission request made during the failover is still answered
//! with the webhook's own verdict.

use crate::support;

use std::time::{Duration, Instant};

use crate::support::admission::*;
use crate::support::replicas::*;
use crate::support::{Probe, TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use nodewarden::api::node_maintenance::medik8s;

/// The configuration and Secret names the shipped RBAC grants.
const CONFIGURATION: &str = "nodewarden";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standbys_keep_answering_admission_while_the_leader_is_killed() {
    let env = TestEnv::new("admission-ha").await;
    support::install_crds(&env.client).await;
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let replicas = Replicas::start_with_env(
        3,
        &env,
        Shared {
            kubeconfig: &kubeconfig,
            lease_name: &lease_name,
            otlp_endpoint: "",
            extra: &[],
            logs: &dir,
        },
        &[(SERVE_WEBHOOK.into(), "1".into())],
    );
    let ports: Vec<u16> = replicas
        .webhook
        .as_ref()
        .expect("webhook ports")
        .values()
        .copied()
        .collect();
    let balancer = Balancer::start(ports).await;
    delete_configuration(&env, CONFIGURATION).await;
    create_configuration(&env, CONFIGURATION, balancer.port).await;
    wait_ca_bundle(&env, CONFIGURATION).await;

    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let missing = env.name("no-such-node");
    let verdict = format!("invalid nodeName, no node with name {missing} found");
    let mut n = 0;
    let mut next = || {
        n += 1;
        maintenance(&env, &format!("m-{n}"), &missing)
    };
    let first = next();
    wait_for("the webhook answering", Duration::from_secs(30), || {
        let (nms, nm) = (nms.clone(), first.clone());
        async move {
            match create(&nms, &nm).await {
                Err(m) if m.contains("invalid nodeName") => Probe::Done(()),
                other => Probe::NotYet(format!("{other:?}")),
            }
        }
    })
    .await;

    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let mut replicas = replicas;
    let killed = Instant::now();
    replicas.kill(&leader).await;
    // Requests keep coming while the standbys elect a new leader.
    let mut answers = Vec::new();
    let mut new_leader = None;
    while killed.elapsed() < Duration::from_secs(8) {
        let asked = Instant::now();
        let answer = create(&nms, &next()).await;
        answers.push((answer, asked.elapsed()));
        if new_leader.is_none()
            && let Some(h) = holder(&leases, &lease_name).await
            && h != leader
        {
            new_leader = Some((h, killed.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wrong: Vec<_> = answers
        .iter()
        .filter(|(a, _)| !matches!(a, Err(m) if m.contains(&verdict)))
        .collect();
    let slowest = answers.iter().map(|(_, t)| *t).max().unwrap_or_default();
    println!(
        "{} admission requests in the 8 s after SIGKILL of leader {leader}: {} answered by the webhook, slowest {slowest:?}; new leader {new_leader:?}",
        answers.len(),
        answers.len() - wrong.len()
    );
    assert!(new_leader.is_some(), "a standby took over");
    assert!(
        wrong.is_empty(),
        "requests not answered by the webhook during the failover: {wrong:?}\n{}",
        replicas.tail_logs()
    );
    delete_configuration(&env, CONFIGURATION).await;
    drop(replicas);
    drop(balancer);
    env.cleanup().await;
}
