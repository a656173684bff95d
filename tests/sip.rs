//! SIPClusters (`airship.airshipit.org/v1`) over metal3's genuine
//! BareMetalHost CRD on the real control plane: the hosts' networkData and
//! BMC Secrets are real Secrets, the test plays metal3 by writing host
//! status, the support services' pods run on kwok nodes and the garbage
//! collector removes what a deleted SIPCluster owned.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::sip::{SIPCluster, labels};
use serde_json::{Value, json};
use support::sip::*;
use support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

#[tokio::test]
async fn a_sipcluster_claims_spread_hosts_runs_its_services_and_replaces_a_failed_host() {
    let env = TestEnv::new("sip-main").await;
    support::install_crds(&env.client).await;
    env.create_kwok_nodes(2, &[]).await;
    put_ssh_keys(&env).await;
    create_racks(&env, 6, 4).await;
    let operator = env.start_operator(Default::default()).await;
    create_sip(&env, "tenant", spec(&env, (3, 1), (4, 1), 30200))
        .await
        .expect("creating the SIPCluster");
    let message = wait_ready(&env, "tenant", "True", "ReconciliationSucceeded").await;
    assert!(message.contains("9 hosts"), "{message}");
    let got = claimed(&env, "tenant").await;
    let of = |role: &str, state: &str| -> Vec<String> {
        got.iter()
            .filter(|(_, (r, s))| r == role && s == state)
            .map(|(n, _)| n.clone())
            .collect()
    };
    assert_eq!(of("ControlPlane", "active").len(), 3, "{got:?}");
    assert_eq!(of("ControlPlane", "standby").len(), 1, "{got:?}");
    assert_eq!(of("Worker", "active").len(), 4, "{got:?}");
    assert_eq!(of("Worker", "standby").len(), 1, "{got:?}");
    let cp: Vec<String> = [of("ControlPlane", "active"), of("ControlPlane", "standby")].concat();
    let racks: BTreeSet<&str> = cp.iter().map(|h| rack_of(h)).collect();
    assert_eq!(racks.len(), 4, "one control-plane host per rack: {cp:?}");
    for h in &cp {
        assert!(
            h.ends_with("-h0"),
            "control-plane hosts have the control-plane flavor: {h}"
        );
    }

    // Services: the right backends, owned by the SIPCluster.
    let cfg = haproxy_config(&env, "loadbalancer-controlplane-tenant").await;
    for h in of("ControlPlane", "active") {
        let ip = format!("10.23.{}.10:6443", &rack_of(&h)[1..]);
        assert!(
            cfg.contains(&format!("server {h} {ip}")),
            "{h} is a backend:\n{cfg}"
        );
    }
    let standby = of("ControlPlane", "standby")[0].clone();
    assert!(!cfg.contains(&standby), "a standby is no backend:\n{cfg}");
    let worker_cfg = haproxy_config(&env, "loadbalancer-worker-tenant").await;
    assert_eq!(
        worker_cfg.lines().filter(|l| l.starts_with("  server ")).count(),
        4 * 3,
        "4 workers x 3 ports:\n{worker_cfg}"
    );
    let jump = Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
        .get("jumphost-tenant")
        .await
        .expect("the jump host's secret");
    let hosts: Value = serde_json::from_slice(&jump.data.unwrap_or_default()["hosts"].0).expect("hosts json");
    assert_eq!(hosts.as_array().map(Vec::len), Some(9), "{hosts}");
    assert!(
        hosts[0]["bmc"]["ip"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.23.0.")),
        "{hosts}"
    );
    assert_eq!(hosts[0]["bmc"]["username"], "root");
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    for name in [
        "loadbalancer-controlplane-tenant",
        "loadbalancer-worker-tenant",
        "jumphost-tenant",
    ] {
        let d = deployments.get(name).await.expect("a service deployment");
        assert_eq!(
            d.owner_references().first().map(|o| o.kind.as_str()),
            Some("SIPCluster"),
            "{name} is owned"
        );
    }
    let svc = Api::<Service>::namespaced(env.client.clone(), &env.namespace)
        .get("loadbalancer-controlplane-tenant")
        .await
        .expect("the service");
    assert_eq!(
        svc.spec.and_then(|s| s.ports).map(|p| p[0].node_port),
        Some(Some(30200))
    );
    let s = sips(&env).get("tenant").await.expect("the sipcluster");
    let status = s.status.expect("a status");
    assert_eq!(status.control_plane.as_deref(), Some("3/3 (+1/1)"));
    assert_eq!(status.workers.as_deref(), Some("4/4 (+1/1)"));
    assert_eq!(status.services.len(), 3);

    // An active control-plane host fails: the standby serves at once, the
    // load balancer follows, a new standby is chosen; then it is deleted.
    let failed = of("ControlPlane", "active")[0].clone();
    set_host_status(&env, &failed, "error", "provisioned").await;
    wait_for(
        "the standby promoted and a new standby chosen",
        Duration::from_secs(20),
        || async {
            let now = claimed(&env, "tenant").await;
            let state = |h: &str| now.get(h).map(|(_, s)| s.clone());
            let standbys: Vec<&String> = now
                .iter()
                .filter(|(_, (r, s))| r == "ControlPlane" && s == "standby")
                .map(|(n, _)| n)
                .collect();
            if state(&failed).is_none() && state(&standby).as_deref() == Some("active") && standbys.len() == 1
            {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("{now:?}"))
            }
        },
    )
    .await;
    wait_for("the load balancer follows", Duration::from_secs(20), || async {
        let cfg = haproxy_config(&env, "loadbalancer-controlplane-tenant").await;
        if cfg.contains(&format!("server {standby} ")) && !cfg.contains(&format!("server {failed} ")) {
            Probe::Done(())
        } else {
            Probe::NotYet(cfg)
        }
    })
    .await;
    let now = claimed(&env, "tenant").await;
    let cp_racks: BTreeSet<&str> = now
        .iter()
        .filter(|(_, (r, _))| r == "ControlPlane")
        .map(|(n, _)| rack_of(n))
        .collect();
    assert_eq!(cp_racks.len(), 4, "spread holds after the replacement: {now:?}");
    wait_ready(&env, "tenant", "True", "ReconciliationSucceeded").await;
    hosts_api(&env)
        .delete(&failed, &DeleteParams::default())
        .await
        .expect("deleting the failed host");
    assert_eq!(claimed(&env, "tenant").await.len(), 9);
    // Events are published in the background: wait for it.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), &env.namespace);
    wait_for(
        "a HostReplaced Event naming the failed host",
        Duration::from_secs(20),
        || async {
            match events
                .list(&ListParams::default().fields("reason=HostReplaced"))
                .await
            {
                Ok(l)
                    if l.items
                        .iter()
                        .any(|e| e.message.as_deref().is_some_and(|m| m.contains(&failed))) =>
                {
                    Probe::Done(())
                }
                Ok(l) => Probe::NotYet(format!("{} HostReplaced events", l.items.len())),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;

    // Shrinking: one worker fewer; the standby that was idle goes first.
    let before = claimed(&env, "tenant").await;
    let idle: Vec<String> = before
        .iter()
        .filter(|(_, (r, s))| r == "Worker" && s == "standby")
        .map(|(n, _)| n.clone())
        .collect();
    sips(&env)
        .patch(
            "tenant",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"nodes": {"Worker": {"count": {"active": 3, "standby": 1}}}}})),
        )
        .await
        .expect("shrinking");
    wait_for(
        "3 active workers and 1 standby",
        Duration::from_secs(20),
        || async {
            let now = claimed(&env, "tenant").await;
            let of = |s: &str| now.values().filter(|(r, x)| r == "Worker" && x == s).count();
            match (of("active"), of("standby"), now.contains_key(&idle[0])) {
                (3, 1, false) => Probe::Done(()),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    wait_for(
        "the worker load balancer follows",
        Duration::from_secs(20),
        || async {
            let cfg = haproxy_config(&env, "loadbalancer-worker-tenant").await;
            match cfg.lines().filter(|l| l.starts_with("  server ")).count() {
                9 => Probe::Done(()),
                n => Probe::NotYet(format!("{n} servers")),
            }
        },
    )
    .await;

    // Deleting the SIPCluster: every host released, every service object gone.
    sips(&env)
        .delete("tenant", &DeleteParams::default())
        .await
        .expect("deleting the SIPCluster");
    wait_for("hosts released and services collected", TIMEOUT, || async {
        let left = claimed(&env, "tenant").await.len();
        let lp = ListParams::default().labels("sip.airshipit.org/cluster-name=tenant");
        let d = deployments.list(&lp).await.map(|l| l.items.len()).unwrap_or(1);
        let s = Api::<Service>::namespaced(env.client.clone(), &env.namespace)
            .list(&lp)
            .await
            .map(|l| l.items.len())
            .unwrap_or(1);
        let sec = Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
            .list(&lp)
            .await
            .map(|l| l.items.len())
            .unwrap_or(1);
        match (left, d, s, sec) {
            (0, 0, 0, 0) => Probe::Done(()),
            other => Probe::NotYet(format!("hosts, deployments, services, secrets: {other:?}")),
        }
    })
    .await;
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn too_few_racks_is_unschedulable_until_hosts_are_added() {
    let env = TestEnv::new("sip-short").await;
    support::install_crds(&env.client).await;
    put_ssh_keys(&env).await;
    create_racks(&env, 2, 3).await;
    let operator = env.start_operator(Default::default()).await;
    create_sip(&env, "short", spec(&env, (3, 0), (2, 0), 30220))
        .await
        .expect("creating the SIPCluster");
    let message = wait_ready(&env, "short", "False", "Unschedulable").await;
    assert!(
        message.contains("ControlPlane: 3 wanted (3 active + 0 standby), 2 available (one per test.nodewarden.dev/rack value)"),
        "{message}"
    );
    assert!(
        claimed(&env, "short").await.is_empty(),
        "nothing claimed until all fit"
    );
    create_host(&env, "r9-h0", "rack-9", "control-plane", "10.23.9.10").await;
    wait_ready(&env, "short", "True", "ReconciliationSucceeded").await;
    assert_eq!(claimed(&env, "short").await.len(), 5);
    delete_sip_and_wait(&env, "short").await;
    assert!(claimed(&env, "short").await.is_empty(), "released on delete");
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn two_sipclusters_at_once_over_a_pool_for_one_never_share_a_host() {
    let env = TestEnv::new("sip-race").await;
    support::install_crds(&env.client).await;
    put_ssh_keys(&env).await;
    // 6 racks of one control-plane host each: each cluster wants 4.
    create_racks(&env, 6, 1).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let checker = tokio::spawn(watch_claims(
        env.client.clone(),
        env.namespace.clone(),
        stop.clone(),
    ));
    let operator = env.start_operator(Default::default()).await;
    let (a, b) = tokio::join!(
        create_sip(&env, "alpha", spec(&env, (3, 1), (0, 0), 30240)),
        create_sip(&env, "beta", spec(&env, (3, 1), (0, 0), 30250)),
    );
    a.expect("creating alpha");
    b.expect("creating beta");
    let (winner, loser) = wait_for("one SIPCluster Ready", TIMEOUT, || async {
        let ready = |s: &SIPCluster| {
            s.status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .any(|c| c.type_ == "Ready" && c.status == "True")
        };
        match (sips(&env).get("alpha").await, sips(&env).get("beta").await) {
            (Ok(a), Ok(_)) if ready(&a) => Probe::Done(("alpha", "beta")),
            (Ok(_), Ok(b)) if ready(&b) => Probe::Done(("beta", "alpha")),
            other => Probe::NotYet(format!("{:?}", other.0.map(|s| s.status))),
        }
    })
    .await;
    let message = wait_ready(&env, loser, "False", "Unschedulable").await;
    assert!(message.contains("no host claimed until all fit"), "{message}");
    // Give the loser time to (wrongly) take hosts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(claimed(&env, winner).await.len(), 4);
    assert!(claimed(&env, loser).await.is_empty(), "the loser holds nothing");
    stop.cancel();
    let breaches = checker.await.expect("the checker");
    assert!(breaches.is_empty(), "{breaches:#?}");

    // Once the winner goes, the loser gets the hosts.
    sips(&env)
        .delete(winner, &DeleteParams::default())
        .await
        .expect("deleting the winner");
    wait_ready(&env, loser, "True", "ReconciliationSucceeded").await;
    delete_sip_and_wait(&env, loser).await;
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn bad_sipclusters_get_a_clear_answer() {
    let env = TestEnv::new("sip-bad").await;
    support::install_crds(&env.client).await;
    let base = spec(&env, (1, 0), (1, 0), 30260);
    let with = |path: &[&str], value: Value| {
        let mut s = base.clone();
        let mut at = &mut s;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = value;
        s
    };
    let cases = [
        (
            with(&["nodes", "Storage"], json!({"count": {"active": 1}})),
            "the roles are ControlPlane and Worker",
        ),
        (
            with(&["nodes", "Worker", "count", "active"], json!(-1)),
            "count.active must not be negative",
        ),
        (
            with(&["nodes", "Worker", "count", "standby"], json!(-2)),
            "count.standby must not be negative",
        ),
        (
            with(&["nodes", "Worker", "topologyKey"], json!("")),
            "topologyKey must not be empty",
        ),
    ];
    for (i, (spec, wanted)) in cases.into_iter().enumerate() {
        match create_sip(&env, &format!("bad-{i}"), spec).await {
            Err(kube::Error::Api(s)) => assert!(s.message.contains(wanted), "{wanted}: {}", s.message),
            other => panic!("{wanted}: accepted: {other:?}"),
        }
    }
    // The jump host's key Secret is missing: Ready=False naming the field.
    create_racks(&env, 1, 2).await;
    let operator = env.start_operator(Default::default()).await;
    create_sip(&env, "nokeys", base.clone()).await.expect("creating");
    let message = wait_ready(&env, "nokeys", "False", "InfraServiceFailure").await;
    assert!(
        message.contains("spec.services.jumpHost[0].nodeSSHPrivateKeys") && message.contains("ssh-keys"),
        "{message}"
    );
    put_ssh_keys(&env).await;
    wait_ready(&env, "nokeys", "True", "ReconciliationSucceeded").await;
    delete_sip_and_wait(&env, "nokeys").await;
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_samples_apply_strictly_and_their_sipcluster_becomes_ready() {
    let env = TestEnv::new("sip-samples").await;
    support::install_crds(&env.client).await;
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/samples");
    for file in ["baremetalhosts.yaml", "sipcluster.yaml"] {
        support::apply_manifest(&env.client, &dir.join(file)).await;
    }
    // Only this test's operator may see them: its run label; and metal3's
    // word that the hosts are usable.
    let label = json!({"metadata": {"labels": {RUN_LABEL: env.id}}});
    let hosts: Api<BareMetalHost> = Api::namespaced(env.client.clone(), "metal3");
    let status = json!({"status": {
        "errorCount": 0, "errorMessage": "", "operationalStatus": "OK", "poweredOn": true,
        "provisioning": {"ID": "", "state": "available"},
    }});
    for h in hosts
        .list(&ListParams::default())
        .await
        .expect("the sample hosts")
        .items
    {
        let name = h.name_any();
        hosts
            .patch(&name, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .expect("labelling");
        hosts
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("host status");
    }
    let api: Api<SIPCluster> = Api::namespaced(env.client.clone(), "sipcluster-system");
    api.patch("tenant-1", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("labelling the SIPCluster");
    let operator = env.start_operator(Default::default()).await;
    support::wait_for_condition(
        &api,
        "tenant-1",
        ("Ready", "True", "ReconciliationSucceeded"),
        TIMEOUT,
    )
    .await;
    let s = api.get("tenant-1").await.expect("the sample");
    let status = s.status.expect("a status");
    assert_eq!(status.control_plane.as_deref(), Some("1/1 (+1/1)"));
    assert_eq!(status.workers.as_deref(), Some("2/2 (+1/1)"));
    assert!(
        status
            .hosts
            .iter()
            .all(|h| h.ip.as_deref().is_some_and(|ip| ip.starts_with("10.23.25."))),
        "{:?}",
        status.hosts
    );
    // Leave nothing behind for the next run.
    api.delete("tenant-1", &DeleteParams::default())
        .await
        .expect("deleting the sample");
    wait_for("the sample SIPCluster gone", TIMEOUT, || async {
        match api.get_opt("tenant-1").await {
            Ok(None) => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    for h in hosts
        .list(&ListParams::default())
        .await
        .expect("the sample hosts")
        .items
    {
        assert!(
            h.labels().get(labels::CLUSTER_NAME).is_none(),
            "{} released",
            h.name_any()
        );
        let _ = hosts.delete(&h.name_any(), &DeleteParams::default()).await;
    }
    operator.stop().await;
    env.cleanup().await;
}
