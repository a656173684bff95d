//! SIPCluster: the bare-metal hosts of a tenant cluster and its support
//! services (Airship SIP's API, `airship.airshipit.org/v1`, in its final
//! shape: `labelSelector` + `topologyKey` + `count.active/standby` per role).
//!
//! Beyond upstream: bad specs are refused at admission (CEL), the status
//! names every chosen host with its role and whether it is active or
//! standby, the services and their endpoints, and conditions carry
//! observedGeneration.

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The roles a SIPCluster schedules hosts for (the keys of `spec.nodes`).
pub const ROLES: [&str; 2] = ["ControlPlane", "Worker"];

/// Host labels: upstream's, plus whether the host is active or standby.
pub mod labels {
    /// The claiming SIPCluster's namespace (upstream's).
    pub const CLUSTER_NAMESPACE: &str = "sip.airshipit.org/cluster-namespace";
    /// The claiming SIPCluster's name (upstream's).
    pub const CLUSTER_NAME: &str = "sip.airshipit.org/cluster-name";
    /// The role the host was chosen for: `ControlPlane` or `Worker` (upstream's).
    pub const NODE_TYPE: &str = "sip.airshipit.org/node-type";
    /// `active` or `standby` (upstream cannot tell them apart).
    pub const STATE: &str = "nodewarden.dev/sip-state";
}

/// The bare-metal hosts and support services of one tenant cluster.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "airship.airshipit.org",
    version = "v1",
    kind = "SIPCluster",
    doc = "The bare-metal hosts (metal3 BareMetalHosts) and support services of a tenant cluster",
    plural = "sipclusters",
    namespaced,
    status = "SIPClusterStatus",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "ControlPlane",
        type_ = "string",
        json_path = ".status.controlPlane",
        description = "active/wanted (+standby/wanted)"
    ),
    printcolumn(
        name = "Workers",
        type_ = "string",
        json_path = ".status.workers",
        description = "active/wanted (+standby/wanted)"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        priority = "1",
        json_path = ".status.conditions[?(@.type=='Ready')].message"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SIPClusterSpec {
    /// The hosts to schedule, by role (`ControlPlane`, `Worker`).
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self.all(role, role in ['ControlPlane', 'Worker'])").message("spec.nodes: the roles are ControlPlane and Worker"))]
    #[schemars(extend("maxProperties" = 8))]
    pub nodes: BTreeMap<String, NodeSet>,
    /// The support services deployed for the cluster.
    pub services: SIPClusterServices,
}

/// How to choose one role's hosts.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSet {
    /// Which BareMetalHosts may serve the role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// At most one of the role's hosts per value of this host label (a rack,
    /// a server): like topologyKey of pod anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    #[x_kube(validation = kube::core::Rule::new("self != ''").message("spec.nodes[*].topologyKey must not be empty (leave it out for no spread)"))]
    pub topology_key: Option<String>,
    /// How many hosts: active and standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<NodeCount>,
}

/// How many hosts a role wants.
#[derive(KubeSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCount {
    /// Hosts in use.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("spec.nodes[*].count.active must not be negative"))]
    #[schemars(range(max = 1000))]
    pub active: i32,
    /// Hosts held ready to replace a failed active one.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("spec.nodes[*].count.standby must not be negative"))]
    #[schemars(range(max = 1000))]
    pub standby: i32,
}

/// The services deployed for the cluster.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SIPClusterServices {
    /// HAProxy in front of the control-plane hosts' API servers (port 6443).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub load_balancer_control_plane: Vec<LoadBalancerControlPlane>,
    /// HAProxy in front of the worker hosts, one port per port of the range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub load_balancer_worker: Vec<LoadBalancerWorker>,
    /// An SSH jump host with the hosts' list and BMC access.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub jump_host: Vec<JumpHost>,
}

/// What every service has.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceCommon {
    /// The container image.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Node labels the service's pod must run on (a nodeSelector).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// The host network (networkData `networks[].id`) whose address the service uses.
    #[serde(default, rename = "nodeInterfaceId", skip_serializing_if = "Option::is_none")]
    pub node_interface_id: Option<String>,
    /// A fixed cluster IP for the Service.
    #[serde(default, rename = "clusterIP", skip_serializing_if = "Option::is_none")]
    pub cluster_ip: Option<String>,
}

/// The control-plane load balancer.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerControlPlane {
    /// Image, node labels, interface, cluster IP.
    #[serde(flatten)]
    pub common: ServiceCommon,
    /// The NodePort the API servers are reached on.
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("nodePort must be a port number"))]
    pub node_port: i32,
}

/// The worker load balancer.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerWorker {
    /// Image, node labels, interface, cluster IP.
    #[serde(flatten)]
    pub common: ServiceCommon,
    /// The NodePorts forwarded to the same ports of every worker.
    pub node_port_range: PortRange,
}

/// A range of ports, both ends included.
#[derive(KubeSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[x_kube(validation = kube::core::Rule::new("self.start <= self.end && self.end - self.start < 100").message("nodePortRange: start must not be after end, and at most 100 ports"))]
pub struct PortRange {
    /// The first port.
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("nodePortRange.start must be a port number"))]
    pub start: i32,
    /// The last port.
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("nodePortRange.end must be a port number"))]
    pub end: i32,
}

/// The jump host.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JumpHost {
    /// Image, node labels, interface, cluster IP.
    #[serde(flatten)]
    pub common: ServiceCommon,
    /// The NodePort SSH is reached on.
    #[x_kube(validation = kube::core::Rule::new("self >= 1 && self <= 65535").message("nodePort must be a port number"))]
    pub node_port: i32,
    /// BMC access from the jump host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcOptions>,
    /// Public keys allowed to log in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_authorized_keys: Vec<String>,
    /// A Secret in the SIPCluster's namespace whose keys are SSH private
    /// keys for the cluster's hosts (mounted, named by their keys).
    #[serde(rename = "nodeSSHPrivateKeys")]
    #[schemars(length(min = 1))]
    pub node_ssh_private_keys: String,
}

/// How the jump host reaches the BMCs.
#[derive(KubeSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BmcOptions {
    /// Through the proxy of the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<bool>,
}

/// What the SIPCluster controller chose and deployed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SIPClusterStatus {
    /// `Ready`, with upstream's reasons (Progressing, Unschedulable,
    /// InfraServiceFailure, UnableToApplyLabels, UnableToDecommission,
    /// ReconciliationSucceeded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The hosts chosen, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<ChosenHost>,
    /// The services deployed and where they are reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceEndpoint>,
    /// Control-plane hosts: `active/wanted (+standby/wanted)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<String>,
    /// Worker hosts: `active/wanted (+standby/wanted)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<String>,
}

/// One chosen host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChosenHost {
    /// The BareMetalHost's name.
    pub name: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
    /// `active` or `standby`.
    pub state: String,
    /// Its value of the role's topologyKey.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// Its address on the services' interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

/// One deployed service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEndpoint {
    /// `loadBalancerControlPlane`, `loadBalancerWorker` or `jumpHost`.
    pub kind: String,
    /// The Deployment, Service and Secret's name.
    pub name: String,
    /// The NodePorts it is reached on (`30001`, `30002-30011`).
    pub node_ports: String,
    /// The backends it serves (load balancers): `host=ip`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<String>,
}
