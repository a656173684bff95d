//! SIPClusters and metal3 BareMetalHosts in tests: hosts with their
//! Secrets (the test plays metal3 by writing host status), SIPClusters,
//! what is claimed, and a watch that catches a host changing hands.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::sip::{SIPCluster, labels};
use serde_json::{Value, json};

use super::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

pub const TIMEOUT: Duration = Duration::from_secs(60);

pub fn sips(env: &TestEnv) -> Api<SIPCluster> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

pub fn hosts_api(env: &TestEnv) -> Api<BareMetalHost> {
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// One BareMetalHost with its BMC and networkData Secrets, reported usable
/// (as metal3 would: operational OK, provisioning available).
pub async fn create_host(env: &TestEnv, name: &str, rack: &str, flavor: &str, ip: &str) {
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
pub async fn set_host_status(env: &TestEnv, name: &str, operational: &str, state: &str) {
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
pub async fn create_racks(env: &TestEnv, racks: usize, per_rack: usize) -> Vec<String> {
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
pub async fn create_sip(env: &TestEnv, name: &str, spec: Value) -> Result<DynamicObject, kube::Error> {
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
pub fn spec(env: &TestEnv, cp: (i32, i32), workers: (i32, i32), port: i32) -> Value {
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

pub async fn put_ssh_keys(env: &TestEnv) {
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
pub async fn claimed(env: &TestEnv, sip: &str) -> BTreeMap<String, (String, String)> {
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
pub async fn wait_ready(env: &TestEnv, sip: &str, status: &str, reason: &str) -> String {
    super::wait_for_condition(&sips(env), sip, ("Ready", status, reason), TIMEOUT).await
}

pub async fn haproxy_config(env: &TestEnv, name: &str) -> String {
    let s = Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
        .get(name)
        .await
        .expect("the load balancer's secret");
    let data = s.data.unwrap_or_default();
    String::from_utf8(data.get("haproxy.cfg").map(|b| b.0.clone()).unwrap_or_default()).expect("utf8")
}

/// Deletes a SIPCluster and waits until its finalizer let it go.
pub async fn delete_sip_and_wait(env: &TestEnv, name: &str) {
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

pub fn rack_of(host: &str) -> &str {
    host.split('-').next().unwrap_or_default()
}

/// Every cluster-name label change of the test's hosts: a host that goes
/// from one cluster to another without being released first is a breach.
/// Judged on the watch's own events only: a relist (after a 410) shows
/// where each host is now, not what happened in the gap, so it is not held
/// against a host.
pub async fn watch_claims(
    client: Client,
    ns: String,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<String> {
    let api: Api<BareMetalHost> = Api::namespaced(client, &ns);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    // Each host's last few events (resourceVersion, cluster, live), for the breach message.
    let mut history: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut breaches = Vec::new();
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return breaches,
            e = events.next() => e,
        };
        let (host, live) = match event {
            Some(Ok(watcher::Event::Apply(h))) => (h, true),
            Some(Ok(watcher::Event::InitApply(h))) => (h, false),
            Some(_) => continue,
            None => return breaches,
        };
        let name = host.name_any();
        let cluster = host.labels().get(labels::CLUSTER_NAME).cloned();
        let seen = history.entry(name.clone()).or_default();
        seen.push(format!(
            "{} rv {} {cluster:?}{}",
            k8s_openapi::jiff::Timestamp::now(),
            host.resource_version().unwrap_or_default(),
            if live { "" } else { " (relist)" }
        ));
        if seen.len() > 6 {
            seen.remove(0);
        }
        match cluster {
            Some(c) => {
                if let Some(before) = owner.get(&name)
                    && *before != c
                    && live
                {
                    breaches.push(format!("{name} went from {before} to {c}: {seen:?}"));
                }
                owner.insert(name, c);
            }
            None => {
                owner.remove(&name);
            }
        }
    }
}

/// Upstream SIP's labels on a service's objects (and its Deployment's selector).
pub fn upstream_labels(instance: &str, component: &str, app: &str) -> Value {
    json!({
        "app.kubernetes.io/part-of": "sip",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/instance": instance,
    })
}

/// Labels a host for `sip` as upstream SIP does: cluster and role, no
/// state label.
pub async fn label_as_upstream(env: &TestEnv, sip: &str, host: &str, role: &str) {
    let patch = json!({"metadata": {"labels": {
        labels::CLUSTER_NAMESPACE: env.namespace, labels::CLUSTER_NAME: sip, labels::NODE_TYPE: role,
    }}});
    hosts_api(env)
        .patch(host, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("labelling a host as upstream SIP");
}

/// Removes a label from a host.
pub async fn drop_host_label(env: &TestEnv, host: &str, label: &str) {
    let patch = json!({"metadata": {"labels": { label: null }}});
    hosts_api(env)
        .patch(host, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("removing a host label");
}

/// A service's Deployment, Service and Secret (and the jump host's
/// ConfigMap) as upstream SIP creates them: its labels and selector, no
/// owner, upstream's containers and volumes.
pub async fn create_upstream_service(
    env: &TestEnv,
    instance: &str,
    component: &str,
    node_ports: &[(&str, i32, i32)],
) {
    let app = if component == "jumphost" {
        "jumphost"
    } else {
        "haproxy"
    };
    let labels = upstream_labels(instance, component, app);
    let ports: Vec<Value> = node_ports
        .iter()
        .map(|(n, p, _)| json!({"name": n, "containerPort": p}))
        .collect();
    // Upstream forces its load balancers onto control-plane nodes.
    let (volume, mount, placement) = match component {
        "jumphost" => (
            json!({"name": "scripts", "configMap": {"name": instance, "defaultMode": 0o777}}),
            json!({"name": "scripts", "mountPath": "/opt/sip/bin"}),
            json!({}),
        ),
        _ => (
            json!({"name": "haproxy-config", "secret": {"secretName": instance}}),
            json!({"name": "haproxy-config", "mountPath": "/usr/local/etc/haproxy"}),
            json!({"node-role.kubernetes.io/master": ""}),
        ),
    };
    let objects = [
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": instance, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": component, "image": "upstream", "ports": ports, "volumeMounts": [mount]}],
                         "volumes": [volume], "nodeSelector": placement,
                         "tolerations": [{"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"}]}}}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": instance},
            "spec": {"type": "NodePort", "selector": labels,
                "ports": node_ports.iter().map(|(n, p, np)| json!({"name": n, "port": p, "nodePort": np})).collect::<Vec<_>>()}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": instance}, "type": "Opaque",
            "stringData": {"upstream": "yes"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": instance, "labels": labels},
            "data": {"authorized-keys": "", "host": "#!/bin/sh\n"}}),
    ];
    let count = if component == "jumphost" { 4 } else { 3 };
    for object in objects.into_iter().take(count) {
        create_dynamic(env, object).await;
    }
}

/// Creates any object in the test's namespace, as given.
pub async fn create_dynamic(env: &TestEnv, object: Value) {
    let o: DynamicObject = serde_json::from_value(object).expect("an object");
    let gvk = o
        .types
        .as_ref()
        .map(kube::core::GroupVersionKind::try_from)
        .and_then(Result::ok)
        .expect("a kind");
    let resource = ApiResource::from_gvk(&gvk);
    Api::<DynamicObject>::namespaced_with(env.client.clone(), &env.namespace, &resource)
        .create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("creating {} {}: {e}", gvk.kind, o.name_any()));
}

/// The UID of an object of the test's namespace (None: not there).
pub async fn uid_of<K>(env: &TestEnv, name: &str) -> Option<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(env.client.clone(), &env.namespace)
        .get_opt(name)
        .await
        .expect("reading an object")
        .and_then(|o| o.meta().uid.clone())
}

/// Watches the test's hosts and returns every sight of one of `held`
/// without its cluster label (a release), until `stop`. `synced` fires once
/// the watch has listed the hosts, so nothing after it goes unseen.
pub async fn watch_releases(
    client: Client,
    ns: String,
    held: Vec<String>,
    synced: tokio::sync::oneshot::Sender<()>,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<String> {
    let api: Api<BareMetalHost> = Api::namespaced(client, &ns);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
    let mut synced = Some(synced);
    let mut released = Vec::new();
    loop {
        let host = tokio::select! {
            _ = stop.cancelled() => return released,
            e = events.next() => match e {
                Some(Ok(watcher::Event::Apply(h) | watcher::Event::InitApply(h))) => h,
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(s) = synced.take() {
                        let _ = s.send(());
                    }
                    continue;
                }
                Some(_) => continue,
                None => return released,
            },
        };
        if held.contains(&host.name_any()) && host.labels().get(labels::CLUSTER_NAME).is_none() {
            released.push(host.name_any());
        }
    }
}

/// A test namespace with the CRDs, a kwok node for the services' pods, the
/// jump host's key Secret and `racks` × `per_rack` hosts.
pub async fn sip_env(name: &str, racks: usize, per_rack: usize) -> TestEnv {
    let env = TestEnv::new(name).await;
    super::install_crds(&env.client).await;
    env.create_kwok_nodes(1, &[]).await;
    put_ssh_keys(&env).await;
    create_racks(&env, racks, per_rack).await;
    env
}
