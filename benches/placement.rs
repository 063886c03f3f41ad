//! What a placement decision costs as the pool grows: the books (`placement::Table`) are read
//! and written under one lock on every model request, so their cost is paid by every request
//! and, under contention, by every other request waiting for the lock.
//!
//! - `hit`: the model is loaded; `decide` answers `Serve` and the request's `release` follows
//!   (what every warm request pays).
//! - `miss_evict`: the pool is full; a model nobody has is requested, so `decide` chooses a
//!   backend and its least recently used victims, and `finish_load` marks the new copy ready
//!   (what a cold request pays before the load itself starts).
//! - `miss_evict_gdsf`: the same under `placement.policy = "gdsf"`, whose victims are ranked
//!   by worth instead of age (a hit costs the same under every policy: ranking happens on
//!   misses).
//!
//! - `hit_tinylfu`: `hit` under `placement.policy = "tinylfu"`, whose warm hits also count
//!   the request in its frequency sketch (one hash of the name, four counters, and now and
//!   then a halving of all of them).
//!
//! Each runs with 100 backends and 1,000, 10,000 and 100,000 models, to show how the cost
//! scales in the number of models. Run: `cargo bench --bench placement`.
//! Later per-request hot paths (routing, JWT, validation) get a file of their own beside this.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use infergate::internals::{
    BackendView, Decision, Estimate, EvictionOrder, EvictionPolicy, ModelRef, Policy, SizeSource,
    Table,
};
use std::hint::black_box;
use std::time::Duration;
use tokio::time::Instant;

const BACKENDS: usize = 100;
const MODEL_BYTES: u64 = 100 << 20;
const POOL_SIZES: [usize; 3] = [1_000, 10_000, 100_000];

fn estimate() -> Estimate {
    Estimate {
        bytes: MODEL_BYTES,
        source: SizeSource::Config,
    }
}

fn view() -> Vec<BackendView> {
    vec![
        BackendView {
            ready: true,
            knows: true,
            in_flight: 0,
            queued: 0,
        };
        BACKENDS
    ]
}

/// A pool whose every backend is exactly full with `models` models of the same size, all
/// loaded at `start` (so every one is old enough to be evicted later), evicting by `order`.
fn full_pool(models: usize, start: Instant, order: EvictionPolicy) -> (Table, Vec<ModelRef>) {
    assert_eq!(models % BACKENDS, 0);
    let usable = vec![(models / BACKENDS) as u64 * MODEL_BYTES; BACKENDS];
    let policy = Policy {
        min_churn_age: Duration::from_secs(60),
        backoff: Duration::from_secs(5),
        backoff_max: Duration::from_secs(300),
    };
    let mut table = Table::new(&usable, policy, start).with_order(EvictionOrder::new(order, start));
    let view = view();
    let names: Vec<ModelRef> = (0..models)
        .map(|i| ModelRef::new(format!("model-{i}"), None))
        .collect();
    for model in &names {
        match table.decide(model, &estimate().into(), &view, false, true, start) {
            Decision::Load(plan) => {
                assert!(plan.evict.is_empty(), "the pool filled up early");
                table.finish_load(plan.backend, &model.name, &Ok(()), start);
            }
            other => panic!("filling the pool: {other:?}"),
        }
    }
    (table, names)
}

fn hit(c: &mut Criterion) {
    hit_under(c, "placement/hit", EvictionPolicy::Lru);
    hit_under(c, "placement/hit_tinylfu", EvictionPolicy::Tinylfu);
}

fn hit_under(c: &mut Criterion, name: &str, order: EvictionPolicy) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    for models in POOL_SIZES {
        let start = Instant::now();
        let (mut table, names) = full_pool(models, start, order);
        let view = view();
        let mut now = start + Duration::from_secs(1);
        // Requests spread over the whole pool (a stride co-prime with the pool size), so
        // lookups are not served from one hot cache line; each ends a microsecond after the
        // last, as real releases do (copies released at one same instant would be ordered by
        // name alone, which no real pool sees).
        let mut i = 0usize;
        group.bench_function(BenchmarkId::from_parameter(models), |b| {
            b.iter(|| {
                i = (i + 7919) % names.len();
                now += Duration::from_micros(1);
                let model = &names[i];
                match table.decide(
                    black_box(model),
                    &estimate().into(),
                    &view,
                    false,
                    true,
                    now,
                ) {
                    Decision::Serve(backend) => table.release(backend, &model.name, now),
                    other => panic!("expected a hit: {other:?}"),
                }
            })
        });
    }
    group.finish();
}

fn miss_evict(c: &mut Criterion) {
    miss_evict_under(c, "placement/miss_evict", EvictionPolicy::Lru);
    miss_evict_under(c, "placement/miss_evict_gdsf", EvictionPolicy::Gdsf);
}

fn miss_evict_under(c: &mut Criterion, name: &str, order: EvictionPolicy) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    // Eviction work grows with the pool; fewer samples keep the 100,000 case short.
    group.sample_size(20);
    for models in POOL_SIZES {
        let start = Instant::now();
        let (mut table, _) = full_pool(models, start, order);
        let view = view();
        // Each cold request comes one second after the last, an hour after the pool filled:
        // the least recently used copies are always past min_churn_age.
        let mut now = start + Duration::from_secs(3600);
        let mut n = 0u64;
        group.bench_function(BenchmarkId::from_parameter(models), |b| {
            b.iter(|| {
                n += 1;
                now += Duration::from_secs(1);
                let model = ModelRef::new(format!("cold-{n}"), None);
                match table.decide(&model, &estimate().into(), &view, false, true, now) {
                    Decision::Load(plan) => {
                        debug_assert_eq!(plan.evict.len(), 1);
                        for victim in &plan.evict {
                            table.departed(plan.backend, &victim.model, now);
                        }
                        table.finish_load(plan.backend, &model.name, &Ok(()), now);
                        black_box(plan.evict);
                    }
                    other => panic!("expected a load with eviction: {other:?}"),
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, hit, miss_evict);
criterion_main!(benches);
