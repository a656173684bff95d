//! A SIPCluster's support services as Kubernetes objects (pure): per load
//! balancer an HAProxy Deployment, its NodePort Service and its
//! configuration in a Secret; per jump host an sshd Deployment, Service and
//! Secret (hosts, BMC access, SSH config). Every object is owned by the
//! SIPCluster, so the garbage collector removes them with it (upstream
//! leaves them behind).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::api::sip::{JumpHost, LoadBalancerControlPlane, LoadBalancerWorker, ServiceCommon};

/// The label every service object carries: the SIPCluster's name.
pub const CLUSTER_LABEL: &str = "sip.airshipit.org/cluster-name";

/// The kube-apiserver port the control-plane load balancer forwards.
pub const API_SERVER_PORT: i32 = 6443;

/// One backend or host of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// The BareMetalHost's name.
    pub name: String,
    /// Its address on the service's interface (None: it has none there).
    pub ip: Option<String>,
}

/// A host as the jump host sees it: its BMC and credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BmcHost {
    /// The BareMetalHost's name.
    pub name: String,
    /// Its address on the jump host's interface.
    pub ip: Option<String>,
    /// The BMC's management address.
    pub bmc_ip: String,
    /// BMC user.
    pub username: String,
    /// BMC password.
    pub password: String,
}

/// The three objects of one service, and what a person needs to know of it.
#[derive(Clone, Debug)]
pub struct ServiceObjects {
    /// The pod.
    pub deployment: Deployment,
    /// How it is reached.
    pub service: Service,
    /// Its configuration.
    pub secret: Secret,
    /// `30001` or `30002-30011`.
    pub node_ports: String,
    /// `host=ip` per backend (load balancers).
    pub backends: Vec<String>,
}

/// Who owns the objects and where they live.
#[derive(Clone, Debug)]
pub struct Owner {
    /// The SIPCluster's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The owner reference (controller) to set on every object.
    pub reference: OwnerReference,
}

/// The name of a service's objects: `<prefix>-<cluster>`, `-<index>` after
/// the first.
pub fn instance_name(prefix: &str, owner: &Owner, index: usize) -> String {
    match index {
        0 => format!("{prefix}-{}", owner.name),
        i => format!("{prefix}-{}-{i}", owner.name),
    }
}

/// The control-plane load balancer: port 6443 on every active
/// control-plane host, reached on `nodePort`.
pub fn load_balancer_control_plane(
    owner: &Owner,
    index: usize,
    spec: &LoadBalancerControlPlane,
    backends: &[Backend],
) -> ServiceObjects {
    let name = instance_name("loadbalancer-controlplane", owner, index);
    let ports = vec![("http".to_string(), API_SERVER_PORT, spec.node_port)];
    let config = haproxy_config(&ports, backends, true);
    load_balancer(owner, &name, &spec.common, ports, config, backends)
}

/// The worker load balancer: each port of the range to the same port of
/// every active worker.
pub fn load_balancer_worker(
    owner: &Owner,
    index: usize,
    spec: &LoadBalancerWorker,
    backends: &[Backend],
) -> ServiceObjects {
    let name = instance_name("loadbalancer-worker", owner, index);
    let ports: Vec<(String, i32, i32)> = (spec.node_port_range.start..=spec.node_port_range.end)
        .map(|p| (format!("port-{p}"), p, p))
        .collect();
    let config = haproxy_config(&ports, backends, false);
    load_balancer(owner, &name, &spec.common, ports, config, backends)
}

fn load_balancer(
    owner: &Owner,
    name: &str,
    common: &ServiceCommon,
    ports: Vec<(String, i32, i32)>,
    config: String,
    backends: &[Backend],
) -> ServiceObjects {
    let data = BTreeMap::from([("haproxy.cfg".to_string(), config)]);
    let container = json!({
        "name": "loadbalancer",
        "image": common.image,
        "ports": ports.iter().map(|(n, p, _)| json!({"name": n, "containerPort": p})).collect::<Vec<_>>(),
        "volumeMounts": [{"name": "haproxy-config", "mountPath": "/usr/local/etc/haproxy", "readOnly": true}],
    });
    let volumes = json!([{"name": "haproxy-config", "secret": {"secretName": name}}]);
    let deployment = deployment(
        owner,
        name,
        "loadbalancer",
        common,
        &data,
        container,
        volumes,
        json!([]),
    );
    let node_ports = match (ports.first(), ports.last()) {
        (Some(a), Some(b)) if a.2 != b.2 => format!("{}-{}", a.2, b.2),
        (Some(a), _) => a.2.to_string(),
        _ => String::new(),
    };
    ServiceObjects {
        deployment,
        service: service(owner, name, "loadbalancer", common, &ports),
        secret: secret(owner, name, "loadbalancer", data),
        node_ports,
        backends: backends
            .iter()
            .map(|b| format!("{}={}", b.name, b.ip.as_deref().unwrap_or("?")))
            .collect(),
    }
}

/// The jump host: sshd with the hosts' list (BMC address and credentials),
/// an SSH config naming every host, the authorized keys and the hosts'
/// private keys (`nodeSSHPrivateKeys`, mounted), reached on `nodePort`.
pub fn jump_host(
    owner: &Owner,
    index: usize,
    spec: &JumpHost,
    hosts: &[BmcHost],
    private_key_names: &[String],
) -> ServiceObjects {
    let name = instance_name("jumphost", owner, index);
    let host_list: Vec<serde_json::Value> = hosts
        .iter()
        .map(|h| json!({"name": h.name, "bmc": {"ip": h.bmc_ip, "username": h.username, "password": h.password}}))
        .collect();
    let mut ssh_config = String::from("Host *\n");
    for key in private_key_names {
        ssh_config.push_str(&format!("  IdentityFile /etc/opt/sip/ssh-private-keys/{key}\n"));
    }
    for h in hosts.iter().filter(|h| h.ip.is_some()) {
        ssh_config.push_str(&format!("Host {0}\n  HostName {0}\n", h.name));
    }
    let data = BTreeMap::from([
        (
            "hosts".to_string(),
            serde_json::Value::from(host_list).to_string(),
        ),
        ("ssh_config".to_string(), ssh_config),
        ("authorized_keys".to_string(), spec.ssh_authorized_keys.join("\n")),
    ]);
    let proxy = spec.bmc.and_then(|b| b.proxy).unwrap_or(false);
    let container = json!({
        "name": "jumphost",
        "image": spec.common.image,
        "ports": [{"name": "ssh", "containerPort": 22}],
        "env": if proxy { json!([]) } else { json!([{"name": "NO_PROXY", "value": "*"}, {"name": "no_proxy", "value": "*"}]) },
        "volumeMounts": [
            {"name": "data", "mountPath": "/etc/opt/sip", "readOnly": true},
            {"name": "ssh-private-keys", "mountPath": "/etc/opt/sip/ssh-private-keys", "readOnly": true},
        ],
    });
    let volumes = json!([
        {"name": "data", "secret": {"secretName": name}},
        {"name": "ssh-private-keys", "secret": {"secretName": spec.node_ssh_private_keys, "defaultMode": 0o400}},
    ]);
    let aliases: Vec<serde_json::Value> = hosts
        .iter()
        .filter_map(|h| Some(json!({"ip": h.ip.as_ref()?, "hostnames": [h.name]})))
        .collect();
    let ports = vec![("ssh".to_string(), 22, spec.node_port)];
    ServiceObjects {
        deployment: deployment(
            owner,
            &name,
            "jumphost",
            &spec.common,
            &data,
            container,
            volumes,
            json!(aliases),
        ),
        service: service(owner, &name, "jumphost", &spec.common, &ports),
        secret: secret(owner, &name, "jumphost", data),
        node_ports: spec.node_port.to_string(),
        backends: Vec::new(),
    }
}

/// HAProxy's configuration: a frontend and a backend per port, a server
/// per backend with an address. The control plane's backends are checked
/// on the API server's /readyz; the workers' by a TCP connect.
pub fn haproxy_config(ports: &[(String, i32, i32)], backends: &[Backend], api_server: bool) -> String {
    let mut c = String::from(
        "global\n  log stdout format raw local0 notice\n\n\
         defaults\n  mode tcp\n  log global\n  option tcplog\n  option dontlognull\n  retries 1\n  \
         timeout queue 30s\n  timeout connect 30s\n  timeout client 600s\n  timeout server 600s\n",
    );
    for (name, port, _) in ports {
        c.push_str(&format!(
            "\nfrontend {name}-frontend\n  bind *:{port}\n  default_backend {name}-backend\n\
             backend {name}-backend\n  balance roundrobin\n"
        ));
        if api_server {
            c.push_str(
                "  option httpchk GET /readyz\n  http-check expect status 200\n  \
                 default-server check check-ssl verify none inter 5s downinter 2s fall 4\n",
            );
        } else {
            c.push_str("  option tcp-check\n  default-server check\n");
        }
        for b in backends {
            if let Some(ip) = &b.ip {
                c.push_str(&format!("  server {} {ip}:{port}\n", b.name));
            }
        }
    }
    c
}

fn labels(owner: &Owner, name: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), name.to_string()),
        ("app.kubernetes.io/component".to_string(), component.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "nodewarden".to_string(),
        ),
        (CLUSTER_LABEL.to_string(), owner.name.clone()),
    ])
}

fn metadata(owner: &Owner, name: &str, component: &str) -> serde_json::Value {
    json!({
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, name, component),
        "ownerReferences": [owner.reference],
    })
}

/// A hash of the configuration in the pod template: a new configuration
/// rolls the pod (HAProxy and sshd read theirs at start).
fn config_hash(data: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in data {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    crate::upgrade::hex(&h.finalize()[..8])
}

#[allow(clippy::too_many_arguments)] // one call per service kind, each naming every part
fn deployment(
    owner: &Owner,
    name: &str,
    component: &str,
    common: &ServiceCommon,
    data: &BTreeMap<String, String>,
    container: serde_json::Value,
    volumes: serde_json::Value,
    host_aliases: serde_json::Value,
) -> Deployment {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_string(), name.to_string())]);
    let value = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, component),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": labels(owner, name, component),
                    "annotations": {"nodewarden.dev/config-hash": config_hash(data)},
                },
                "spec": {
                    "containers": [container],
                    "volumes": volumes,
                    "nodeSelector": common.node_labels,
                    "hostAliases": host_aliases,
                },
            },
        },
    });
    serde_json::from_value(value).unwrap_or_default()
}

fn service(
    owner: &Owner,
    name: &str,
    component: &str,
    common: &ServiceCommon,
    ports: &[(String, i32, i32)],
) -> Service {
    let mut spec = json!({
        "type": "NodePort",
        "selector": {"app.kubernetes.io/name": name},
        "ports": ports.iter().map(|(n, p, np)| json!({"name": n, "port": p, "targetPort": p, "nodePort": np})).collect::<Vec<_>>(),
    });
    if let Some(ip) = &common.cluster_ip {
        spec["clusterIP"] = json!(ip);
    }
    let value = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, component),
        "spec": spec,
    });
    serde_json::from_value(value).unwrap_or_default()
}

fn secret(owner: &Owner, name: &str, component: &str, data: BTreeMap<String, String>) -> Secret {
    let mut s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(owner, name, component),
        "type": "Opaque",
    }))
    .unwrap_or_default();
    s.data = Some(
        data.into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect(),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::sip::PortRange;

    fn owner() -> Owner {
        Owner {
            name: "tenant".into(),
            namespace: "ns".into(),
            reference: OwnerReference {
                api_version: "airship.airshipit.org/v1".into(),
                kind: "SIPCluster".into(),
                name: "tenant".into(),
                uid: "u".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        }
    }

    fn backends() -> Vec<Backend> {
        vec![
            Backend {
                name: "cp-1".into(),
                ip: Some("10.0.0.1".into()),
            },
            Backend {
                name: "cp-2".into(),
                ip: None,
            },
        ]
    }

    #[test]
    fn the_control_plane_load_balancer_forwards_6443_to_active_hosts() {
        let spec = LoadBalancerControlPlane {
            common: ServiceCommon {
                image: "haproxy:2.3.2".into(),
                ..Default::default()
            },
            node_port: 30001,
        };
        let o = load_balancer_control_plane(&owner(), 0, &spec, &backends());
        assert_eq!(
            o.deployment.metadata.name.as_deref(),
            Some("loadbalancer-controlplane-tenant")
        );
        let cfg = String::from_utf8(o.secret.data.expect("data")["haproxy.cfg"].0.clone()).expect("utf8");
        assert!(cfg.contains("bind *:6443"), "{cfg}");
        assert!(cfg.contains("server cp-1 10.0.0.1:6443"), "{cfg}");
        assert!(
            !cfg.contains("cp-2"),
            "a host without an address is no backend: {cfg}"
        );
        let ports = o.service.spec.expect("spec").ports.expect("ports");
        assert_eq!(ports[0].node_port, Some(30001));
        assert_eq!(o.node_ports, "30001");
        assert_eq!(o.backends, ["cp-1=10.0.0.1", "cp-2=?"]);
        for meta in [&o.deployment.metadata, &o.service.metadata, &o.secret.metadata] {
            assert_eq!(meta.owner_references.as_ref().map(Vec::len), Some(1), "owned");
        }
    }

    #[test]
    fn a_new_backend_changes_the_pod_template() {
        let spec = LoadBalancerWorker {
            common: ServiceCommon {
                image: "haproxy".into(),
                ..Default::default()
            },
            node_port_range: PortRange {
                start: 30002,
                end: 30004,
            },
        };
        let a = load_balancer_worker(&owner(), 1, &spec, &backends());
        let mut more = backends();
        more.push(Backend {
            name: "w-9".into(),
            ip: Some("10.0.0.9".into()),
        });
        let b = load_balancer_worker(&owner(), 1, &spec, &more);
        assert_eq!(
            a.deployment.metadata.name.as_deref(),
            Some("loadbalancer-worker-tenant-1")
        );
        assert_eq!(a.node_ports, "30002-30004");
        let hash = |o: &ServiceObjects| {
            o.deployment
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.annotations.clone())
        };
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn the_jump_host_lists_hosts_with_their_bmc() {
        let spec = JumpHost {
            common: ServiceCommon {
                image: "jump".into(),
                ..Default::default()
            },
            node_port: 30000,
            bmc: None,
            ssh_authorized_keys: vec!["ssh-rsa AAA a".into()],
            node_ssh_private_keys: "keys".into(),
        };
        let hosts = [BmcHost {
            name: "cp-1".into(),
            ip: Some("10.0.0.1".into()),
            bmc_ip: "10.23.25.1".into(),
            username: "root".into(),
            password: "pw".into(),
        }];
        let o = jump_host(&owner(), 0, &spec, &hosts, &["id_rsa".into()]);
        let data = o.secret.data.expect("data");
        let list: serde_json::Value = serde_json::from_slice(&data["hosts"].0).expect("json");
        assert_eq!(list[0]["bmc"]["ip"], "10.23.25.1");
        assert_eq!(list[0]["bmc"]["username"], "root");
        let ssh = String::from_utf8(data["ssh_config"].0.clone()).expect("utf8");
        assert!(
            ssh.contains("IdentityFile /etc/opt/sip/ssh-private-keys/id_rsa"),
            "{ssh}"
        );
        assert!(ssh.contains("Host cp-1"), "{ssh}");
        let pod = o.deployment.spec.expect("spec").template.spec.expect("pod");
        assert_eq!(pod.host_aliases.expect("aliases")[0].ip, "10.0.0.1");
    }
}
