//! What a replacement phase span costs: with no OTEL_* endpoint set (the
//! default: nothing is built) and with export configured (the span is built
//! and handed to the batch processor; the endpoint here discards nothing
//! because nothing listens, so the figure is nodewarden's side only).

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use nodewarden::telemetry::trace::{self, SpanRecord, TraceParent};

fn phase(tp: &TraceParent) {
    let now = SystemTime::now();
    trace::emit_phase(
        tp,
        SpanRecord::new("drain", now - Duration::from_secs(3), now)
            .attr("k8s.node.name", "worker-00017")
            .attr("nodewarden.pods.total", 12i64),
    );
}

fn emit(c: &mut Criterion) {
    let tp = TraceParent::new_root();
    c.bench_function("phase span, export not configured", |b| {
        b.iter(|| phase(black_box(&tp)))
    });
    // SAFETY: single-threaded here; nothing else reads the environment yet.
    unsafe {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9");
        std::env::set_var("OTEL_BSP_MAX_QUEUE_SIZE", "1000000");
    }
    trace::init("bench").expect("an exporter");
    c.bench_function("phase span, export configured", |b| {
        b.iter(|| phase(black_box(&tp)))
    });
    c.bench_function("traceparent parse + format", |b| {
        let header = tp.header();
        b.iter(|| TraceParent::parse(black_box(&header)).map(|t| t.header()))
    });
}

criterion_group!(benches, emit);
criterion_main!(benches);
