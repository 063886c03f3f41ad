//! Parsers for the human-friendly values the command lines take
//! (`2s`, `500ms`, `1MB`, `10%`, `1,8,32`).
//!
//! They live in one place so that `infergate-load` and `fake-triton` accept
//! exactly the same spellings, and so the spellings are unit-tested once.

use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Parses a duration such as `250us`, `10ms`, `2s`, `1.5s` or `1m`.
///
/// A bare number is taken as seconds, because that is what people type for
/// `--warmup 2` and `--duration 10`.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("invalid duration {text:?}: expected a number followed by us, ms, s or m");
    }
    let value: f64 = num
        .parse()
        .with_context(|| format!("invalid duration {text:?}"))?;
    let seconds = match unit.trim() {
        "us" | "µs" => value / 1e6,
        "ms" => value / 1e3,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        other => bail!("invalid duration unit {other:?} in {text:?}: use us, ms, s or m"),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        bail!("invalid duration {text:?}");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Parses a byte size such as `512`, `64KB`, `1MB`, `1MiB` or `2GB`.
///
/// `KB`/`MB`/`GB` are decimal (1 MB = 1,000,000 bytes) and `KiB`/`MiB`/`GiB`
/// binary, matching how HTTP body limits are usually written in both styles.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!(
            "invalid size {text:?}: expected a number followed by B, KB, MB, GB, KiB, MiB or GiB"
        );
    }
    let value: f64 = num
        .parse()
        .with_context(|| format!("invalid size {text:?}"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => bail!("invalid size unit {other:?} in {text:?}"),
    };
    Ok((value * mult).round() as u64)
}

/// Parses a percentage such as `10%` or `10` into a fraction (`0.10`).
pub fn parse_percent(text: &str) -> Result<f64> {
    let t = text.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    let value: f64 = t
        .parse()
        .with_context(|| format!("invalid percentage {text:?}"))?;
    if !value.is_finite() || value < 0.0 {
        bail!("invalid percentage {text:?}");
    }
    Ok(value / 100.0)
}

/// Parses a comma-separated sweep such as `1,8,32` (concurrency levels or
/// request rates), refusing empty items and zero/negative values.
pub fn parse_list<T>(text: &str) -> Result<Vec<T>>
where
    T: std::str::FromStr + PartialOrd + Default,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let mut out = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            bail!("empty item in list {text:?}");
        }
        let v: T = item
            .parse()
            .with_context(|| format!("invalid value {item:?} in list {text:?}"))?;
        if v <= T::default() {
            bail!("values in {text:?} must be greater than zero");
        }
        out.push(v);
    }
    Ok(out)
}

/// Formats a duration given in microseconds for the terminal table, in
/// milliseconds with three decimals so the columns line up.
pub fn fmt_ms(us: u64) -> String {
    format!("{:.3}", us as f64 / 1000.0)
}

/// Formats a byte count compactly (`1.05 MB`) for the report header.
pub fn fmt_bytes(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} GB", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} MB", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.2} KB", n as f64 / 1e3),
        n => format!("{n} B"),
    }
}

/// Formats a duration for headers and progress lines (`2s`, `500ms`).
pub fn fmt_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".into()
    } else if d.subsec_micros() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_micros() == d.subsec_millis() * 1000 {
        format!("{}ms", d.as_millis())
    } else if d >= Duration::from_secs(1) {
        format!("{:.3}s", d.as_secs_f64())
    } else {
        format!("{}us", d.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0ms").unwrap(), Duration::ZERO);
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
        assert_eq!(parse_size("1mb").unwrap(), 1_000_000);
        assert_eq!(parse_size("64KiB").unwrap(), 65_536);
        assert_eq!(parse_size("1.5KB").unwrap(), 1_500);
        assert_eq!(parse_size("2GiB").unwrap(), 2 * 1024 * 1024 * 1024);
        assert!(parse_size("MB").is_err());
        assert!(parse_size("1XB").is_err());
    }

    #[test]
    fn percents() {
        assert!((parse_percent("10%").unwrap() - 0.10).abs() < 1e-12);
        assert!((parse_percent("2.5").unwrap() - 0.025).abs() < 1e-12);
        assert!(parse_percent("-1%").is_err());
        assert!(parse_percent("x").is_err());
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list::<usize>("1,8,32").unwrap(), vec![1, 8, 32]);
        assert_eq!(parse_list::<usize>(" 4 ").unwrap(), vec![4]);
        assert_eq!(parse_list::<f64>("100,250.5").unwrap(), vec![100.0, 250.5]);
        assert!(parse_list::<usize>("1,,2").is_err());
        assert!(parse_list::<usize>("0").is_err());
        assert!(parse_list::<f64>("-5").is_err());
        assert!(parse_list::<usize>("a").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_ms(1234), "1.234");
        assert_eq!(fmt_bytes(999), "999 B");
        assert_eq!(fmt_bytes(1_048_576), "1.05 MB");
        assert_eq!(fmt_duration(Duration::from_secs(2)), "2s");
        assert_eq!(fmt_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1500us");
    }
}
