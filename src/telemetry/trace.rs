//! OpenTelemetry traces.
//!
//! Two kinds of spans leave nodewarden:
//!
//! - one span per reconcile, from the `tracing` crate through
//!   tracing-opentelemetry (their trace ids are the exemplars of the
//!   reconcile histogram);
//! - the long-lived traces of node replacements and rollouts. These outlive
//!   any one reconcile and any one replica, so their context travels on the
//!   Kubernetes objects as a W3C `traceparent` annotation, and each phase span
//!   is emitted, with explicit start and end times, by whichever replica sees
//!   the phase end. A replacement a new leader finishes stays in its trace.
//!
//! Span ids of phases are derived from the trace id and the phase name, so a
//! phase emitted again after a crash is the same span, not a second one.
//!
//! Export is configured by the standard `OTEL_*` variables. Without
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) nothing is
//! installed: the global tracer is the no-op one and no span is even built.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracer, SdkTracerProvider};

/// The replacement's (or rollout's) root span, on every object that carries it.
pub const TRACEPARENT_ANNOTATION: &str = "nodewarden.dev/traceparent";
/// When the traced work began (RFC 3339), the root span's start.
pub const TRACE_STARTED_ANNOTATION: &str = "nodewarden.dev/trace-started";
/// On a replacement's objects: the rollout it belongs to (a span link).
pub const ROLLOUT_TRACEPARENT_ANNOTATION: &str = "nodewarden.dev/rollout-traceparent";

/// The root span of a replacement.
pub const REPLACE_NODE: &str = "replace node";
/// The root span of a new node that ended up replacing nobody (the target
/// moved on before it was paired); it is drained and removed.
pub const SURPLUS_NODE: &str = "surplus node";
/// The root span of a rollout.
pub const ROLLOUT: &str = "rollout";
/// A span of a rollout's trace: the rollout halted on failed joins.
pub const ROLLOUT_HALTED: &str = "rollout halted";
/// A span of a rollout's trace: a wave, from its start to when it finished.
pub const ROLLOUT_WAVE: &str = "rollout wave";
/// A span of a rollout's trace: the soak after a wave.
pub const WAVE_SOAK: &str = "wave soak";
/// A span of a rollout's trace: a failure domain's replacements.
pub const ROLLOUT_DOMAIN: &str = "rollout domain";

const TRACER_NAME: &str = "nodewarden";

/// A W3C trace context: the trace and the span new spans hang under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: TraceId,
    /// The span new spans hang under (the trace's root span).
    pub span_id: SpanId,
}

impl TraceParent {
    /// A fresh trace: random trace id and root span id.
    pub fn new_root() -> Self {
        let ids = RandomIdGenerator::default();
        TraceParent {
            trace_id: ids.new_trace_id(),
            span_id: ids.new_span_id(),
        }
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>`; anything else is None.
    pub fn parse(header: &str) -> Option<Self> {
        let mut parts = header.trim().split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || version != "00" || flags.len() != 2 {
            return None;
        }
        if trace.len() != 32 || span.len() != 16 {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        (trace_id != TraceId::INVALID && span_id != SpanId::INVALID)
            .then_some(TraceParent { trace_id, span_id })
    }

    /// The `traceparent` header value (always sampled: these traces are few
    /// and each one matters).
    pub fn header(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }

    fn span_context(&self) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            self.span_id,
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )
    }

    /// The id of this trace's span for `phase`: the same on every replica.
    pub fn phase_span_id(&self, phase: &str) -> SpanId {
        // FNV-1a over the trace id and the phase name.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.trace_id.to_bytes().iter().chain(phase.as_bytes()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        SpanId::from_bytes(hash.max(1).to_be_bytes())
    }
}

/// A finished span to emit: its phase, times and what it did.
#[derive(Debug, Default)]
pub struct SpanRecord {
    /// The span's name: the phase (it also derives the phase's span id).
    pub name: &'static str,
    /// When the phase began; None: when the span is emitted.
    pub start: Option<SystemTime>,
    /// When the phase ended; None: when the span is emitted.
    pub end: Option<SystemTime>,
    /// The span's attributes.
    pub attributes: Vec<KeyValue>,
    /// Timed events within the span (e.g. a drain's evictions).
    pub events: Vec<Event>,
    /// Other traces this span is linked to (a replacement to its rollout).
    pub links: Vec<TraceParent>,
    /// Set when the phase failed.
    pub error: Option<String>,
}

impl SpanRecord {
    /// A span named `name` from `start` to `end`, with nothing else yet.
    pub fn new(name: &'static str, start: SystemTime, end: SystemTime) -> Self {
        SpanRecord {
            name,
            start: Some(start),
            end: Some(end),
            ..Default::default()
        }
    }

    /// Adds the attribute `key` = `value`.
    pub fn attr(mut self, key: &'static str, value: impl Into<opentelemetry::Value>) -> Self {
        self.attributes.push(KeyValue::new(key, value));
        self
    }

    /// Links the span to `to`, if there is one.
    pub fn link(mut self, to: Option<TraceParent>) -> Self {
        self.links.extend(to);
        self
    }
}

/// Emits the root span of `trace` itself (its id is the traceparent's span id).
pub fn emit_root(trace: &TraceParent, record: SpanRecord) {
    PRESET.with(|p| p.set(Some((trace.trace_id, trace.span_id))));
    emit(record, &Context::new());
    PRESET.with(|p| p.set(None));
}

/// Emits a child of the root span of `trace`, with the phase's stable id.
pub fn emit_phase(trace: &TraceParent, record: SpanRecord) {
    PRESET.with(|p| p.set(Some((trace.trace_id, trace.phase_span_id(record.name)))));
    let parent = Context::new().with_remote_span_context(trace.span_context());
    emit(record, &parent);
    PRESET.with(|p| p.set(None));
}

/// As [`emit_phase`], for a phase that recurs in one trace (a rollout's
/// waves): `key` tells them apart and derives the span id.
pub fn emit_recurring_phase(trace: &TraceParent, key: &str, record: SpanRecord) {
    PRESET.with(|p| {
        p.set(Some((
            trace.trace_id,
            trace.phase_span_id(&format!("{} {key}", record.name)),
        )))
    });
    let parent = Context::new().with_remote_span_context(trace.span_context());
    emit(record, &parent);
    PRESET.with(|p| p.set(None));
}

fn emit(record: SpanRecord, parent: &Context) {
    if !enabled() {
        return;
    }
    let tracer = opentelemetry::global::tracer(TRACER_NAME);
    let mut builder = tracer
        .span_builder(record.name)
        .with_kind(SpanKind::Internal)
        .with_attributes(record.attributes)
        .with_events(record.events)
        .with_links(
            record
                .links
                .iter()
                .map(|l| Link::with_context(l.span_context()))
                .collect(),
        );
    if let Some(start) = record.start {
        builder = builder.with_start_time(start);
    }
    let span = tracer.build_with_context(builder, parent);
    let cx = parent.with_span(span);
    let span = cx.span();
    if let Some(e) = record.error {
        span.set_status(Status::error(e));
    }
    match record.end {
        Some(end) => span.end_with_timestamp(end),
        None => span.end(),
    }
}

thread_local! {
    /// Ids the next span built on this thread must have (building a span is
    /// synchronous, so setting and consuming happen in one call).
    static PRESET: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Random ids, except where [`emit_root`] or [`emit_phase`] preset them.
#[derive(Debug, Default)]
struct PresetIds(RandomIdGenerator);

impl IdGenerator for PresetIds {
    fn new_trace_id(&self) -> TraceId {
        match PRESET.with(Cell::get) {
            Some((trace, _)) => trace,
            None => self.0.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> SpanId {
        match PRESET.with(Cell::get) {
            Some((_, span)) => span,
            None => self.0.new_span_id(),
        }
    }
}

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether spans are exported at all.
pub fn enabled() -> bool {
    PROVIDER.get().is_some()
}

/// Whether the environment asks for trace export.
pub fn export_requested(env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| env(k).is_some_and(|v| !v.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The OTLP exporter could not be built from the environment's settings.
#[derive(Debug, thiserror::Error)]
#[error("configuring the OTLP trace exporter: {0}")]
pub struct TraceInitError(String);

/// Installs the OTLP exporter when the environment asks for one and returns
/// the tracer for the `tracing` bridge; None when nothing is exported.
/// `instance` names this replica (`service.instance.id`).
pub fn init(instance: &str) -> Result<Option<SdkTracer>, TraceInitError> {
    if !export_requested(|k| std::env::var(k).ok()) {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| TraceInitError(e.to_string()))?;
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES still apply on top.
    let resource = Resource::builder()
        .with_service_name(std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "nodewarden".into()))
        .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_id_generator(PresetIds::default())
        .with_resource(resource)
        .build();
    let tracer = provider.tracer(TRACER_NAME);
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = PROVIDER.set(provider);
    Ok(Some(tracer))
}

/// Hands buffered spans to the exporter and waits (at most `timeout`). Called
/// after a root span, so a replica killed right after finishing a
/// replacement has already sent its trace.
///
/// While the collector is failing (the last flush failed or timed out), the
/// flush runs in the background instead: spans cannot reach a collector that
/// is down however long a reconcile waits, and a rollout must not slow to the
/// exporter's pace. The first flush that succeeds makes flushes wait again.
pub async fn flush(timeout: Duration) {
    let Some(provider) = PROVIDER.get() else {
        return;
    };
    if !COLLECTOR_FAILING.load(Ordering::Relaxed) {
        let _ = background_flush(provider.clone(), timeout).await;
    } else if !FLUSHING.swap(true, Ordering::Relaxed) {
        // One probe of a failing collector at a time.
        let probe = background_flush(provider.clone(), timeout);
        tokio::spawn(async move {
            let _ = probe.await;
            FLUSHING.store(false, Ordering::Relaxed);
        });
    }
}

/// Set while flushes fail: see [`flush`].
static COLLECTOR_FAILING: AtomicBool = AtomicBool::new(false);
/// A background flush of a failing collector is running.
static FLUSHING: AtomicBool = AtomicBool::new(false);

/// Starts a flush bounded by `timeout` and records whether it worked.
fn background_flush(provider: SdkTracerProvider, timeout: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let flushing = tokio::task::spawn_blocking(move || provider.force_flush());
        let failed = match tokio::time::timeout(timeout, flushing).await {
            Ok(Ok(Ok(()))) => false,
            Ok(Ok(Err(e))) => {
                tracing::debug!(error = %e, "flushing spans failed");
                true
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "flushing spans failed");
                true
            }
            Err(_) => {
                tracing::debug!(?timeout, "flushing spans timed out");
                true
            }
        };
        if COLLECTOR_FAILING.swap(failed, Ordering::Relaxed) != failed {
            if failed {
                tracing::warn!("the trace collector is failing: reconciles no longer wait for span exports");
            } else {
                tracing::info!("the trace collector answers again");
            }
        }
    })
}

/// Flushes and stops the exporter (graceful shutdown).
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown()
    {
        tracing::debug!(error = %e, "stopping the trace exporter");
    }
}

/// The trace id of the current `tracing` span, when it is exported.
pub fn current_trace_id() -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if !enabled() {
        return None;
    }
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Reads the trace annotations of an object.
pub fn from_annotations(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<(TraceParent, Option<SystemTime>)> {
    let a = annotations?;
    let parent = TraceParent::parse(a.get(TRACEPARENT_ANNOTATION)?)?;
    let started = a.get(TRACE_STARTED_ANNOTATION).and_then(|s| parse_time(s));
    Some((parent, started))
}

/// The rollout a replacement belongs to, from its annotations.
pub fn rollout_of(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Option<TraceParent> {
    TraceParent::parse(annotations?.get(ROLLOUT_TRACEPARENT_ANNOTATION)?)
}

/// `t` in RFC 3339, as the trace-started annotation holds it (empty when `t`
/// is out of range).
pub fn format_time(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Reads an RFC 3339 time (the trace-started annotation); None when malformed.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_rejects_malformed_values() {
        let tp = TraceParent::new_root();
        assert_eq!(TraceParent::parse(&tp.header()), Some(tp));
        for bad in [
            "",
            "00-abc-def-01",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319x-b7ad6b7169203331-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        let known = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        assert_eq!(known.trace_id.to_string(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(known.span_id.to_string(), "b7ad6b7169203331");
    }

    #[test]
    fn phase_span_ids_are_stable_and_distinct() {
        let tp = TraceParent::new_root();
        let same = TraceParent::parse(&tp.header()).unwrap();
        assert_eq!(tp.phase_span_id("drain"), same.phase_span_id("drain"));
        assert_ne!(tp.phase_span_id("drain"), tp.phase_span_id("delete node"));
        assert_ne!(
            tp.phase_span_id("drain"),
            TraceParent::new_root().phase_span_id("drain")
        );
        assert_ne!(tp.phase_span_id("drain"), tp.span_id);
    }

    #[test]
    fn export_follows_the_standard_variables() {
        let table: &[(&[(&str, &str)], bool)] = &[
            (&[], false),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")], true),
            (
                &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")],
                true,
            ),
            (&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], false),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_SDK_DISABLED", "true"),
                ],
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_TRACES_EXPORTER", "none"),
                ],
                false,
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_TRACES_EXPORTER", "otlp"),
                ],
                true,
            ),
        ];
        for (vars, want) in table {
            let lookup = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
            assert_eq!(export_requested(lookup), *want, "{vars:?}");
        }
    }

    #[test]
    fn times_round_trip() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_763_700_000_123_456_789);
        assert_eq!(parse_time(&format_time(t)), Some(t));
        assert_eq!(parse_time("yesterday"), None);
    }
}
