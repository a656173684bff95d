//! The `aws` provider against moto (the AWS mock, pinned, `e2e/moto/`):
//! Auto Scaling groups with launch templates made through the Query API as
//! Constellation's installer makes them, a joiner playing the kubelets,
//! ScalingGroups discovered from the groups' tags, and a NodeVersion image
//! change that replaces every node through the AWS API, at upstream's
//! `maxNodeBudget`, while the invariant checker watches.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use crate::support::aws::*;
use crate::support::rollout::*;
use crate::support::{TcpProxy, TestEnv};
use nodewarden::cloud::aws::query::QueryClient;
use nodewarden::cloud::aws::{AwsProvider, api};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_groups_are_replaced_through_auto_scaling_within_the_node_budget_without_a_leak() {
    let moto = Moto::start();
    let env = TestEnv::new("aws").await;
    support::install_crds(&env.client).await;
    let cluster = AwsCluster::start(&env, &moto, "ami-00000001").await;
    create_budget_node_version(&env, "ami-00000001", 2).await;
    workload(&env, "web", 4).await;

    let provider = AwsProvider::new(moto.provider_config(&cluster.uid))
        .await
        .expect("the aws provider");
    let mut config = env.operator_config(Default::default(), Some(Arc::new(provider)), "operator");
    config.discover_scaling_groups = Some(env.name("version"));
    let operator = env.start_operator_from(config).await;
    wait_discovered(&env, &cluster).await;

    // maxNodeBudget 2 is the surge: the checker holds the rollout to it.
    let checker = Checker::start(&env, 9, 2);
    let took = roll_nodes(&env, 9, "ami-00000002", None).await;
    let peak = checker.peak_surge();
    let found = checker.finish().await;
    assert!(
        peak >= 2,
        "the budget of 2 was used: at most {peak} extra node(s) seen"
    );
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    println!("9 nodes replaced through moto's Auto Scaling API (maxNodeBudget 2) in {took:?}");

    cluster.wait_instances_equal_nodes(&env).await;
    cluster.assert_templates_default_to("ami-00000002").await;
    cluster.stop().await;
    operator.stop().await;
    env.cleanup().await;
}

/// A create reads the group's desired capacity and writes it plus one; a
/// terminate decrements it. Side by side, a terminate that landed between a
/// create's read and write was undone, and the group started an instance
/// nobody asked for. Each round here replaces one instance with a create and
/// a terminate at once; the group must end at its size, with no stray.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_and_terminates_side_by_side_keep_the_group_at_its_size() {
    use nodewarden::cloud::{CloudProvider, CreateNodeRequest};
    const SIZE: usize = 4;
    let (moto, aws, uid, group) = moto_with_group("race", SIZE as i32).await;
    let running = || async {
        instances(&aws, &uid)
            .await
            .expect("moto's instances")
            .into_iter()
            .filter(|(_, i)| !matches!(i.0.as_str(), "terminated" | "shutting-down"))
            .map(|(id, i)| format!("aws:///{}/{id}", i.2))
            .collect::<Vec<_>>()
    };
    let provider = AwsProvider::new(moto.provider_config(&uid))
        .await
        .expect("the aws provider");
    for round in 0..8 {
        let old = running().await;
        assert_eq!(old.len(), SIZE, "round {round}: running instances {old:?}");
        let request = CreateNodeRequest::new(group.clone()).with_request_id(format!("race-{round}"));
        let (created, deleted) = tokio::join!(provider.create_node(&request), provider.delete_node(&old[0]));
        created.expect("the create");
        deleted.expect("the terminate");
    }
    assert_eq!(
        desired_capacity(&aws, &group).await,
        Some(SIZE as i32),
        "the group's desired capacity"
    );
    let left = running().await;
    assert_eq!(left.len(), SIZE, "running instances at the end: {left:?}");
    drop(moto);
}

/// A capacity change AWS carries out after the caller gave up on it must
/// not be overtaken by the next one: a create's "desired + 1" held past its
/// timeout and landing after the terminate sent next would undo the
/// terminate's decrement and start an instance nobody asked for (CI's
/// tests/it/aws_ha.rs once, moto paused mid-rollout: a tenth node where nine
/// were rolled). The terminate waits until the held change shows; both,
/// retried as the work queue retries them, leave the group at its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_change_without_an_answer_is_not_overtaken_by_the_next() {
    use nodewarden::cloud::{CloudError, CloudProvider, CreateNodeRequest};
    const SIZE: i32 = 3;
    let (moto, aws, uid, group) = moto_with_group("doubt", SIZE).await;
    let proxy = TcpProxy::start(moto.endpoint.trim_start_matches("http://").to_string()).await;
    proxy.hold_first(b"Action=SetDesiredCapacity&", Duration::from_secs(4));
    let mut config = moto.provider_config(&uid);
    config.endpoint = Some(format!("http://127.0.0.1:{}", proxy.port));
    config.call_timeout = Some(Duration::from_secs(1));
    let provider = AwsProvider::new(config).await.expect("the aws provider");
    let desired = || desired_capacity(&aws, &group);
    let in_service = || in_service(&aws, &group);
    let old = in_service().await;
    assert_eq!(old.len(), SIZE as usize, "{old:?}");

    let request = CreateNodeRequest::new(group.clone()).with_request_id("held".to_string());
    let first = provider.create_node(&request).await;
    assert!(
        matches!(first, Err(CloudError::Timeout { .. })),
        "the create's capacity change is held past its timeout: {first:?}"
    );
    assert_eq!(proxy.held_seen(), 1);
    let next = provider.delete_node(&old[0]).await;
    assert!(
        matches!(next, Err(CloudError::ChangeInDoubt { .. })),
        "the terminate waits for the change in doubt: {next:?}"
    );
    assert_eq!(desired().await, Some(SIZE), "nothing has landed yet");

    // The work queue's retries: each call again until it succeeds.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let created = loop {
        match provider.create_node(&request).await {
            Ok(created) => break created,
            Err(e) if e.retryable() && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(e) => panic!("the create: {e}"),
        }
    };
    loop {
        match provider.delete_node(&old[0]).await {
            Ok(()) => break,
            Err(e) if e.retryable() && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(e) => panic!("the terminate: {e}"),
        }
    }
    assert_eq!(
        proxy.held_seen(),
        1,
        "the create's retry found its instance instead of asking again"
    );
    assert_eq!(desired().await, Some(SIZE), "the group's desired capacity");
    let now = in_service().await;
    assert_eq!(
        now.len(),
        SIZE as usize,
        "instances in service at the end: {now:?}"
    );
    assert!(
        now.contains(&created.provider_id),
        "{now:?} holds the created {}",
        created.provider_id
    );
    assert!(
        !now.contains(&old[0]),
        "{now:?} without the terminated {}",
        old[0]
    );
    drop(proxy);
    drop(moto);
}

/// A leader killed after its create's capacity change landed, before it
/// tagged the instance, and the next leader retiring a donor of the same
/// group (a terminate with decrement) before it finishes that create: the
/// create asked again must find the instance the first one started, not
/// start a second. (CI's tests/it/aws_ha.rs once: a tenth node where nine
/// were rolled, when "desired above its value before the create" was the
/// sign of a create that landed, and the decrement hid it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_cut_off_before_tagging_is_found_after_a_terminate_lowered_the_group() {
    use nodewarden::cloud::{CloudError, CloudProvider, CreateNodeRequest};
    const SIZE: i32 = 3;
    let (moto, aws, uid, group) = moto_with_group("cutoff", SIZE).await;
    let proxy = TcpProxy::start(moto.endpoint.trim_start_matches("http://").to_string()).await;
    // The instance's tagging never lands: the leader dies while it is sent.
    proxy.hold_first(b"Action=CreateTags&", Duration::from_secs(30));
    let mut config = moto.provider_config(&uid);
    config.endpoint = Some(format!("http://127.0.0.1:{}", proxy.port));
    config.call_timeout = Some(Duration::from_secs(1));
    let dying = AwsProvider::new(config).await.expect("the aws provider");
    let old = in_service(&aws, &group).await;
    assert_eq!(old.len(), SIZE as usize, "{old:?}");
    let request = CreateNodeRequest::new(group.clone()).with_request_id("cut-off".to_string());
    let first = dying.create_node(&request).await;
    assert!(
        matches!(first, Err(CloudError::Timeout { .. })),
        "the create is cut off while it tags its instance: {first:?}"
    );
    assert_eq!(proxy.held_seen(), 1, "the instance's tagging was sent once");
    drop(dying);
    drop(proxy);
    let desired = || desired_capacity(&aws, &group);
    assert_eq!(
        desired().await,
        Some(SIZE + 1),
        "the create's capacity change landed"
    );

    let next = AwsProvider::new(moto.provider_config(&uid))
        .await
        .expect("the next leader's provider");
    next.delete_node(&old[0]).await.expect("a donor retired");
    assert_eq!(desired().await, Some(SIZE), "the terminate's decrement");
    let created = next.create_node(&request).await.expect("the create, asked again");
    assert_eq!(desired().await, Some(SIZE), "no second instance for one request");
    let mut want: Vec<String> = old[1..].to_vec();
    want.push(created.provider_id.clone());
    want.sort();
    let mut now = in_service(&aws, &group).await;
    now.sort();
    assert_eq!(
        now, want,
        "the group: the two kept and the one the first create started"
    );
    drop(moto);
}

/// moto with one worker group of `size` on ami-00000001, of a cluster
/// named by `prefix`: (moto, a client of it, cluster uid, group).
async fn moto_with_group(prefix: &str, size: i32) -> (Moto, Arc<QueryClient>, String, String) {
    let moto = Moto::start();
    let aws = moto.client();
    let uid = format!("{prefix}-{}", std::process::id());
    let group = format!("{uid}-workers");
    create_group(&aws, &uid, &group, "worker", size, "ami-00000001").await;
    (moto, aws, uid, group)
}

/// The group's desired capacity as moto has it.
async fn desired_capacity(aws: &QueryClient, group: &str) -> Option<i32> {
    let (groups, _) = api::describe_groups(aws, &[group], None, None)
        .await
        .expect("the group");
    groups.first().map(|g| g.desired_capacity)
}

/// The provider IDs of the group's instances in service, as moto has them.
async fn in_service(aws: &QueryClient, group: &str) -> Vec<String> {
    api::describe_group_instances(aws, &[])
        .await
        .expect("the group's instances")
        .into_iter()
        .filter(|i| i.group == group && i.lifecycle_state == "InService")
        .map(|i| format!("aws:///{}/{}", i.zone, i.id))
        .collect()
}

/// `--cloud aws` without the cluster's tag value or its region (unset, or
/// empty as the shipped overlay leaves them) stops at start with one line
/// naming where to set it: no guessed region, no process that runs on
/// without a cloud.
#[test]
fn a_missing_aws_setting_is_refused_at_start_in_one_line_naming_it() {
    // (what, the environment, the setting the refusal names)
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
    );
    let cases: [Case; 4] = [
        (
            "no cluster tag",
            &[("AWS_REGION", "eu-west-1")],
            "NODEWARDEN_AWS_CLUSTER_UID",
        ),
        (
            "an empty cluster tag",
            &[("AWS_REGION", "eu-west-1"), ("NODEWARDEN_AWS_CLUSTER_UID", "")],
            "NODEWARDEN_AWS_CLUSTER_UID",
        ),
        (
            "no region",
            &[("NODEWARDEN_AWS_CLUSTER_UID", "uid-1")],
            "AWS_REGION",
        ),
        (
            "an empty region",
            &[("NODEWARDEN_AWS_CLUSTER_UID", "uid-1"), ("AWS_REGION", "")],
            "AWS_REGION",
        ),
    ];
    for (what, vars, named) in cases {
        let mut command = std::process::Command::new(support::nodewarden_binary());
        command.args(["run", "--cloud", "aws", "--kubeconfig", "/nonexistent"]);
        for var in [
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "NODEWARDEN_AWS_REGION",
            "NODEWARDEN_AWS_CLUSTER_UID",
            "NODEWARDEN_CLOUD",
        ] {
            command.env_remove(var);
        }
        command.envs(vars.iter().copied());
        let out = command.output().expect("running nodewarden");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("nodewarden: ")).collect();
        assert_eq!(out.status.code(), Some(1), "{what}: exits 1\n{stderr}");
        assert_eq!(lines.len(), 1, "{what}: one line\n{stderr}");
        assert!(lines[0].contains(named), "{what}: names {named}: {}", lines[0]);
        assert!(
            !stderr.contains("kubeconfig"),
            "{what}: refused before any connection: {stderr}"
        );
    }
}
