//! A SIPCluster's support services as Kubernetes objects (pure): per load
//! balancer an HAProxy Deployment, its NodePort Service and its
//! configuration in a Secret; per jump host an sshd Deployment, Service,
//! Secret (hosts, BMC access, SSH config) and ConfigMap (authorized keys, the
//! `host` power tool), laid out as Airship SIP's jump-host image expects.
//! Names, labels and selectors are upstream SIP's, so objects it made are
//! taken over in place ([`adopt`]). Every object is owned by the SIPCluster,
//! so the garbage collector removes them with it (upstream leaves them
//! behind).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::template::{Template, TemplateError, Value};
use crate::api::sip::{JumpHost, LoadBalancerControlPlane, LoadBalancerWorker, ServiceCommon};

/// The label every service object carries: the SIPCluster's name.
pub const CLUSTER_LABEL: &str = "sip.airshipit.org/cluster-name";

/// The kube-apiserver port the control-plane load balancer forwards.
pub const API_SERVER_PORT: i32 = 6443;

/// Where the jump-host image's user `ubuntu` keeps its SSH files.
pub const JUMP_HOST_SSH_DIR: &str = "/home/ubuntu/.ssh";

/// The jump host's data: the hosts' list and the nodes' private keys.
pub const JUMP_HOST_DATA_DIR: &str = "/etc/opt/sip";

/// Where the jump host's tools are: `host list|reboot`.
pub const JUMP_HOST_SCRIPTS_DIR: &str = "/opt/sip/bin";

/// The power tool the jump host runs as `host`.
pub const HOST_TOOL: &str = include_str!("host.sh");

/// The ConfigMaps (in the SIPCluster's namespace) and keys whose Go
/// templates render HAProxy's configuration, as upstream SIP reads them.
pub const CONTROL_PLANE_TEMPLATE: (&str, &str) = ("loadbalancercontrolplane", "loadBalancerControlPlane.cfg");
/// See [`CONTROL_PLANE_TEMPLATE`].
pub const WORKER_TEMPLATE: (&str, &str) = ("loadbalancerworker", "loadBalancerWorker.cfg");

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

/// The objects of one service, and what a person needs to know of it.
#[derive(Clone, Debug)]
pub struct ServiceObjects {
    /// The pod.
    pub deployment: Deployment,
    /// How it is reached.
    pub service: Service,
    /// Its configuration.
    pub secret: Secret,
    /// Its files that are no secret (the jump host's keys and tool).
    pub config_map: Option<ConfigMap>,
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

/// A load balancer's ports: (name, port, nodePort).
type Ports = Vec<(String, i32, i32)>;

/// The control-plane load balancer: port 6443 on every active
/// control-plane host, reached on `nodePort`. `template`: upstream's Go
/// template for `haproxy.cfg`, if the user gave one.
pub fn load_balancer_control_plane(
    owner: &Owner,
    index: usize,
    spec: &LoadBalancerControlPlane,
    backends: &[Backend],
    template: Option<&Template>,
) -> Result<ServiceObjects, TemplateError> {
    let name = instance_name("loadbalancer-controlplane", owner, index);
    let ports = vec![("http".to_string(), API_SERVER_PORT, spec.node_port)];
    let config = match template {
        Some(t) => t.render(&template_data(&ports, backends))?,
        None => haproxy_config(&ports, backends, true),
    };
    Ok(load_balancer(owner, &name, &spec.common, ports, config, backends))
}

/// The worker load balancer: each port of the range to the same port of
/// every active worker.
pub fn load_balancer_worker(
    owner: &Owner,
    index: usize,
    spec: &LoadBalancerWorker,
    backends: &[Backend],
    template: Option<&Template>,
) -> Result<ServiceObjects, TemplateError> {
    let name = instance_name("loadbalancer-worker", owner, index);
    let ports: Ports = (spec.node_port_range.start..=spec.node_port_range.end)
        .map(|p| (format!("port-{p}"), p, p))
        .collect();
    let config = match template {
        Some(t) => t.render(&template_data(&ports, backends))?,
        None => haproxy_config(&ports, backends, false),
    };
    Ok(load_balancer(owner, &name, &spec.common, ports, config, backends))
}

/// What upstream's templates are given: `.ContainerPorts` (Kubernetes
/// ContainerPorts: Name, ContainerPort, …) and `.Servers` (Name, IP) —
/// the backends that have an address on the interface.
pub fn template_data(ports: &[(String, i32, i32)], backends: &[Backend]) -> Value {
    let ports = ports
        .iter()
        .map(|(name, port, _)| {
            Value::record([
                ("Name", Value::Str(name.clone())),
                ("ContainerPort", Value::Int(i64::from(*port))),
                ("HostPort", Value::Int(0)),
                ("HostIP", Value::Str(String::new())),
                ("Protocol", Value::Str(String::new())),
            ])
        })
        .collect();
    let servers = backends
        .iter()
        .filter_map(|b| {
            Some(Value::record([
                ("Name", Value::Str(b.name.clone())),
                ("IP", Value::Str(b.ip.clone()?)),
            ]))
        })
        .collect();
    Value::record([
        ("ContainerPorts", Value::List(ports)),
        ("Servers", Value::List(servers)),
    ])
}

fn load_balancer(
    owner: &Owner,
    name: &str,
    common: &ServiceCommon,
    ports: Ports,
    config: String,
    backends: &[Backend],
) -> ServiceObjects {
    let data = BTreeMap::from([("haproxy.cfg".to_string(), config)]);
    let pod = json!({
        "containers": [{
            "name": "loadbalancer",
            "image": common.image,
            "imagePullPolicy": "IfNotPresent",
            "ports": ports.iter().map(|(n, p, _)| json!({"name": n, "containerPort": p})).collect::<Vec<_>>(),
            "volumeMounts": [{"name": "haproxy-config", "mountPath": "/usr/local/etc/haproxy"}],
        }],
        "volumes": [{"name": "haproxy-config", "secret": {"secretName": name}}],
    });
    let kind = Kind::LoadBalancer;
    let node_ports = match (ports.first(), ports.last()) {
        (Some(a), Some(b)) if a.2 != b.2 => format!("{}-{}", a.2, b.2),
        (Some(a), _) => a.2.to_string(),
        _ => String::new(),
    };
    ServiceObjects {
        deployment: deployment(owner, name, kind, common, config_hash([&data]), pod),
        service: service(owner, name, kind, common, &ports),
        secret: secret(owner, name, kind, data),
        config_map: None,
        node_ports,
        backends: backends
            .iter()
            .map(|b| format!("{}={}", b.name, b.ip.as_deref().unwrap_or("?")))
            .collect(),
    }
}

/// The jump host, laid out as upstream SIP's jump-host image expects: sshd
/// for user `ubuntu` with `authorized_keys` and the SSH config (every host
/// with an address, the nodes' private keys) in `/home/ubuntu/.ssh`, the
/// hosts' list (BMC address and credentials) at `/etc/opt/sip/hosts` and
/// the `host list|reboot` tool in `/opt/sip/bin`; reached on `nodePort`.
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
        ssh_config.push_str(&format!(
            "  IdentityFile {JUMP_HOST_DATA_DIR}/ssh-private-keys/{key}\n"
        ));
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
    ]);
    let files = BTreeMap::from([
        ("authorized-keys".to_string(), spec.ssh_authorized_keys.join("\n")),
        ("host".to_string(), HOST_TOOL.to_string()),
    ]);
    let proxy = spec.bmc.and_then(|b| b.proxy).unwrap_or(false);
    // Probes on the named port, as upstream: sshd up is the pod ready.
    let probe = |delay: i32, period: i32| json!({"tcpSocket": {"port": "ssh"}, "initialDelaySeconds": delay, "periodSeconds": period});
    let aliases: Vec<serde_json::Value> = hosts
        .iter()
        .filter_map(|h| Some(json!({"ip": h.ip.as_ref()?, "hostnames": [h.name]})))
        .collect();
    let pod = json!({
        "initContainers": [{
            "name": "ssh-perms",
            "image": spec.common.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c"],
            "args": [format!("mkdir -m700 {JUMP_HOST_SSH_DIR}")],
        }],
        "containers": [{
            "name": "jumphost",
            "image": spec.common.image,
            "imagePullPolicy": "IfNotPresent",
            "ports": [{"name": "ssh", "containerPort": 22}],
            // Redfish straight to the BMCs unless `bmc.proxy` (upstream
            // means this too; its loop sets the variables on a copy).
            "env": if proxy { json!([]) } else { json!([{"name": "NO_PROXY", "value": "*"}, {"name": "no_proxy", "value": "*"}]) },
            "volumeMounts": [
                {"name": "data", "mountPath": format!("{JUMP_HOST_DATA_DIR}/hosts"), "subPath": "hosts"},
                {"name": "scripts", "mountPath": JUMP_HOST_SCRIPTS_DIR},
                {"name": "data", "mountPath": format!("{JUMP_HOST_SSH_DIR}/config"), "subPath": "ssh_config"},
                {"name": "ssh-private-keys", "mountPath": format!("{JUMP_HOST_DATA_DIR}/ssh-private-keys")},
                {"name": "authorized-keys", "mountPath": format!("{JUMP_HOST_SSH_DIR}/authorized_keys"), "subPath": "authorized_keys"},
            ],
            "livenessProbe": probe(15, 10),
            "readinessProbe": probe(5, 20),
        }],
        // sshd and `ubuntu` (uid/gid 1000) read the mounted files.
        "securityContext": {"fsGroup": 1000},
        "volumes": [
            {"name": "data", "secret": {"secretName": name}},
            {"name": "authorized-keys", "configMap": {"name": name, "defaultMode": 0o700,
                "items": [{"key": "authorized-keys", "path": "authorized_keys", "mode": 0o600}]}},
            {"name": "scripts", "configMap": {"name": name, "defaultMode": 0o777}},
            // Group-readable for `ubuntu` through fsGroup, no one else.
            {"name": "ssh-private-keys", "secret": {"secretName": spec.node_ssh_private_keys, "defaultMode": 0o440}},
        ],
        "hostAliases": aliases,
    });
    let kind = Kind::JumpHost;
    let ports = vec![("ssh".to_string(), 22, spec.node_port)];
    ServiceObjects {
        deployment: deployment(
            owner,
            &name,
            kind,
            &spec.common,
            config_hash([&data, &files]),
            pod,
        ),
        service: service(owner, &name, kind, &spec.common, &ports),
        secret: secret(owner, &name, kind, data),
        config_map: Some(config_map(owner, &name, kind, files)),
        node_ports: spec.node_port.to_string(),
        backends: Vec::new(),
    }
}

/// HAProxy's configuration when no template is given: a frontend and a
/// backend per port, a server per backend with an address. The control
/// plane's backends are checked on the API server's /readyz; the workers'
/// by a TCP connect.
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

/// Which service: upstream's `component` and `name` labels.
#[derive(Clone, Copy, Debug)]
enum Kind {
    LoadBalancer,
    JumpHost,
}

impl Kind {
    fn component(self) -> &'static str {
        match self {
            Kind::LoadBalancer => "loadbalancer",
            Kind::JumpHost => "jumphost",
        }
    }

    fn app(self) -> &'static str {
        match self {
            Kind::LoadBalancer => "haproxy",
            Kind::JumpHost => "jumphost",
        }
    }
}

/// Upstream SIP's labels (`app.kubernetes.io/{part-of,component,name,
/// instance}`): a new Deployment's selector, so label-based tooling written
/// for upstream keeps matching.
fn upstream_labels(name: &str, kind: Kind) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/part-of".to_string(), "sip".to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            kind.component().to_string(),
        ),
        ("app.kubernetes.io/name".to_string(), kind.app().to_string()),
        ("app.kubernetes.io/instance".to_string(), name.to_string()),
    ])
}

fn labels(owner: &Owner, name: &str, kind: Kind) -> BTreeMap<String, String> {
    let mut l = upstream_labels(name, kind);
    l.insert(
        "app.kubernetes.io/managed-by".to_string(),
        "nodewarden".to_string(),
    );
    l.insert(CLUSTER_LABEL.to_string(), owner.name.clone());
    l
}

fn metadata(owner: &Owner, name: &str, kind: Kind) -> serde_json::Value {
    json!({
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, name, kind),
        "ownerReferences": [owner.reference],
    })
}

/// A hash of the configuration in the pod template: a new configuration
/// rolls the pod (HAProxy and sshd read theirs at start, subPath mounts
/// never change).
fn config_hash<const N: usize>(parts: [&BTreeMap<String, String>; N]) -> String {
    let mut h = Sha256::new();
    for (k, v) in parts.into_iter().flatten() {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    crate::upgrade::hex(&h.finalize()[..8])
}

fn deployment(
    owner: &Owner,
    name: &str,
    kind: Kind,
    common: &ServiceCommon,
    hash: String,
    mut pod: serde_json::Value,
) -> Deployment {
    pod["nodeSelector"] = json!(common.node_labels);
    let value = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, kind),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": upstream_labels(name, kind)},
            "template": {
                "metadata": {
                    "labels": labels(owner, name, kind),
                    "annotations": {"nodewarden.dev/config-hash": hash},
                },
                "spec": pod,
            },
        },
    });
    serde_json::from_value(value).unwrap_or_default()
}

fn service(
    owner: &Owner,
    name: &str,
    kind: Kind,
    common: &ServiceCommon,
    ports: &[(String, i32, i32)],
) -> Service {
    let mut spec = json!({
        "type": "NodePort",
        "selector": upstream_labels(name, kind),
        "ports": ports.iter().map(|(n, p, np)| json!({"name": n, "port": p, "targetPort": p, "nodePort": np})).collect::<Vec<_>>(),
    });
    if let Some(ip) = &common.cluster_ip {
        spec["clusterIP"] = json!(ip);
    }
    let value = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, kind),
        "spec": spec,
    });
    serde_json::from_value(value).unwrap_or_default()
}

fn secret(owner: &Owner, name: &str, kind: Kind, data: BTreeMap<String, String>) -> Secret {
    let mut s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(owner, name, kind),
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

fn config_map(owner: &Owner, name: &str, kind: Kind, data: BTreeMap<String, String>) -> ConfigMap {
    let mut c: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, name, kind),
    }))
    .unwrap_or_default();
    c.data = Some(data);
    c
}

/// What is already there under a service's names.
#[derive(Clone, Debug, Default)]
pub struct Existing {
    /// The Deployment.
    pub deployment: Option<Deployment>,
    /// The Service.
    pub service: Option<Service>,
    /// The Secret.
    pub secret: Option<Secret>,
    /// The ConfigMap.
    pub config_map: Option<ConfigMap>,
}

/// Fits a service's objects to those already there, so applying them
/// changes nothing the API server keeps immutable: a Deployment keeps its
/// selector (upstream SIP's, or an older nodewarden's) and its pods and
/// Service follow it. Returns the objects taken over (not yet owned by
/// `owner_uid`), or what blocks the takeover, naming the object.
pub fn adopt(
    wanted: &mut ServiceObjects,
    existing: &Existing,
    owner_uid: &str,
) -> Result<Vec<String>, String> {
    let ns = wanted.deployment.metadata.namespace.clone().unwrap_or_default();
    let id =
        |kind: &str, meta: &ObjectMeta| format!("{kind} {ns}/{}", meta.name.as_deref().unwrap_or_default());
    let metas = [
        ("Deployment", existing.deployment.as_ref().map(|o| &o.metadata)),
        ("Service", existing.service.as_ref().map(|o| &o.metadata)),
        ("Secret", existing.secret.as_ref().map(|o| &o.metadata)),
        ("ConfigMap", existing.config_map.as_ref().map(|o| &o.metadata)),
    ];
    // The SIPCluster these objects are for, as their owner references name it.
    let this = wanted
        .deployment
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.uid == owner_uid)
        .map(|r| (r.kind.clone(), r.name.clone()));
    // Made for an earlier SIPCluster of this name, deleted since (its
    // objects wait for the garbage collector): this one takes them over.
    let earlier = |r: &OwnerReference| {
        this.as_ref()
            .is_some_and(|(kind, name)| &r.kind == kind && &r.name == name)
    };
    let mut taken = Vec::new();
    for (kind, meta) in metas {
        let Some(meta) = meta else { continue };
        let refs = meta.owner_references.iter().flatten();
        if let Some(other) = refs
            .clone()
            .find(|r| r.controller == Some(true) && r.uid != owner_uid && !earlier(r))
        {
            return Err(format!(
                "{} is controlled by {} {}; nodewarden takes over only objects no one else controls",
                id(kind, meta),
                other.kind,
                other.name
            ));
        }
        if !refs.clone().any(|r| r.uid == owner_uid) {
            taken.push(id(kind, meta));
        }
    }
    if let Some(d) = &existing.deployment {
        let selector = d.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
        keep_selector(wanted, &selector)
            .map_err(|why| format!("{}: {why}", id("Deployment", &d.metadata)))?;
    }
    if let (Some(have), Some(want)) = (
        existing
            .service
            .as_ref()
            .and_then(|s| s.spec.as_ref()?.cluster_ip.clone()),
        wanted.service.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
    ) && have != want
    {
        let svc = existing.service.as_ref().map(|s| id("Service", &s.metadata));
        return Err(format!(
            "{}: its clusterIP {have} cannot change (immutable) to the {want} spec.services asks",
            svc.unwrap_or_default()
        ));
    }
    if let Some(s) = &existing.secret {
        let data_differs = s.data.as_ref() != wanted.secret.data.as_ref();
        if s.immutable == Some(true) && data_differs {
            return Err(format!(
                "{}: it is immutable and holds other data",
                id("Secret", &s.metadata)
            ));
        }
        let kind = s.type_.as_deref().unwrap_or("Opaque");
        if kind != "Opaque" {
            return Err(format!(
                "{}: its type {kind} cannot change to Opaque",
                id("Secret", &s.metadata)
            ));
        }
    }
    if let (Some(c), Some(w)) = (&existing.config_map, &wanted.config_map)
        && c.immutable == Some(true)
        && c.data != w.data
    {
        return Err(format!(
            "{}: it is immutable and holds other data",
            id("ConfigMap", &c.metadata)
        ));
    }
    Ok(taken)
}

/// Gives the Deployment the selector it has (immutable), its pods the
/// labels that selector picks, and the Service the same selector.
fn keep_selector(wanted: &mut ServiceObjects, selector: &LabelSelector) -> Result<(), String> {
    if selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err("its selector has matchExpressions, which a Service cannot select by".into());
    }
    let picks = selector.match_labels.clone().unwrap_or_default();
    if picks.is_empty() {
        return Err("its selector selects every pod".into());
    }
    let Some(spec) = wanted.deployment.spec.as_mut() else {
        return Ok(());
    };
    spec.selector = selector.clone();
    let labels = spec
        .template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default);
    labels.extend(picks.clone());
    if let Some(s) = wanted.service.spec.as_mut() {
        s.selector = Some(picks);
    }
    Ok(())
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
        let o = load_balancer_control_plane(&owner(), 0, &spec, &backends(), None).expect("built");
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
        let a = load_balancer_worker(&owner(), 1, &spec, &backends(), None).expect("built");
        let mut more = backends();
        more.push(Backend {
            name: "w-9".into(),
            ip: Some("10.0.0.9".into()),
        });
        let b = load_balancer_worker(&owner(), 1, &spec, &more, None).expect("built");
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

    fn jump_spec() -> JumpHost {
        JumpHost {
            common: ServiceCommon {
                image: "quay.io/airshipit/jump-host".into(),
                ..Default::default()
            },
            node_port: 30000,
            bmc: None,
            ssh_authorized_keys: vec!["ssh-rsa AAA a".into(), "ssh-ed25519 BBB b".into()],
            node_ssh_private_keys: "keys".into(),
        }
    }

    /// The jump host's pod as upstream SIP's jump-host image expects it.
    #[test]
    fn the_jump_host_pod_has_upstreams_layout() {
        let o = jump_host(&owner(), 0, &jump_spec(), &[], &["id_rsa".into()]);
        let pod = o
            .deployment
            .spec
            .clone()
            .expect("spec")
            .template
            .spec
            .expect("pod");
        // (path, volume, subPath) of the one container; the init container mounts nothing.
        let got: Vec<(&str, &str, Option<&str>)> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.mount_path.as_str(), m.name.as_str(), m.sub_path.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("/etc/opt/sip/hosts", "data", Some("hosts")),
                ("/opt/sip/bin", "scripts", None),
                ("/home/ubuntu/.ssh/config", "data", Some("ssh_config")),
                ("/etc/opt/sip/ssh-private-keys", "ssh-private-keys", None),
                (
                    "/home/ubuntu/.ssh/authorized_keys",
                    "authorized-keys",
                    Some("authorized_keys")
                ),
            ]
        );
        assert_eq!(pod.containers.len(), 1);
        assert!(
            pod.init_containers
                .iter()
                .flatten()
                .all(|c| c.volume_mounts.is_none())
        );
        let volumes: Vec<serde_json::Value> = pod
            .volumes
            .iter()
            .flatten()
            .map(|v| serde_json::to_value(v).expect("json"))
            .collect();
        // (volume, source kind, object, defaultMode, items)
        let cases = [
            ("data", "secret", "jumphost-tenant", None, None),
            (
                "authorized-keys",
                "configMap",
                "jumphost-tenant",
                Some(0o700),
                Some(json!([{"key": "authorized-keys", "path": "authorized_keys", "mode": 0o600}])),
            ),
            ("scripts", "configMap", "jumphost-tenant", Some(0o777), None),
            ("ssh-private-keys", "secret", "keys", Some(0o440), None),
        ];
        assert_eq!(volumes.len(), cases.len());
        for (v, (name, kind, object, mode, items)) in volumes.iter().zip(cases) {
            assert_eq!(v["name"], name);
            let source = &v[kind];
            let object_field = if kind == "secret" { "secretName" } else { "name" };
            assert_eq!(source[object_field], object, "{v}");
            assert_eq!(source["defaultMode"].as_i64(), mode, "{v}");
            assert_eq!(source.get("items"), items.as_ref(), "{v}");
        }
        let init = &pod.init_containers.as_ref().expect("init containers")[0];
        assert_eq!(init.name, "ssh-perms");
        assert_eq!(init.image.as_deref(), Some("quay.io/airshipit/jump-host"));
        assert_eq!(
            [init.command.clone(), init.args.clone()],
            [
                Some(vec!["/bin/sh".to_string(), "-c".to_string()]),
                Some(vec!["mkdir -m700 /home/ubuntu/.ssh".to_string()])
            ]
        );
        assert_eq!(pod.security_context.and_then(|s| s.fs_group), Some(1000));
        let c = &pod.containers[0];
        let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
            let p = p.clone().expect("a probe");
            let port = p.tcp_socket.map(|t| t.port);
            (port, p.initial_delay_seconds, p.period_seconds)
        };
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String as Named;
        assert_eq!(
            probe(&c.liveness_probe),
            (Some(Named("ssh".into())), Some(15), Some(10))
        );
        assert_eq!(
            probe(&c.readiness_probe),
            (Some(Named("ssh".into())), Some(5), Some(20))
        );
        let cm = o.config_map.expect("a ConfigMap");
        assert_eq!(cm.metadata.name.as_deref(), Some("jumphost-tenant"));
        let files = cm.data.expect("data");
        assert_eq!(files.keys().collect::<Vec<_>>(), ["authorized-keys", "host"]);
        assert_eq!(files["authorized-keys"], "ssh-rsa AAA a\nssh-ed25519 BBB b");
        assert!(files["host"].starts_with("#!/bin/sh"));
        assert!(files["host"].contains("/etc/opt/sip/hosts"));
        let secret = o.secret.data.expect("data");
        assert_eq!(secret.keys().collect::<Vec<_>>(), ["hosts", "ssh_config"]);
        // Upstream's labels, and its selector for a new Deployment.
        let selector = o
            .deployment
            .spec
            .expect("spec")
            .selector
            .match_labels
            .expect("labels");
        assert_eq!(
            selector,
            BTreeMap::from([
                ("app.kubernetes.io/part-of".into(), "sip".into()),
                ("app.kubernetes.io/component".into(), "jumphost".into()),
                ("app.kubernetes.io/name".into(), "jumphost".into()),
                ("app.kubernetes.io/instance".into(), "jumphost-tenant".into()),
            ])
        );
        assert_eq!(o.service.spec.expect("spec").selector, Some(selector));
    }

    /// The `host` tool, run with stand-ins for jq's input and redfishtool.
    #[test]
    fn the_host_tool_lists_and_reboots_through_the_bmc() {
        let Ok(jq) = std::process::Command::new("jq").arg("--version").output() else {
            panic!("jq is needed to test the host tool");
        };
        assert!(jq.status.success());
        let dir = std::env::temp_dir().join(format!("nodewarden-host-tool-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let hosts = dir.join("hosts");
        std::fs::write(
            &hosts,
            r#"[{"name":"cp-1","bmc":{"ip":"10.0.0.1:8000","username":"root","password":"pw"}}]"#,
        )
        .expect("hosts");
        let fake = dir.join("redfishtool");
        std::fs::write(&fake, "#!/bin/sh\necho \"redfishtool $*\"\n").expect("a fake redfishtool");
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&fake)
            .status()
            .expect("chmod");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(HOST_TOOL)
                .arg("host")
                .args(args)
                .env("SIP_HOSTS_FILE", &hosts)
                .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
                .output()
                .expect("running the tool");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        // (arguments, succeeds, output)
        let cases: [(&[&str], bool, &str); 4] = [
            (&["list"], true, "cp-1\n"),
            (
                &["reboot", "cp-1"],
                true,
                "Rebooting host 'cp-1'\nredfishtool -r 10.0.0.1:8000 -u root -p pw Systems reset GracefulRestart\n",
            ),
            (&["reboot", "cp-9"], false, ""),
            (&["reboot"], false, ""),
        ];
        for (args, ok, out) in cases {
            assert_eq!(run(args), (ok, out.to_string()), "{args:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn upstream_deployment(name: &str, selector: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": "d1",
                         "labels": {"app.kubernetes.io/part-of": "sip"}},
            "spec": {"selector": selector, "template": {"spec": {"containers": []}}},
        }))
        .expect("a deployment")
    }

    /// (what is there, taken over or the blocker's words)
    #[test]
    fn objects_already_there_are_taken_over_as_they_are_or_named() {
        let sel = |labels: serde_json::Value| json!({"matchLabels": labels});
        let upstream = sel(
            json!({"app.kubernetes.io/part-of": "sip", "app.kubernetes.io/component": "jumphost",
            "app.kubernetes.io/name": "jumphost", "app.kubernetes.io/instance": "jumphost-tenant"}),
        );
        let older = sel(json!({"app.kubernetes.io/name": "jumphost-tenant"}));
        let mine_ref = json!([{"apiVersion": "airship.airshipit.org/v1", "kind": "SIPCluster", "name": "tenant", "uid": "u", "controller": true}]);
        let other_ref = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "o", "controller": true}]);
        let earlier_ref = json!([{"apiVersion": "airship.airshipit.org/v1", "kind": "SIPCluster", "name": "tenant", "uid": "gone", "controller": true}]);
        let with_refs = |refs: &serde_json::Value| {
            let mut d = upstream_deployment("jumphost-tenant", upstream.clone());
            d.metadata.owner_references = serde_json::from_value(refs.clone()).expect("refs");
            d
        };
        let service = |ip: &str| -> Service {
            serde_json::from_value(json!({"metadata": {"name": "jumphost-tenant", "namespace": "ns"},
                "spec": {"clusterIP": ip}}))
            .expect("a service")
        };
        let secret = |immutable: bool, type_: &str| -> Secret {
            serde_json::from_value(json!({"metadata": {"name": "jumphost-tenant", "namespace": "ns"},
                "immutable": immutable, "type": type_, "data": {"hosts": "W10="}}))
            .expect("a secret")
        };
        let mut asks_ip = jump_spec();
        asks_ip.common.cluster_ip = Some("10.96.0.20".into());
        type Case<'a> = (&'a str, Existing, JumpHost, Result<Vec<&'a str>, &'a str>);
        let cases: Vec<Case> = vec![
            ("nothing there", Existing::default(), jump_spec(), Ok(vec![])),
            (
                "upstream's deployment",
                Existing {
                    deployment: Some(upstream_deployment("jumphost-tenant", upstream.clone())),
                    ..Default::default()
                },
                jump_spec(),
                Ok(vec!["Deployment ns/jumphost-tenant"]),
            ),
            (
                "an older nodewarden's selector",
                Existing {
                    deployment: Some(with_refs(&mine_ref)).map(|mut d| {
                        d.spec.as_mut().expect("spec").selector =
                            serde_json::from_value(older.clone()).expect("sel");
                        d
                    }),
                    ..Default::default()
                },
                jump_spec(),
                Ok(vec![]),
            ),
            (
                "made for an earlier SIPCluster of this name",
                Existing {
                    deployment: Some(with_refs(&earlier_ref)),
                    ..Default::default()
                },
                jump_spec(),
                Ok(vec!["Deployment ns/jumphost-tenant"]),
            ),
            (
                "controlled by another",
                Existing {
                    deployment: Some(with_refs(&other_ref)),
                    ..Default::default()
                },
                jump_spec(),
                Err("Deployment ns/jumphost-tenant is controlled by ReplicaSet x"),
            ),
            (
                "a selector by expressions",
                Existing {
                    deployment: Some(upstream_deployment(
                        "jumphost-tenant",
                        json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]}),
                    )),
                    ..Default::default()
                },
                jump_spec(),
                Err("Deployment ns/jumphost-tenant: its selector has matchExpressions"),
            ),
            (
                "a Service on another clusterIP",
                Existing {
                    service: Some(service("10.96.0.10")),
                    ..Default::default()
                },
                asks_ip.clone(),
                Err("Service ns/jumphost-tenant: its clusterIP 10.96.0.10 cannot change (immutable)"),
            ),
            (
                "a Service on the clusterIP asked",
                Existing {
                    service: Some(service("10.96.0.20")),
                    ..Default::default()
                },
                asks_ip,
                Ok(vec!["Service ns/jumphost-tenant"]),
            ),
            (
                "an immutable Secret",
                Existing {
                    secret: Some(secret(true, "Opaque")),
                    ..Default::default()
                },
                jump_spec(),
                Err("Secret ns/jumphost-tenant: it is immutable"),
            ),
            (
                "a Secret of another type",
                Existing {
                    secret: Some(secret(false, "kubernetes.io/tls")),
                    ..Default::default()
                },
                jump_spec(),
                Err("Secret ns/jumphost-tenant: its type kubernetes.io/tls cannot change"),
            ),
        ];
        for (what, existing, spec, want) in cases {
            let mut o = jump_host(&owner(), 0, &spec, &[], &[]);
            let got = adopt(&mut o, &existing, "u");
            match (&got, want) {
                (Ok(taken), Ok(want)) => assert_eq!(taken, &want, "{what}"),
                (Err(e), Err(want)) => assert!(e.starts_with(want), "{what}: {e}"),
                _ => panic!("{what}: {got:?}"),
            }
            // What a Deployment there had as selector, it keeps; its pods
            // and the Service follow that selector.
            if let (Ok(_), Some(d)) = (&got, &existing.deployment) {
                let had = d.spec.as_ref().expect("spec").selector.clone();
                let spec = o.deployment.spec.expect("spec");
                assert_eq!(spec.selector, had, "{what}");
                let picks = had.match_labels.expect("labels");
                let pod_labels = spec.template.metadata.and_then(|m| m.labels).expect("labels");
                assert!(picks.iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "{what}");
                assert_eq!(o.service.spec.and_then(|s| s.selector), Some(picks), "{what}");
            }
        }
    }

    /// A template from upstream's ConfigMap: its output is the configuration.
    #[test]
    fn a_template_renders_the_configuration() {
        let spec = LoadBalancerControlPlane {
            common: ServiceCommon {
                image: "haproxy".into(),
                ..Default::default()
            },
            node_port: 30001,
        };
        let t = Template::parse(
            "# custom\n{{- $servers := .Servers }}{{ range .ContainerPorts }}\nlisten {{ .Name }}\n  bind :{{ .ContainerPort }}\n{{- $p := .ContainerPort }}{{ range $servers }}\n  server {{ .Name }} {{ .IP }}:{{ $p }}{{ end }}{{ end }}\n",
        )
        .expect("a template");
        let o = load_balancer_control_plane(&owner(), 0, &spec, &backends(), Some(&t)).expect("rendered");
        let cfg = String::from_utf8(o.secret.data.expect("data")["haproxy.cfg"].0.clone()).expect("utf8");
        assert_eq!(
            cfg,
            "# custom\nlisten http\n  bind :6443\n  server cp-1 10.0.0.1:6443\n"
        );
        let bad = Template::parse("{{ range .Backends }}{{ end }}").expect("parses");
        let err = load_balancer_control_plane(&owner(), 0, &spec, &backends(), Some(&bad))
            .expect_err("no .Backends");
        assert!(err.to_string().contains("Backends"), "{err}");
    }
}
