//! JoiningNode: announces a node about to join, with the Kubernetes
//! components it was given, so the node can be annotated with them as soon
//! as it appears (a components mismatch is replaced like an image mismatch).

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A node expected to join, and its components.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "JoiningNode",
    doc = "A node about to join, and the Kubernetes components it was given",
    plural = "joiningnodes",
    status = "JoiningNodeStatus",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.name", priority = "1"),
    printcolumn(
        name = "Components",
        type_ = "string",
        json_path = ".spec.componentsreference",
        description = "ConfigMap of the node's Kubernetes components"
    ),
    printcolumn(
        name = "Deadline",
        type_ = "string",
        format = "date-time",
        json_path = ".spec.deadline"
    ),
    printcolumn(
        name = "ControlPlane",
        type_ = "boolean",
        json_path = ".spec.iscontrolplane",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct JoiningNodeSpec {
    /// The name of the Node expected to join.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The ConfigMap (in kube-system) of the Kubernetes components the node was given.
    #[serde(
        rename = "componentsreference",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub components_reference: String,
    /// Whether the node joins the control plane.
    #[serde(
        rename = "iscontrolplane",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub is_control_plane: bool,
    /// After this the join counts as failed and the object is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
}

/// Empty, as in Constellation; the status subresource is kept for its API.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JoiningNodeStatus {}

impl JoiningNodeSpec {
    /// Has the deadline passed at `now`? Never, when there is none.
    pub fn deadline_passed(&self, now: Timestamp) -> bool {
        self.deadline.as_ref().is_some_and(|d| d.0 <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lowercase_json_names_are_kept() {
        let spec: JoiningNodeSpec = serde_json::from_value(json!({
            "name": "worker-1",
            "componentsreference": "k8s-components-abc",
            "iscontrolplane": true,
            "deadline": "2024-01-01T00:00:00Z",
        }))
        .expect("Constellation's JoiningNode parses");
        assert!(spec.is_control_plane);
        let json = serde_json::to_value(&spec).expect("serializable");
        assert_eq!(json["componentsreference"], "k8s-components-abc");
        assert_eq!(json["iscontrolplane"], true);
        let before = Timestamp::from_second(1_704_067_199).expect("a time");
        assert!(!spec.deadline_passed(before));
        assert!(spec.deadline_passed(Timestamp::from_second(1_704_067_200).expect("a time")));
    }
}
