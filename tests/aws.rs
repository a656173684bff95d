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
