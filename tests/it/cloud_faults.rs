//! Each cloud provider's fault table against its fake: a create that meets
//! throttling, a server failure, a hang past the call timeout (the change
//! in doubt) or a lost answer fails in the kind the work queue retries, and
//! asked again under the same key makes exactly one instance; and a rollout
//! whose first new instance never starts and whose creates then keep
//! failing says Degraded=True CloudError with the cloud's own words while
//! it lasts, then completes with the instance that never started deleted
//! and instances = nodes once the cloud recovers. (An operation that fails:
//! `azure::an_image_change_whose_operation_fails_is_an_error`.)

use crate::support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use nodewarden::api::update::{NodeVersion, PendingNode, condition, reason};
use nodewarden::cloud::{CloudProvider, CreateNodeRequest};

use crate::support::discovery::{Joiner, create_budget_node_version, wait_discovered};
use crate::support::rollout::*;
use crate::support::{Probe, TestEnv, wait_for};

/// (fault, the fake's rule mode, its status, the error kind a create sees).
const TABLE: [(&str, &str, u16, &str); 4] = [
    ("throttled", "fail", 429, "throttled"),
    ("a server failure", "fail", 503, "server"),
    ("a hang past the call timeout", "hang", 503, "timeout"),
    ("an answer lost after the change", "fail-after", 503, "server"),
];

/// Runs [`TABLE`] against `provider`'s creates in `group`; `rule` is the
/// query naming the create call to the fake (`path=…`, `method=…`).
/// Returns the provider IDs made, one per row.
async fn create_fault_table<C, Fut>(
    provider: &dyn CloudProvider,
    group: &str,
    control: C,
    rule: &str,
) -> Vec<String>
where
    C: Fn(String) -> Fut,
    Fut: Future<Output = String>,
{
    let mut made = Vec::new();
    for (n, (fault, mode, status, kind)) in TABLE.into_iter().enumerate() {
        control(format!("/fake/{mode}?status={status}&count=1&{rule}")).await;
        let request = CreateNodeRequest::new(group).with_request_id(format!("fault-table-{n}"));
        let first = provider.create_node(&request).await;
        let Err(e) = first else {
            panic!("{fault}: the create succeeded: {first:?}");
        };
        assert_eq!((e.kind().as_str(), e.retryable()), (kind, true), "{fault}: {e}");
        let again = provider
            .create_node(&request)
            .await
            .unwrap_or_else(|e| panic!("{fault}: asked again: {e}"));
        let third = provider
            .create_node(&request)
            .await
            .unwrap_or_else(|e| panic!("{fault}: once more: {e}"));
        assert_eq!(again, third, "{fault}: one request, one instance");
        println!("{fault}: {kind}, then {} once", again.provider_id);
        made.push(again.provider_id);
    }
    made
}

/// The first replacement's instance never starts (`never_starts`: the
/// control path that makes the fake say so of a provider ID), and every
/// create after it fails with 503 (`rule`): the NodeVersion says
/// Degraded=True CloudError with the cloud's words (`words`); the rule
/// cleared, the rollout of `total` nodes completes. Returns the provider ID
/// of the instance that never started.
async fn degraded_while_creates_fail<C, Fut>(
    env: &TestEnv,
    (total, image): (usize, &str),
    control: C,
    never_starts: impl Fn(&str) -> String,
    rule: &str,
    words: &str,
) -> String
where
    C: Fn(String) -> Fut,
    Fut: Future<Output = String>,
{
    // GCE has no failed state: an instance that never starts is given up
    // at its join deadline (ARM's failed VM at once).
    let patch = serde_json::json!({"spec": {"image": image, "rollout": {"joinTimeout": "15s"}}});
    Api::<NodeVersion>::all(env.client.clone())
        .patch(
            &env.name("version"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("the new image");
    // The creates fail from the first replacement on (the group's image is
    // set by then: on Azure both are PATCHes of the scale set).
    let pending: Api<PendingNode> = Api::all(env.client.clone());
    let selector = kube::api::ListParams::default().labels(&env.run_selector());
    let first = wait_for(
        "the first replacement's instance",
        Duration::from_secs(60),
        || async {
            let listed = pending.list(&selector).await.map(|l| l.items).unwrap_or_default();
            let created = listed
                .iter()
                .filter(|p| p.name_any().starts_with("join-"))
                .find(|p| !p.spec.provider_id.is_empty());
            match created {
                Some(p) => Probe::Done(p.spec.provider_id.clone()),
                None => Probe::NotYet(format!("{} PendingNodes, none created", listed.len())),
            }
        },
    )
    .await;
    control(never_starts(&first)).await;
    control(format!("/fake/fail?status=503&count=100000&{rule}")).await;
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let message = wait_for(
        "Degraded with the cloud's words",
        Duration::from_secs(60),
        || async {
            let status = versions
                .get(&env.name("version"))
                .await
                .ok()
                .and_then(|v| v.status)
                .unwrap_or_default();
            let degraded = status.rollout_conditions.into_iter().find(|c| {
                c.type_ == condition::DEGRADED && c.status == "True" && c.reason == reason::CLOUD_ERROR
            });
            match degraded {
                Some(c) if c.message.contains(words) => Probe::Done(c.message),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    println!("while creates failed: Degraded=True CloudError: {message}");
    control("/fake/clear-failures".into()).await;
    roll_nodes(env, total, image, None).await;
    support::wait_for_condition(
        &versions,
        &env.name("version"),
        (condition::DEGRADED, "False", reason::AS_EXPECTED),
        Duration::from_secs(30),
    )
    .await;
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcp_faults_leave_one_instance_per_create_and_say_degraded_while_they_last() {
    use crate::support::gcp::*;
    const OLD: &str = "projects/constellation-images/global/images/constellation-v2-23-0";
    const NEW: &str = "projects/constellation-images/global/images/constellation-v2-24-0";
    let fake = GceFake::start();
    let env = TestEnv::new("gcp-faults").await;
    support::install_crds(&env.client).await;
    let (compute, uid, zone) = (fake.client(), env.id.clone(), "europe-west3-a");
    let name = format!("{uid}-w");
    let group = create_group(&compute, &uid, zone, &name, "worker", 2, OLD).await;
    let config = nodewarden::cloud::gcp::GcpConfig {
        call_timeout: Some(Duration::from_secs(2)),
        ..fake.provider_config(&uid)
    };
    let provider = nodewarden::cloud::gcp::GcpProvider::new(config)
        .await
        .expect("the gcp provider");
    let control = |path: String| {
        let fake = &fake;
        async move { fake.control("POST", &path).await }
    };
    let made = create_fault_table(&provider, &group, control, "path=createInstances").await;
    let all = instances(&compute, &uid).await.expect("the instances");
    assert_eq!(all.len(), 2 + TABLE.len(), "one instance per create: {all:?}");
    for id in &made {
        provider
            .delete_node(id)
            .await
            .expect("the table's instances deleted");
    }

    // A rollout whose creates fail.
    let (client, cloud, run, cluster) = (env.client.clone(), compute.clone(), env.id.clone(), uid.clone());
    // A boot of 3 s: the instance made to never start is marked so long
    // before it could join.
    let joiner = Joiner::start(&env, 2, "the fake's instances", move |stop| {
        join(client, cloud, run, cluster, Duration::from_secs(3), stop)
    })
    .await;
    create_budget_node_version(&env, OLD, 1).await;
    let mut config = env.operator_config(Default::default(), Some(Arc::new(provider)), "operator");
    config.discover_scaling_groups = Some(env.name("version"));
    let operator = env.start_operator_from(config).await;
    wait_discovered(&env, &[(group.clone(), name.clone(), "Worker")]).await;
    // GCE's word for an instance that stopped for good.
    let terminated = |id: &str| {
        let (zone, name) = id
            .rsplit_once('/')
            .map(|(rest, n)| (rest.rsplit('/').next().unwrap_or_default(), n))
            .unwrap_or_default();
        format!("/fake/instances/{zone}/{name}/status?to=TERMINATED")
    };
    let failed = degraded_while_creates_fail(
        &env,
        (2, NEW),
        control,
        terminated,
        "path=createInstances",
        "status 503",
    )
    .await;
    wait_for(
        "the instance that never started deleted",
        Duration::from_secs(30),
        || async {
            match instances(&compute, &uid).await {
                Ok(all) if !all.contains_key(&failed) => Probe::Done(()),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_instances_equal_nodes(&env, &compute, &uid).await;
    operator.stop().await;
    joiner.stop().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_faults_leave_one_vm_per_create_and_say_degraded_while_they_last() {
    use crate::support::azure::*;
    let gallery =
        |v: &str| format!("/communityGalleries/ConstellationCVM-b3782fa0/images/constellation/versions/{v}");
    let (old, new) = (gallery("2.23.0"), gallery("2.24.0"));
    let fake = AzureFake::start();
    let env = TestEnv::new("azure-faults").await;
    support::install_crds(&env.client).await;
    let (arm, uid) = (fake.client(), env.id.clone());
    let name = format!("{uid}-w");
    let set = create_scale_set(&arm, &uid, &name, "worker", 2, &old).await;
    let config = nodewarden::cloud::azure::AzureConfig {
        call_timeout: Some(Duration::from_secs(2)),
        ..fake.provider_config(&uid)
    };
    let provider = nodewarden::cloud::azure::AzureProvider::new(config).expect("the azure provider");
    let control = |path: String| {
        let fake = &fake;
        async move { fake.control("POST", &path).await }
    };
    let rule = format!("method=PATCH&path={name}");
    let made = create_fault_table(&provider, &set, control, &rule).await;
    let all = vms(&arm, &uid).await.expect("the VMs");
    assert_eq!(all.len(), 2 + TABLE.len(), "one VM per create: {all:?}");
    for id in &made {
        provider.delete_node(id).await.expect("the table's VMs deleted");
    }

    // A rollout whose creates fail.
    let (client, cloud, run, cluster) = (env.client.clone(), arm.clone(), env.id.clone(), uid.clone());
    // A boot of 3 s: the VM made to never start is marked so long before
    // it could join.
    let joiner = Joiner::start(&env, 2, "the fake's VMs", move |stop| {
        join(client, cloud, run, cluster, Duration::from_secs(3), stop)
    })
    .await;
    create_budget_node_version(&env, &old, 1).await;
    let mut config = env.operator_config(Default::default(), Some(Arc::new(provider)), "operator");
    config.discover_scaling_groups = Some(env.name("version"));
    let operator = env.start_operator_from(config).await;
    wait_discovered(&env, &[(set.clone(), name.clone(), "Worker")]).await;
    // ARM's word for a VM whose provisioning failed.
    let failed_vm = |id: &str| {
        let (set, instance) = id
            .split_once("/virtualMachineScaleSets/")
            .and_then(|(_, r)| r.split_once("/virtualMachines/"))
            .unwrap_or_default();
        format!("/fake/vms/{set}/{instance}/state?provisioning=Failed")
    };
    let failed = degraded_while_creates_fail(&env, (2, &new), control, failed_vm, &rule, "status 503").await;
    wait_for(
        "the VM that never started deleted",
        Duration::from_secs(30),
        || async {
            match vms(&arm, &uid).await {
                Ok(all) if !all.contains_key(&failed) => Probe::Done(()),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_instances_equal_nodes(&env, &arm, &uid).await;
    operator.stop().await;
    joiner.stop().await;
    env.cleanup().await;
}
