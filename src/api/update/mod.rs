//! `update.edgeless.systems/v1alpha1`: Constellation's node operator API,
//! accepted unchanged (same kinds, same JSON names, all cluster-scoped with a
//! status subresource), so its manifests and tooling keep working.
//!
//! Beyond Constellation: NodeVersion's `spec.rollout` (surge and
//! unavailability as counts or percentages, control plane first, join and
//! drain timeouts); node counts, a `progress` figure and `Progressing` /
//! `Degraded` conditions in its status; printer columns on every kind; CEL
//! rules that refuse bad input with a message naming the field.

pub mod autoscaling_strategy;
pub mod domain;
pub mod halt;
pub mod joining_node;
pub mod node_version;
pub mod pending_node;
pub mod rollout;
pub mod scaling_group;
pub mod waves;

pub use autoscaling_strategy::{AutoscalingStrategy, AutoscalingStrategySpec, AutoscalingStrategyStatus};
pub use domain::DomainStatus;
pub use halt::RolloutHalt;
pub use joining_node::{JoiningNode, JoiningNodeSpec, JoiningNodeStatus};
pub use node_version::{NodeCounts, NodeVersion, NodeVersionSpec, NodeVersionStatus, StatusList};
pub use pending_node::{CspNodeState, PendingNode, PendingNodeGoal, PendingNodeSpec, PendingNodeStatus};
pub use rollout::{Rollout, RolloutLimits};
pub use scaling_group::{NodeRole, ScalingGroup, ScalingGroupSpec, ScalingGroupStatus};
pub use waves::WaveStatus;

/// The API group.
pub const GROUP: &str = "update.edgeless.systems";

/// The name Constellation gives its single NodeVersion (older releases:
/// `constellation-os`). Any name works; ScalingGroups say which they follow.
pub const DEFAULT_NODE_VERSION: &str = "constellation-version";

/// Condition types. `Outdated` is Constellation's, on NodeVersion and
/// ScalingGroup; the others are nodewarden's, in a NodeVersion's
/// `status.rolloutConditions`.
pub mod condition {
    /// True while any node (or, on a ScalingGroup, the group's image) is not
    /// the desired one.
    pub const OUTDATED: &str = "Outdated";
    /// True while replacements are in flight or about to start.
    pub const PROGRESSING: &str = "Progressing";
    /// True when the rollout is stuck on something a human should look at.
    pub const DEGRADED: &str = "Degraded";
    /// Always True: which rollout settings are in force, and from where.
    pub const ROLLOUT_SETTINGS: &str = "RolloutSettings";
}

/// Constellation's messages for its Outdated condition (its CLI shows them
/// as the cluster's status).
pub mod message {
    /// Outdated=False.
    pub const NODE_VERSIONS_UP_TO_DATE: &str = "Node version of every node is up to date";
    /// Outdated=True.
    pub const NODE_VERSIONS_OUT_OF_DATE: &str = "Some node versions are out of date";
}

/// Condition reasons (CamelCase, stable: tooling may match on them).
pub mod reason {
    /// Outdated=False (Constellation's).
    pub const NODE_VERSIONS_UP_TO_DATE: &str = "NodeVersionsUpToDate";
    /// Outdated=True (Constellation's).
    pub const NODE_VERSIONS_OUT_OF_DATE: &str = "NodeVersionsOutOfDate";
    /// Progressing=True: replacement nodes are being created, joined or drained.
    pub const REPLACING_NODES: &str = "ReplacingNodes";
    /// Progressing=True: worker groups wait for the control plane to be up to date.
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlane";
    /// Progressing=True: the upgrade-agent upgrades the control plane to
    /// `kubernetesClusterVersion`; nodes are replaced after it.
    pub const UPGRADING_CONTROL_PLANE: &str = "UpgradingControlPlane";
    /// Degraded=True: the upgrade-agent failed to upgrade the control plane
    /// (tried again after a minute; nodes wait).
    pub const CONTROL_PLANE_UPGRADE_FAILED: &str = "ControlPlaneUpgradeFailed";
    /// Progressing=True: waiting for the cloud group to boot the new image.
    pub const WAITING_FOR_SCALING_GROUP: &str = "WaitingForScalingGroup";
    /// Progressing=False: every node is up to date.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// Degraded=False.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Progressing=True: a wave is done; the next starts once every node
    /// is Ready and `soakTime` has passed.
    pub const SOAKING_WAVE: &str = "SoakingWave";
    /// Progressing=True: a failure domain is done; the next starts once
    /// every node on the target is Ready (`spec.rollout.topologyKey`).
    pub const WAITING_FOR_DOMAIN: &str = "WaitingForDomain";
    /// Degraded=True, Progressing=False: `haltAfterFailedJoins` new nodes in
    /// a row were given up; the rollout waits for a person.
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    /// Degraded=True: a new node did not join within `joinTimeout`.
    pub const JOIN_TIMEOUT: &str = "JoinTimeout";
    /// Degraded=True: a drain did not finish within `drainTimeout`.
    pub const DRAIN_TIMEOUT: &str = "DrainTimeout";
    /// Degraded=True: some nodes cannot be handled (see `status.invalid`).
    pub const INVALID_NODES: &str = "InvalidNodes";
    /// Degraded=True: the cloud provider keeps refusing or failing requests.
    pub const CLOUD_ERROR: &str = "CloudError";
    /// Degraded=True: a control-plane node is not retired yet because its
    /// etcd member cannot be removed safely (the message names the members).
    pub const ETCD_MEMBER_REMOVAL_BLOCKED: &str = "EtcdMemberRemovalBlocked";
    /// Degraded=True: etcd cannot be reached or refuses nodewarden's requests.
    pub const ETCD_ERROR: &str = "EtcdError";
    /// Progressing=False, Degraded=True: nodewarden runs without a cloud provider.
    pub const NO_CLOUD_PROVIDER: &str = "NoCloudProvider";
    /// RolloutSettings: every setting is the NodeVersion's own.
    pub const FROM_NODE_VERSION: &str = "FromNodeVersion";
    /// RolloutSettings: some come from the operator's defaults (or the built-in ones).
    pub const FROM_OPERATOR: &str = "FromOperatorDefaults";
}

/// The annotations the rollout keeps on Nodes and AutoscalingStrategies
/// (Constellation's names, which its tools read).
pub mod annotations {
    /// On a Node: the ID of its scaling group (Constellation's).
    pub const GROUP_ANNOTATION: &str = "constellation.edgeless.systems/scaling-group-id";
    /// On a Node: the image its instance runs (Constellation's).
    pub const IMAGE_ANNOTATION: &str = "constellation.edgeless.systems/node-image";
    /// On a Node: its Kubernetes components reference (Constellation's).
    pub const COMPONENTS_ANNOTATION: &str = "constellation.edgeless.systems/kubernetes-components";
    /// On a donor: the name of its heir.
    pub const HEIR_ANNOTATION: &str = "constellation.edgeless.systems/heir";
    /// On an heir: the name of its donor.
    pub const DONOR_ANNOTATION: &str = "constellation.edgeless.systems/donor";
    /// On a surplus node being removed.
    pub const OBSOLETE_ANNOTATION: &str = "constellation.edgeless.systems/obsolete";
    /// On an AutoscalingStrategy nodewarden disabled: which NodeVersion did (so
    /// only what nodewarden paused is resumed).
    pub const PAUSED_BY_ANNOTATION: &str = "nodewarden.dev/paused-by";
}
