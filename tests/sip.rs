//! SIPClusters (`airship.airshipit.org/v1`) over metal3's genuine
//! BareMetalHost CRD on the real control plane: the hosts' networkData and
//! BMC Secrets are real Secrets, the test plays metal3 by writing host
//! status, the support services' pods run on kwok nodes and the garbage
//! collector removes what a deleted SIPCluster owned.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::sip::{SIPCluster, labels};
use serde_json::{Value, json};
use support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

const TIMEOUT: Duration = Duration::from_secs(60);

fn sips(env: &TestEnv) -> Api<SIPCluster> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

fn hosts_api(env: &TestEnv) -> Api<BareMetalHost> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// One BareMetalHost with its BMC and networkData Secrets, reported usable
/// (as metal3 would: operational OK, provisioning available).
async fn create_host(env: &TestEnv, name: &str, rack: &str, flavor: &str, ip: &str) {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let params = PatchParams::apply("sip-test").force();
    let bmc: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-bmc")},
        "stringData": {"username": "root", "password": format!("pw-{name}")},
    }))
    .expect("a secret");
    secrets
        .patch(&format!("{name}-bmc"), &params, &Patch::Apply(&bmc))
        .await
        .expect("the BMC secret");
    let network = json!({
        "links": [{"id": "oam", "type": "phy", "ethernet_mac_address": "52:54:00:00:00:01"}],
        "networks": [{"id": "oam-ipv4", "link": "oam", "type": "ipv4", "ip_address": ip, "netmask": "255.255.255.0"}],
    });
    let nd: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-network")},
        "stringData": {"networkData": network.to_string()},
    }))
    .expect("a secret");
    secrets
        .patch(&format!("{name}-network"), &params, &Patch::Apply(&nd))
        .await
        .expect("the networkData secret");
    let host: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "metal3.io/v1alpha1",
        "kind": "BareMetalHost",
        "metadata": {"name": name, "labels": {
            RUN_LABEL: env.id, "test.nodewarden.dev/rack": rack,
            "test.nodewarden.dev/server": name, "test.nodewarden.dev/flavor": flavor,
        }},
        "spec": {
            "online": true,
            "bootMACAddress": "52:54:00:00:00:01",
            "bmc": {"address": format!("redfish+http://10.23.0.{}:8000/redfish/v1/Systems/{name}", name.len()), "credentialsName": format!("{name}-bmc")},
            "networkData": {"name": format!("{name}-network")},
        },
    }))
    .expect("a host");
    let resource = ApiResource::erase::<BareMetalHost>(&());
    Api::<DynamicObject>::namespaced_with(env.client.clone(), &env.namespace, &resource)
        .create(&PostParams::default(), &host)
        .await
        .expect("creating a BareMetalHost");
    set_host_status(env, name, "OK", "available").await;
}

/// Plays metal3: the host's operational status and provisioning state.
async fn set_host_status(env: &TestEnv, name: &str, operational: &str, state: &str) {
    let status = json!({"status": {
        "errorCount": 0, "errorMessage": if operational == "error" { "BMC unreachable" } else { "" },
        "operationalStatus": operational, "poweredOn": true,
        "provisioning": {"ID": "", "state": state},
    }});
    hosts_api(env)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("writing host status");
}

/// `count` hosts per rack over `racks` racks: the first of each rack is a
/// control-plane flavor, the others workers. Returns the host names.
async fn create_racks(env: &TestEnv, racks: usize, per_rack: usize) -> Vec<String> {
    let mut names = Vec::new();
    for r in 0..racks {
        for h in 0..per_rack {
            let name = format!("r{r}-h{h}");
            let flavor = if h == 0 { "control-plane" } else { "worker" };
            create_host(
                env,
                &name,
                &format!("rack-{r}"),
                flavor,
                &format!("10.23.{r}.{}", 10 + h),
            )
            .await;
            names.push(name);
        }
    }
    names
}

/// A SIPCluster of the test (run label), untyped so bad specs reach admission.
async fn create_sip(env: &TestEnv, name: &str, spec: Value) -> Result<DynamicObject, kube::Error> {
    let sip: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "airship.airshipit.org/v1",
        "kind": "SIPCluster",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": spec,
    }))
    .expect("a sipcluster");
    let resource = ApiResource::erase::<SIPCluster>(&());
    Api::<DynamicObject>::namespaced_with(env.client.clone(), &env.namespace, &resource)
        .create(&PostParams::default(), &sip)
        .await
}

/// The spec of the issue: 3 control-plane hosts one per rack + 1 standby,
/// 4 workers one per server + 1 standby, both load balancers and a jump
/// host, pinned to the test's kwok nodes, on NodePorts from `port`.
fn spec(env: &TestEnv, cp: (i32, i32), workers: (i32, i32), port: i32) -> Value {
    let pin = json!({ RUN_LABEL: env.id });
    json!({
        "nodes": {
            "ControlPlane": {
                "labelSelector": {"matchLabels": {"test.nodewarden.dev/flavor": "control-plane"}},
                "topologyKey": "test.nodewarden.dev/rack",
                "count": {"active": cp.0, "standby": cp.1},
            },
            "Worker": {
                "labelSelector": {"matchLabels": {"test.nodewarden.dev/flavor": "worker"}},
                "topologyKey": "test.nodewarden.dev/server",
                "count": {"active": workers.0, "standby": workers.1},
            },
        },
        "services": {
            "loadBalancerControlPlane": [{"image": "haproxy:2.3.2", "nodePort": port, "nodeInterfaceId": "oam-ipv4", "nodeLabels": pin}],
            "loadBalancerWorker": [{"image": "haproxy:2.3.2", "nodePortRange": {"start": port + 1, "end": port + 3}, "nodeInterfaceId": "oam-ipv4", "nodeLabels": pin}],
            "jumpHost": [{"image": "quay.io/airshipit/jump-host", "nodePort": port + 4, "nodeInterfaceId": "oam-ipv4",
                          "sshAuthorizedKeys": ["ssh-rsa AAAAB3Nza test"], "nodeSSHPrivateKeys": "ssh-keys", "nodeLabels": pin}],
        },
    })
}

async fn put_ssh_keys(env: &TestEnv) {
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "ssh-keys"},
        "stringData": {"id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\ntest\n-----END OPENSSH PRIVATE KEY-----\n"},
    }))
    .expect("a secret");
    Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
        .patch(
            "ssh-keys",
            &PatchParams::apply("sip-test").force(),
            &Patch::Apply(&s),
        )
        .await
        .expect("the ssh keys secret");
}

/// The hosts labelled for `sip`: name → (role, state).
async fn claimed(env: &TestEnv, sip: &str) -> BTreeMap<String, (String, String)> {
    hosts_api(env)
        .list(&ListParams::default().labels(&format!("{}={sip}", labels::CLUSTER_NAME)))
        .await
        .expect("listing hosts")
        .items
        .into_iter()
        .map(|h| {
            let l = h.labels();
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            (h.name_any(), (get(labels::NODE_TYPE), get(labels::STATE)))
        })
        .collect()
}

/// Waits for the SIPCluster's Ready condition with `status` and `reason`; its message.
async fn wait_ready(env: &TestEnv, sip: &str, status: &str, reason: &str) -> String {
    support::wait_for_condition(&sips(env), sip, ("Ready", status, reason), TIMEOUT).await
}

async fn haproxy_config(env: &TestEnv, name: &str) -> String {
    let s = Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
        .get(name)
        .await
        .expect("the load balancer's secret");
    let data = s.data.unwrap_or_default();
    String::from_utf8(data.get("haproxy.cfg").map(|b| b.0.clone()).unwrap_or_default()).expect("utf8")
}

/// Deletes a SIPCluster and waits until its finalizer let it go.
async fn delete_sip_and_wait(env: &TestEnv, name: &str) {
    let _ = sips(env).delete(name, &DeleteParams::default()).await;
    wait_for(&format!("{name} gone"), TIMEOUT, || async {
        match sips(env).get_opt(name).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(s)) => Probe::NotYet(format!("finalizers {:?}", s.finalizers())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

fn rack_of(host: &str) -> &str {
    host.split('-').next().unwrap_or_default()
}

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

/// Every cluster-name label change of the test's hosts: a host that goes
/// from one cluster to another without being released first is a breach.
async fn watch_claims(client: Client, ns: String, stop: tokio_util::sync::CancellationToken) -> Vec<String> {
    let api: Api<BareMetalHost> = Api::namespaced(client, &ns);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut breaches = Vec::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return breaches,
            e = events.next() => e,
        };
        let host = match event {
            Some(Ok(watcher::Event::Apply(h) | watcher::Event::InitApply(h))) => h,
            Some(_) => continue,
            None => return breaches,
        };
        let name = host.name_any();
        match host.labels().get(labels::CLUSTER_NAME) {
            Some(c) => {
                if let Some(before) = owner.get(&name)
                    && before != c
                {
                    breaches.push(format!("{name} went from {before} to {c}"));
                }
                owner.insert(name, c.clone());
            }
            None => {
                owner.remove(&name);
            }
        }
    }
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
