//! The `aws` provider against moto (the AWS mock, pinned, `e2e/moto/`):
//! Auto Scaling groups with launch templates made through the SDK as
//! Constellation's installer makes them, a joiner playing the kubelets,
//! and a NodeVersion image change that replaces every node through the
//! AWS API while the invariant checker watches.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::InstanceStateName;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use nodewarden::cloud::aws::AwsProvider;
use support::aws::*;
use support::rollout::*;
use support::{Probe, TestEnv, node_is_ready, seen, wait_for};
use tokio_util::sync::CancellationToken;

const GROUPS: [(&str, &str, &str, i32); 3] = [
    ("cp", "control-plane", "ControlPlane", 3),
    ("workers-a", "worker", "Worker", 3),
    ("workers-b", "worker", "Worker", 3),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_change_replaces_every_node_through_auto_scaling_without_a_leak() {
    let moto = Moto::start();
    let env = TestEnv::new("aws").await;
    support::install_crds(&env.client).await;
    let sdk = moto.sdk().await;
    let uid = env.id.clone();
    let mut groups = Vec::new();
    for (g, tag_role, role, size) in GROUPS {
        let name = format!("{}-{g}", env.id);
        create_group(&sdk, &uid, &name, tag_role, size, "ami-00000001").await;
        groups.push((name, role));
    }
    let stop = CancellationToken::new();
    let joiner = tokio::spawn(join(
        env.client.clone(),
        sdk.clone(),
        env.id.clone(),
        uid.clone(),
        Duration::from_secs(1),
        stop.clone(),
    ));
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for(
        "9 Ready nodes from moto's instances",
        Duration::from_secs(60),
        || async {
            match nodes.list(&ListParams::default().labels(&selector)).await {
                Ok(l) if l.items.iter().filter(|n| node_is_ready(n)).count() == 9 => Probe::Done(()),
                Ok(l) => Probe::NotYet(format!("{} nodes", l.items.len())),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    create_node_version(&env, &groups, "ami-00000001").await;
    workload(&env, "web", 4).await;
    let provider = AwsProvider::new(moto.provider_config(&uid))
        .await
        .expect("the aws provider");
    let operator = env
        .start_operator_with(Default::default(), Some(Arc::new(provider)), "operator")
        .await;
    let checker = Checker::start(&env, 9, 1);
    let took = roll_nodes(&env, 9, "ami-00000002", 1).await;
    let found = checker.finish().await;
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    println!("9 nodes replaced through moto's Auto Scaling API in {took:?}");

    // Nothing leaked: moto's running instances are exactly the Nodes.
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    wait_for(
        "moto's instances equal the Nodes",
        Duration::from_secs(30),
        || async {
            let running: BTreeSet<String> = match instances(&ec2, &uid).await {
                Ok(all) => all
                    .iter()
                    .filter(|(_, v)| v.0 == InstanceStateName::Running)
                    .map(|(id, v)| format!("aws:///{}/{id}", v.2))
                    .collect(),
                Err(e) => return Probe::NotYet(e),
            };
            let node_ids: BTreeSet<String> = match nodes.list(&ListParams::default().labels(&selector)).await
            {
                Ok(l) => l
                    .items
                    .iter()
                    .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
                    .collect(),
                Err(e) => return Probe::NotYet(seen(e)),
            };
            match running == node_ids {
                true => Probe::Done(()),
                false => Probe::NotYet(format!("instances {running:?} vs nodes {node_ids:?}")),
            }
        },
    )
    .await;
    for (name, _) in &groups {
        assert_eq!(
            default_image(&sdk, name).await,
            "ami-00000002",
            "{name}'s launch template"
        );
    }
    stop.cancel();
    let _ = joiner.await;
    operator.stop().await;
    env.cleanup().await;
}
