//! PendingNode: a cloud instance that is joining or leaving the cluster and
//! so has no Node object (or will soon have none). It is the bookkeeping that
//! makes sure every instance created is either a joined node or deleted
//! again, and that a node that does not exist yet is not taken for gone.

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the instance is headed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PendingNodeGoal {
    /// Become a Ready node of the cluster.
    Join,
    /// Be terminated at the cloud.
    Leave,
}

/// The instance's state as the cloud provider reports it.
// A missing instance counts as Terminated, but only once it was seen to exist
// or for a Leave: a node that does not exist yet is not gone (Constellation #2545).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum CspNodeState {
    /// No information (yet).
    #[default]
    Unknown,
    /// Being created at the cloud; not running yet.
    Creating,
    /// Running at the cloud; not necessarily joined to the cluster.
    Ready,
    /// Not running, temporarily.
    Stopped,
    /// Being deleted at the cloud.
    Terminating,
    /// Gone at the cloud (deleted, or missing once it had been seen or was meant to leave).
    Terminated,
    /// An unrecoverable error at the cloud.
    Failed,
}

/// An instance on its way into or out of the cluster.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "PendingNode",
    doc = "A cloud instance joining or leaving the cluster",
    plural = "pendingnodes",
    status = "PendingNodeStatus",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Goal", type_ = "string", json_path = ".spec.goal"),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.cspState",
        description = "the instance's state at the cloud"
    ),
    printcolumn(
        name = "Deadline",
        type_ = "string",
        format = "date-time",
        json_path = ".spec.deadline"
    ),
    printcolumn(
        name = "Reached",
        type_ = "boolean",
        json_path = ".status.reachedGoal",
        priority = "1"
    ),
    printcolumn(
        name = "Provider ID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PendingNodeSpec {
    /// The instance's provider ID (`gce://…`, `azure:///…`, `aws:///…`).
    #[serde(rename = "providerID", default, skip_serializing_if = "String::is_empty")]
    pub provider_id: String,
    /// The scaling group the instance belongs to (its `spec.groupId`).
    #[serde(rename = "groupID", default, skip_serializing_if = "String::is_empty")]
    pub group_id: String,
    /// The name the instance's Node has (or will have).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_name: String,
    /// Join or Leave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<PendingNodeGoal>,
    /// When to give up: a Join past it is deleted and turns into a Leave. Unset: wait forever.
    // A Leave past its deadline stays, unschedulable, so no data is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
}

/// What the pending node controller last saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingNodeStatus {
    /// The instance's state at the cloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csp_state: Option<CspNodeState>,
    /// Whether the goal is reached (joined and Ready, or terminated).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reached_goal: bool,
}

impl PendingNodeSpec {
    /// Has the deadline passed at `now`? Never, when there is none.
    pub fn deadline_passed(&self, now: Timestamp) -> bool {
        self.deadline.as_ref().is_some_and(|d| d.0 <= now)
    }
}

impl PendingNode {
    /// The cloud state last reported (Unknown before the first report).
    pub fn csp_state(&self) -> CspNodeState {
        self.status.as_ref().and_then(|s| s.csp_state).unwrap_or_default()
    }

    /// Whether the status says the goal is reached.
    pub fn reached_goal(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.reached_goal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_seed_spec_parses_with_constellations_names() {
        let spec: PendingNodeSpec = serde_json::from_value(json!({
            "providerID": "gce://p/z/i",
            "groupID": "projects/p/zones/z/instanceGroupManagers/g",
            "nodeName": "n",
            "goal": "Join",
            "deadline": "2022-07-04T08:33:18+00:00",
        }))
        .expect("the seed's spec parses");
        assert_eq!(spec.goal, Some(PendingNodeGoal::Join));
        let json = serde_json::to_value(&spec).expect("serializable");
        assert_eq!(json["providerID"], "gce://p/z/i");
        assert_eq!(json["groupID"], "projects/p/zones/z/instanceGroupManagers/g");
        let status = PendingNodeStatus {
            csp_state: Some(CspNodeState::Terminating),
            reached_goal: true,
        };
        assert_eq!(
            serde_json::to_value(&status).expect("serializable"),
            json!({"cspState": "Terminating", "reachedGoal": true})
        );
    }

    #[test]
    fn deadline_passes_at_and_after_it() {
        let at = |s: i64| Timestamp::from_second(s).expect("a time");
        let spec = |deadline: Option<i64>| PendingNodeSpec {
            provider_id: String::new(),
            group_id: String::new(),
            node_name: String::new(),
            goal: Some(PendingNodeGoal::Join),
            deadline: deadline.map(|s| Time(at(s))),
        };
        let cases = [
            // (deadline, now, passed)
            (Some(100), 99, false),
            (Some(100), 100, true),
            (Some(100), 101, true),
            (None, 1_000_000, false),
        ];
        for (deadline, now, want) in cases {
            assert_eq!(
                spec(deadline).deadline_passed(at(now)),
                want,
                "{deadline:?} at {now}"
            );
        }
    }
}
