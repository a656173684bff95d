//! NodeMaintenance: cordon and drain a node on request (the Node Maintenance
//! Operator's API, `nodemaintenance.medik8s.io/v1beta1`, with its JSON names —
//! including `totalpods` — and the kubevirt-era group
//! `nodemaintenance.kubevirt.io/v1beta1` served alike).
//!
//! Beyond NMO: conditions with observedGeneration, printer columns, a drain
//! timeout with a policy for when it passes, and the PodDisruptionBudgets that
//! block the drain named in status.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label nodewarden puts on the NodeMaintenances it makes for itself:
/// `rollout` (a replaced node's drain) or `plan` (a Plan's drain). The
/// webhook judges those by the rule that fits them (see
/// `admission::rules::Requester`).
pub const DRAIN_FOR_LABEL: &str = "nodewarden.dev/drain-for";
/// [`DRAIN_FOR_LABEL`] of a rollout's drain.
pub const DRAIN_FOR_ROLLOUT: &str = "rollout";
/// [`DRAIN_FOR_LABEL`] of a Plan's drain.
pub const DRAIN_FOR_PLAN: &str = "plan";

/// What to do when a drain has not finished within `drainTimeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DrainTimeoutPolicy {
    /// Phase Failed, with the pods and the PodDisruptionBudgets that blocked it named.
    #[default]
    Fail,
    /// Delete the remaining pods (bypassing PodDisruptionBudgets) and finish.
    DeletePods,
}

/// The desired maintenance, shared by both API groups.
macro_rules! node_maintenance_spec {
    ($group:literal, $shortname:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[kube(
            group = $group,
            version = "v1beta1",
            kind = "NodeMaintenance",
            plural = "nodemaintenances",
            shortname = $shortname,
            status = "crate::api::node_maintenance::NodeMaintenanceStatus",
            printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
            printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
            printcolumn(name = "Progress", type_ = "integer", json_path = ".status.drainProgress", description = "percent of pods evicted"),
            printcolumn(name = "Pending", type_ = "integer", json_path = ".status.pendingPodsCount", priority = "1"),
            printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason", priority = "1"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        #[serde(rename_all = "camelCase")]
        pub struct NodeMaintenanceSpec {
            /// The node to put into maintenance. Required; cannot be changed.
            #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("updating spec.NodeName isn't allowed"))]
            #[x_kube(validation = kube::core::Rule::new("self != ''").message("nodeName must not be empty"))]
            pub node_name: String,
            /// Why the node is in maintenance (for humans).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub reason: Option<String>,
            /// Give up draining after this long (Go duration, e.g. "30m"); unset: wait forever, like NMO.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[x_kube(validation = kube::core::Rule::new("self.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$')").message("drainTimeout must be a duration such as 90s, 30m or 1h30m"))]
            pub drain_timeout: Option<String>,
            /// What to do when drainTimeout passes. Default: Fail.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub on_drain_timeout: Option<crate::api::node_maintenance::DrainTimeoutPolicy>,
        }
    };
}

/// `nodemaintenance.medik8s.io/v1beta1`, the current group.
pub mod medik8s {
    use super::*;
    node_maintenance_spec!(
        "nodemaintenance.medik8s.io",
        "nm",
        "Puts a node into maintenance: cordon and drain."
    );
}

/// `nodemaintenance.kubevirt.io/v1beta1`, the kubevirt-era group (same schema).
pub mod kubevirt {
    use super::*;
    // Its own short name: `kubectl get nm` must mean one resource (medik8s's).
    node_maintenance_spec!(
        "nodemaintenance.kubevirt.io",
        "nmkv",
        "Puts a node into maintenance: cordon and drain (kubevirt-era group)."
    );
}

/// Where a maintenance stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MaintenancePhase {
    /// Under way: draining, or waiting for its turn (another tool holds the
    /// node's lease, or too many nodes are in maintenance).
    Running,
    /// The node is cordoned and drained.
    Succeeded,
    /// Impossible as asked, or the drain did not finish within drainTimeout
    /// (policy Fail).
    Failed,
}

/// A pod by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub struct PodReference {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

/// A pod whose eviction a PodDisruptionBudget refuses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DrainBlocker {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// `namespace/name` of the PodDisruptionBudget (empty when the API did not say which).
    pub pdb: String,
}

/// What the maintenance controller last did and saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    /// Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MaintenancePhase>,
    /// Percent of the pods to evict that are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_progress: Option<i32>,
    /// When the controller last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
    /// The latest error, if any (names the field and the reason for bad input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Names of the pods still to be evicted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods: Option<Vec<String>>,
    /// The pods still to be evicted, with namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods_refs: Option<Vec<PodReference>>,
    /// Number of pods still to be evicted (for the printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_pods_count: Option<i32>,
    /// All pods on the node when maintenance began (NMO's lowercase JSON name).
    #[serde(default, rename = "totalpods", skip_serializing_if = "Option::is_none")]
    pub total_pods: Option<i32>,
    /// Accepted for old documents that spell it `totalPods`; nodewarden writes `totalpods`.
    #[serde(default, rename = "totalPods", skip_serializing_if = "Option::is_none")]
    pub total_pods_legacy: Option<i32>,
    /// Pods to evict when maintenance began (DaemonSet and mirror pods stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_pods: Option<i32>,
    /// Times the node's maintenance lease was held by another tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_on_lease_count: Option<i32>,
    /// Pods whose eviction a PodDisruptionBudget refuses, and which budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<Vec<DrainBlocker>>,
    /// The maintenance's conditions, with observedGeneration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// What the maintenance controller needs from either group's NodeMaintenance.
pub trait MaintenanceObject:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + Serialize
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Which group this type is, for logs and Events.
    const GROUP: &'static str;
    /// The NoSchedule taint a node in this group's maintenance carries (as
    /// the Node Maintenance Operator sets it for the group: no value, no timeAdded).
    const DRAIN_TAINT: &'static str;
    /// `spec.nodeName`: the node to put into maintenance.
    fn node_name(&self) -> &str;
    /// `spec.reason`, if given.
    fn reason(&self) -> Option<&str>;
    /// `spec.drainTimeout` as written (a Go duration, not parsed yet).
    fn drain_timeout(&self) -> Option<&str>;
    /// `spec.onDrainTimeout`, Fail when unset.
    fn on_drain_timeout(&self) -> DrainTimeoutPolicy;
    /// The status, if the controller has written one.
    fn maintenance_status(&self) -> Option<&NodeMaintenanceStatus>;
}

macro_rules! impl_maintenance_object {
    ($ty:ty, $group:literal, $taint:literal) => {
        impl MaintenanceObject for $ty {
            const GROUP: &'static str = $group;
            const DRAIN_TAINT: &'static str = $taint;
            fn node_name(&self) -> &str {
                &self.spec.node_name
            }
            fn reason(&self) -> Option<&str> {
                self.spec.reason.as_deref()
            }
            fn drain_timeout(&self) -> Option<&str> {
                self.spec.drain_timeout.as_deref()
            }
            fn on_drain_timeout(&self) -> DrainTimeoutPolicy {
                self.spec.on_drain_timeout.unwrap_or_default()
            }
            fn maintenance_status(&self) -> Option<&NodeMaintenanceStatus> {
                self.status.as_ref()
            }
        }
    };
}

impl_maintenance_object!(
    medik8s::NodeMaintenance,
    "nodemaintenance.medik8s.io",
    "medik8s.io/drain"
);
impl_maintenance_object!(
    kubevirt::NodeMaintenance,
    "nodemaintenance.kubevirt.io",
    "kubevirt.io/drain"
);

/// Parses a Go-style duration ("90s", "30m", "1h30m", "1.5h", "250ms").
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else {
            return None;
        };
        total += value * unit;
        rest = &rest[len..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("90s", Some(90.0)),
            ("30m", Some(1800.0)),
            ("1h30m", Some(5400.0)),
            ("1.5h", Some(5400.0)),
            ("250ms", Some(0.25)),
            ("", None),
            ("10", None),
            ("5d", None),
            ("m", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input).map(|d| d.as_secs_f64()), want, "{input}");
        }
    }

    #[test]
    fn status_keeps_nmo_json_names() {
        let status = NodeMaintenanceStatus {
            total_pods: Some(5),
            eviction_pods: Some(3),
            pending_pods: Some(vec!["a".into()]),
            ..Default::default()
        };
        let json = serde_json::to_value(&status).expect("serializable");
        assert_eq!(json["totalpods"], 5);
        assert_eq!(json["evictionPods"], 3);
        assert_eq!(json["pendingPods"][0], "a");
    }
}
