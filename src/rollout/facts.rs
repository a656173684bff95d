//! What the planner looks at: the rollout's scaling groups, their nodes and
//! the instances on their way, gathered by the NodeVersion controller.

/// A scaling group's role; control-plane groups sort (and go) first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Control-plane nodes.
    ControlPlane,
    /// Worker nodes.
    Worker,
}

/// A scaling group of this rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupFacts {
    /// The group's id at the cloud (`spec.groupId`).
    pub id: String,
    /// Control plane or workers.
    pub role: Role,
    /// The cloud creates new instances with the target image already.
    pub image_ready: bool,
}

/// A Node of this rollout's groups.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// The id of the node's scaling group.
    pub group: String,
    /// Its failure domain: the value of the rollout's topologyKey label
    /// ("" without one, or when the rollout has none).
    pub domain: String,
    /// On the rollout's target version (image and Kubernetes components).
    pub up_to_date: bool,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// The node this one replaces (heir annotation).
    pub heir_of: Option<String>,
    /// The node replacing this one (donor annotation).
    pub donor_to: Option<String>,
    /// Drain requested (a NodeMaintenance exists) and how it stands.
    pub drain: DrainState,
    /// Joined through a PendingNode of this rollout that is still tracked.
    pub joining: bool,
    /// A surplus node being removed (a mint left without a partner).
    pub obsolete: bool,
}

/// Where the rollout's drain of a node stands (its NodeMaintenance's phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DrainState {
    /// No drain requested (no NodeMaintenance).
    #[default]
    None,
    /// Requested and not finished.
    Running,
    /// Drained: the node may be retired.
    Succeeded,
    /// The drain failed; the node is left alone (Degraded says so).
    Failed,
}

/// An instance created but not yet a Node (goal Join).
#[derive(Clone, Debug, PartialEq)]
pub struct JoinFacts {
    /// The PendingNode's name.
    pub pending: String,
    /// The id of the scaling group the instance was created in.
    pub group: String,
}

/// Everything [`plan`](super::plan()) and [`counts`](super::counts()) look at, gathered by the reconciler.
pub struct Facts<'a> {
    /// The rollout's scaling groups.
    pub groups: &'a [GroupFacts],
    /// The Nodes of those groups.
    pub nodes: &'a [NodeFacts],
    /// Instances created that are not Nodes yet.
    pub joins: &'a [JoinFacts],
    /// Extra nodes allowed in flight (resolved from `spec.rollout.maxSurge`).
    pub max_surge: usize,
    /// Outdated nodes allowed to drain before their heir is Ready (resolved
    /// from `spec.rollout.maxUnavailable`).
    pub max_unavailable: usize,
    /// No worker instance is created while a control-plane node is outdated.
    pub control_plane_first: bool,
    /// The rollout halted (`status.halt`): no instance is created, no node
    /// paired, drained or retired; only surplus nodes go.
    pub halted: bool,
    /// Replacements the rollout's waves allow to start now; None: no waves.
    pub wave_starts: Option<usize>,
    /// Replace one failure domain at a time (`spec.rollout.topologyKey`).
    pub one_domain_at_a_time: bool,
    /// Workload pods on the target's new nodes not Ready now: waves and
    /// domains wait for them as for the nodes.
    pub unready_pods: usize,
}
