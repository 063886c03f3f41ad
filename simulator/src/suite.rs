//! `--suite`: the named traces a policy change is judged on, replayed in one run, and one
//! table over all of them. Each named trace changes one thing of the base workload (the
//! command line's other options, the defaults unless given), so a row's difference from
//! `default` is that one thing's doing; `serverless` replays a CSV file instead.

use super::engine::{Outcome, Placer, run};
use super::policies::{Baseline, Real, Rule};
use super::{Args, REAL_ROWS, setup_of, trace_of};
use infergate::internals::ByteSize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The named traces, in the table's order, with what each changes.
pub const NAMED: [(&str, &str); 6] = [
    ("default", "the base workload (seed 1 unless --seed)"),
    ("seed-2", "--seed 2: another draw of the same workload"),
    (
        "drift-1000",
        "--drift 1000: popularity moves ten times faster",
    ),
    ("capacity-8GiB", "--capacity 8GiB: half the memory"),
    ("zipf-0.8", "--zipf 0.8: flatter popularity"),
    (
        "serverless",
        "traces/serverless.csv: a replayed CSV (synthetic, serverless-shaped: traces/serverless.py)",
    ),
];

/// The base arguments changed as the named trace says; `None` for an unknown name.
pub fn named_args(base: &Args, name: &str) -> Option<Args> {
    let mut args = base.clone();
    match name {
        "default" => {}
        "seed-2" => args.seed = 2,
        "drift-1000" => args.drift = 1000.0,
        "capacity-8GiB" => args.capacity = ByteSize::parse("8GiB").ok()?,
        "zipf-0.8" => args.zipf = 0.8,
        "serverless" => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces");
            args.trace = Some(dir.join("serverless.csv"));
            args.sizes = Some(dir.join("serverless.sizes.csv"));
            // Its 2,000 models hold about 1 TiB; 8 backends of 16 GiB hold a tenth of it,
            // as the generated traces' pool holds 7.6% of theirs.
            args.backends = 8;
        }
        _ => return None,
    }
    Some(args)
}

/// One replay of the suite.
#[derive(Clone, Debug)]
pub struct SuiteRow {
    /// The named trace.
    pub trace: &'static str,
    /// The policy (a `REAL_ROWS` name, or "Belady").
    pub policy: &'static str,
    /// What it did.
    pub outcome: Outcome,
    /// Wall time of the replay.
    pub wall: Duration,
}

/// The policy names `--policies` takes, with their rows.
const POLICIES: [(&str, &str); 8] = [
    ("lru", "infergate, lru"),
    ("lfu", "infergate, lfu"),
    ("gdsf", "infergate, gdsf"),
    ("tinylfu", "infergate, tinylfu"),
    ("belady-guarded", "Belady, churn guard"),
    ("belady-size-guarded", "Belady × size, churn guard"),
    ("belady-refusing", "Belady × size, churn guard, refusing"),
    ("belady", "Belady"),
];

/// The oracles' rows, with their rules.
const ORACLES: [(&str, Rule); 4] = [
    ("Belady, churn guard", Rule::BeladyGuarded),
    ("Belady × size, churn guard", Rule::BeladySizeGuarded),
    ("Belady × size, churn guard, refusing", Rule::BeladyRefusing),
    ("Belady", Rule::Belady),
];

/// Replays the named traces `traces` (all when empty) under the policies named in
/// `policies` (all when empty; Belady always), on `jobs` threads (0: one per core). Rows
/// come back in the order of `NAMED`, then `POLICIES`.
pub fn suite_rows(
    base: &Args,
    traces: &[String],
    policies: &[String],
    jobs: usize,
) -> anyhow::Result<Vec<SuiteRow>> {
    let mut chosen = Vec::new();
    for (name, _) in NAMED {
        if traces.is_empty() || traces.iter().any(|t| t == name) {
            chosen.push(name);
        }
    }
    for t in traces {
        anyhow::ensure!(
            NAMED.iter().any(|(name, _)| name == t),
            "unknown trace {t:?}"
        );
    }
    for p in policies {
        anyhow::ensure!(
            POLICIES.iter().any(|(name, _)| name == p),
            "unknown policy {p:?}"
        );
    }
    let rows: Vec<&'static str> = POLICIES
        .iter()
        .filter(|(name, _)| {
            let named = policies.iter().any(|p| p == name);
            // The refusing oracle breaks the rules (and takes longest): only when named.
            *name == "belady" || named || (policies.is_empty() && *name != "belady-refusing")
        })
        .map(|(_, row)| *row)
        .collect();
    // Traces first (each a fraction of a second), then every (trace, policy) replay as one
    // job, taken by whichever thread is free.
    let mut built = Vec::new();
    for &name in &chosen {
        let args = named_args(base, name).expect("a named trace");
        built.push((name, trace_of(&args)?, setup_of(&args)));
    }
    let work: Vec<(usize, &'static str)> = (0..built.len())
        .flat_map(|t| rows.iter().map(move |&p| (t, p)))
        .collect();
    let jobs = if jobs == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        jobs
    };
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(work.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(t, policy)) = work.get(i) else {
                        break;
                    };
                    let (name, trace, setup) = &built[t];
                    let started = Instant::now();
                    let mut placer: Box<dyn Placer> =
                        match REAL_ROWS.iter().find(|(row, _)| *row == policy) {
                            Some((_, eviction)) => Box::new(Real::new(trace, setup, *eviction)),
                            None => {
                                let (_, rule) = ORACLES
                                    .iter()
                                    .find(|(row, _)| *row == policy)
                                    .expect("every row is a real policy or an oracle");
                                Box::new(Baseline::new(*rule, trace, setup))
                            }
                        };
                    let outcome = run(placer.as_mut(), trace, setup);
                    let row = SuiteRow {
                        trace: name,
                        policy,
                        outcome,
                        wall: started.elapsed(),
                    };
                    done.lock().expect("no replay panics").push((i, row));
                }
            });
        }
    });
    let mut done = done.into_inner().expect("no replay panics");
    done.sort_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, row)| row).collect())
}

/// `--suite`: replays, prints the table and how long it all took.
pub fn run_suite(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let rows = suite_rows(args, &args.traces, &args.policies, args.jobs)?;
    print!("{}", suite_table(&rows));
    println!(
        "\n{} replays in {:.1}s of wall time",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The table: one row per (trace, policy), with the hit ratio as a share of Belady's on
/// the same trace, bytes loaded and load seconds; then, per trace, the best real policy.
pub fn suite_table(rows: &[SuiteRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| trace | policy | hit ratio | of Belady | of guarded | refused | loaded | load time | wall |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for row in rows {
        let o = &row.outcome;
        let share = |yardstick: &str| {
            rows.iter()
                .find(|r| r.trace == row.trace && r.policy == yardstick)
                .map(|r| r.outcome.hit_ratio())
                .filter(|&ratio| ratio > 0.0)
                .map_or("—".into(), |ratio| {
                    format!("{:.1}%", 100.0 * o.hit_ratio() / ratio)
                })
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.2}% | {} | {} | {:.2}% | {} | {:.1} h | {:.1}s |",
            row.trace,
            row.policy.trim_start_matches("infergate, "),
            100.0 * o.hit_ratio(),
            share("Belady"),
            share("Belady, churn guard"),
            100.0 * o.refusals() as f64 / o.requests.max(1) as f64,
            super::human(o.bytes_loaded),
            o.load_seconds() / 3600.0,
            row.wall.as_secs_f64(),
        );
    }
    out
}
