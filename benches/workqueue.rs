//! Work queue and rate limiter throughput.
//!
//! One element is one full add + get + done cycle for the queue benches, and
//! one `when` call for the limiter benches.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nodewarden::runtime::rate_limiter::{ItemExponential, RateLimiter, TokenBucket, default_rate_limiter};
use nodewarden::runtime::workqueue::WorkQueue;

/// Cycles per measured batch.
const BATCH: u64 = 10_240;
const PRODUCERS: u64 = 4;
const WORKERS: u64 = 8;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// One task doing add, get, done back to back: the uncontended cost.
fn single(c: &mut Criterion) {
    let rt = current_thread();
    let mut g = c.benchmark_group("workqueue");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("add_get_done/single_task", |b| {
        let q: WorkQueue<u64> = WorkQueue::with_defaults("bench");
        b.iter(|| {
            rt.block_on(async {
                for i in 0..BATCH {
                    q.add(i % 1024);
                    let k = q.get().await.expect("open");
                    q.done(black_box(&k));
                }
            })
        });
    });
    g.bench_function("add_get_done/batched_1024", |b| {
        let q: WorkQueue<u64> = WorkQueue::with_defaults("bench");
        b.iter(|| {
            rt.block_on(async {
                for chunk in 0..BATCH / 1024 {
                    for i in 0..1024 {
                        q.add(chunk * 1024 + i);
                    }
                    for _ in 0..1024 {
                        let k = q.get().await.expect("open");
                        q.done(&k);
                    }
                }
            })
        });
    });
    g.finish();
}

/// Producers and workers on a multi-thread runtime fighting for the lock;
/// keys are unique so every add is handed out exactly once.
fn contended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("workqueue");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("add_get_done/4_producers_8_workers", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let q: WorkQueue<u64> = WorkQueue::with_defaults("bench");
                let per_producer = iters * BATCH / PRODUCERS;
                let start = Instant::now();
                let workers: Vec<_> = (0..WORKERS)
                    .map(|_| {
                        let q = q.clone();
                        tokio::spawn(async move {
                            let mut n = 0u64;
                            while let Some(k) = q.get().await {
                                q.done(&k);
                                n += 1;
                            }
                            n
                        })
                    })
                    .collect();
                let producers: Vec<_> = (0..PRODUCERS)
                    .map(|p| {
                        let q = q.clone();
                        tokio::spawn(async move {
                            for i in 0..per_producer {
                                q.add(p * per_producer + i);
                                if i % 256 == 0 {
                                    tokio::task::yield_now().await;
                                }
                            }
                        })
                    })
                    .collect();
                for p in producers {
                    p.await.expect("producer");
                }
                q.shut_down_with_drain().await;
                let mut handled = 0;
                for w in workers {
                    handled += w.await.expect("worker");
                }
                let elapsed = start.elapsed();
                assert_eq!(handled, per_producer * PRODUCERS);
                elapsed
            })
        });
    });
    g.finish();
}

fn limiters(c: &mut Criterion) {
    const N: u64 = 1024;
    let mut g = c.benchmark_group("rate_limiter");
    g.throughput(Throughput::Elements(N));
    g.bench_function("item_exponential/when", |b| {
        let l = ItemExponential::<u64>::default();
        b.iter(|| {
            for k in 0..N {
                black_box(l.when(&k));
            }
        });
    });
    g.bench_function("token_bucket/when", |b| {
        let l = TokenBucket::default();
        b.iter(|| {
            for k in 0..N {
                black_box(RateLimiter::<u64>::when(&l, &k));
            }
        });
    });
    g.bench_function("default_max_of/when", |b| {
        let l = default_rate_limiter::<u64>();
        b.iter(|| {
            for k in 0..N {
                black_box(l.when(&k));
            }
        });
    });
    g.finish();
}

fn config() -> Criterion {
    // Short runs: the machine is shared and small.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = single, contended, limiters
}
criterion_main!(benches);
