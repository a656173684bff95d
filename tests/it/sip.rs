//! SIPClusters (`airship.airshipit.org/v1`) over metal3's genuine
//! BareMetalHost CRD on the real control plane: the hosts' networkData and
//! BMC Secrets are real Secrets, the test plays metal3 by writing host
//! status, the support services' pods run on kwok nodes and the garbage
//! collector removes what a deleted SIPCluster owned.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::sip::*;
use crate::support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::sip::{SIPCluster, labels};
use serde_json::{Value, json};

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
    drift_is_made_right_at_once(&env, &cfg).await;

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

/// What a Ready SIPCluster made, deleted or edited by hand, is made right
/// within seconds: its objects are watched, while its resync is minutes
/// away. Then all is quiet: applying what is there writes nothing, so the
/// watch wakes nothing (no reconcile feeding on its own writes).
async fn drift_is_made_right_at_once(env: &TestEnv, cfg: &str) {
    let within = Duration::from_secs(10);
    let lb = "loadbalancer-controlplane-tenant";
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.namespace);
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let gone = uid_of::<Service>(env, lb).await;
    services
        .delete(lb, &DeleteParams::default())
        .await
        .expect("deleting a Service");
    wait_for("the Service made again", within, || async {
        match uid_of::<Service>(env, lb).await {
            Some(uid) if Some(&uid) != gone.as_ref() => Probe::Done(()),
            other => Probe::NotYet(format!("uid {other:?}")),
        }
    })
    .await;
    let gone = uid_of::<Deployment>(env, "jumphost-tenant").await;
    deployments
        .delete("jumphost-tenant", &DeleteParams::default())
        .await
        .expect("deleting a Deployment");
    wait_for("the Deployment made again", within, || async {
        match uid_of::<Deployment>(env, "jumphost-tenant").await {
            Some(uid) if Some(&uid) != gone.as_ref() => Probe::Done(()),
            other => Probe::NotYet(format!("uid {other:?}")),
        }
    })
    .await;
    let tampered = json!({"stringData": {"haproxy.cfg": "tampered"}});
    secrets
        .patch(lb, &PatchParams::default(), &Patch::Merge(&tampered))
        .await
        .expect("editing the load balancer's configuration");
    wait_for("the configuration written back", within, || async {
        match haproxy_config(env, lb).await {
            now if now == cfg => Probe::Done(()),
            now => Probe::NotYet(now),
        }
    })
    .await;
    let versions = || async {
        let mut all = Vec::new();
        for name in [lb, "loadbalancer-worker-tenant", "jumphost-tenant"] {
            let service = services.get(name).await.expect("the Service");
            let secret = secrets.get(name).await.expect("the Secret");
            all.push((name, service.resource_version(), secret.resource_version()));
        }
        all
    };
    let settled = versions().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(versions().await, settled, "nothing written while nothing changed");
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

/// The objects of the three services of SIPCluster `sip`: (kind, name).
fn service_objects(sip: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for prefix in ["loadbalancer-controlplane", "loadbalancer-worker", "jumphost"] {
        let name = format!("{prefix}-{sip}");
        for kind in ["Deployment", "Service", "Secret"] {
            out.push((kind, name.clone()));
        }
    }
    out.push(("ConfigMap", format!("jumphost-{sip}")));
    out
}

async fn uids(env: &TestEnv, sip: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (kind, name) in service_objects(sip) {
        let uid = match kind {
            "Deployment" => uid_of::<Deployment>(env, &name).await,
            "Service" => uid_of::<Service>(env, &name).await,
            "Secret" => uid_of::<Secret>(env, &name).await,
            _ => uid_of::<ConfigMap>(env, &name).await,
        };
        out.push((format!("{kind} {name}"), uid));
    }
    out
}

/// Waits for an Event of `reason` whose message holds `words`.
async fn wait_for_event(env: &TestEnv, reason: &str, words: &str) {
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), &env.namespace);
    wait_for(&format!("a {reason} Event: {words}"), TIMEOUT, || async {
        match events
            .list(&ListParams::default().fields(&format!("reason={reason}")))
            .await
        {
            Ok(l)
                if l.items
                    .iter()
                    .any(|e| e.message.as_deref().is_some_and(|m| m.contains(words))) =>
            {
                Probe::Done(())
            }
            Ok(l) => Probe::NotYet(format!("{} {reason} events", l.items.len())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

/// Airship SIP ran this SIPCluster: its hosts carry upstream's labels (no
/// state label; one without its topology label), its services are
/// upstream's objects (its labels and selectors, no owner). nodewarden
/// takes over with no host released and no object recreated, each
/// Deployment keeping its selector.
#[tokio::test]
async fn takeover_from_airship_sip_keeps_every_host_and_service() {
    let env = sip_env("sip-takeover", 3, 3).await;
    let held = [
        ("r0-h0", "ControlPlane"),
        ("r1-h0", "ControlPlane"),
        ("r2-h0", "ControlPlane"),
        ("r0-h1", "Worker"),
        ("r1-h1", "Worker"),
        ("r2-h1", "Worker"),
    ];
    for (host, role) in held {
        label_as_upstream(&env, "tenant", host, role).await;
    }
    // Upstream treats a host without the topologyKey label as unconstrained.
    drop_host_label(&env, "r2-h1", "test.nodewarden.dev/server").await;
    let port = 30500;
    create_upstream_service(
        &env,
        "loadbalancer-controlplane-tenant",
        "loadbalancer",
        &[("http", 6443, port)],
    )
    .await;
    let worker_ports: Vec<(String, i32, i32)> = (port + 1..=port + 3)
        .map(|p| (format!("port-{p}"), p, p))
        .collect();
    let worker_ports: Vec<(&str, i32, i32)> = worker_ports
        .iter()
        .map(|(n, p, np)| (n.as_str(), *p, *np))
        .collect();
    create_upstream_service(&env, "loadbalancer-worker-tenant", "loadbalancer", &worker_ports).await;
    create_upstream_service(&env, "jumphost-tenant", "jumphost", &[("ssh", 22, port + 4)]).await;
    let before = uids(&env, "tenant").await;
    assert!(before.iter().all(|(_, u)| u.is_some()), "{before:?}");
    let labels_before: Vec<_> = claimed(&env, "tenant")
        .await
        .into_iter()
        .map(|(h, (r, _))| (h, r))
        .collect();
    assert_eq!(labels_before.len(), 6);

    let stop = tokio_util::sync::CancellationToken::new();
    let (synced, listed) = tokio::sync::oneshot::channel();
    let releases = tokio::spawn(watch_releases(
        env.client.clone(),
        env.namespace.clone(),
        held.iter().map(|(h, _)| h.to_string()).collect(),
        synced,
        stop.clone(),
    ));
    listed.await.expect("the host watch listed");
    create_sip(&env, "tenant", spec(&env, (3, 0), (2, 1), port))
        .await
        .expect("creating the SIPCluster");
    let operator = env.start_operator(Default::default()).await;
    wait_ready(&env, "tenant", "True", "ReconciliationSucceeded").await;
    wait_for_event(&env, "Adopted", "Deployment").await;

    // No object was made anew, every Deployment kept upstream's selector
    // and is owned now, the Services select the same pods.
    assert_eq!(uids(&env, "tenant").await, before, "no object recreated");
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.namespace);
    for (component, prefix) in [
        ("loadbalancer", "loadbalancer-controlplane"),
        ("loadbalancer", "loadbalancer-worker"),
        ("jumphost", "jumphost"),
    ] {
        let name = format!("{prefix}-tenant");
        let app = if component == "jumphost" {
            "jumphost"
        } else {
            "haproxy"
        };
        let want: std::collections::BTreeMap<String, String> =
            serde_json::from_value(upstream_labels(&name, component, app)).expect("labels");
        let d = deployments.get(&name).await.expect("the deployment");
        assert_eq!(
            d.owner_references().first().map(|o| o.kind.as_str()),
            Some("SIPCluster"),
            "{name} is owned now"
        );
        let spec = d.spec.expect("spec");
        assert_eq!(
            spec.selector.match_labels.as_ref(),
            Some(&want),
            "{name} keeps its selector"
        );
        let pod_labels = spec.template.metadata.and_then(|m| m.labels).unwrap_or_default();
        assert!(
            want.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{name}: {pod_labels:?}"
        );
        let svc = services.get(&name).await.expect("the service");
        assert_eq!(svc.spec.and_then(|s| s.selector), Some(want), "{name}'s Service");
    }
    // The load balancer is placed by nodeLabels now (nodeSelector is one
    // atomic field); upstream's toleration, a field nodewarden leaves
    // alone, stays.
    let lb = deployments
        .get("loadbalancer-controlplane-tenant")
        .await
        .expect("it");
    let pod = lb.spec.and_then(|s| s.template.spec).expect("a pod");
    let placement = pod.node_selector.unwrap_or_default();
    assert_eq!(placement.keys().collect::<Vec<_>>(), [RUN_LABEL], "{placement:?}");
    let tolerated = pod.tolerations.unwrap_or_default();
    assert_eq!(
        tolerated.iter().map(|t| t.key.as_deref()).collect::<Vec<_>>(),
        [Some("node-role.kubernetes.io/master")]
    );
    let jump = deployments.get("jumphost-tenant").await.expect("the jump host");
    let pod = jump.spec.and_then(|s| s.template.spec).expect("a pod");
    assert_eq!(
        pod.init_containers.as_ref().map(|c| c[0].name.as_str()),
        Some("ssh-perms"),
        "the jump host runs in nodewarden's layout now"
    );

    // Every host held as it was, the one without its topology label too.
    let after: Vec<_> = claimed(&env, "tenant")
        .await
        .into_iter()
        .map(|(h, (r, _))| (h, r))
        .collect();
    assert_eq!(after, labels_before, "the same hosts, the same roles");
    let standby = claimed(&env, "tenant")
        .await
        .values()
        .filter(|(_, s)| s == "standby")
        .count();
    assert_eq!(standby, 1, "one worker waits as the standby asked for");
    stop.cancel();
    let released = releases.await.expect("the watch");
    assert!(released.is_empty(), "hosts released on takeover: {released:?}");
    delete_sip_and_wait(&env, "tenant").await;
    operator.stop().await;
    env.cleanup().await;
}

/// Every mount of a pod's containers as `container: path <- volume[subPath]`.
fn mounts(pod: &k8s_openapi::api::core::v1::PodSpec) -> Vec<String> {
    pod.init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .flat_map(|c| {
            c.volume_mounts.iter().flatten().map(move |m| {
                let sub = m
                    .sub_path
                    .as_deref()
                    .map(|s| format!("[{s}]"))
                    .unwrap_or_default();
                format!("{}: {} <- {}{sub}", c.name, m.mount_path, m.name)
            })
        })
        .collect()
}

/// The jump host as upstream's jump-host image expects it, on the API
/// server; the BMC address keeps its port; a worker host without the
/// topology label is claimed; the worker load balancer's configuration
/// comes from upstream's template ConfigMap, a template nodewarden cannot
/// render is named, and without the ConfigMap nodewarden's own serves; a
/// change of the ConfigMap alone takes effect at once.
#[tokio::test]
async fn the_jump_host_has_upstreams_layout_and_a_template_configures_the_load_balancer() {
    let env = sip_env("sip-layout", 2, 2).await;
    create_host(&env, "bare-w", "rack-9", "worker", "10.23.9.10").await;
    drop_host_label(&env, "bare-w", "test.nodewarden.dev/server").await;
    let template = "# from the ConfigMap\n{{- $servers := .Servers }}\n{{- range .ContainerPorts }}\n{{- $p := . }}\nlisten {{ $p.Name }}\n  bind *:{{ $p.ContainerPort }}\n{{- range $servers }}\n  server {{ .Name }} {{ .IP }}:{{ $p.ContainerPort }}\n{{- end }}\n{{- end }}\n";
    let cm = |source: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "loadbalancerworker"},
               "data": {"loadBalancerWorker.cfg": source}})
    };
    create_dynamic(&env, cm(template)).await;
    let operator = env.start_operator(Default::default()).await;
    let port = 30510;
    create_sip(&env, "tenant", spec(&env, (1, 0), (3, 0), port))
        .await
        .expect("creating the SIPCluster");
    wait_ready(&env, "tenant", "True", "ReconciliationSucceeded").await;
    let got = claimed(&env, "tenant").await;
    assert!(
        got.contains_key("bare-w"),
        "a host without the topology label is claimed: {got:?}"
    );

    // The rendered template, servers in name order.
    let servers = [
        ("bare-w", "10.23.9.10"),
        ("r0-h1", "10.23.0.11"),
        ("r1-h1", "10.23.1.11"),
    ];
    let mut want = String::from("# from the ConfigMap");
    for p in port + 1..=port + 3 {
        want.push_str(&format!("\nlisten port-{p}\n  bind *:{p}"));
        for (name, ip) in servers {
            want.push_str(&format!("\n  server {name} {ip}:{p}"));
        }
    }
    want.push('\n');
    assert_eq!(haproxy_config(&env, "loadbalancer-worker-tenant").await, want);
    let cp = haproxy_config(&env, "loadbalancer-controlplane-tenant").await;
    assert!(
        cp.contains("option httpchk GET /readyz"),
        "no template: nodewarden's own\n{cp}"
    );

    // The jump host's pod, ConfigMap and Secret as upstream lays them out.
    let jump = Api::<Deployment>::namespaced(env.client.clone(), &env.namespace)
        .get("jumphost-tenant")
        .await
        .expect("the jump host");
    let pod = jump.spec.and_then(|s| s.template.spec).expect("a pod");
    assert_eq!(
        mounts(&pod),
        [
            "jumphost: /etc/opt/sip/hosts <- data[hosts]",
            "jumphost: /opt/sip/bin <- scripts",
            "jumphost: /home/ubuntu/.ssh/config <- data[ssh_config]",
            "jumphost: /etc/opt/sip/ssh-private-keys <- ssh-private-keys",
            "jumphost: /home/ubuntu/.ssh/authorized_keys <- authorized-keys[authorized_keys]",
        ]
    );
    let volumes: Vec<String> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            let from = match (&v.secret, &v.config_map) {
                (Some(s), _) => format!("Secret {}", s.secret_name.clone().unwrap_or_default()),
                (_, Some(c)) => format!("ConfigMap {}", c.name),
                _ => "other".into(),
            };
            format!("{} <- {from}", v.name)
        })
        .collect();
    assert_eq!(
        volumes,
        [
            "data <- Secret jumphost-tenant",
            "authorized-keys <- ConfigMap jumphost-tenant",
            "scripts <- ConfigMap jumphost-tenant",
            "ssh-private-keys <- Secret ssh-keys",
        ]
    );
    let init = &pod.init_containers.as_ref().expect("init containers")[0];
    assert_eq!(
        (init.name.as_str(), init.args.clone()),
        (
            "ssh-perms",
            Some(vec!["mkdir -m700 /home/ubuntu/.ssh".to_string()])
        )
    );
    assert_eq!(pod.security_context.and_then(|s| s.fs_group), Some(1000));
    let c = &pod.containers[0];
    assert!(
        c.liveness_probe
            .as_ref()
            .and_then(|p| p.tcp_socket.as_ref())
            .is_some()
    );
    assert!(
        c.readiness_probe
            .as_ref()
            .and_then(|p| p.tcp_socket.as_ref())
            .is_some()
    );
    let files = Api::<ConfigMap>::namespaced(env.client.clone(), &env.namespace)
        .get("jumphost-tenant")
        .await
        .expect("the jump host's ConfigMap")
        .data
        .unwrap_or_default();
    assert_eq!(
        files.get("authorized-keys").map(String::as_str),
        Some("ssh-rsa AAAAB3Nza test")
    );
    assert!(
        files.get("host").is_some_and(|s| s.contains("reboot")),
        "{files:?}"
    );
    let secret = Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
        .get("jumphost-tenant")
        .await
        .expect("the jump host's secret")
        .data
        .unwrap_or_default();
    let hosts: Value = serde_json::from_slice(&secret["hosts"].0).expect("hosts json");
    let bmc = hosts[0]["bmc"]["ip"].as_str().unwrap_or_default().to_string();
    assert!(
        bmc.starts_with("10.23.0.") && bmc.ends_with(":8000"),
        "the BMC keeps its port: {hosts}"
    );

    // A template nodewarden cannot render: named, the running configuration kept.
    let configmaps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let broken = "{{ range .Servers }}{{ .Name | printf \"%s\" }}{{ end }}";
    configmaps
        .patch(
            "loadbalancerworker",
            &PatchParams::default(),
            &Patch::Merge(&cm(broken)),
        )
        .await
        .expect("changing the template");
    // The ConfigMap is watched: its change alone runs a pass, within
    // seconds (the Ready SIPCluster's resync is minutes away).
    let not_rendered = ("Ready", "False", "TemplateNotRendered");
    let message =
        support::wait_for_condition(&sips(&env), "tenant", not_rendered, Duration::from_secs(10)).await;
    let named = format!("ConfigMap {}/loadbalancerworker", env.namespace);
    assert!(
        message.contains(&named) && message.contains("the pipe"),
        "{message}"
    );
    wait_for_event(&env, "TemplateNotRendered", &named).await;
    assert_eq!(
        haproxy_config(&env, "loadbalancer-worker-tenant").await,
        want,
        "kept"
    );
    configmaps
        .delete("loadbalancerworker", &DeleteParams::default())
        .await
        .expect("deleting the template");
    wait_ready(&env, "tenant", "True", "ReconciliationSucceeded").await;
    let own = haproxy_config(&env, "loadbalancer-worker-tenant").await;
    assert!(own.contains("option tcp-check"), "nodewarden's own again:\n{own}");
    delete_sip_and_wait(&env, "tenant").await;
    operator.stop().await;
    env.cleanup().await;
}

/// A service object another controller owns is not fought over: Ready
/// says which object and what blocks, nothing is written to it, the other
/// services run, and once it is gone the service is made.
#[tokio::test]
async fn an_object_another_controller_owns_is_named_not_fought_over() {
    let env = sip_env("sip-blocked", 2, 2).await;
    create_dynamic(
        &env,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone"}}),
    )
    .await;
    let owner = uid_of::<ConfigMap>(&env, "someone")
        .await
        .expect("the owner's uid");
    let labels = upstream_labels("jumphost-held", "jumphost", "jumphost");
    create_dynamic(
        &env,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "jumphost-held", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone", "uid": owner, "controller": true}]},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "x", "image": "x"}]}}}}),
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let operator = env.start_operator(Default::default()).await;
    create_sip(&env, "held", spec(&env, (1, 0), (1, 0), 30520))
        .await
        .expect("creating the SIPCluster");
    let message = wait_ready(&env, "held", "False", "AdoptionBlocked").await;
    let named = format!(
        "Deployment {}/jumphost-held is controlled by ConfigMap someone",
        env.namespace
    );
    assert!(message.contains(&named), "{message}");
    wait_for_event(&env, "AdoptionBlocked", &named).await;
    // Nothing written to it (the Deployment controller writes its status).
    let untouched = deployments.get("jumphost-held").await.expect("it");
    let managers: Vec<String> = untouched
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.iter().any(|m| m.starts_with("nodewarden")),
        "{managers:?}"
    );
    assert_eq!(untouched.owner_references().len(), 1);
    let lb = deployments
        .get("loadbalancer-controlplane-held")
        .await
        .expect("the other services run");
    assert_eq!(
        lb.owner_references().first().map(|o| o.name.as_str()),
        Some("held")
    );
    deployments
        .delete("jumphost-held", &DeleteParams::default())
        .await
        .expect("removing it");
    wait_ready(&env, "held", "True", "ReconciliationSucceeded").await;
    let made = deployments.get("jumphost-held").await.expect("made now");
    assert_eq!(
        made.owner_references().first().map(|o| o.name.as_str()),
        Some("held")
    );
    delete_sip_and_wait(&env, "held").await;
    operator.stop().await;
    env.cleanup().await;
}

/// Services an earlier nodewarden made (selector `app.kubernetes.io/name:
/// <instance>`) keep their selector: same objects, the pods and Service
/// following it.
#[tokio::test]
async fn services_an_earlier_nodewarden_made_keep_their_selector() {
    let env = sip_env("sip-older", 2, 2).await;
    let older = json!({"app.kubernetes.io/name": "jumphost-older"});
    create_dynamic(
        &env,
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "jumphost-older"},
            "spec": {"selector": {"matchLabels": older}, "template": {"metadata": {"labels": older},
                "spec": {"containers": [{"name": "jumphost", "image": "x"}]}}}}),
    )
    .await;
    create_dynamic(
        &env,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "jumphost-older"},
            "spec": {"type": "NodePort", "selector": older, "ports": [{"name": "ssh", "port": 22, "nodePort": 30534}]}}),
    )
    .await;
    let before = (
        uid_of::<Deployment>(&env, "jumphost-older").await,
        uid_of::<Service>(&env, "jumphost-older").await,
    );
    let operator = env.start_operator(Default::default()).await;
    create_sip(&env, "older", spec(&env, (1, 0), (1, 0), 30530))
        .await
        .expect("creating the SIPCluster");
    wait_ready(&env, "older", "True", "ReconciliationSucceeded").await;
    let after = (
        uid_of::<Deployment>(&env, "jumphost-older").await,
        uid_of::<Service>(&env, "jumphost-older").await,
    );
    assert_eq!(after, before, "the same objects");
    let want: std::collections::BTreeMap<String, String> = serde_json::from_value(older).expect("labels");
    let d = Api::<Deployment>::namespaced(env.client.clone(), &env.namespace)
        .get("jumphost-older")
        .await
        .expect("the deployment");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.selector.match_labels.as_ref(), Some(&want));
    let pod_labels = spec.template.metadata.and_then(|m| m.labels).unwrap_or_default();
    assert_eq!(
        pod_labels.get("app.kubernetes.io/name").map(String::as_str),
        Some("jumphost-older")
    );
    assert_eq!(
        pod_labels.get("app.kubernetes.io/part-of").map(String::as_str),
        Some("sip")
    );
    let svc = Api::<Service>::namespaced(env.client.clone(), &env.namespace)
        .get("jumphost-older")
        .await
        .expect("the service");
    assert_eq!(svc.spec.and_then(|s| s.selector), Some(want));
    delete_sip_and_wait(&env, "older").await;
    operator.stop().await;
    env.cleanup().await;
}

/// `--sip auto` on a cluster where metal3 comes later: the replica is ready
/// without metal3's API, a SIPCluster waits untouched, and once the
/// BareMetalHost CRD is installed the controller serves it, with no
/// restart. A control plane of its own: the shared one has metal3 installed.
#[tokio::test]
async fn with_sip_auto_metal3_installed_after_the_start_is_noticed_without_a_restart() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;
    use nodewarden::controllers::{App, BareMetal, sip_cluster};
    use nodewarden::runtime::controller::ControllerConfig;
    use nodewarden::runtime::leader::{LeaderElectionConfig, LeaderElector};
    use nodewarden::runtime::manager::Manager;
    use nodewarden::telemetry::Metrics;
    use tokio_util::sync::CancellationToken;

    let private = tokio::task::spawn_blocking(|| support::PrivateControlPlane::start("sip-late-metal3"))
        .await
        .expect("starting a private control plane");
    let client = private.0.client().await;
    support::install_own_crds(&client).await;
    let ns = "tenants";
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("a namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("creating the namespace");

    let mut election = LeaderElectionConfig::new(ns.to_string(), "nodewarden", "replica-0".to_string());
    election.lease_duration = Duration::from_secs(3);
    election.renew_deadline = Duration::from_secs(2);
    election.retry_period = Duration::from_millis(500);
    let elector = LeaderElector::new(client.clone(), election).expect("a valid election config");
    let metrics = Metrics::new();
    let mut manager = Manager::new(
        client.clone(),
        elector,
        ControllerConfig::default(),
        std::sync::Arc::new(metrics.clone()),
    );
    let mut app = App::new(&manager, metrics);
    app.bare_metal = BareMetal::WhenInstalled;
    sip_cluster::register(&mut manager, &app);
    let ready = manager.readiness();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(shutdown.clone()));

    wait_for(
        "/readyz without metal3's API",
        Duration::from_secs(20),
        || async {
            if ready() {
                Probe::Done(())
            } else {
                Probe::NotYet("not ready".into())
            }
        },
    )
    .await;
    let pin = json!({"test.nodewarden.dev/pin": "late"});
    let sip: SIPCluster = serde_json::from_value(json!({
        "apiVersion": "airship.airshipit.org/v1",
        "kind": "SIPCluster",
        "metadata": {"name": "late", "namespace": ns},
        "spec": {
            "nodes": {
                "ControlPlane": {
                    "labelSelector": {"matchLabels": {"test.nodewarden.dev/flavor": "control-plane"}},
                    "topologyKey": "test.nodewarden.dev/rack",
                    "count": {"active": 1, "standby": 0},
                },
            },
            "services": {
                "jumpHost": [{"image": "quay.io/airshipit/jump-host", "nodePort": 30100, "nodeInterfaceId": "oam-ipv4",
                              "sshAuthorizedKeys": ["ssh-rsa AAAAB3Nza test"], "nodeSSHPrivateKeys": "ssh-keys", "nodeLabels": pin}],
            },
        },
    }))
    .expect("a SIPCluster");
    let sips: Api<SIPCluster> = Api::namespaced(client.clone(), ns);
    sips.create(&PostParams::default(), &sip)
        .await
        .expect("creating the SIPCluster");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = sips.get("late").await.expect("the SIPCluster");
    assert!(
        waiting.status.is_none(),
        "untouched while metal3 is missing: {:?}",
        waiting.status
    );

    support::metal3::install_metal3_crd(&client).await;
    let installed = std::time::Instant::now();
    // The next look for the API comes within METAL3_RETRY.
    let limit = sip_cluster::METAL3_RETRY + Duration::from_secs(15);
    wait_for("the SIPCluster served", limit, || async {
        match sips.get("late").await {
            Ok(s) if s.status.as_ref().is_some_and(|st| !st.conditions.is_empty()) => Probe::Done(()),
            Ok(s) => Probe::NotYet(format!("{:?}", s.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    println!(
        "SIPCluster served {:?} after metal3's CRD was installed",
        installed.elapsed()
    );
    assert!(ready(), "still ready");
    shutdown.cancel();
    let _ = task.await;
}
