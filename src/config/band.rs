//! Priority bands, a word config and flow control share: tenants' `priority` and
//! `max_priority` name them, and the flow phase queues by them (`crate::flow`).

use serde::{Deserialize, Serialize};

/// A priority band. Every request of a band is served before any of the band below it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Band {
    /// Interactive work that must not wait behind anything else.
    Critical,
    /// Everything not said otherwise, and all anonymous traffic.
    #[default]
    Standard,
    /// Work that may be refused first when the pool is short (batch jobs, prefetch).
    Sheddable,
}

impl Band {
    /// How many bands there are.
    pub const COUNT: usize = 3;
    /// The bands, highest first.
    pub const ALL: [Band; Self::COUNT] = [Self::Critical, Self::Standard, Self::Sheddable];

    /// Its place, 0 for the highest.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name in config, headers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Standard => "standard",
            Self::Sheddable => "sheddable",
        }
    }

    /// The band a header value names (exactly, lower case), or `None`.
    pub fn parse(value: &[u8]) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|b| b.as_str().as_bytes() == value)
    }

    /// This band, or `highest` when it is above it.
    pub fn capped(self, highest: Band) -> Self {
        self.max(highest)
    }
}
