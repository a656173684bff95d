//! The `gcp` provider against the Compute fake (`e2e/gcefake`, its wire
//! format Google's generated Go types): managed instance groups made through
//! the Compute API as an installer makes them, a joiner playing the
//! kubelets, ScalingGroups discovered from the templates' labels, and a
//! NodeVersion image change that replaces every node through the API, at
//! upstream's `maxNodeBudget`, while the invariant checker watches. Then what
//! the provider promises on its own: a create whose answer was lost starts
//! one instance, failures map to what the work queue retries, and tokens
//! come from a service account's key or the metadata server.

use crate::support;

use std::sync::Arc;

use nodewarden::cloud::gcp::api::Compute;
use nodewarden::cloud::gcp::credentials::Source;
use nodewarden::cloud::gcp::{GcpConfig, GcpProvider};
use nodewarden::cloud::{CloudProvider, CreateNodeRequest, InstanceState};

use crate::support::TestEnv;
use crate::support::discovery::{Joiner, assert_nodes_labelled, label_nodes};
use crate::support::discovery::{create_budget_node_version, wait_discovered};
use crate::support::gcp::*;
use crate::support::rollout::*;
use crate::support::update_samples;

const OLD: &str = "projects/constellation-images/global/images/constellation-v2-23-0";
const NEW: &str = "projects/constellation-images/global/images/constellation-v2-24-0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_groups_are_replaced_through_managed_instance_groups_within_the_node_budget_without_a_leak()
 {
    let fake = GceFake::start();
    let env = TestEnv::new("gcp").await;
    support::install_crds(&env.client).await;
    let cluster = GcpCluster::start(&env, &fake, OLD).await;
    create_budget_node_version(&env, OLD, 2).await;
    workload(&env, "web", 4).await;

    let provider = GcpProvider::new(fake.provider_config(&cluster.uid))
        .await
        .expect("the gcp provider");
    let mut config = env.operator_config(Default::default(), Some(Arc::new(provider)), "operator");
    config.discover_scaling_groups = Some(env.name("version"));
    let operator = env.start_operator_from(config).await;
    let groups: Vec<(String, String, &str)> = cluster
        .groups
        .iter()
        .map(|(id, name, role)| (id.clone(), name.clone(), *role))
        .collect();
    wait_discovered(&env, &groups).await;

    // Compute failing on its side now and then: every failure is retried.
    fake.control("POST", "/fake/fail?status=503&count=4&path=instances")
        .await;
    fake.control("POST", "/fake/fail?status=429&count=3&path=instanceGroupManagers")
        .await;
    let checker = Checker::start(&env, 9, 2);
    let took = roll_nodes(&env, 9, NEW, None).await;
    let peak = checker.peak_surge();
    let found = checker.finish().await;
    assert!(
        peak >= 2,
        "the budget of 2 was used: at most {peak} extra node(s) seen"
    );
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    println!(
        "9 nodes replaced through the Compute fake's managed instance groups (maxNodeBudget 2) in {took:?}"
    );

    let requests: Vec<serde_json::Value> =
        serde_json::from_str(&fake.control("GET", "/fake/requests").await).expect("the fake's requests");
    let injected = requests.iter().filter(|r| r["injected"] == "fail").count();
    assert_eq!(
        injected, 7,
        "every injected failure met a call (and the rollout went on)"
    );
    println!(
        "{} Compute calls in all, the cluster's setup and the joiner's included",
        requests.len()
    );

    cluster.wait_instances_equal_nodes(&env).await;
    cluster.assert_templates_on(NEW).await;
    cluster.stop().await;
    operator.stop().await;
    env.cleanup().await;
}

/// A createInstances carried out whose answer never came back (the fake
/// answers 503 after doing it): asked again with the same key, the provider
/// names the same instance and the group grows by one, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_starts_one_instance() {
    let (fake, compute, uid, group, provider) = fake_with_group("lost", "europe-west3-a").await;
    let request = CreateNodeRequest::new(group.clone()).with_request_id("pendingnode-uid-1");

    fake.control("POST", "/fake/fail-after?status=503&count=1&path=createInstances")
        .await;
    let first = provider.create_node(&request).await;
    assert!(
        first.as_ref().is_err_and(|e| e.retryable()),
        "the lost answer is a retryable failure: {first:?}"
    );
    let again = provider
        .create_node(&request)
        .await
        .expect("the create asked again");
    let third = provider.create_node(&request).await.expect("and once more");
    assert_eq!(again, third, "one request, one instance");
    assert!(
        again
            .provider_id
            .starts_with(&format!("gce://{PROJECT}/europe-west3-a/{uid}-w-")),
        "{again:?}"
    );

    let all = instances(&compute, &uid).await.expect("the instances");
    assert_eq!(all.len(), 3, "two instances and the one created: {all:?}");
    assert!(all.contains_key(&again.provider_id), "{all:?}");
    let manager: serde_json::Value = compute.get(&group, "the group").await.expect("the group");
    assert_eq!(manager["targetSize"], 3, "the group's target size");
}

/// A delete of an instance takes it out of its group and lowers the
/// group's size; asked again, or of an instance gone, it succeeds; the
/// state, image and group of an instance are read as Constellation reads
/// them, and a missing instance is NotFound (the caller's to judge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_are_read_and_deleted_as_constellation_does() {
    let (_fake, compute, uid, group, provider) = fake_with_group("reads", "europe-west3-b").await;
    let all = instances(&compute, &uid).await.expect("the instances");
    let victim = all.keys().next().expect("an instance").clone();

    assert_eq!(
        provider.node_group(&victim).await.expect("its group"),
        group,
        "created-by names the project by number"
    );
    assert_eq!(provider.node_image(&victim).await.expect("its image"), OLD);
    assert_eq!(
        provider.group_image(&group).await.expect("the group's image"),
        OLD
    );
    let state = provider.node_state(&victim).await.expect("its state");
    assert!(
        matches!(state, InstanceState::Creating | InstanceState::Ready),
        "{state:?}"
    );

    provider.delete_node(&victim).await.expect("the delete");
    provider
        .delete_node(&victim)
        .await
        .expect("the delete asked again");
    let manager: serde_json::Value = compute.get(&group, "the group").await.expect("the group");
    assert_eq!(manager["targetSize"], 1, "the group's target size");
    support::wait_for(
        "the deleted instance gone",
        std::time::Duration::from_secs(10),
        || async {
            match provider.node_state(&victim).await {
                Err(e) if e.is_not_found() => support::Probe::Done(()),
                other => support::Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    provider
        .delete_node(&victim)
        .await
        .expect("the delete of an instance gone");

    provider
        .set_group_image(&group, NEW)
        .await
        .expect("the new image");
    provider
        .set_group_image(&group, NEW)
        .await
        .expect("the same image again: nothing to do");
    assert_eq!(
        provider.group_image(&group).await.expect("the group's image"),
        NEW
    );
    let groups = provider.list_groups().await.expect("the groups");
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(
        (groups[0].id.as_str(), groups[0].size, groups[0].image.as_str()),
        (group.as_str(), 1, NEW)
    );
}

/// Tokens from a service account's key (a JWT signed with its RSA key,
/// checked by the fake with Go's crypto/rsa) and from the metadata server;
/// Compute refuses calls without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_come_from_a_service_account_key_or_the_metadata_server() {
    let dir = tempfile::tempdir().expect("a dir");
    let (key_pem, public_pem) = (dir.path().join("key.pem"), dir.path().join("public.pem"));
    openssl(
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ],
        &key_pem,
    );
    openssl(
        &[
            "pkey",
            "-pubout",
            "-in",
            key_pem.to_str().unwrap_or_default(),
            "-out",
        ],
        &public_pem,
    );
    let public = public_pem.to_string_lossy().to_string();
    let fake = GceFake::start_with(&["-require-token", "-sa-public-key", &public]);
    let uid = format!("tokens-{}", std::process::id());
    let key = serde_json::json!({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "k1",
        "private_key": std::fs::read_to_string(&key_pem).expect("the key"),
        "client_email": "nodewarden@nodewarden-test.iam.gserviceaccount.com",
        "token_uri": format!("{}/token", fake.endpoint),
    });
    let key_file = dir.path().join("key.json");
    std::fs::write(&key_file, key.to_string()).expect("the key file");

    let anonymous = GcpProvider::new(fake.provider_config(&uid))
        .await
        .expect("a provider");
    let refused = anonymous.list_groups().await;
    assert!(
        refused.as_ref().is_err_and(|e| !e.retryable()),
        "no token, no answer: {refused:?}"
    );

    let source = Source::from_file(&key_file).expect("the key file");
    let config = |credentials: Source, project: Option<&str>| GcpConfig {
        credentials: Some(credentials),
        project: project.map(String::from),
        ..fake.provider_config(&uid)
    };
    let keyed = GcpProvider::new(config(source, None))
        .await
        .expect("the project from the key");
    keyed
        .list_groups()
        .await
        .expect("groups listed with the key's token");
    let metadata = GcpProvider::new(config(Source::Metadata(fake.host().to_string()), None))
        .await
        .expect("the project from the metadata server");
    metadata
        .list_groups()
        .await
        .expect("groups listed with the metadata server's token");

    let tokens = fake.control("GET", "/fake/tokens").await;
    for kind in ["\"sa\"", "\"md\""] {
        assert!(tokens.contains(kind), "a {kind} token issued and used: {tokens}");
    }
}

/// The fake with one worker group of two on OLD in `zone`, of a cluster
/// named by `prefix`: (fake, a client of it, cluster uid, group, provider).
async fn fake_with_group(prefix: &str, zone: &str) -> (GceFake, Arc<Compute>, String, String, GcpProvider) {
    let fake = GceFake::start();
    let compute = fake.client();
    let uid = format!("{prefix}-{}", std::process::id());
    let group = create_group(&compute, &uid, zone, &format!("{uid}-w"), "worker", 2, OLD).await;
    let provider = GcpProvider::new(fake.provider_config(&uid))
        .await
        .expect("the gcp provider");
    (fake, compute, uid, group, provider)
}

fn openssl(args: &[&str], out: &std::path::Path) {
    let status = std::process::Command::new("openssl")
        .args(args)
        .arg(out)
        .status()
        .expect("running openssl");
    assert!(status.success(), "openssl {args:?}");
}

/// `--cloud gcp` without the cluster's label value stops at start with one
/// line naming where to set it.
#[test]
fn a_missing_gcp_cluster_uid_is_refused_at_start_in_one_line_naming_it() {
    for value in [None, Some("")] {
        let mut command = std::process::Command::new(support::nodewarden_binary());
        command.args(["run", "--cloud", "gcp", "--kubeconfig", "/nonexistent"]);
        command
            .env_remove("NODEWARDEN_CLOUD")
            .env_remove("NODEWARDEN_GCP_CLUSTER_UID");
        if let Some(v) = value {
            command.env("NODEWARDEN_GCP_CLUSTER_UID", v);
        }
        let out = command.output().expect("running nodewarden");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("nodewarden: ")).collect();
        assert_eq!(out.status.code(), Some(1), "{value:?}: exits 1\n{stderr}");
        assert_eq!(lines.len(), 1, "{value:?}: one line\n{stderr}");
        assert!(lines[0].contains("NODEWARDEN_GCP_CLUSTER_UID"), "{}", lines[0]);
    }
}

/// Constellation's README examples for GCP (its NodeVersion and
/// ScalingGroup, placeholders filled) applied unchanged drive a complete
/// rollout of a managed instance group: every node replaced, each heir with
/// its donor's labels, instances = nodes at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_examples_roll_a_managed_instance_group() {
    let _samples = update_samples::lock().lock().await;
    let fake = GceFake::start();
    let env = TestEnv::new("gcp-seed").await;
    support::install_crds(&env.client).await;
    let (compute, uid, zone) = (fake.client(), env.id.clone(), "europe-west3-c");
    let name = format!("{uid}-w");
    create_group(&compute, &uid, zone, &name, "worker", 3, OLD).await;
    let (client, cloud, run, cluster) = (env.client.clone(), compute.clone(), env.id.clone(), uid.clone());
    let joiner = Joiner::start(&env, 3, "the fake's instances", move |stop| {
        join(
            client,
            cloud,
            run,
            cluster,
            std::time::Duration::from_secs(1),
            stop,
        )
    })
    .await;
    label_nodes(&env, "team.example.com/owner", "payments").await;

    let (_, version) = update_samples::apply(
        &env,
        "update-nodeversion-3.yaml",
        &[("<image-name>", "constellation-v2-23-0")],
    )
    .await;
    let fills = [
        ("<project-id>", PROJECT),
        ("<zone>", zone),
        ("<instance-group-name>", name.as_str()),
    ];
    let (_, group) = update_samples::apply(&env, "update-scalinggroup-3.yaml", &fills).await;
    let provider = GcpProvider::new(fake.provider_config(&uid))
        .await
        .expect("the gcp provider");
    let operator = env
        .start_operator_with(Default::default(), Some(Arc::new(provider)), "operator")
        .await;
    let took = roll_nodes_of(&env, &version, 3, NEW, None).await;
    println!("the seed's NodeVersion and ScalingGroup rolled 3 nodes in {took:?}");
    assert_nodes_labelled(&env, "team.example.com/owner", "payments").await;
    wait_instances_equal_nodes(&env, &compute, &uid).await;

    for (kind, name) in [("ScalingGroup", &group), ("NodeVersion", &version)] {
        update_samples::delete_and_wait(&update_samples::dynamic_api(&env.client, kind), name).await;
    }
    operator.stop().await;
    joiner.stop().await;
    env.cleanup().await;
}
