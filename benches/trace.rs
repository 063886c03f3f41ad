//! What W3C trace context costs a request when no spans are exported (no
//! `telemetry.otlp_endpoint`): joining the client's `traceparent` and stamping the backend's
//! headers, or starting a trace (which then goes to no backend). Every HTTP and gRPC request pays it. Run:
//! `cargo bench --bench trace`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use infergate::internals::{Carried, RequestTrace, TRACEPARENT};
use std::hint::black_box;

fn start_and_stamp(c: &mut Criterion) {
    let mut group = c.benchmark_group("trace");
    group.throughput(Throughput::Elements(1));
    let client =
        HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    for (name, traceparent) in [("joined", Some(client.as_bytes())), ("started", None)] {
        group.bench_function(name, |b| {
            let mut headers = HeaderMap::new();
            let carried = Carried {
                traceparent: traceparent.is_some(),
                tracestate: false,
            };
            if carried.traceparent {
                headers.insert(&TRACEPARENT, client.clone());
            }
            b.iter(|| {
                let trace = RequestTrace::start(black_box(traceparent), true);
                trace.stamp(&mut headers, carried);
                black_box(trace.trace_id());
            })
        });
    }
    group.finish();
}

criterion_group!(benches, start_and_stamp);
criterion_main!(benches);
