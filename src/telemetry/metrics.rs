//! The process's Prometheus metrics, registered once at start-up and served
//! at `/metrics` in OpenMetrics text.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::runtime::workqueue::QueueMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    /// The error's category (see `error::Category`), also the Event reason.
    pub category: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric nodewarden exports. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub queue: QueueMetrics,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: HistogramFamily<ControllerLabels>,
    /// 1 while this replica leads, else 0.
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodewarden");
        let queue = QueueMetrics::register(&mut registry);
        let reconciles = Family::<ControllerLabels, Counter>::default();
        registry.register("reconciles", "Reconciles run, by controller", reconciles.clone());
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and error category",
            reconcile_errors.clone(),
        );
        let reconcile_duration: HistogramFamily<ControllerLabels> =
            Family::new_with_constructor(reconcile_histogram);
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile, by controller",
            reconcile_duration.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            queue,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            leader,
        }
    }

    /// The metrics in OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
