//! The NodeVersion controller's own figures: nodes by state, progress, the
//! last step's time (leader only) and finished replacements.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::telemetry::Metrics;
use crate::telemetry::metrics::FloatGauge;

/// A node's state in a rollout, the `state` label of `nodes`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum NodeState {
    /// On the NodeVersion's image.
    UpToDate,
    /// On another image, not yet being replaced.
    Outdated,
    /// Being replaced (a surge node or an unavailable one).
    Replacing,
}

impl NodeState {
    /// Every state, in the order the metric's series are set.
    pub const ALL: [NodeState; 3] = [NodeState::UpToDate, NodeState::Outdated, NodeState::Replacing];

    /// The label text: `up_to_date`, `outdated` or `replacing`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::UpToDate => "up_to_date",
            NodeState::Outdated => "outdated",
            NodeState::Replacing => "replacing",
        }
    }
}

crate::telemetry::metrics::label_value_from_as_str!(NodeState);

/// Label set of the rollout metrics: the NodeVersion.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeVersionLabels {
    /// The NodeVersion's name.
    pub nodeversion: String,
}

/// Label set of `nodes`: the NodeVersion and a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    /// The NodeVersion's name.
    pub nodeversion: String,
    /// The nodes' state in the rollout.
    pub state: NodeState,
}

/// The rollout families, registered by the NodeVersion controller.
#[derive(Clone)]
pub struct RolloutMetrics {
    /// Nodes of each NodeVersion by state (set by the leader).
    pub nodes: Family<NodeStateLabels, Gauge>,
    /// Up-to-date nodes / all nodes, per NodeVersion.
    pub rollout_progress: Family<NodeVersionLabels, FloatGauge>,
    /// Unix time of the rollout's last step or count change.
    pub rollout_last_progress: Family<NodeVersionLabels, FloatGauge>,
    /// Node replacements finished (the old node deleted).
    pub replacements: Family<NodeVersionLabels, Counter>,
}

impl RolloutMetrics {
    /// The families, registered with `metrics`; the leader-only ones are
    /// cleared when leadership is lost.
    pub fn register(metrics: &Metrics) -> Self {
        let m = RolloutMetrics {
            nodes: Family::default(),
            rollout_progress: Family::default(),
            rollout_last_progress: Family::default(),
            replacements: Family::default(),
        };
        metrics.register(
            "nodes",
            "Nodes of each NodeVersion by state: up_to_date, outdated, replacing (leader only)",
            m.nodes.clone(),
        );
        metrics.register(
            "rollout_progress_ratio",
            "Share of a NodeVersion's nodes that are up to date (leader only)",
            m.rollout_progress.clone(),
        );
        metrics.register(
            "rollout_last_progress_timestamp_seconds",
            "Unix time a NodeVersion's rollout last took a step or changed its counts (leader only)",
            m.rollout_last_progress.clone(),
        );
        metrics.register(
            "replacements",
            "Node replacements finished: the outdated node and its instance deleted",
            m.replacements.clone(),
        );
        let leader_only = m.clone();
        metrics.leader_only(move || {
            leader_only.nodes.clear();
            leader_only.rollout_progress.clear();
            leader_only.rollout_last_progress.clear();
        });
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_states_export_their_text_and_go_with_leadership() {
        let metrics = Metrics::new();
        let m = RolloutMetrics::register(&metrics);
        for state in NodeState::ALL {
            m.nodes
                .get_or_create(&NodeStateLabels {
                    nodeversion: "v".into(),
                    state,
                })
                .set(1);
        }
        let nv = NodeVersionLabels {
            nodeversion: "v".into(),
        };
        m.rollout_progress.get_or_create(&nv).set(0.5);
        let text = metrics.encode();
        for line in [
            r#"nodewarden_nodes{nodeversion="v",state="up_to_date"} 1"#,
            r#"nodewarden_nodes{nodeversion="v",state="outdated"} 1"#,
            r#"nodewarden_nodes{nodeversion="v",state="replacing"} 1"#,
            r#"nodewarden_rollout_progress_ratio{nodeversion="v"} 0.5"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        metrics.forget_leader_state();
        let text = metrics.encode();
        assert!(!text.contains("nodewarden_rollout_progress_ratio{"), "{text}");
        assert!(!text.contains("nodewarden_nodes{"), "{text}");
    }
}
