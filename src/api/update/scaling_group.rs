//! ScalingGroup: one scaling group at the cloud provider (a GCP managed
//! instance group, an Azure VM scale set, an AWS auto scaling group) whose
//! nodes follow the NodeVersion it names. Several groups may name different
//! NodeVersions, so independent node pools roll out independently.

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the nodes of a group do. Workers wait while any control-plane node
/// is outdated: a kubelet must never be newer than its API server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum NodeRole {
    /// Worker nodes (also what Constellation assumes when `role` is unset).
    #[default]
    Worker,
    /// Control-plane nodes: replaced first, never autoscaled.
    ControlPlane,
}

/// A cloud scaling group and the NodeVersion its nodes follow.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "ScalingGroup",
    doc = "A scaling group at the cloud provider and the NodeVersion its nodes follow",
    plural = "scalinggroups",
    status = "ScalingGroupStatus",
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(
        name = "Group",
        type_ = "string",
        json_path = ".spec.groupId",
        description = "the cloud provider's scaling group"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".status.imageReference",
        description = "the image new instances of the group boot"
    ),
    printcolumn(
        name = "NodeVersion",
        type_ = "string",
        json_path = ".spec.nodeImage",
        priority = "1"
    ),
    printcolumn(name = "Min", type_ = "integer", json_path = ".spec.min", priority = "1"),
    printcolumn(name = "Max", type_ = "integer", json_path = ".spec.max", priority = "1"),
    printcolumn(
        name = "Autoscaling",
        type_ = "boolean",
        json_path = ".spec.autoscaling",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = kube::core::Rule::new("!has(self.min) || !has(self.max) || self.min <= self.max")
    .message("spec.min must not be greater than spec.max"))]
#[serde(rename_all = "camelCase")]
pub struct ScalingGroupSpec {
    /// The NodeVersion whose image and components the group's nodes follow.
    // Constellation's JSON name says "image", but it names a NodeVersion.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_image: String,
    /// The cloud provider's canonical identifier of the group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group_id: String,
    /// The group's name as the cluster-autoscaler knows it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub autoscaler_group_name: String,
    /// The human-friendly name of the node group (from the cluster's configuration).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_group_name: String,
    /// Whether the cluster-autoscaler may scale this group (never for control planes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub autoscaling: bool,
    /// Fewest nodes the autoscaler keeps in the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("spec.min must not be negative"))]
    pub min: Option<i32>,
    /// Most nodes the autoscaler puts in the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("spec.max must not be negative"))]
    pub max: Option<i32>,
    /// Worker or ControlPlane. Default Worker.
    #[serde(default)]
    pub role: NodeRole,
}

/// What the scaling group controller last saw at the cloud.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingGroupStatus {
    /// The image new instances of the group boot right now.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_reference: String,
    /// `Outdated` while the group's image differs from its NodeVersion's.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl ScalingGroupSpec {
    /// The NodeVersion this group follows (`spec.nodeImage`).
    pub fn node_version(&self) -> &str {
        &self.node_image
    }

    /// Whether the group's nodes are control-plane nodes.
    pub fn is_control_plane(&self) -> bool {
        self.role == NodeRole::ControlPlane
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_seed_spec_parses_as_a_worker_group() {
        let spec: ScalingGroupSpec = serde_json::from_value(json!({
            "nodeImage": "constellation-version",
            "groupId": "projects/p/zones/z/instanceGroupManagers/g",
            "autoscaling": true,
        }))
        .expect("the seed's spec parses");
        assert_eq!(spec.node_version(), "constellation-version");
        assert_eq!(spec.role, NodeRole::Worker);
        assert!(!spec.is_control_plane());
        assert_eq!((spec.min, spec.max), (None, None));
    }

    #[test]
    fn json_names_match_constellation() {
        let spec = ScalingGroupSpec {
            node_image: "v".into(),
            group_id: "g".into(),
            autoscaler_group_name: "a".into(),
            node_group_name: "n".into(),
            autoscaling: false,
            min: Some(1),
            max: Some(3),
            role: NodeRole::ControlPlane,
        };
        let json = serde_json::to_value(&spec).expect("serializable");
        assert_eq!(
            json,
            json!({"nodeImage": "v", "groupId": "g", "autoscalerGroupName": "a",
                   "nodeGroupName": "n", "min": 1, "max": 3, "role": "ControlPlane"})
        );
    }
}
