//! Admission does not wait for a leader: three replicas, as the
//! ServiceAccount of manifests/base/rbac.yaml, each serve the webhook behind
//! a balancer (the webhook Service in a cluster); the leader is SIGKILLed
//! and every admission request made during the failover is still answered
//! with the webhook's own verdict, before a new leader as after — save one
//! the API server had already sent down the killed replica's connection
//! (no server can answer that one; a Service in a cluster loses it too).

use crate::support;

use std::time::{Duration, Instant};

use crate::support::TestEnv;
use crate::support::admission::*;
use crate::support::replicas::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams};
use nodewarden::api::node_maintenance::medik8s;
use serde_json::json;

/// The configuration and Secret names the shipped RBAC grants.
const CONFIGURATION: &str = "nodewarden";

/// The configuration is cluster-wide: one test at a time has it.
static CONFIGURATION_HELD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `count` replicas of nodewarden's ServiceAccount on the Lease
/// `lease_name`, each serving the webhook, behind a balancer the
/// configuration calls; returned once the caBundle is set.
async fn serving(env: &TestEnv, count: usize, lease_name: &str) -> (Replicas, Balancer) {
    support::install_crds(&env.client).await;
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let replicas = Replicas::start_with_env(
        count,
        env,
        Shared {
            kubeconfig: &kubeconfig,
            lease_name,
            otlp_endpoint: "",
            extra: &[],
            logs: &dir,
        },
        &[(SERVE_WEBHOOK.into(), "1".into())],
    );
    let ports = replicas.webhook.as_ref().expect("webhook ports");
    let balancer = Balancer::start(ports.values().copied().collect()).await;
    delete_configuration(env, CONFIGURATION).await;
    create_configuration(env, CONFIGURATION, balancer.port).await;
    wait_ca_bundle(env, CONFIGURATION).await;
    (replicas, balancer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standbys_keep_answering_admission_while_the_leader_is_killed() {
    let _held = CONFIGURATION_HELD.lock().await;
    let env = TestEnv::new("admission-ha").await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let (replicas, balancer) = serving(&env, 3, &lease_name).await;

    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let missing = env.name("no-such-node");
    let verdict = format!("invalid nodeName, no node with name {missing} found");
    let mut n = 0;
    let mut next = || {
        n += 1;
        maintenance(&env, &format!("m-{n}"), &missing)
    };
    wait_webhook_answers(&nms, &next()).await;

    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let mut replicas = replicas;
    let killed = Instant::now();
    replicas.kill(&leader).await;
    // Requests keep coming while the standbys elect a new leader.
    let mut answers = Vec::new();
    let mut new_leader = None;
    while killed.elapsed() < Duration::from_secs(8) {
        let asked = killed.elapsed();
        let started = Instant::now();
        let answer = create(&nms, &next()).await;
        answers.push(Answer {
            asked,
            took: started.elapsed(),
            answer,
        });
        if new_leader.is_none()
            && let Some(h) = holder(&leases, &lease_name).await
            && h != leader
        {
            new_leader = Some((h, killed.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elected = new_leader.as_ref().map(|(_, t)| *t).expect("a standby took over");
    let verdicts = judge(&answers, &verdict, elected);
    println!(
        "{} admission requests in the 8 s after SIGKILL of leader {leader}: {} answered by the webhook ({} before a new leader), slowest {:?}; lost with the killed replica's connection: {:?}; new leader {new_leader:?}",
        answers.len(),
        verdicts.answered,
        verdicts.answered_leaderless,
        answers.iter().map(|a| a.took).max().unwrap_or_default(),
        verdicts.lost_with_connection,
    );
    // The requests go one after another: at most the one in flight at the
    // kill was on the killed replica's connection.
    assert!(
        verdicts.lost_with_connection.len() <= 1,
        "more than one request lost with the killed replica's connection: {:?}",
        verdicts.lost_with_connection
    );
    assert!(
        verdicts.answered_leaderless > 0,
        "no request was answered while no leader held the lease"
    );
    assert!(
        verdicts.wrong.is_empty(),
        "requests not answered by the webhook during the failover: {:?}\n{}",
        verdicts.wrong,
        replicas.tail_logs()
    );
    delete_configuration(&env, CONFIGURATION).await;
    drop(replicas);
    drop(balancer);
    env.cleanup().await;
}

/// One admission request made after the leader's kill: when it was made
/// (since the kill), how long it took, what came back.
struct Answer {
    asked: Duration,
    took: Duration,
    answer: Result<(), String>,
}

/// What the requests after the kill came to.
struct Verdicts<'a> {
    answered: usize,
    /// Answered by the webhook before a standby held the lease.
    answered_leaderless: usize,
    /// Made within [`CONNECTION_GRACE`] of the kill and failed in transport:
    /// the API server's open connection went to the killed replica (over
    /// HTTP/2, every request shares one), and a request already on it when
    /// the replica died cannot be answered by anyone. A real cluster's
    /// Service does the same; the webhook's verdict does not depend on it.
    lost_with_connection: Vec<Duration>,
    wrong: Vec<&'a Answer>,
}

/// How long after the kill the API server may still send a request down the
/// killed replica's connection (the balancer closes it at once; the API
/// server notices on its next read).
const CONNECTION_GRACE: Duration = Duration::from_secs(1);

fn judge<'a>(answers: &'a [Answer], verdict: &str, elected: Duration) -> Verdicts<'a> {
    let mut v = Verdicts {
        answered: 0,
        answered_leaderless: 0,
        lost_with_connection: Vec::new(),
        wrong: Vec::new(),
    };
    for a in answers {
        match &a.answer {
            Err(m) if m.contains(verdict) => {
                v.answered += 1;
                if a.asked + a.took < elected {
                    v.answered_leaderless += 1;
                }
            }
            Err(m) if a.asked < CONNECTION_GRACE && lost_in_transport(m) => {
                v.lost_with_connection.push(a.asked)
            }
            _ => v.wrong.push(a),
        }
    }
    v
}

/// The API server's message for a webhook call whose connection broke.
fn lost_in_transport(message: &str) -> bool {
    message.contains("failed to call webhook")
        && ["EOF", "connection reset", "broken pipe", "client connection lost"]
            .iter()
            .any(|cause| message.contains(cause))
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} after the kill, took {:?}: {:?}",
            self.asked, self.took, self.answer
        )
    }
}

/// The first caBundle of the configuration's webhooks, and its resourceVersion.
async fn ca_bundle(env: &TestEnv) -> (Option<Vec<u8>>, Option<String>) {
    let vwc = Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .get(CONFIGURATION)
        .await
        .expect("the configuration");
    let ca = vwc
        .webhooks
        .unwrap_or_default()
        .first()
        .and_then(|w| w.client_config.ca_bundle.clone())
        .map(|b| b.0);
    (ca, vwc.metadata.resource_version)
}

/// A reinstall brings the configuration back with no caBundle, and a leader
/// may be a full lease away: replicas that do not lead fill it. Two
/// replicas serve the webhook while another holder keeps their Lease; the
/// caBundle they set is emptied, filled again with the same CA, left alone
/// once it is right (no replica writes it over and over), and the webhook's
/// own verdicts come back through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standbys_fill_an_emptied_ca_bundle_without_a_leader() {
    let _held = CONFIGURATION_HELD.lock().await;
    let env = TestEnv::new("admission-standby").await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    // The Lease goes in before any replica runs (whose setup applies the
    // namespace): on a fresh control plane this test may be the first to
    // need it (the cause of this test's rare 404s in CI).
    ensure_system_namespace(&env.client).await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let elsewhere: Lease = serde_json::from_value(json!({
        "metadata": {"name": lease_name, "labels": {support::RUN_LABEL: env.id}},
        "spec": {"holderIdentity": "elsewhere", "leaseDurationSeconds": 3600,
                 "acquireTime": now, "renewTime": now},
    }))
    .expect("a Lease");
    leases
        .create(&PostParams::default(), &elsewhere)
        .await
        .expect("the Lease, held elsewhere");
    let (replicas, balancer) = serving(&env, 2, &lease_name).await;
    let (first, _) = ca_bundle(&env).await;

    // As a reinstall leaves it: no caBundle.
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let mut vwc = vwcs.get(CONFIGURATION).await.expect("the configuration");
    for w in vwc.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = None;
    }
    vwcs.replace(CONFIGURATION, &PostParams::default(), &vwc)
        .await
        .expect("emptying the caBundle");
    let emptied = Instant::now();
    wait_ca_bundle(&env, CONFIGURATION).await;
    println!(
        "the caBundle was filled again {:?} after it was emptied",
        emptied.elapsed()
    );
    let (again, version) = ca_bundle(&env).await;
    assert_eq!(again, first, "the same CA, the Secret's");
    // Past a refresh of both replicas: neither writes it again.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        ca_bundle(&env).await.1,
        version,
        "the caBundle is left alone once right"
    );
    assert_eq!(
        holder(&leases, &lease_name).await.as_deref(),
        Some("elsewhere"),
        "no replica led"
    );

    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let missing = env.name("no-such-node");
    wait_webhook_answers(&nms, &maintenance(&env, "m", &missing)).await;
    delete_configuration(&env, CONFIGURATION).await;
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    drop(replicas);
    drop(balancer);
    env.cleanup().await;
}
