//! etcd member removal in a control-plane rollout, against a real etcd
//! cluster: one process of the pinned etcd binary per control-plane node,
//! each on the node's InternalIP (a loopback address the sim-cloud hands
//! out), new members added as `kubeadm join` adds them, and nodewarden's
//! controllers in-process with the etcd endpoints as flags would give them.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::support::etcd::{EtcdCluster, Listed};
use crate::support::jaeger::Jaeger;
use crate::support::replicas::{Replicas, replica_log_dir, service_account_kubeconfig};
use crate::support::rollout::*;
use crate::support::{Probe, RunningOperator, TestEnv, seen, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use nodewarden::api::update::{NodeVersion, condition, reason};
use nodewarden::cloud::CloudProvider;
use nodewarden::controllers::node_maintenance::MaintenanceConfig;
use nodewarden::etcd::{EtcdClient, EtcdConfig, EtcdSetup, Health};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The InternalIP of each of the test's nodes, by name.
pub(crate) async fn node_ips(env: &TestEnv) -> BTreeMap<String, IpAddr> {
    node_ips_of(&env.client, &env.run_selector()).await
}

async fn node_ips_of(client: &kube::Client, selector: &str) -> BTreeMap<String, IpAddr> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Ok(list) = nodes.list(&ListParams::default().labels(selector)).await else {
        return BTreeMap::new();
    };
    list.items
        .iter()
        .filter_map(|n| {
            let ip = n
                .status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .find(|a| a.type_ == "InternalIP")?
                .address
                .parse()
                .ok()?;
            Some((n.name_any(), ip))
        })
        .collect()
}

/// Plays `kubeadm join` for every new control-plane node: a member on its
/// InternalIP, added and started (tried again while etcd refuses the add).
fn joiner(env: &TestEnv, cluster: Arc<EtcdCluster>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    joiner_with(env, cluster, stop, false)
}

/// As [`joiner`]; with `static_pods` each joined node also gets the mirror
/// pod of its static etcd pod, as the kubelet of a kubeadm node makes it.
pub(crate) fn joiner_with(
    env: &TestEnv,
    cluster: Arc<EtcdCluster>,
    stop: CancellationToken,
    static_pods: bool,
) -> tokio::task::JoinHandle<()> {
    let (client, selector, run) = (env.client.clone(), env.run_selector(), env.id.clone());
    tokio::spawn(async move {
        // etcd refuses adds for seconds after a change: said once per node.
        let mut refused = BTreeSet::new();
        while !stop.is_cancelled() {
            for (name, ip) in node_ips_of(&client, &selector).await {
                if cluster.has(ip).await {
                    continue;
                }
                match cluster.join(&name, ip).await {
                    Ok(()) if static_pods => {
                        support::admission::create_etcd_pod_in(&client, &run, &name).await
                    }
                    Ok(()) => {}
                    Err(e) if refused.insert(name.clone()) => {
                        println!("joining {name} to etcd: {e}; trying again")
                    }
                    Err(_) => {}
                }
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    })
}

/// A control plane of three sim-cloud nodes on `ip_base` and the two
/// addresses after it, and an etcd member on each.
struct Fixture {
    r: Rollout,
    cluster: Arc<EtcdCluster>,
    initial: BTreeMap<String, IpAddr>,
}

async fn fixture(test: &str, ip_base: &str) -> Fixture {
    // A slower boot leaves a test seconds between one retirement and the
    // next replacement's join.
    let extra = json!({"internalIpBase": ip_base, "bootDelay": "2s"});
    let r = setup_with(test, &[("cp", "ControlPlane", 3)], extra).await;
    let initial = node_ips(&r.env).await;
    assert_eq!(initial.len(), 3, "every node has its InternalIP: {initial:?}");
    let members: Vec<(String, IpAddr)> = initial.iter().map(|(n, ip)| (n.clone(), *ip)).collect();
    let cluster = Arc::new(EtcdCluster::start(&members).await);
    Fixture { r, cluster, initial }
}

/// The operator in-process, with `cluster`'s members as its etcd endpoints.
async fn in_process(r: &Rollout, cluster: &EtcdCluster) -> RunningOperator {
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let mut config = r
        .env
        .operator_config(MaintenanceConfig::default(), Some(cloud), "operator");
    config.etcd = EtcdSetup::Endpoints(Arc::new(
        EtcdClient::new(EtcdConfig {
            endpoints: cluster.client_urls().await,
            ..Default::default()
        })
        .expect("an etcd client"),
    ));
    r.env.start_operator_from(config).await
}

/// Waits until etcd's members are exactly the nodes' (one started member
/// on each node's InternalIP, no other); returns them.
pub(crate) async fn members_are_the_nodes(env: &TestEnv, cluster: &EtcdCluster) -> Vec<Listed> {
    wait_for(
        "etcd's members to be exactly the nodes'",
        Duration::from_secs(30),
        || async {
            let ips: BTreeSet<IpAddr> = node_ips(env).await.into_values().collect();
            match cluster.list().await {
                Ok(members) => {
                    let on: BTreeSet<IpAddr> = members.iter().filter_map(|m| m.ip).collect();
                    let started = members.iter().all(|m| !m.name.is_empty());
                    if on == ips && members.len() == ips.len() && started {
                        Probe::Done(members)
                    } else {
                        Probe::NotYet(format!("members {members:?}, nodes on {ips:?}"))
                    }
                }
                Err(e) => Probe::NotYet(e),
            }
        },
    )
    .await
}

/// How often the Event `reason` was reported on NodeVersion `name` (Events
/// of one reason on one object are one Event with a series).
pub(crate) async fn times(env: &TestEnv, name: &str, reason: &str) -> i32 {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    let fields = format!("regarding.kind=NodeVersion,regarding.name={name}");
    let list = events
        .list(&ListParams::default().fields(&fields))
        .await
        .expect("listing Events");
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// [`times`] once it reached `expected`, or what it reached in 30 s: the
/// Events are written after the actions they tell of, so a rollout can be
/// complete before its last Event is.
pub(crate) async fn times_reaching(env: &TestEnv, name: &str, reason: &str, expected: i32) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = times(env, name, reason).await;
        if seen >= expected || std::time::Instant::now() >= deadline {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn finish(r: Rollout) {
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_rollout_removes_the_etcd_member_of_each_replaced_node() {
    let jaeger = Jaeger::start();
    let f = fixture("etcd-members", "127.0.0.2").await;
    let env = &f.r.env;
    // The shipped binary with its flags, as nodewarden's ServiceAccount.
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let endpoints = f.cluster.client_urls().await.join(",");
    let operator = Replicas::start(
        1,
        env,
        &kubeconfig,
        &format!("nodewarden-{}", env.id),
        &jaeger.otlp_endpoint,
        &["--sim-cloud", &f.r.sim.sim.addr, "--etcd-endpoints", &endpoints],
        &dir,
    );
    let ips: BTreeSet<IpAddr> = f.initial.values().copied().collect();
    let want: BTreeSet<IpAddr> = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    assert_eq!(ips, want, "the sim-cloud handed out the addresses asked for");
    let checker = Checker::start(env, 3, 1);
    let stop = CancellationToken::new();
    let joining = joiner(env, f.cluster.clone(), stop.clone());

    let took = roll(&f.r, "img-2", 1).await;
    let members = members_are_the_nodes(env, &f.cluster).await;
    assert!(
        members.iter().all(|m| m.ip.is_some_and(|ip| !ips.contains(&ip))),
        "no member of a replaced node is left: {members:?}"
    );
    let nv = env.name("version");
    assert_eq!(
        times_reaching(env, &nv, "EtcdMemberRemoved", 3).await,
        3,
        "one Event per removal"
    );
    // A "remove etcd member" phase in each replacement's trace.
    let replaced: BTreeSet<String> = f.initial.keys().cloned().collect();
    let traces = jaeger
        .wait_node_traces("nodewarden", "replace node", &replaced)
        .await;
    for t in &traces {
        let removal = t.spans.iter().find(|s| s.operation_name == "remove etcd member");
        let outcome = removal.and_then(|s| s.tag_str("nodewarden.etcd.outcome"));
        // "removed already": etcd answered 404 to a removal of a member its
        // list had just shown (a list from a member behind the change, or
        // an earlier attempt's answer lost); the member list is checked above.
        assert!(
            matches!(outcome, Some("removed" | "removed already")),
            "{outcome:?} {:?}",
            t.operations()
        );
    }
    stop.cancel();
    let _ = joining.await;
    let found = checker.finish().await;
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    println!(
        "control-plane rollout of 3 nodes with etcd member removal: {took:?}; members now {:?}",
        members.iter().map(|m| &m.name).collect::<Vec<_>>()
    );
    drop(operator);
    finish(f.r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_member_holds_the_removal_with_a_condition_naming_it() {
    let f = fixture("etcd-unhealthy", "127.0.1.2").await;
    let op = in_process(&f.r, &f.cluster).await;
    let env = &f.r.env;
    let old: BTreeSet<IpAddr> = f.initial.values().copied().collect();
    let stop = CancellationToken::new();
    let joining = joiner(env, f.cluster.clone(), stop.clone());
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let nv = env.name("version");
    let cluster = f.cluster.clone();

    let hold_and_heal = async {
        // The first replacement is through: an old member removed, the
        // replacement's member in.
        let first_new = wait_for(
            "the first old member replaced",
            Duration::from_secs(120),
            || async {
                let members = match cluster.list().await {
                    Ok(m) => m,
                    Err(e) => return Probe::NotYet(e),
                };
                let old_left = members
                    .iter()
                    .filter(|m| m.ip.is_some_and(|ip| old.contains(&ip)))
                    .count();
                let new: Vec<IpAddr> = members
                    .iter()
                    .filter(|m| !m.name.is_empty())
                    .filter_map(|m| m.ip)
                    .filter(|ip| !old.contains(ip))
                    .collect();
                match (old_left, new.as_slice()) {
                    (2, [ip]) => Probe::Done(*ip),
                    _ => Probe::NotYet(format!("{members:?}")),
                }
            },
        )
        .await;
        // The new member goes down: it is no donor, so the next removal
        // (of an old member) must wait for it.
        let name = cluster.name_on(first_new).await.expect("a member on that IP");
        cluster.kill(first_new).await;
        let message = wait_for(
            "Degraded=EtcdMemberRemovalBlocked naming the member that is down",
            Duration::from_secs(120),
            || async {
                let nv = match versions.get(&nv).await {
                    Ok(nv) => nv,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let conditions = nv.status.unwrap_or_default().rollout_conditions;
                match conditions.iter().find(|c| c.type_ == condition::DEGRADED) {
                    Some(c)
                        if c.reason == reason::ETCD_MEMBER_REMOVAL_BLOCKED && c.message.contains(&name) =>
                    {
                        Probe::Done(c.message.clone())
                    }
                    other => Probe::NotYet(format!("{other:?}")),
                }
            },
        )
        .await;
        env.wait_events("NodeVersion", &nv, &["EtcdMemberRemovalBlocked"])
            .await;
        // Held: two old nodes are still there, with their members.
        let nodes_now = node_ips(env).await;
        let old_nodes = nodes_now.values().filter(|ip| old.contains(ip)).count();
        assert_eq!(
            old_nodes, 2,
            "no old node retired while a member is down: {nodes_now:?}"
        );
        cluster.restart(first_new).await;
        (name, message)
    };
    let (took, (name, message)) = tokio::join!(roll(&f.r, "img-2", 1), hold_and_heal);
    assert!(message.contains(&name), "{message}");
    let members = members_are_the_nodes(env, &f.cluster).await;
    stop.cancel();
    let _ = joining.await;
    // The condition clears once the member is back (the pass that finds
    // the rollout done writes it; the nodes can be seen done before that).
    support::wait_for_condition(
        &versions,
        &nv,
        (condition::DEGRADED, "False", reason::AS_EXPECTED),
        Duration::from_secs(30),
    )
    .await;
    println!(
        "rollout with a member down mid-way: {took:?}; held with: {message}; members now {:?}",
        members.iter().map(|m| &m.name).collect::<Vec<_>>()
    );
    op.stop().await;
    finish(f.r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_etcd_is_left_alone() {
    // The nodes on 127.0.2.x, etcd's member elsewhere: no member is theirs.
    let r = setup_with(
        "etcd-external",
        &[("cp", "ControlPlane", 1)],
        json!({"internalIpBase": "127.0.2.2"}),
    )
    .await;
    let env = &r.env;
    let external: IpAddr = "127.0.2.100".parse().expect("an IP");
    let cluster = EtcdCluster::start(&[("external-0".to_string(), external)]).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let mut config = env.operator_config(MaintenanceConfig::default(), Some(cloud), "operator");
    config.etcd = EtcdSetup::Endpoints(Arc::new(
        EtcdClient::new(EtcdConfig {
            endpoints: cluster.client_urls().await,
            ..Default::default()
        })
        .expect("an etcd client"),
    ));
    let op = env.start_operator_from(config).await;

    roll(&r, "img-2", 1).await;
    let nv = env.name("version");
    env.wait_events("NodeVersion", &nv, &["NoEtcdMember"]).await;
    let events = env.event_reasons("NodeVersion", &nv).await;
    assert!(!events.contains_key("EtcdMemberRemoved"), "{events:?}");
    let members = cluster.list().await.expect("the member list");
    assert_eq!(
        members.iter().map(|m| m.ip).collect::<Vec<_>>(),
        vec![Some(external)],
        "the external member stays"
    );
    op.stop().await;
    r.sim.sim.kill().await;
    r.env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_is_reached_over_tls_with_the_client_certificate_only() {
    let ip: IpAddr = "127.0.3.2".parse().expect("an IP");
    let cluster = EtcdCluster::start_with(&[("tls-0".to_string(), ip)], true).await;
    let tls = cluster.tls.clone().expect("certificates");
    let endpoints = cluster.client_urls().await;
    let client = EtcdClient::new(tls.config(endpoints.clone())).expect("a client");
    let members = client.members().await.expect("the member list over TLS");
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].name, "tls-0");
    assert!(members[0].client_urls[0].starts_with("https://"), "{members:?}");
    assert_eq!(client.health(&members[0]).await, Health::Healthy);
    // Without a client certificate etcd refuses the connection.
    let anonymous = EtcdConfig {
        cert: None,
        key: None,
        ..tls.config(endpoints.clone())
    };
    let refused = EtcdClient::new(anonymous).expect("a client").members().await;
    assert!(refused.is_err(), "{refused:?}");
    // Nor is a server trusted that the CA did not sign.
    let other = tempfile::tempdir().expect("a temp dir");
    let stranger = support::etcd::Tls::generate(other.path(), &[ip]);
    let untrusted = EtcdConfig {
        ca: Some(stranger.ca.clone()),
        ..tls.config(endpoints)
    };
    let refused = EtcdClient::new(untrusted).expect("a client").members().await;
    assert!(refused.is_err(), "{refused:?}");
}
