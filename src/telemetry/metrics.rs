//! The process's Prometheus metrics, registered once at start-up and served
//! at `/metrics` in OpenMetrics text.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
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

/// Label set of every queue metric: the queue's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The queue's name (its controller's).
    pub name: String,
}

/// Implements `EncodeLabelValue` with the type's `as_str`, for the label
/// enums each part of nodewarden defines beside its families. The derive
/// would export each variant's Rust name (`UpToDate`), not the label text
/// dashboards and alerts use (`up_to_date`).
macro_rules! label_value_from_as_str {
    ($($label:ty),* $(,)?) => {$(
        impl prometheus_client::encoding::EncodeLabelValue for $label {
            fn encode(
                &self,
                encoder: &mut prometheus_client::encoding::LabelValueEncoder,
            ) -> std::fmt::Result {
                std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )*};
}
pub(crate) use label_value_from_as_str;

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
/// A gauge of a fractional value.
pub type FloatGauge = Gauge<f64, AtomicU64>;

fn reconcile_histogram() -> HistogramWithExemplars<TraceLabels> {
    // 1 ms .. ~65 s
    HistogramWithExemplars::new(exponential_buckets(0.001, 2.0, 17))
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
    /// Every reflector's counters, read at each scrape.
    reflectors: Reflectors,
    /// What each part clears when leadership is lost.
    leader_only: Arc<Mutex<Vec<ForgetFn>>>,
}

/// Clears a part's leader-only figures.
type ForgetFn = Box<dyn Fn() + Send + Sync>;

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
            reflectors: Reflectors::default(),
            leader_only: Arc::default(),
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

    /// Registers a family that a part of nodewarden keeps itself (a
    /// controller's or the cloud's own figures), under the `nodewarden_`
    /// prefix. Each part registers its families once, as it starts.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        lock(&self.registry).register(name, help, metric);
    }

    /// Leadership lost: the gauges only a leader keeps current go, so no
    /// dashboard or alert reads a former leader's last values.
    pub fn forget_leader_state(&self) {
        for forget in lock(&self.leader_only).iter() {
            forget();
        }
    }

    /// `forget` clears a part's leader-only figures when leadership is
    /// lost (see [`Metrics::forget_leader_state`]).
    pub fn leader_only(&self, forget: impl Fn() + Send + Sync + 'static) {
        lock(&self.leader_only).push(Box::new(forget));
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
    fn reconcile_errors_are_labelled_by_category_text() {
        let m = Metrics::new();
        m.failed("c", Category::KubeApi);
        let line = r#"nodewarden_reconcile_errors_total{controller="c",category="KubeApiError"} 1"#;
        let text = m.encode();
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }

    #[test]
    fn a_former_leader_forgets_what_each_part_asked() {
        let m = Metrics::new();
        let gauge: Gauge = Gauge::default();
        m.register("probe", "A leader-only probe", gauge.clone());
        gauge.set(3);
        let cleared = gauge.clone();
        m.leader_only(move || {
            cleared.set(0);
        });
        assert!(m.encode().contains("nodewarden_probe 3"));
        m.forget_leader_state();
        assert!(m.encode().contains("nodewarden_probe 0"), "{}", m.encode());
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
