//! Request traces: generated (log-normal sizes, Zipf popularity that drifts, bursts) or read
//! from CSV files, and written back to them so a generated trace can be replayed elsewhere.
//!
//! Trace file: `time_ms,model`, one request a line, an optional header, `#` comments.
//! Sizes file: `model,bytes`, where bytes may be spelt like the config (`256MiB`). A model the
//! sizes file does not name gets the default size.

use infergate::internals::ByteSize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Duration;

/// One request: when it arrives and which model it asks for (an index into `Trace::names`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Milliseconds since the start of the trace.
    pub at_ms: u64,
    /// Model index.
    pub model: u32,
}

/// A replayable workload: the models, their true sizes, and the requests in time order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Model names, by index.
    pub names: Vec<String>,
    /// Bytes each model takes once loaded, by index.
    pub sizes: Vec<u64>,
    /// Requests sorted by arrival time.
    pub requests: Vec<Request>,
}

/// The knobs of the generated workload.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Number of models.
    pub models: usize,
    /// Number of requests (bursts included).
    pub requests: usize,
    /// Seed; the same seed gives the same trace.
    pub seed: u64,
    /// Mean arrival rate of the steady (Poisson) stream, requests per second.
    pub rate: f64,
    /// Median model size (the log-normal's e^μ).
    pub size_median: u64,
    /// The log-normal's σ.
    pub size_sigma: f64,
    /// Sizes are clamped to at least this...
    pub size_min: u64,
    /// ...and at most this.
    pub size_max: u64,
    /// Zipf exponent of popularity by rank.
    pub zipf: f64,
    /// Popularity drift: ranks rotated per hour. Each step every model moves one rank down
    /// and the coldest one becomes the hottest (a newly deployed model taking off).
    pub drift_per_hour: f64,
    /// Mean time between bursts (exponential); zero turns bursts off.
    pub burst_every: Duration,
    /// Requests in one burst, all for one model picked uniformly (usually a cold one).
    pub burst_size: usize,
    /// A burst's requests are spread uniformly over this long.
    pub burst_length: Duration,
    /// One more model, `hot`, of this size, takes `hot_share` of the steady stream (no drift:
    /// a large model that stays popular). Off at share 0.
    pub hot_size: u64,
    /// Share of the steady stream that goes to `hot` (0 to 1).
    pub hot_share: f64,
    /// A scan (a batch job touching every model once, in random order, at `scan_rate` a
    /// second) starts this often; zero turns scans off.
    pub scan_every: Duration,
    /// Requests per second of a scan.
    pub scan_rate: f64,
}

/// A small, fast, seedable generator: xoshiro256++ seeded through SplitMix64 (the same
/// generator as `rand`'s `SmallRng` on 64-bit targets), kept here so the trace depends on
/// nothing but the seed.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator for this seed.
    pub fn new(seed: u64) -> Self {
        let mut state = seed;
        let mut splitmix = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [splitmix(), splitmix(), splitmix(), splitmix()],
        }
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Exponential with this mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// Generates the workload. Deterministic in `w.seed`: sizes, the popularity order, the steady
/// stream and the bursts each draw from their own generator, so changing one knob (say the
/// burst rate) leaves the others' draws alone.
pub fn generate(w: &Workload) -> Trace {
    assert!(
        w.models > 0 && w.rate > 0.0,
        "models and rate must be positive"
    );
    let n = w.models;
    let width = (n - 1).max(1).to_string().len();
    let mut names: Vec<String> = (0..n).map(|i| format!("m{i:0width$}")).collect();
    let mut sizes = model_sizes(w);
    let hot = (w.hot_share > 0.0).then(|| {
        names.push("hot".into());
        sizes.push(w.hot_size);
        n as u32
    });
    let (mut requests, end) = steady_stream(w, hot);
    // Bursts and scans on top, over the same span; the merged stream is cut back to
    // `requests`.
    let scanned = add_scans(w, end, &mut requests);
    let burst = add_bursts(w, end, &mut requests);
    if scanned || burst {
        requests.sort_by_key(|r| r.at_ms);
        requests.truncate(w.requests);
    }
    Trace {
        names,
        sizes,
        requests,
    }
}

/// Sizes: log-normal around the median, clamped, rounded to whole MiB.
fn model_sizes(w: &Workload) -> Vec<u64> {
    let mut rng = Rng::new(w.seed ^ 0x5153_4553);
    (0..w.models)
        .map(|_| {
            let bytes = w.size_median as f64 * (w.size_sigma * rng.normal()).exp();
            let bytes = bytes.clamp(w.size_min as f64, w.size_max as f64) as u64;
            (bytes >> 20).max(1) << 20
        })
        .collect()
}

/// Popularity: rank r has weight 1/(r+1)^s; which model holds a rank is a random
/// permutation, so popularity is independent of size and of the model's name. Returns the
/// permutation and the cumulative weights.
fn popularity(w: &Workload) -> (Vec<u32>, Vec<f64>) {
    let n = w.models;
    let mut rng = Rng::new(w.seed ^ 0x504F_5055);
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut cdf = Vec::with_capacity(n);
    let mut total = 0.0;
    for r in 0..n {
        total += 1.0 / ((r + 1) as f64).powf(w.zipf);
        cdf.push(total);
    }
    (order, cdf)
}

/// The steady stream: Poisson arrivals, each for a Zipf-drawn rank mapped through the
/// drifting permutation (or the hot model, for its share). Returns it and its last second.
fn steady_stream(w: &Workload, hot: Option<u32>) -> (Vec<Request>, f64) {
    let n = w.models;
    let (order, cdf) = popularity(w);
    let total = cdf.last().copied().unwrap_or(0.0);
    let mut rng = Rng::new(w.seed ^ 0x5354_4541);
    let mut hot_rng = Rng::new(w.seed ^ 0x484F_5421);
    let mut requests = Vec::with_capacity(w.requests + w.burst_size);
    let mut t = 0.0f64;
    for _ in 0..w.requests {
        t += rng.exponential(1.0 / w.rate);
        let u = rng.unit() * total;
        let rank = cdf.partition_point(|&c| c <= u).min(n - 1);
        let shift = ((t / 3600.0) * w.drift_per_hour) as usize % n;
        let mut model = order[(rank + n - shift) % n];
        if let Some(hot) = hot
            && hot_rng.unit() < w.hot_share
        {
            model = hot;
        }
        requests.push(Request {
            at_ms: (t * 1000.0) as u64,
            model,
        });
    }
    (requests, t)
}

/// Scans: every `scan_every`, each model once in a random order at `scan_rate`. Returns
/// whether any were asked for.
fn add_scans(w: &Workload, end: f64, requests: &mut Vec<Request>) -> bool {
    if w.scan_every.is_zero() || w.scan_rate <= 0.0 {
        return false;
    }
    let n = w.models;
    let mut rng = Rng::new(w.seed ^ 0x5343_414E);
    let mut at = w.scan_every.as_secs_f64();
    while at < end {
        let mut models: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            models.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (i, model) in models.into_iter().enumerate() {
            requests.push(Request {
                at_ms: ((at + i as f64 / w.scan_rate) * 1000.0) as u64,
                model,
            });
        }
        at += w.scan_every.as_secs_f64();
    }
    true
}

/// Bursts: `burst_size` requests for one random model within `burst_length`, arriving every
/// `burst_every` on average. Returns whether any were asked for.
fn add_bursts(w: &Workload, end: f64, requests: &mut Vec<Request>) -> bool {
    if w.burst_every.is_zero() || w.burst_size == 0 {
        return false;
    }
    let mut rng = Rng::new(w.seed ^ 0x4255_5253);
    let mut at = rng.exponential(w.burst_every.as_secs_f64());
    while at < end {
        let model = rng.below(w.models as u64) as u32;
        for _ in 0..w.burst_size {
            let offset = rng.unit() * w.burst_length.as_secs_f64();
            requests.push(Request {
                at_ms: ((at + offset) * 1000.0) as u64,
                model,
            });
        }
        at += rng.exponential(w.burst_every.as_secs_f64());
    }
    true
}

/// Reads a trace (`time_ms,model`) and optionally a sizes file (`model,bytes`); models
/// without a size get `default_size`. Requests are sorted by time (stably).
pub fn parse(trace: &str, sizes: Option<&str>, default_size: u64) -> Result<Trace, String> {
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut id = |name: &str, names: &mut Vec<String>| -> u32 {
        if let Some(&id) = ids.get(name) {
            return id;
        }
        let id = names.len() as u32;
        names.push(name.to_string());
        ids.insert(name.to_string(), id);
        id
    };
    let mut known_sizes: Vec<(u32, u64)> = Vec::new();
    if let Some(sizes) = sizes {
        for (i, (number, line)) in data_lines(sizes).enumerate() {
            let (name, bytes) = two_fields(line)
                .ok_or_else(|| format!("sizes line {number}: expected `model,bytes`"))?;
            let bytes = match ByteSize::parse(bytes) {
                Ok(size) => size.bytes(),
                Err(_) if i == 0 => continue, // a header
                Err(error) => return Err(format!("sizes line {number}: {error}")),
            };
            known_sizes.push((id(name, &mut names), bytes));
        }
    }
    let mut requests = Vec::new();
    for (i, (number, line)) in data_lines(trace).enumerate() {
        let (at, name) = two_fields(line)
            .ok_or_else(|| format!("trace line {number}: expected `time_ms,model`"))?;
        let at_ms = match at.parse::<u64>() {
            Ok(at) => at,
            Err(_) if i == 0 => continue, // a header
            Err(_) => return Err(format!("trace line {number}: bad time {at:?}")),
        };
        if name.is_empty() {
            return Err(format!("trace line {number}: empty model name"));
        }
        requests.push(Request {
            at_ms,
            model: id(name, &mut names),
        });
    }
    requests.sort_by_key(|r| r.at_ms);
    let mut sizes = vec![default_size; names.len()];
    for (id, bytes) in known_sizes {
        sizes[id as usize] = bytes;
    }
    Ok(Trace {
        names,
        sizes,
        requests,
    })
}

/// The trace as CSV text: (`time_ms,model`, `model,bytes`).
pub fn to_csv(trace: &Trace) -> (String, String) {
    let mut requests = String::with_capacity(trace.requests.len() * 16);
    requests.push_str("time_ms,model\n");
    for r in &trace.requests {
        let _ = writeln!(requests, "{},{}", r.at_ms, trace.names[r.model as usize]);
    }
    let mut sizes = String::with_capacity(trace.names.len() * 24);
    sizes.push_str("model,bytes\n");
    for (name, bytes) in trace.names.iter().zip(&trace.sizes) {
        let _ = writeln!(sizes, "{name},{bytes}");
    }
    (requests, sizes)
}

/// Non-empty, non-comment lines with their 1-based line numbers.
fn data_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
}

fn two_fields(line: &str) -> Option<(&str, &str)> {
    let (a, b) = line.split_once(',')?;
    Some((a.trim(), b.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(seed: u64) -> Workload {
        Workload {
            models: 500,
            requests: 20_000,
            seed,
            rate: 20.0,
            size_median: 256 << 20,
            size_sigma: 1.0,
            size_min: 16 << 20,
            size_max: 8 << 30,
            zipf: 1.0,
            drift_per_hour: 100.0,
            burst_every: Duration::from_secs(60),
            burst_size: 50,
            burst_length: Duration::from_secs(10),
            hot_size: 0,
            hot_share: 0.0,
            scan_every: Duration::ZERO,
            scan_rate: 50.0,
        }
    }

    #[test]
    fn generation_is_determined_by_the_seed() {
        let a = generate(&workload(7));
        assert_eq!(a, generate(&workload(7)));
        assert_ne!(a.requests, generate(&workload(8)).requests);
        assert_eq!(a.requests.len(), 20_000);
        assert_eq!(a.names.len(), 500);
        assert!(a.requests.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(
            a.sizes
                .iter()
                .all(|&s| (16 << 20..=8 << 30).contains(&s) && s % (1 << 20) == 0)
        );
        // Zipf: the hottest model gets far more than an even share (1/500).
        let mut counts = vec![0usize; 500];
        for r in &a.requests {
            counts[r.model as usize] += 1;
        }
        assert!(*counts.iter().max().unwrap() > 20_000 / 50);
    }

    #[test]
    fn a_hot_model_and_scans_come_on_top_of_the_stream() {
        let plain = generate(&workload(5));
        let hot = generate(&Workload {
            hot_size: 4 << 30,
            hot_share: 0.25,
            ..workload(5)
        });
        assert_eq!(hot.names.last().map(String::as_str), Some("hot"));
        assert_eq!(hot.sizes.last(), Some(&(4 << 30)));
        let share = hot.requests.iter().filter(|r| r.model == 500).count() as f64 / 20_000.0;
        assert!((0.2..0.3).contains(&share), "{share}");
        assert_eq!(plain.names.len(), 500, "no hot model unless asked for");
        // A scan every 5 minutes of the ~17 minutes the stream lasts: each touches every
        // model once, 50 a second.
        let scanned = generate(&Workload {
            scan_every: Duration::from_secs(300),
            burst_every: Duration::ZERO,
            ..workload(5)
        });
        assert_eq!(scanned.requests.len(), 20_000);
        let first_scan: Vec<u32> = scanned
            .requests
            .iter()
            .filter(|r| (300_000..310_000).contains(&r.at_ms))
            .map(|r| r.model)
            .collect();
        let distinct: std::collections::HashSet<_> = first_scan.iter().collect();
        assert!(distinct.len() >= 490, "{}", distinct.len());
    }

    #[test]
    fn csv_round_trip() {
        let trace = generate(&Workload {
            requests: 1000,
            ..workload(3)
        });
        let (requests, sizes) = to_csv(&trace);
        let back = parse(&requests, Some(&sizes), 1).unwrap();
        // Names are numbered in order of first appearance when read back, so compare by name.
        assert_eq!(back.requests.len(), trace.requests.len());
        for (a, b) in trace.requests.iter().zip(&back.requests) {
            assert_eq!(a.at_ms, b.at_ms);
            assert_eq!(trace.names[a.model as usize], back.names[b.model as usize]);
            assert_eq!(trace.sizes[a.model as usize], back.sizes[b.model as usize]);
        }
    }

    #[test]
    fn parse_reports_bad_lines_and_accepts_size_spellings() {
        let trace = parse("time_ms,model\n# comment\n5,b\n0,a\n", Some("a,1MiB\n"), 7).unwrap();
        assert_eq!(trace.names, ["a", "b"]);
        assert_eq!(trace.sizes, [1 << 20, 7]);
        assert_eq!(trace.requests[0], Request { at_ms: 0, model: 0 });
        assert!(parse("0,a\nx,b\n", None, 1).unwrap_err().contains("line 2"));
        assert!(parse("0\n", None, 1).is_err());
    }
}
