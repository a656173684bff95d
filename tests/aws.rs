//! The `aws` provider against moto (the AWS mock, pinned, `e2e/moto/`):
//! Auto Scaling groups with launch templates made through the SDK as
//! Constellation's installer makes them, a joiner playing the kubelets,
//! ScalingGroups discovered from the groups' tags, and a NodeVersion image
//! change that replaces every node through the AWS API, at upstream's
//! `maxNodeBudget`, while the invariant checker watches.

mod support;

use std::sync::Arc;

use nodewarden::cloud::aws::AwsProvider;
use support::TestEnv;
use support::aws::*;
use support::rollout::*;

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
    let moto = Moto::start();
    let sdk = moto.sdk().await;
    let uid = format!("race-{}", std::process::id());
    let group = format!("{uid}-workers");
    const SIZE: usize = 4;
    create_group(&sdk, &uid, &group, "worker", SIZE as i32, "ami-00000001").await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let running = || async {
        instances(&ec2, &uid)
            .await
            .expect("moto's instances")
            .into_iter()
            .filter(|(_, i)| {
                !matches!(
                    i.0,
                    aws_sdk_ec2::types::InstanceStateName::Terminated
                        | aws_sdk_ec2::types::InstanceStateName::ShuttingDown
                )
            })
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
    let asg = aws_sdk_autoscaling::Client::new(&sdk);
    let desired = asg
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(&group)
        .send()
        .await
        .expect("the group")
        .auto_scaling_groups
        .unwrap_or_default()
        .first()
        .and_then(|g| g.desired_capacity);
    assert_eq!(desired, Some(SIZE as i32), "the group's desired capacity");
    let left = running().await;
    assert_eq!(left.len(), SIZE, "running instances at the end: {left:?}");
    drop(moto);
}
