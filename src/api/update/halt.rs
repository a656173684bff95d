//! A rollout that stopped itself: new instances of its target kept failing
//! to join, or workloads stayed unready on its new nodes, so the image is
//! taken to be bad. The record lives in the
//! NodeVersion's status (`status.halt`), so every replica and every restart
//! sees the same count; [`crate::rollout::halt`] decides it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Failed joins of one rollout target, and whether it halted on them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutHalt {
    /// The target the count is for: the image and the Kubernetes
    /// components reference (`<image> <components>`). A new target starts
    /// a new count.
    #[serde(default)]
    pub target: String,
    /// The new nodes given up in a row for this target (never joined within
    /// joinTimeout, or failed at the cloud), oldest first. A node of the
    /// target that joins clears it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_joins: Vec<String>,
    /// Failed joins no longer counted (one joined after them, or the
    /// rollout was resumed), kept while their PendingNodes remain so that
    /// none counts twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgiven: Vec<String>,
    /// Pods on new nodes of this target unready for longer than
    /// podReadyTimeout while their workload's pods are Ready on other nodes
    /// (`<namespace>/<pod> on <node> (<Kind> <name>)`). While the rollout
    /// runs, those unready now; once halted, every one that halted it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unready_pods: Vec<String>,
    /// When the rollout halted; unset while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_at: Option<Time>,
    /// The value of the `nodewarden.dev/resume-rollout` annotation last
    /// honoured: a new value resumes a halted rollout once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_with: Option<String>,
}

impl RolloutHalt {
    /// Whether the rollout is halted.
    pub fn is_halted(&self) -> bool {
        self.halted_at.is_some()
    }
}

/// On a NodeVersion: set (or change) it to resume a halted rollout.
pub const RESUME_ANNOTATION: &str = "nodewarden.dev/resume-rollout";

/// On a PendingNode: the target (`<image> <components>`) it was created
/// for, so a failed join counts against that target only; carried to the
/// node it becomes, whose pods are watched for the target.
pub const TARGET_ANNOTATION: &str = "nodewarden.dev/rollout-target";
