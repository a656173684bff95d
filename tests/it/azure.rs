//! The `azure` provider against the ARM fake (`e2e/azurefake`, its wire
//! format armcompute's model types, its long-running operations ARM's):
//! VM scale sets made through ARM as an installer makes them, a joiner
//! playing the kubelets, ScalingGroups discovered from the scale sets'
//! tags, and a NodeVersion image change that replaces every node through
//! the API, at upstream's `maxNodeBudget`, while the invariant checker
//! watches. Then what the provider promises on its own: a create whose
//! answer was lost raises the capacity once, creates at once get a VM each,
//! failures map to what the work queue retries, and tokens come from a
//! client secret, workload identity or the managed identity.

use crate::support;

use std::sync::Arc;

use nodewarden::cloud::azure::credentials::Source;
use nodewarden::cloud::azure::{AzureConfig, AzureProvider};
use nodewarden::cloud::{CloudProvider, CreateNodeRequest, InstanceState};

use crate::support::TestEnv;
use crate::support::azure::*;
use crate::support::discovery::{Joiner, assert_nodes_labelled, label_nodes};
use crate::support::discovery::{create_budget_node_version, wait_discovered};
use crate::support::rollout::*;
use crate::support::update_samples;

const OLD: &str = "/subscriptions/00000000-0000-4000-8000-000000000001/resourceGroups/images/providers/Microsoft.Compute/galleries/Constellation/images/constellation/versions/2.23.0";
const NEW: &str = "/communityGalleries/ConstellationCVM-b3782fa0/images/constellation/versions/2.24.0";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_scale_sets_are_replaced_within_the_node_budget_without_a_leak() {
    let fake = AzureFake::start();
    let env = TestEnv::new("azure").await;
    support::install_crds(&env.client).await;
    let cluster = AzureCluster::start(&env, &fake, OLD).await;
    create_budget_node_version(&env, OLD, 2).await;
    workload(&env, "web", 4).await;

    let provider = AzureProvider::new(fake.provider_config(&cluster.uid)).expect("the azure provider");
    let mut config = env.operator_config(Default::default(), Some(Arc::new(provider)), "operator");
    config.discover_scaling_groups = Some(env.name("version"));
    let operator = env.start_operator_from(config).await;
    wait_discovered(&env, &cluster.groups).await;

    // ARM failing on its side now and then: every failure is retried.
    fake.control("POST", "/fake/fail?status=503&count=4&path=instanceView")
        .await;
    fake.control(
        "POST",
        "/fake/fail?status=429&count=3&path=virtualMachineScaleSets",
    )
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
    println!("9 nodes replaced through the ARM fake's scale sets (maxNodeBudget 2) in {took:?}");

    let requests: Vec<serde_json::Value> =
        serde_json::from_str(&fake.control("GET", "/fake/requests").await).expect("the fake's requests");
    let injected = requests.iter().filter(|r| r["injected"] == "fail").count();
    assert_eq!(
        injected, 7,
        "every injected failure met a call (and the rollout went on)"
    );
    println!(
        "{} ARM calls in all, the cluster's setup and the joiner's included",
        requests.len()
    );

    cluster.wait_instances_equal_nodes(&env).await;
    cluster.assert_models_on(NEW).await;
    for (id, name, _) in &cluster.groups {
        let set: serde_json::Value = cluster.arm.get(id, "a scale set").await.expect("the scale set");
        assert_eq!(set["sku"]["capacity"], 3, "{name}: back to its size");
    }
    cluster.stop().await;
    operator.stop().await;
    env.cleanup().await;
}

/// A capacity PATCH carried out whose answer never came back (the fake
/// answers 503 after doing it): asked again with the same key, the provider
/// finds its record and the new VM, and the capacity grew by one, not two;
/// three creates at once get three VMs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_raises_the_capacity_once() {
    let (fake, uid, set, provider) = fake_with_scale_set("lost").await;
    let request = CreateNodeRequest::new(set.clone()).with_request_id("pendingnode-uid-1");
    fake.control(
        "POST",
        &format!("/fake/fail-after?status=503&count=1&method=PATCH&path={uid}-w"),
    )
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
    assert_eq!(again, third, "one request, one VM");
    assert!(
        again
            .provider_id
            .starts_with(&format!("azure://{set}/virtualMachines/")),
        "{again:?}"
    );
    assert!(again.node_name.starts_with(&format!("{uid}-w")), "{again:?}");
    assert_eq!(again.image.as_deref(), Some(OLD));
    let arm = fake.client();
    let all = vms(&arm, &uid).await.expect("the VMs");
    assert_eq!(all.len(), 3, "two VMs and the one created: {all:?}");
    assert!(all.contains_key(&again.provider_id), "{all:?}");

    let requests: Vec<CreateNodeRequest> = (2..5)
        .map(|n| CreateNodeRequest::new(set.clone()).with_request_id(format!("pendingnode-uid-{n}")))
        .collect();
    let made = futures::future::join_all(requests.iter().map(|r| provider.create_node(r))).await;
    let made: std::collections::BTreeSet<String> = made
        .into_iter()
        .map(|m| m.expect("a create at once").provider_id)
        .collect();
    assert_eq!(made.len(), 3, "three creates at once, three VMs: {made:?}");
    let scale_set: serde_json::Value = arm.get(&set, "the scale set").await.expect("the scale set");
    assert_eq!(scale_set["sku"]["capacity"], 6, "the capacity: {scale_set}");
}

/// A delete takes the VM out of its scale set and lowers the capacity;
/// asked again it succeeds; the state, image and group of a VM are read as
/// Constellation reads them, and a VM gone is NotFound (the caller's to judge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_are_read_and_deleted_as_constellation_does() {
    let (fake, uid, set, provider) = fake_with_scale_set("reads").await;
    let arm = fake.client();
    let all = vms(&arm, &uid).await.expect("the VMs");
    let victim = all.keys().next().expect("a VM").clone();
    assert_eq!(provider.node_group(&victim).await.expect("its group"), set);
    assert_eq!(provider.node_image(&victim).await.expect("its image"), OLD);
    assert_eq!(provider.group_image(&set).await.expect("the model's image"), OLD);
    let state = provider.node_state(&victim).await.expect("its state");
    assert!(
        matches!(state, InstanceState::Creating | InstanceState::Ready),
        "{state:?}"
    );
    support::wait_for("the VM running", std::time::Duration::from_secs(10), || async {
        match provider.node_state(&victim).await {
            Ok(InstanceState::Ready) => support::Probe::Done(()),
            other => support::Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;

    let instance = victim.rsplit('/').next().unwrap_or_default().to_string();
    let name = format!("{uid}-w");
    fake.control(
        "POST",
        &format!("/fake/vms/{name}/{instance}/state?power=deallocated"),
    )
    .await;
    assert_eq!(
        provider.node_state(&victim).await.expect("its state"),
        InstanceState::Stopped
    );

    provider.delete_node(&victim).await.expect("the delete");
    provider
        .delete_node(&victim)
        .await
        .expect("the delete asked again");
    let scale_set: serde_json::Value = arm.get(&set, "the scale set").await.expect("the scale set");
    assert_eq!(scale_set["sku"]["capacity"], 1, "the capacity");
    support::wait_for(
        "the deleted VM gone",
        std::time::Duration::from_secs(10),
        || async {
            match provider.node_state(&victim).await {
                Err(e) if e.is_not_found() => support::Probe::Done(()),
                other => support::Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    let gone = provider.delete_node(&victim).await;
    assert!(
        gone.as_ref().is_err_and(|e| e.is_not_found()),
        "a VM gone: {gone:?}"
    );

    provider.set_group_image(&set, NEW).await.expect("the new image");
    assert_eq!(provider.group_image(&set).await.expect("the model's image"), NEW);
    let groups = provider.list_groups().await.expect("the groups");
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(
        (groups[0].id.as_str(), groups[0].size, groups[0].image.as_str()),
        (set.as_str(), 1, NEW)
    );
}

/// An image change whose operation ends Failed is an error naming ARM's
/// code, not a success (the operation kept running until the fake fails it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_change_whose_operation_fails_is_an_error() {
    let fake = AzureFake::start_with(&["-op-delay", "60s"]);
    let uid = format!("failing-{}", std::process::id());
    let set = create_scale_set(&fake.client(), &uid, &format!("{uid}-w"), "worker", 1, OLD).await;
    let provider = AzureProvider::new(fake.provider_config(&uid)).expect("the azure provider");
    let change = tokio::spawn({
        let set = set.clone();
        async move { provider.set_group_image(&set, NEW).await }
    });
    let operation = support::wait_for(
        "the image change polled",
        std::time::Duration::from_secs(10),
        || async {
            let requests: Vec<serde_json::Value> =
                serde_json::from_str(&fake.control("GET", "/fake/requests").await).unwrap_or_default();
            let polled = requests.iter().find_map(|r| {
                let path = r["path"].as_str()?;
                path.contains("/operations/")
                    .then(|| path.rsplit('/').next().map(str::to_string))?
            });
            match polled {
                Some(op) => support::Probe::Done(op),
                None => support::Probe::NotYet("no poll yet".into()),
            }
        },
    )
    .await;
    fake.control(
        "POST",
        &format!("/fake/operations/{operation}/fail?code=QuotaExceeded&message=no"),
    )
    .await;
    let failed = change.await.expect("the task");
    assert!(
        failed
            .as_ref()
            .is_err_and(|e| e.to_string().contains("QuotaExceeded")),
        "{failed:?}"
    );
}

/// Tokens by a client secret, workload identity (the federated token file)
/// and the managed identity (the metadata service); ARM refuses calls
/// without a good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_come_from_a_secret_workload_identity_or_the_managed_identity() {
    let dir = tempfile::tempdir().expect("a dir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "service-account-jwt\n").expect("the token file");
    let fake = AzureFake::start_with(&["-require-token", "-federated-token", "service-account-jwt"]);
    let uid = format!("tokens-{}", std::process::id());
    let config = |credentials: Source| AzureConfig {
        credentials: Some(credentials),
        ..fake.provider_config(&uid)
    };
    let workload = Source::Workload {
        authority: fake.endpoint.clone(),
        tenant: "tenant".into(),
        client_id: "nodewarden".into(),
        token_file,
    };
    let managed = Source::Managed {
        endpoint: fake.endpoint.clone(),
        client_id: None,
    };
    for source in [fake.secret_source(), workload, managed] {
        let what = format!("{source:?}");
        let provider = AzureProvider::new(config(source)).expect("a provider");
        provider
            .list_groups()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let wrong = Source::Secret {
        authority: fake.endpoint.clone(),
        tenant: "tenant".into(),
        client_id: "nodewarden".into(),
        secret: "wrong".into(),
    };
    let refused = AzureProvider::new(config(wrong))
        .expect("a provider")
        .list_groups()
        .await;
    assert!(
        refused.as_ref().is_err_and(|e| !e.retryable()),
        "a wrong secret, no answer: {refused:?}"
    );
    let tokens = fake.control("GET", "/fake/tokens").await;
    for kind in ["\"aad-secret\"", "\"aad-federated\"", "\"mi\""] {
        assert!(tokens.contains(kind), "a {kind} token issued and used: {tokens}");
    }
}

/// The fake with one worker scale set of two on OLD, of a cluster named by
/// `prefix`: (fake, cluster uid, scale set ID, provider).
async fn fake_with_scale_set(prefix: &str) -> (AzureFake, String, String, AzureProvider) {
    let fake = AzureFake::start();
    let uid = format!("{prefix}-{}", std::process::id());
    let set = create_scale_set(&fake.client(), &uid, &format!("{uid}-w"), "worker", 2, OLD).await;
    let provider = AzureProvider::new(fake.provider_config(&uid)).expect("the azure provider");
    (fake, uid, set, provider)
}

/// `--cloud azure` without its settings stops at start with one line
/// naming where to set the first one missing.
#[test]
fn missing_azure_settings_are_refused_at_start_in_one_line_naming_them() {
    let cases = [
        (vec![], "NODEWARDEN_AZURE_CLUSTER_UID"),
        (
            vec![("NODEWARDEN_AZURE_CLUSTER_UID", "u")],
            "AZURE_SUBSCRIPTION_ID",
        ),
        (
            vec![
                ("NODEWARDEN_AZURE_CLUSTER_UID", "u"),
                ("AZURE_SUBSCRIPTION_ID", "s"),
            ],
            "NODEWARDEN_AZURE_RESOURCE_GROUP",
        ),
    ];
    for (vars, named) in cases {
        let mut command = std::process::Command::new(support::nodewarden_binary());
        command.args(["run", "--cloud", "azure", "--kubeconfig", "/nonexistent"]);
        for var in [
            "NODEWARDEN_CLOUD",
            "NODEWARDEN_AZURE_CLUSTER_UID",
            "NODEWARDEN_AZURE_SUBSCRIPTION",
            "AZURE_SUBSCRIPTION_ID",
            "NODEWARDEN_AZURE_RESOURCE_GROUP",
        ] {
            command.env_remove(var);
        }
        command.envs(vars.iter().copied());
        let out = command.output().expect("running nodewarden");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("nodewarden: ")).collect();
        assert_eq!(out.status.code(), Some(1), "{vars:?}: exits 1\n{stderr}");
        assert_eq!(lines.len(), 1, "{vars:?}: one line\n{stderr}");
        assert!(lines[0].contains(named), "{}", lines[0]);
    }
}

/// Constellation's README examples for Azure (its NodeVersion and
/// ScalingGroup, placeholders filled) applied unchanged drive a complete
/// rollout of a VM scale set: every node replaced, each heir with its
/// donor's labels, VMs = nodes at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_examples_roll_a_vm_scale_set() {
    let _samples = update_samples::lock().lock().await;
    let fake = AzureFake::start();
    let env = TestEnv::new("azure-seed").await;
    support::install_crds(&env.client).await;
    let (arm, uid) = (fake.client(), env.id.clone());
    let name = format!("{uid}-w");
    let gallery = |version: &str| {
        format!(
            "/subscriptions/{SUBSCRIPTION}/resourceGroups/CONSTELLATION-IMAGES/providers/Microsoft.Compute/galleries/Constellation/images/constellation/versions/{version}"
        )
    };
    create_scale_set(&arm, &uid, &name, "worker", 3, &gallery("2.23.0")).await;
    let (client, cloud, run, cluster) = (env.client.clone(), arm.clone(), env.id.clone(), uid.clone());
    let joiner = Joiner::start(&env, 3, "the fake's VMs", move |stop| {
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

    let image_fills = [
        ("<subscription-id>", SUBSCRIPTION),
        ("<image-definition-name>", "constellation"),
        ("<image-version>", "2.23.0"),
    ];
    let (_, version) = update_samples::apply(&env, "update-nodeversion-4.yaml", &image_fills).await;
    let fills = [
        ("<subscription-id>", SUBSCRIPTION),
        ("<resource-group>", RESOURCE_GROUP),
        ("<scale-set-name>", name.as_str()),
    ];
    let (_, group) = update_samples::apply(&env, "update-scalinggroup-4.yaml", &fills).await;
    let provider = AzureProvider::new(fake.provider_config(&uid)).expect("the azure provider");
    let operator = env
        .start_operator_with(Default::default(), Some(Arc::new(provider)), "operator")
        .await;
    let took = roll_nodes_of(&env, &version, 3, &gallery("2.24.0"), None).await;
    println!("the seed's NodeVersion and ScalingGroup rolled 3 nodes in {took:?}");
    assert_nodes_labelled(&env, "team.example.com/owner", "payments").await;
    wait_instances_equal_nodes(&env, &arm, &uid).await;

    for (kind, name) in [("ScalingGroup", &group), ("NodeVersion", &version)] {
        update_samples::delete_and_wait(&update_samples::dynamic_api(&env.client, kind), name).await;
    }
    operator.stop().await;
    joiner.stop().await;
    env.cleanup().await;
}
