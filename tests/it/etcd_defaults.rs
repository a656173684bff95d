//! etcd as a default install meets it: no etcd flag, etcd found on the
//! control plane as Constellation's operator finds it (each control-plane
//! node's InternalIP at 2379, the control plane's own certificates, as the
//! chart mounts them), stacked members seen by their static pods. A real
//! etcd cluster of one process per control-plane node, over TLS.

use crate::support;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::etcd_members::{finish, joiner_with, members_are_the_nodes, node_ips, times_reaching};
use crate::support::admission::{create, create_configuration, create_etcd_pod, free_port, maintenance};
use crate::support::etcd::{EtcdCluster, EtcdOptions};
use crate::support::plans::{TIMEOUT, create_plan, upgrade, wait_upgraded};
use crate::support::replicas::{Replicas, replica_log_dir, service_account_kubeconfig};
use crate::support::rollout::*;
use crate::support::{Probe, RunningOperator, wait_for};
use kube::api::{Api, Patch, PatchParams};
use nodewarden::api::node_maintenance::medik8s;
use nodewarden::api::update::{NodeVersion, condition, reason};
use nodewarden::cloud::CloudProvider;
use nodewarden::controllers::node_maintenance::MaintenanceConfig;
use nodewarden::etcd::{Discovery, EtcdSetup};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// `count` control-plane nodes from `ip_base` on, a member on each at 2379
/// over TLS (the serving certificate for the next dozen addresses, where
/// replacements come up), and each node's static etcd pod.
async fn stacked(test: &str, ip_base: &str, count: usize) -> (Rollout, Arc<EtcdCluster>) {
    let extra = json!({"internalIpBase": ip_base, "bootDelay": "2s"});
    let r = setup_with(test, &[("cp", "ControlPlane", count)], extra).await;
    let initial = node_ips(&r.env).await;
    assert_eq!(initial.len(), count, "every node has its InternalIP: {initial:?}");
    let base: std::net::Ipv4Addr = ip_base.parse().expect("an IPv4 base");
    let sans: Vec<IpAddr> = (0..12u32)
        .map(|i| IpAddr::V4((u32::from(base) + i).into()))
        .collect();
    let members: Vec<(String, IpAddr)> = initial.iter().map(|(n, ip)| (n.clone(), *ip)).collect();
    let options = EtcdOptions {
        tls_for: Some(sans),
        client_port: Some(nodewarden::etcd::access::DEFAULT_CLIENT_PORT),
    };
    let cluster = Arc::new(EtcdCluster::start_with_options(&members, options).await);
    for node in initial.keys() {
        create_etcd_pod(&r.env, node).await;
    }
    (r, cluster)
}

/// The control plane's etcd PKI as the chart's init container leaves it.
fn pki_dir(cluster: &EtcdCluster, dir: &Path) {
    cluster.tls.as_ref().expect("a TLS cluster").write_pki(dir);
}

/// The Degraded rollout condition of `nv`, once its reason is `wanted`.
async fn degraded(env: &support::TestEnv, nv: &str, wanted: &str) -> String {
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    wait_for(
        &format!("Degraded={wanted}"),
        Duration::from_secs(120),
        || async {
            let status = match versions.get(nv).await {
                Ok(v) => v.status.unwrap_or_default(),
                Err(e) => return Probe::NotYet(support::seen(e)),
            };
            match status
                .rollout_conditions
                .iter()
                .find(|c| c.type_ == condition::DEGRADED)
            {
                Some(c) if c.reason == wanted => Probe::Done(c.message.clone()),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await
}

/// With the chart's etcd settings (only the certificates' directory, here
/// the test's), a three-node stacked control plane is rolled completely
/// and keeps three healthy members, one per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_install_rolls_a_stacked_control_plane_keeping_three_healthy_members() {
    let (r, cluster) = stacked("etcd-default", "127.0.4.2", 3).await;
    let env = &r.env;
    let initial: BTreeSet<IpAddr> = node_ips(env).await.into_values().collect();
    let pki = tempfile::tempdir().expect("a dir");
    pki_dir(&cluster, pki.path());
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let pki_flag = format!("--etcd-pki-dir={}", pki.path().display());
    let operator = Replicas::start(
        1,
        env,
        &kubeconfig,
        &format!("nodewarden-{}", env.id),
        "",
        &["--sim-cloud", &r.sim.sim.addr, &pki_flag],
        &dir,
    );
    let stop = CancellationToken::new();
    let joining = joiner_with(env, cluster.clone(), stop.clone(), true);

    let took = roll(&r, "img-2", 1).await;
    let members = members_are_the_nodes(env, &cluster).await;
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(
        members
            .iter()
            .all(|m| m.ip.is_some_and(|ip| !initial.contains(&ip))),
        "no member of a replaced node is left: {members:?}"
    );
    let client = nodewarden::etcd::EtcdClient::new(
        cluster
            .tls
            .as_ref()
            .expect("certificates")
            .config(cluster.client_urls().await),
    )
    .expect("a client");
    let listed = client.members().await.expect("the member list");
    let health = client.health_of(&listed.iter().collect::<Vec<_>>()).await;
    assert!(
        health.values().all(|h| *h == nodewarden::etcd::Health::Healthy) && health.len() == 3,
        "three healthy members: {health:?}"
    );
    let nv = env.name("version");
    assert_eq!(
        times_reaching(env, &nv, "EtcdMemberRemoved", 3).await,
        3,
        "one removal per node"
    );
    stop.cancel();
    let _ = joining.await;
    println!("stacked control plane of 3 rolled with etcd found on it: {took:?}");
    drop(operator);
    finish(r).await;
}

/// Stacked etcd that cannot be reached (the certificates missing, as on a
/// replica off the control plane): the rollout holds, Degraded and an
/// Event saying what to set, and retires no control-plane node; once the
/// certificates are there it finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_stacked_etcd_holds_the_rollout_and_retires_no_control_plane_node() {
    let (r, cluster) = stacked("etcd-unreachable", "127.0.5.2", 3).await;
    let env = &r.env;
    let initial = node_ips(env).await;
    let pki = tempfile::tempdir().expect("a dir");
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let mut config = env.operator_config(MaintenanceConfig::default(), Some(cloud), "operator");
    config.etcd = EtcdSetup::Discover(Discovery::in_dir(pki.path()));
    let op = env.start_operator_from(config).await;
    let stop = CancellationToken::new();
    let joining = joiner_with(env, cluster.clone(), stop.clone(), true);

    let nv = env.name("version");
    Api::<NodeVersion>::all(env.client.clone())
        .patch(
            &nv,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"image": "img-2"}})),
        )
        .await
        .expect("the new image");
    let message = degraded(env, &nv, reason::ETCD_MEMBER_REMOVAL_BLOCKED).await;
    for wanted in ["cannot reach", "--etcd-endpoints", "etcd.hostPKI", "not retired"] {
        assert!(message.contains(wanted), "{wanted}: {message}");
    }
    env.wait_events("NodeVersion", &nv, &["EtcdUnreachable"]).await;
    // Held: the old nodes stay (looked at again after a few passes).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let now = node_ips(env).await;
    for (node, ip) in &initial {
        assert_eq!(now.get(node), Some(ip), "{node} is not retired: {now:?}");
    }
    let members = cluster.list().await.expect("the member list");
    let old_members = members
        .iter()
        .filter(|m| m.ip.is_some_and(|ip| initial.values().any(|i| *i == ip)))
        .count();
    assert_eq!(old_members, 3, "every old member stays: {members:?}");

    // The certificates arrive (a replica on the control plane leads): done.
    pki_dir(&cluster, pki.path());
    roll(&r, "img-2", 1).await;
    members_are_the_nodes(env, &cluster).await;
    stop.cancel();
    let _ = joining.await;
    println!("held with: {message}");
    op.stop().await;
    finish(r).await;
}

/// nodewarden with the webhook on (a configuration of the test's own) and
/// etcd found on the control plane with the certificates in `pki`.
async fn operator_with_webhook(r: &Rollout, pki: &Path) -> RunningOperator {
    let env = &r.env;
    let port = free_port();
    let configuration = env.name("webhook");
    create_configuration(env, &configuration, port).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let mut config = env.operator_config(MaintenanceConfig::default(), Some(cloud), "operator");
    config.etcd = EtcdSetup::Discover(Discovery::in_dir(pki));
    config.admission = Some(support::admission::admission_config(env, port, &configuration));
    let operator = env.start_operator_from(config).await;
    support::admission::wait_ca_bundle(env, &configuration).await;
    operator
}

/// A single-control-plane stacked-etcd cluster (a MiniConstellation, a
/// one-server k3s): the webhook refuses a person's maintenance of its only
/// member, and admits nodewarden's own: the rollout replaces the node and a
/// server Plan's drain of the replacement finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_stacked_control_plane_node_is_replaced_and_drained_by_a_plan_with_the_webhook_on() {
    let (r, cluster) = stacked("etcd-single", "127.0.6.2", 1).await;
    let env = &r.env;
    let pki = tempfile::tempdir().expect("a dir");
    pki_dir(&cluster, pki.path());
    let op = operator_with_webhook(&r, pki.path()).await;
    let old = node_ips(env).await.into_keys().next().expect("the node");
    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let refused = wait_for("the webhook's quorum rule", Duration::from_secs(30), || async {
        match create(&nms, &maintenance(env, "by-hand", &old)).await {
            Err(message) if message.contains("will violate etcd quorum") => Probe::Done(message),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    assert!(refused.contains("0 of the 1 members"), "{refused}");

    let stop = CancellationToken::new();
    let joining = joiner_with(env, cluster.clone(), stop.clone(), true);
    let took = roll(&r, "img-2", 1).await;
    let members = members_are_the_nodes(env, &cluster).await;
    assert_eq!(members.len(), 1, "{members:?}");
    let nv = env.name("version");
    assert_eq!(times_reaching(env, &nv, "EtcdMemberRemoved", 1).await, 1);
    stop.cancel();
    let _ = joining.await;
    let new = node_ips(env).await.into_keys().next().expect("the replacement");
    assert_ne!(new, old);

    // A server Plan drains the one control-plane node and upgrades it.
    let spec = json!({
        "concurrency": 1, "version": "v2", "drain": {"force": true},
        "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/control-plane": ""}},
        "upgrade": upgrade("example.invalid/k3s-upgrade"),
    });
    create_plan(env, "server", json!({}), spec)
        .await
        .expect("creating the server plan");
    let started = std::time::Instant::now();
    wait_upgraded(env, &env.namespace, "server", std::slice::from_ref(&new), TIMEOUT).await;
    println!(
        "single stacked control-plane node replaced in {took:?}; its Plan drain and upgrade in {:?}",
        started.elapsed()
    );
    op.stop().await;
    finish(r).await;
}
