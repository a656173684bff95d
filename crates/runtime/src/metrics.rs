//! What the runtime reports, as small traits with no-op defaults (client-go's
//! workqueue/metrics.go `MetricsProvider`). The application plugs in its
//! Prometheus registry; the runtime imports nothing of it.

use std::sync::Arc;
use std::time::Duration;

use super::error::Category;
use super::reflector::ReflectorStats;

/// One work queue's figures. Called under the queue's lock: keep it cheap
/// (atomics), never block.
pub trait QueueMetrics: Send + Sync {
    /// Keys ready to be handed out now.
    fn depth(&self, _depth: usize) {}
    /// A key newly made ready (not a duplicate of a waiting one).
    fn added(&self) {}
    /// How long a key waited from add to being handed out.
    fn waited(&self, _queued_for: Duration) {}
    /// How long a key was processed (from hand-out to done).
    fn worked(&self, _took: Duration) {}
    /// A rate-limited re-add (a failure).
    fn retried(&self) {}
}

/// Everything the controllers of a [`super::manager::Manager`] report.
pub trait RuntimeMetrics: Send + Sync {
    /// The figures of the queue named `name`; None records nothing.
    fn queue(&self, _name: &str) -> Option<Arc<dyn QueueMetrics>> {
        None
    }

    /// A reconcile of `controller` ended (whatever its result) after
    /// `took`; `span` is its tracing span (for trace exemplars).
    fn reconciled(&self, _controller: &str, _took: Duration, _span: &tracing::Span) {}

    /// A reconcile of `controller` failed with an error of `category`
    /// (panics and timeouts included).
    fn failed(&self, _controller: &str, _category: Category) {}

    /// This replica started (true) or stopped (false) leading.
    fn leading(&self, _leading: bool) {}

    /// A reflector of `resource` (its plural) selecting `selector` was
    /// made; its counters are read at each scrape.
    fn reflector(&self, _resource: &str, _selector: &str, _stats: Arc<ReflectorStats>) {}
}

/// Records nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMetrics;

impl RuntimeMetrics for NoMetrics {}
