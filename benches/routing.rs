//! What the routing decision costs per request (`RouteTable::resolve`), which every model
//! request pays before placement:
//!
//! - `plain`: the model is not a route (one failed lookup: the common case);
//! - `weighted`: a canary route split 90/10, no sticky key (a counter through splitmix64);
//! - `sticky`: the same route, sticky by a header (a rendezvous hash over the targets);
//! - `pinned`: the `infergate-target` header names the target.
//!
//! The table holds 1,000 routes, so lookups are not served from a tiny map. Run:
//! `cargo bench --bench routing`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use infergate::internals::{Caller, Config, ModelRef, PIN_HEADER, RouteTable};
use std::hint::black_box;

const ROUTES: usize = 1_000;

fn table() -> RouteTable {
    let mut text = String::from(
        "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\nhttp = \"http://127.0.0.1:1\"\n",
    );
    for i in 0..ROUTES {
        text.push_str(&format!(
            "[[routes]]\nmodel = \"ranker-{i}\"\nsticky = \"header:x-user-id\"\n\
             targets = [{{ model = \"ranker-{i}-a\", weight = 90 }}, \
             {{ model = \"ranker-{i}-b\", version = \"2\", weight = 10 }}]\n"
        ));
    }
    let config = Config::parse(&text).expect("valid config");
    RouteTable::new(&config.routes, None)
}

type Header = Option<(http::HeaderName, &'static [u8])>;

fn resolve(c: &mut Criterion) {
    let table = table();
    let mut group = c.benchmark_group("routing");
    group.throughput(Throughput::Elements(1));
    let cases: [(&str, &str, Header); 4] = [
        ("plain", "add_sub", None),
        ("weighted", "ranker-500", None),
        (
            "sticky",
            "ranker-500",
            Some((http::HeaderName::from_static("x-user-id"), b"user-4711")),
        ),
        (
            "pinned",
            "ranker-500",
            Some((PIN_HEADER, b"ranker-500-b/2")),
        ),
    ];
    for (name, model, header) in cases {
        group.bench_function(name, |b| {
            b.iter(|| {
                let requested = ModelRef::new(black_box(model), None);
                let routed = table
                    .resolve(
                        requested,
                        |h| header.as_ref().filter(|(n, _)| n == h).map(|(_, v)| *v),
                        &Caller::Open,
                    )
                    .expect("routed");
                black_box(routed)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, resolve);
criterion_main!(benches);
