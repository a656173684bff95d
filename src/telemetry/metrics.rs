//! The process's Prometheus metrics, registered once at start-up and served
//! at `/metrics` in OpenMetrics text.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

use crate::runtime::error::Category;
use crate::runtime::metrics::{QueueMetrics, RuntimeMetrics};
use crate::runtime::reflector::ReflectorStats;
use crate::runtime::sync::lock;

/// Implements `EncodeLabelValue` with the type's `as_str`. The derive would
/// export each variant's Rust name (`UpToDate`, `KubeApi`), not the label
/// text dashboards and alerts already use (`up_to_date`, `KubeApiError`).
macro_rules! label_value_from_as_str {
    ($($label:ty),* $(,)?) => {$(
        impl EncodeLabelValue for $label {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}

// A reconcile error's Category (the runtime's, also the Event reason) and a
// cloud error's kind are labelled by their text: neither the runtime nor
// cloud/ needs prometheus_client, and telemetry imports neither's types.
label_value_from_as_str!(NodeState, DrainResult, PlanNodeState, JobResult, PlanFailure,);

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

/// How a drain ended, the `result` label of `drain_duration_seconds`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DrainResult {
    /// Every pod to evict is gone.
    Succeeded,
    /// The maintenance ended any other way.
    Failed,
}

impl DrainResult {
    /// The label text: `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainResult::Succeeded => "succeeded",
            DrainResult::Failed => "failed",
        }
    }
}

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

/// Label set of `sip_hosts`: the SIPCluster, a role and a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SipHostLabels {
    /// The SIPCluster's namespace (not `namespace`: scrapes add that label for the pod's).
    pub cluster_namespace: String,
    /// The SIPCluster's name.
    pub cluster: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
    /// `active`, `standby`, or `wanted` (active + standby asked for).
    pub state: String,
}

/// Label set of `sip_host_replacements`: the SIPCluster and the role.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SipRoleLabels {
    /// The SIPCluster's namespace.
    pub cluster_namespace: String,
    /// The SIPCluster's name.
    pub cluster: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
}

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

/// Label set of the reconcile metrics: the controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller's name.
    pub controller: String,
}

/// Label set of `reconcile_errors`: the controller and the error's category.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller's name.
    pub controller: String,
    /// The error's category, also the Event reason ([`Category::as_str`]).
    pub category: &'static str,
}

/// An exemplar's labels: the trace of the observed reconcile.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabels {
    /// The trace id, in hex.
    pub trace_id: String,
}

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

/// Label set of `drain_duration_seconds`: how the drain ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// How the drain ended.
    pub result: DrainResult,
}

/// Label set of every queue metric: the queue's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The queue's name (its controller's).
    pub name: String,
}

/// A family of histograms made with one bucket layout.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// client-go's work-queue metrics, one series per queue name.
#[derive(Clone, Debug)]
pub struct QueueFamilies {
    depth: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    queue_duration: HistogramFamily<QueueLabels>,
    work_duration: HistogramFamily<QueueLabels>,
    retries: Family<QueueLabels, Counter>,
}

/// client-go's buckets: 10 ns to 10 s, factor 10.
fn queue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

impl QueueFamilies {
    fn register(registry: &mut Registry) -> Self {
        let m = QueueFamilies {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(queue_histogram),
            work_duration: Family::new_with_constructor(queue_histogram),
            retries: Family::default(),
        };
        registry.register(
            "workqueue_depth",
            "Current depth of the work queue",
            m.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Keys newly made ready by the work queue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "Time a key waits in the work queue before it is handed out",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "Time from handing a key out to its done",
            m.work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Rate-limited re-adds handled by the work queue",
            m.retries.clone(),
        );
        m
    }

    /// Resolves the series of one queue once, so the queue's hot paths touch
    /// plain atomics instead of the family's label map.
    pub fn bind(&self, name: &str) -> Arc<dyn QueueMetrics> {
        let labels = QueueLabels {
            name: name.to_owned(),
        };
        Arc::new(BoundQueue {
            depth: self.depth.get_or_create_owned(&labels),
            adds: self.adds.get_or_create_owned(&labels),
            queue_duration: self.queue_duration.get_or_create_owned(&labels),
            work_duration: self.work_duration.get_or_create_owned(&labels),
            retries: self.retries.get_or_create_owned(&labels),
        })
    }
}

/// One queue's series.
struct BoundQueue {
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
}

impl QueueMetrics for BoundQueue {
    fn depth(&self, depth: usize) {
        self.depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
    }
    fn added(&self) {
        self.adds.inc();
    }
    fn waited(&self, queued_for: std::time::Duration) {
        self.queue_duration.observe(queued_for.as_secs_f64());
    }
    fn worked(&self, took: std::time::Duration) {
        self.work_duration.observe(took.as_secs_f64());
    }
    fn retried(&self) {
        self.retries.inc();
    }
}
type ExemplarHistogramFamily<L> =
    Family<L, HistogramWithExemplars<TraceLabels>, fn() -> HistogramWithExemplars<TraceLabels>>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn reconcile_histogram() -> HistogramWithExemplars<TraceLabels> {
    // 1 ms .. ~65 s
    HistogramWithExemplars::new(exponential_buckets(0.001, 2.0, 17))
}

fn job_histogram() -> Histogram {
    // 1 s .. ~2.3 h
    Histogram::new(exponential_buckets(1.0, 2.0, 14))
}

fn drain_histogram() -> Histogram {
    // 1 s .. ~1.1 h
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

/// Every metric nodewarden exports. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    /// Behind a lock: the parts of nodewarden register their own families
    /// as they start (see [`Metrics::register`]).
    registry: Arc<Mutex<Registry>>,
    /// Work-queue figures, one series per queue.
    pub queue: QueueFamilies,
    /// Reconciles run, by controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconciles that failed, by controller and error category.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Exemplars carry the reconcile span's trace id (when traces are exported).
    pub reconcile_duration: ExemplarHistogramFamily<ControllerLabels>,
    /// 1 while this replica leads, else 0.
    pub leader: Gauge,
    /// Nodes of each NodeVersion by state (set by the leader).
    pub nodes: Family<NodeStateLabels, Gauge>,
    /// Up-to-date nodes / all nodes, per NodeVersion.
    pub rollout_progress: Family<NodeVersionLabels, FloatGauge>,
    /// Unix time of the rollout's last step or count change.
    pub rollout_last_progress: Family<NodeVersionLabels, FloatGauge>,
    /// Node replacements finished (the old node deleted).
    pub replacements: Family<NodeVersionLabels, Counter>,
    /// From the NodeMaintenance's creation to its drain's end.
    pub drain_duration: HistogramFamily<ResultLabels>,
    /// Drains in progress.
    pub drains_running: Gauge,
    /// Drains with at least one pod a PodDisruptionBudget keeps.
    pub drains_blocked: Gauge,
    /// Selected nodes of each Plan by state (set by the leader).
    pub plan_nodes: Family<PlanNodeLabels, Gauge>,
    /// Upgrade Jobs from their node entering the job phase to the Job's end.
    pub plan_job_duration: HistogramFamily<JobResultLabels>,
    /// Nodes that stopped a Plan, by Plan and reason.
    pub plan_failures: Family<PlanFailureLabels, Counter>,
    /// Hosts of each SIPCluster by role and state (set by the leader).
    pub sip_hosts: Family<SipHostLabels, Gauge>,
    /// Failed active hosts replaced, by SIPCluster and role.
    pub sip_host_replacements: Family<SipRoleLabels, Counter>,
    /// Every reflector's counters, read at each scrape.
    reflectors: Reflectors,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric, registered under the `nodewarden_` prefix, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodewarden");
        // The text lists families in registration order: keep it stable.
        let queue = QueueFamilies::register(&mut registry);
        let metrics = Metrics::unregistered(queue);
        metrics.register_reconcile(&mut registry);
        metrics.register_rollout(&mut registry);
        metrics.register_drain(&mut registry);
        metrics.register_plan(&mut registry);
        metrics.register_sip(&mut registry);
        registry.register_collector(Box::new(metrics.reflectors.clone()));
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            ..metrics
        }
    }

    /// The families, all empty, with an empty registry: `new` registers
    /// them, then puts its registry in.
    fn unregistered(queue: QueueFamilies) -> Self {
        Metrics {
            registry: Arc::default(),
            queue,
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_histogram),
            leader: Gauge::default(),
            nodes: Family::default(),
            rollout_progress: Family::default(),
            rollout_last_progress: Family::default(),
            replacements: Family::default(),
            drain_duration: Family::new_with_constructor(drain_histogram),
            drains_running: Gauge::default(),
            drains_blocked: Gauge::default(),
            plan_nodes: Family::default(),
            plan_job_duration: Family::new_with_constructor(job_histogram),
            plan_failures: Family::default(),
            sip_hosts: Family::default(),
            sip_host_replacements: Family::default(),
            reflectors: Reflectors::default(),
        }
    }

    /// Reconciles and leadership.
    fn register_reconcile(&self, registry: &mut Registry) {
        registry.register(
            "reconciles",
            "Reconciles run, by controller",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and error category",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile, by controller",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
    }

    /// NodeVersion rollouts.
    fn register_rollout(&self, registry: &mut Registry) {
        registry.register(
            "nodes",
            "Nodes of each NodeVersion by state: up_to_date, outdated, replacing (leader only)",
            self.nodes.clone(),
        );
        registry.register(
            "rollout_progress_ratio",
            "Share of a NodeVersion's nodes that are up to date (leader only)",
            self.rollout_progress.clone(),
        );
        registry.register(
            "rollout_last_progress_timestamp_seconds",
            "Unix time a NodeVersion's rollout last took a step or changed its counts (leader only)",
            self.rollout_last_progress.clone(),
        );
        registry.register(
            "replacements",
            "Node replacements finished: the outdated node and its instance deleted",
            self.replacements.clone(),
        );
    }

    /// NodeMaintenance drains.
    fn register_drain(&self, registry: &mut Registry) {
        registry.register(
            "drain_duration_seconds",
            "Time from a NodeMaintenance's creation to the end of its drain, by result",
            self.drain_duration.clone(),
        );
        registry.register(
            "drains_running",
            "Drains in progress",
            self.drains_running.clone(),
        );
        registry.register(
            "drains_blocked",
            "Drains with a pod whose eviction a PodDisruptionBudget refuses",
            self.drains_blocked.clone(),
        );
    }

    /// In-place upgrade Plans.
    fn register_plan(&self, registry: &mut Registry) {
        registry.register(
            "plan_nodes",
            "Selected nodes of each Plan by state: upgraded, due, applying, failed (leader only)",
            self.plan_nodes.clone(),
        );
        registry.register(
            "plan_job_duration_seconds",
            "Time from a node entering its upgrade Job's phase to the Job's end, by result",
            self.plan_job_duration.clone(),
        );
        registry.register(
            "plan_failures",
            "Nodes whose drain or upgrade Job failed and stopped their Plan",
            self.plan_failures.clone(),
        );
    }

    /// SIPCluster hosts.
    fn register_sip(&self, registry: &mut Registry) {
        registry.register(
            "sip_hosts",
            "Hosts of each SIPCluster by role and state: active, standby, wanted (leader only)",
            self.sip_hosts.clone(),
        );
        registry.register(
            "sip_host_replacements",
            "Failed active hosts of a SIPCluster replaced (by a standby or a free host)",
            self.sip_host_replacements.clone(),
        );
    }

    /// Registers a family that a part of nodewarden keeps itself (a
    /// controller's or the cloud's own figures), under the `nodewarden_`
    /// prefix. Each part registers its families once, as it starts.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        lock(&self.registry).register(name, help, metric);
    }

    /// Sets a SIPCluster's host counts of one role.
    pub fn set_sip_hosts(&self, namespace: &str, cluster: &str, role: &str, counts: [(&str, usize); 3]) {
        for (state, n) in counts {
            let labels = SipHostLabels {
                cluster_namespace: namespace.into(),
                cluster: cluster.into(),
                role: role.into(),
                state: state.into(),
            };
            self.sip_hosts
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A deleted SIPCluster: its series go.
    pub fn forget_sip(&self, namespace: &str, cluster: &str) {
        for role in crate::api::sip::ROLES {
            for state in ["active", "standby", "wanted"] {
                self.sip_hosts.remove(&SipHostLabels {
                    cluster_namespace: namespace.into(),
                    cluster: cluster.into(),
                    role: role.into(),
                    state: state.into(),
                });
            }
        }
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

    /// Leadership lost: the gauges only a leader keeps current go, so no
    /// dashboard or alert reads a former leader's last values.
    pub fn forget_leader_state(&self) {
        self.nodes.clear();
        self.rollout_progress.clear();
        self.rollout_last_progress.clear();
        self.plan_nodes.clear();
        self.sip_hosts.clear();
        self.drains_running.set(0);
        self.drains_blocked.set(0);
    }

    /// The metrics in OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &lock(&self.registry));
        out
    }
}

impl RuntimeMetrics for Metrics {
    fn queue(&self, name: &str) -> Option<Arc<dyn QueueMetrics>> {
        Some(self.queue.bind(name))
    }

    fn reconciled(&self, controller: &str, took: std::time::Duration, span: &tracing::Span) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        let exemplar = span
            .in_scope(super::trace::current_trace_id)
            .map(|trace_id| TraceLabels { trace_id });
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64(), exemplar, None);
    }

    fn failed(&self, controller: &str, category: Category) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_owned(),
                category: category.as_str(),
            })
            .inc();
    }

    fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    fn reflector(&self, resource: &str, selector: &str, stats: Arc<ReflectorStats>) {
        let labels = ReflectorLabels {
            resource: resource.to_owned(),
            selector: selector.to_owned(),
        };
        self.reflectors
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((labels, stats));
    }
}

/// Label set of the reflector counters: which resource, selected how.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReflectorLabels {
    /// The resource's plural (`nodes`, `pods`, ...).
    pub resource: String,
    /// `labels:<selector> fields:<selector>`, empty when it watches them all.
    pub selector: String,
}

/// The reflectors' own counters, encoded as counters at each scrape: they
/// stay plain atomics on the reflector's hot path.
#[derive(Clone, Debug, Default)]
struct Reflectors(Arc<std::sync::Mutex<Vec<RegisteredReflector>>>);

/// One reflector's labels and its counters.
type RegisteredReflector = (ReflectorLabels, Arc<ReflectorStats>);

impl Collector for Reflectors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        type Read = fn(&ReflectorStats) -> &AtomicU64;
        const COUNTERS: [(&str, &str, Read); 5] = [
            (
                "reflector_lists",
                "Complete lists by a reflector: its first, then one per relist",
                |s| &s.lists,
            ),
            (
                "reflector_watches",
                "Watches a reflector opened (a restart from the last resourceVersion costs no list)",
                |s| &s.watches,
            ),
            (
                "reflector_expired",
                "410 Gone answers to a reflector (each forces a relist)",
                |s| &s.expired,
            ),
            (
                "reflector_failures",
                "Failed list or watch attempts of a reflector (each backs off)",
                |s| &s.failures,
            ),
            (
                "reflector_stalls",
                "Silent watches and unanswered requests a reflector gave up on",
                |s| &s.stalls,
            ),
        ];
        let reflectors = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (name, help, read) in COUNTERS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, stats) in &reflectors {
                let value = read(stats).load(std::sync::atomic::Ordering::Relaxed);
                ConstCounter::new(value).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflector_counters_are_read_at_each_scrape() {
        let m = Metrics::new();
        let stats = Arc::new(ReflectorStats::default());
        m.reflector("nodes", "", stats.clone());
        m.reflector(
            "pods",
            "fields:spec.nodeName=n",
            Arc::new(ReflectorStats::default()),
        );
        stats.lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        stats.watches.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        let text = m.encode();
        for line in [
            r#"nodewarden_reflector_lists_total{resource="nodes",selector=""} 1"#,
            r#"nodewarden_reflector_watches_total{resource="nodes",selector=""} 3"#,
            r#"nodewarden_reflector_expired_total{resource="pods",selector="fields:spec.nodeName=n"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        stats.lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(
            m.encode()
                .contains(r#"nodewarden_reflector_lists_total{resource="nodes",selector=""} 2"#)
        );
    }

    #[test]
    fn a_former_leader_exports_no_rollout_state() {
        let m = Metrics::new();
        let nv = NodeVersionLabels {
            nodeversion: "v".into(),
        };
        m.rollout_progress.get_or_create(&nv).set(0.5);
        m.nodes
            .get_or_create(&NodeStateLabels {
                nodeversion: "v".into(),
                state: NodeState::Outdated,
            })
            .set(3);
        m.drains_blocked.set(1);
        m.set_plan_nodes("ns", "p", |_| 1);
        assert!(
            m.encode()
                .contains("nodewarden_rollout_progress_ratio{nodeversion=\"v\"} 0.5")
        );
        m.forget_leader_state();
        let text = m.encode();
        assert!(!text.contains("nodewarden_rollout_progress_ratio{"), "{text}");
        assert!(!text.contains("nodewarden_nodes{"), "{text}");
        assert!(!text.contains("nodewarden_plan_nodes{"), "{text}");
        assert!(text.contains("nodewarden_drains_blocked 0"), "{text}");
    }

    /// The label enums export the text the former `String` labels had
    /// (dashboards, alerts and tests match on it).
    #[test]
    fn label_enums_export_their_text() {
        let m = Metrics::new();
        for state in NodeState::ALL {
            m.nodes
                .get_or_create(&NodeStateLabels {
                    nodeversion: "v".into(),
                    state,
                })
                .set(1);
        }
        for result in [DrainResult::Succeeded, DrainResult::Failed] {
            m.drain_duration
                .get_or_create(&ResultLabels { result })
                .observe(1.0);
        }
        m.failed("c", Category::KubeApi);
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
        let text = m.encode();
        for line in [
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="upgraded"} 0"#,
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="due"} 1"#,
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="applying"} 2"#,
            r#"nodewarden_plan_nodes{plan_namespace="ns",plan="p",state="failed"} 3"#,
            r#"nodewarden_plan_job_duration_seconds_count{result="failed"} 1"#,
            r#"nodewarden_plan_failures_total{plan_namespace="ns",plan="p",reason="DrainFailed"} 1"#,
            r#"nodewarden_nodes{nodeversion="v",state="up_to_date"} 1"#,
            r#"nodewarden_nodes{nodeversion="v",state="outdated"} 1"#,
            r#"nodewarden_nodes{nodeversion="v",state="replacing"} 1"#,
            r#"nodewarden_drain_duration_seconds_count{result="succeeded"} 1"#,
            r#"nodewarden_drain_duration_seconds_count{result="failed"} 1"#,
            r#"nodewarden_reconcile_errors_total{controller="c",category="KubeApiError"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }

    #[test]
    fn queues_report_one_series_each() {
        let m = Metrics::new();
        let nodes = m.queue.bind("nodes");
        let other = m.queue.bind("other");
        nodes.added();
        nodes.added();
        nodes.depth(1);
        other.depth(1);
        nodes.retried();
        nodes.waited(std::time::Duration::from_millis(1));
        nodes.worked(std::time::Duration::from_millis(1));
        let text = m.encode();
        for line in [
            r#"nodewarden_workqueue_depth{name="nodes"} 1"#,
            r#"nodewarden_workqueue_depth{name="other"} 1"#,
            r#"nodewarden_workqueue_adds_total{name="nodes"} 2"#,
            r#"nodewarden_workqueue_retries_total{name="nodes"} 1"#,
            r#"nodewarden_workqueue_queue_duration_seconds_count{name="nodes"} 1"#,
            r#"nodewarden_workqueue_work_duration_seconds_count{name="nodes"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }
}
