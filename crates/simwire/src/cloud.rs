//! The cloud's vocabulary: scaling groups, their roles and an instance's
//! states. They are the types of nodewarden's provider trait
//! (`nodewarden::cloud` re-exports them), defined here because the sim-cloud's
//! answers carry them as they are, and the sim-cloud does not depend on the
//! operator.

use serde::{Deserialize, Serialize};

/// An instance's state in the cloud. The names are those of Constellation's
/// PendingNode `status.cspState`, so they can be written there unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InstanceState {
    /// The cloud reported a state nodewarden does not know.
    Unknown,
    /// Being provisioned or booting.
    Creating,
    /// Running. Whether its Node has joined is a separate question.
    Ready,
    /// Exists but is stopped (deallocated): neither running nor gone.
    Stopped,
    /// Being deleted.
    Terminating,
    /// Known to the cloud and gone.
    Terminated,
    /// Provisioning or booting failed; it will not become Ready by itself.
    Failed,
}

impl InstanceState {
    /// True for the states an instance never leaves (until deleted).
    pub fn is_final(self) -> bool {
        matches!(self, InstanceState::Terminated | InstanceState::Failed)
    }
}

/// Whether a group's nodes run the control plane or workloads. Matches the
/// `role` of Constellation's ScalingGroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupRole {
    /// Nodes that run workloads.
    Worker,
    /// Nodes that run the control plane (API server, etcd, ...).
    ControlPlane,
}

/// One scaling group (managed instance group, scale set, auto scaling group,
/// bare-metal host pool).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalingGroup {
    /// The provider's full ID of the group (used in every call).
    pub id: String,
    /// Whether its nodes run workloads or the control plane.
    pub role: GroupRole,
    /// A short human name (Constellation's `nodeGroupName`).
    pub name: String,
    /// Instances that are not being deleted.
    pub size: u32,
    /// The image new instances boot from.
    pub image: String,
}
