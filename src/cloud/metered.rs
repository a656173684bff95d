//! A provider wrapper that meters every call, for any [`CloudProvider`]:
//! it measures latency by operation and failures by kind, and rations calls
//! through one client-side rate limit shared by every controller. A cloud
//! that throttles with a Retry-After pauses every call until then, so an
//! outage or throttling is never answered with more calls.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::decorator::Decorator;
use super::{CloudError, CloudFuture, CloudProvider, InstanceState, states_one_by_one};
use crate::runtime::rate_limiter::TokenBucket;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::decorator::CloudOperation;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::HistogramFamily;

/// The default ration of cloud calls: 10 a second, bursts of 20.
pub const DEFAULT_QPS: f64 = 10.0;
/// See [`DEFAULT_QPS`].
pub const DEFAULT_BURST: u32 = 20;

/// How many cloud calls a second every controller shares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ration {
    /// Calls a second, on average.
    pub qps: f64,
    /// Calls at once after a quiet spell.
    pub burst: u32,
}

impl Default for Ration {
    fn default() -> Self {
        Ration {
            qps: DEFAULT_QPS,
            burst: DEFAULT_BURST,
        }
    }
}

impl Ration {
    /// A ration of `qps` calls a second, bursts of `burst`; None unless
    /// both are positive (and finite).
    pub fn new(qps: f64, burst: u32) -> Option<Ration> {
        (qps.is_finite() && qps > 0.0 && burst > 0).then_some(Ration { qps, burst })
    }
}

/// Label set of `cloud_request_duration_seconds`: which provider, which call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloudLabels {
    /// The cloud provider's name.
    pub provider: String,
    /// The provider call.
    pub operation: CloudOperation,
}

/// Label set of `cloud_errors`: which provider, which call, which kind of failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloudErrorLabels {
    /// The cloud provider's name.
    pub provider: String,
    /// The provider call.
    pub operation: CloudOperation,
    /// The cloud error's kind (`CloudErrorKind::as_str`).
    pub category: &'static str,
}

/// The figures of the cloud calls: latency by operation, failures by kind.
#[derive(Clone)]
pub struct CloudMetrics {
    duration: HistogramFamily<CloudLabels>,
    errors: Family<CloudErrorLabels, Counter>,
}

impl CloudMetrics {
    /// The families, registered with `metrics` (once per process).
    pub fn register(metrics: &Metrics) -> Self {
        let duration: HistogramFamily<CloudLabels> = Family::new_with_constructor(|| {
            // 5 ms .. ~80 s
            Histogram::new(exponential_buckets(0.005, 2.0, 15))
        });
        let errors = Family::default();
        metrics.register(
            "cloud_request_duration_seconds",
            "Latency of cloud provider calls, by provider and operation",
            duration.clone(),
        );
        metrics.register(
            "cloud_errors",
            "Failed cloud provider calls, by provider, operation and error category",
            errors.clone(),
        );
        CloudMetrics { duration, errors }
    }

    /// The latency series of one provider call (made at zero if new).
    pub fn duration(&self, labels: &CloudLabels) -> Histogram {
        self.duration.get_or_create_owned(labels)
    }

    /// The failure count of one provider call and kind (made at zero if new).
    pub fn errors(&self, labels: &CloudErrorLabels) -> Counter {
        self.errors.get_or_create_owned(labels)
    }
}

/// Measures and rations the calls to a provider (see the module docs).
pub struct MeteredCloud {
    inner: Arc<dyn CloudProvider>,
    metrics: CloudMetrics,
    bucket: TokenBucket,
    /// No call before this: the cloud asked us to wait.
    paused_until: Mutex<Option<Instant>>,
}

impl MeteredCloud {
    /// Meters `inner` at [`DEFAULT_QPS`].
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: CloudMetrics) -> Self {
        Self::rationed(inner, metrics, Ration::default())
    }

    /// Meters `inner` at `ration`.
    pub fn rationed(inner: Arc<dyn CloudProvider>, metrics: CloudMetrics, ration: Ration) -> Self {
        MeteredCloud {
            inner,
            metrics,
            bucket: TokenBucket::new(ration.qps, ration.burst),
            paused_until: Mutex::new(None),
        }
    }

    /// How long the next call must wait: for a token, and for a pause the
    /// cloud asked for.
    fn wait_before_call(&self, now: Instant) -> Duration {
        let paused = self
            .paused_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        self.bucket.reserve_at(now).max(paused)
    }

    fn pause(&self, until: Instant) {
        let mut paused = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        if paused.is_none_or(|p| p < until) {
            *paused = Some(until);
        }
    }

    fn measure<'a, T: Send + 'a>(
        &'a self,
        operation: CloudOperation,
        call: CloudFuture<'a, T>,
    ) -> CloudFuture<'a, T> {
        Box::pin(async move {
            let wait = self.wait_before_call(Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let started = Instant::now();
            let result = call.await;
            if let Err(e) = &result
                && let Some(after) = e.retry_after()
            {
                self.pause(Instant::now() + after);
            }
            let provider = self.inner.name().to_string();
            self.metrics
                .duration(&CloudLabels {
                    provider: provider.clone(),
                    operation,
                })
                .observe(started.elapsed().as_secs_f64());
            if let Err(e) = &result {
                self.record_error(provider, operation, e);
            }
            result
        })
    }

    fn record_error(&self, provider: String, operation: CloudOperation, error: &CloudError) {
        self.metrics
            .errors(&CloudErrorLabels {
                provider,
                operation,
                category: error.kind().as_str(),
            })
            .inc();
    }
}

impl Decorator for MeteredCloud {
    fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: CloudOperation,
        call: impl Fn() -> CloudFuture<'a, T> + Send + 'a,
    ) -> CloudFuture<'a, T> {
        self.measure(operation, call())
    }

    fn states<'a>(&'a self, provider_ids: &'a [String]) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
        if self.inner.states_per_call() <= 1 {
            // One call to the cloud per ID: each is metered and rationed.
            return states_one_by_one(self, provider_ids);
        }
        self.measure(CloudOperation::NodeStates, self.inner.node_states(provider_ids))
    }
}

#[cfg(test)]
mod tests {
    use super::{CloudErrorLabels, CloudMetrics, CloudOperation, Metrics, Ration};

    #[test]
    fn cloud_failures_are_labelled_by_call_and_kind() {
        let metrics = Metrics::new();
        let cloud = CloudMetrics::register(&metrics);
        cloud
            .errors(&CloudErrorLabels {
                provider: "p".into(),
                operation: CloudOperation::SetGroupImage,
                category: "invalid_provider_id",
            })
            .inc();
        let text = metrics.encode();
        let line = r#"nodewarden_cloud_errors_total{provider="p",operation="set_group_image",category="invalid_provider_id"} 1"#;
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }

    #[test]
    fn a_ration_must_let_calls_through() {
        let cases = [
            (10.0, 20, true),
            (0.5, 1, true),
            (0.0, 20, false),
            (-1.0, 20, false),
            (10.0, 0, false),
            (f64::NAN, 20, false),
            (f64::INFINITY, 20, false),
        ];
        for (qps, burst, valid) in cases {
            assert_eq!(
                Ration::new(qps, burst).is_some(),
                valid,
                "{qps} qps, bursts of {burst}"
            );
        }
    }
}
