//! Human-friendly sizes and durations for the config file.
//!
//! Operators write `capacity = "2GiB"` and `timeout = "500ms"`; the core only ever sees
//! bytes and `std::time::Duration`. Parsing lives here so every key accepts the same spellings.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::fmt;
use std::time::Duration;

/// A byte count written as `"512MiB"`, `"2GiB"`, `"10MB"` or a plain integer of bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// Parses the config spelling; the error names the accepted units.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            other => {
                return Err(format!(
                    "unknown size unit {other:?} in {text:?} (use B, KB, MB, GB, KiB, MiB, GiB or TiB)"
                ));
            }
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("invalid size {text:?} (expected e.g. \"512MiB\" or 1048576)"))?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("size {text:?} is out of range"));
        }
        Ok(Self(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (unit, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"512MiB\", \"2GiB\" or a number of bytes")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A duration written as `"500ms"`, `"30s"`, `"5m"`, `"1h"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// Parses the config spelling; the error names the accepted units.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let value: f64 = number.parse().map_err(|_| {
            format!("invalid duration {text:?} (expected e.g. \"500ms\" or \"30s\")")
        })?;
        let seconds = match unit.trim() {
            "ms" => value / 1_000.0,
            "s" => value,
            "m" | "min" => value * 60.0,
            "h" => value * 3_600.0,
            "" => return Err(format!("duration {text:?} needs a unit (ms, s, m or h)")),
            other => {
                return Err(format!(
                    "unknown duration unit {other:?} in {text:?} (use ms, s, m or h)"
                ));
            }
        };
        Duration::try_from_secs_f64(seconds)
            .map(Self)
            .map_err(|_| format!("duration {text:?} is out of range"))
    }
}

impl From<HumanDuration> for Duration {
    fn from(value: HumanDuration) -> Self {
        value.0
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        HumanDuration::parse(&text).map_err(de::Error::custom)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_every_unit() {
        assert_eq!(ByteSize::parse("512MiB").unwrap().bytes(), 512 << 20);
        assert_eq!(ByteSize::parse("2GiB").unwrap().bytes(), 2 << 30);
        assert_eq!(ByteSize::parse("10MB").unwrap().bytes(), 10_000_000);
        assert_eq!(ByteSize::parse("1048576").unwrap().bytes(), 1 << 20);
        assert_eq!(ByteSize::parse("1.5KiB").unwrap().bytes(), 1536);
        assert!(
            ByteSize::parse("2 parsecs")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(ByteSize::parse("lots").is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
    }

    #[test]
    fn durations_parse_and_need_a_unit() {
        assert_eq!(
            HumanDuration::parse("500ms").unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!(
            HumanDuration::parse("30s").unwrap().0,
            Duration::from_secs(30)
        );
        assert_eq!(
            HumanDuration::parse("2m").unwrap().0,
            Duration::from_secs(120)
        );
        assert!(
            HumanDuration::parse("30")
                .unwrap_err()
                .contains("needs a unit")
        );
        assert!(HumanDuration::parse("3 fortnights").is_err());
        assert_eq!(
            HumanDuration(Duration::from_millis(1500)).to_string(),
            "1500ms"
        );
    }
}
