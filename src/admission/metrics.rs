//! The webhook's own figures: what it refused, by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::telemetry::Metrics;

/// Why the admission webhook refused a connection or a request, the `reason`
/// label of `webhook_requests_refused`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum WebhookRefusal {
    /// A body over the limit, declared or read (413).
    BodyTooLarge,
    /// A body that is no AdmissionReview, or could not be read (400).
    BadRequest,
    /// A connection past the cap, closed at once.
    TooManyConnections,
    /// A review past the cap of reviews at once (429).
    TooManyRequests,
    /// A connection whose TLS handshake did not finish in time.
    HandshakeTimeout,
    /// A connection that sent no complete request head in time.
    HeaderTimeout,
    /// A body that did not arrive in time (408).
    BodyTimeout,
    /// A review that took longer than the whole request may (503).
    RequestTimeout,
    /// A client that did not read its answer in time.
    WriteTimeout,
}

impl WebhookRefusal {
    /// Every reason, in the order the metric's series are made.
    pub const ALL: [WebhookRefusal; 9] = [
        WebhookRefusal::BodyTooLarge,
        WebhookRefusal::BadRequest,
        WebhookRefusal::TooManyConnections,
        WebhookRefusal::TooManyRequests,
        WebhookRefusal::HandshakeTimeout,
        WebhookRefusal::HeaderTimeout,
        WebhookRefusal::BodyTimeout,
        WebhookRefusal::RequestTimeout,
        WebhookRefusal::WriteTimeout,
    ];

    /// The label text, e.g. `body_too_large`.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookRefusal::BodyTooLarge => "body_too_large",
            WebhookRefusal::BadRequest => "bad_request",
            WebhookRefusal::TooManyConnections => "too_many_connections",
            WebhookRefusal::TooManyRequests => "too_many_requests",
            WebhookRefusal::HandshakeTimeout => "handshake_timeout",
            WebhookRefusal::HeaderTimeout => "header_timeout",
            WebhookRefusal::BodyTimeout => "body_timeout",
            WebhookRefusal::RequestTimeout => "request_timeout",
            WebhookRefusal::WriteTimeout => "write_timeout",
        }
    }
}

/// Label set of `webhook_requests_refused`: why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Why the webhook refused.
    pub reason: WebhookRefusal,
}

crate::telemetry::metrics::label_value_from_as_str!(WebhookRefusal);

/// `webhook_requests_refused`, by reason.
#[derive(Clone)]
pub struct WebhookMetrics {
    refusals: Family<RefusalLabels, Counter>,
}

impl WebhookMetrics {
    /// The family, registered with `metrics` (once per process).
    pub fn register(metrics: &Metrics) -> Self {
        let refusals = Family::default();
        metrics.register(
            "webhook_requests_refused",
            "Connections and requests the admission webhook refused or cut off, by reason",
            refusals.clone(),
        );
        WebhookMetrics { refusals }
    }

    /// Every refusal reason's series, at zero: a replica serving the webhook
    /// exports them from the start, so a rate or an alert sees the first one.
    pub fn serving(&self) {
        for reason in WebhookRefusal::ALL {
            drop(self.refusals.get_or_create(&RefusalLabels { reason }));
        }
    }

    /// Counts one refusal.
    pub fn count(&self, reason: WebhookRefusal) {
        self.refusals.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// The refusals of `reason` so far.
    pub fn refused(&self, reason: WebhookRefusal) -> u64 {
        self.refusals.get_or_create(&RefusalLabels { reason }).get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_webhook_exports_every_reason_from_the_start() {
        let metrics = Metrics::new();
        let webhook = WebhookMetrics::register(&metrics);
        webhook.serving();
        webhook.count(WebhookRefusal::BodyTooLarge);
        let text = metrics.encode();
        for line in [
            r#"nodewarden_webhook_requests_refused_total{reason="body_too_large"} 1"#,
            r#"nodewarden_webhook_requests_refused_total{reason="too_many_connections"} 0"#,
            r#"nodewarden_webhook_requests_refused_total{reason="handshake_timeout"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }
}
