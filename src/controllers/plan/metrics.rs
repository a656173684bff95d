//! The Plan controller's own figures: selected nodes by state (leader
//! only), upgrade Jobs' durations and the nodes that stopped a Plan.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::telemetry::Metrics;
use crate::telemetry::metrics::HistogramFamily;

/// A selected node's state in a Plan, the `state` label of `plan_nodes`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PlanNodeState {
    /// Carries the plan's current hash and is not applying.
    Upgraded,
    /// Waits for its turn.
    Due,
    /// Applying: cordon, drain, Job or the health gate.
    Applying,
    /// Its drain or Job failed; it holds the plan.
    Failed,
}

impl PlanNodeState {
    /// Every state, in the order the metric's series are set.
    pub const ALL: [PlanNodeState; 4] = [
        PlanNodeState::Upgraded,
        PlanNodeState::Due,
        PlanNodeState::Applying,
        PlanNodeState::Failed,
    ];

    /// The label text: `upgraded`, `due`, `applying` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanNodeState::Upgraded => "upgraded",
            PlanNodeState::Due => "due",
            PlanNodeState::Applying => "applying",
            PlanNodeState::Failed => "failed",
        }
    }
}

/// How an upgrade Job ended, the `result` label of `plan_job_duration_seconds`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum JobResult {
    /// Completed.
    Succeeded,
    /// Failed: backoff limit or deadline.
    Failed,
}

impl JobResult {
    /// The label text: `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobResult::Succeeded => "succeeded",
            JobResult::Failed => "failed",
        }
    }
}

/// Why a node stopped a Plan, the `reason` label of `plan_failures`
/// (also the Complete condition's reason).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PlanFailure {
    /// Its drain failed or timed out.
    DrainFailed,
    /// Its Job failed.
    JobFailed,
}

impl PlanFailure {
    /// The label text: the condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanFailure::DrainFailed => "DrainFailed",
            PlanFailure::JobFailed => "JobFailed",
        }
    }
}

crate::telemetry::metrics::label_value_from_as_str!(PlanNodeState, JobResult, PlanFailure);

/// Label set of `plan_nodes`: the Plan and a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlanNodeLabels {
    /// The Plan's namespace (not `namespace`: scrapes add that label for the pod's).
    pub plan_namespace: String,
    /// The Plan's name.
    pub plan: String,
    /// The nodes' state in the plan.
    pub state: PlanNodeState,
}

/// Label set of `plan_job_duration_seconds`: how the Job ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobResultLabels {
    /// How the Job ended.
    pub result: JobResult,
}

/// Label set of `plan_failures`: the Plan and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PlanFailureLabels {
    /// The Plan's namespace (not `namespace`: scrapes add that label for the pod's).
    pub plan_namespace: String,
    /// The Plan's name.
    pub plan: String,
    /// What failed.
    pub reason: PlanFailure,
}

fn job_histogram() -> Histogram {
    // 1 s .. ~2.3 h
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

/// The Plan families, registered by the Plan controller.
#[derive(Clone)]
pub struct PlanMetrics {
    /// Selected nodes of each Plan by state (set by the leader).
    pub plan_nodes: Family<PlanNodeLabels, Gauge>,
    /// Upgrade Jobs from their node entering the job phase to the Job's end.
    pub plan_job_duration: HistogramFamily<JobResultLabels>,
    /// Nodes that stopped a Plan, by Plan and reason.
    pub plan_failures: Family<PlanFailureLabels, Counter>,
}

impl PlanMetrics {
    /// The families, registered with `metrics`; the node counts are
    /// cleared when leadership is lost.
    pub fn register(metrics: &Metrics) -> Self {
        let m = PlanMetrics {
            plan_nodes: Family::default(),
            plan_job_duration: Family::new_with_constructor(job_histogram),
            plan_failures: Family::default(),
        };
        metrics.register(
            "plan_nodes",
            "Selected nodes of each Plan by state: upgraded, due, applying, failed (leader only)",
            m.plan_nodes.clone(),
        );
        metrics.register(
            "plan_job_duration_seconds",
            "Time from a node entering its upgrade Job's phase to the Job's end, by result",
            m.plan_job_duration.clone(),
        );
        metrics.register(
            "plan_failures",
            "Nodes whose drain or upgrade Job failed and stopped their Plan",
            m.plan_failures.clone(),
        );
        let nodes = m.plan_nodes.clone();
        metrics.leader_only(move || nodes.clear());
        m
    }

    /// Sets a Plan's node counts (every state, zeros included).
    pub fn set_plan_nodes(&self, namespace: &str, plan: &str, counts: impl Fn(PlanNodeState) -> usize) {
        for state in PlanNodeState::ALL {
            let labels = PlanNodeLabels {
                plan_namespace: namespace.into(),
                plan: plan.into(),
                state,
            };
            self.plan_nodes
                .get_or_create(&labels)
                .set(i64::try_from(counts(state)).unwrap_or(i64::MAX));
        }
    }

    /// A deleted Plan: its series go.
    pub fn forget_plan(&self, namespace: &str, plan: &str) {
        for state in PlanNodeState::ALL {
            self.plan_nodes.remove(&PlanNodeLabels {
                plan_namespace: namespace.into(),
                plan: plan.into(),
                state,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The label enums export the text dashboards and alerts match on.
    #[test]
    fn plan_figures_export_their_text() {
        let metrics = Metrics::new();
        let m = PlanMetrics::register(&metrics);
        m.set_plan_nodes("ns", "p", |s| {
            PlanNodeState::ALL.iter().position(|x| *x == s).unwrap_or(0)
        });
        m.plan_job_duration
            .get_or_create(&JobResultLabels {
                result: JobResult::Failed,
            })
            .observe(2.0);
        m.plan_failures
            .get_or_create(&PlanFailureLabels {
                plan_namespace: "ns".into(),
                plan: "p".into(),
                reason: PlanFailure::DrainFailed,
            })
            .inc();
        let text = metrics.encode();
        for line in [
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="upgraded"} 0"#,
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="due"} 1"#,
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="applying"} 2"#,
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="failed"} 3"#,
            r#"nodewarden_plan_job_duration_seconds_count{result="failed"} 1"#,
            r#"nodewarden_plan_failures_total{plan_namespace="ns",plan="p",reason="DrainFailed"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        metrics.forget_leader_state();
        assert!(!metrics.encode().contains("nodewarden_plan_nodes{"));
    }
}
