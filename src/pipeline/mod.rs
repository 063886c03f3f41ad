//! The walk every model request takes, whatever its wire format: check the caller (`auth`),
//! resolve the route to a target model (`route`), find or load a copy of it
//! (`Placement::acquire`), check the input (`validate`), then forward. Each stage is a plain function over the gateway state and the
//! request, so HTTP and gRPC share every rule.

pub mod auth;
pub mod mirror;
mod place;
pub mod replay;
pub mod repository;
mod route;
pub mod sequence;

pub use auth::Caller;
pub use place::LeasedBody;
pub use route::{Outcome, PIN_HEADER, RouteTable, Routed};

/// The model a request names, as the client wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelRef {
    /// Model name.
    pub name: String,
    /// A specific version, or `None` for the server's choice.
    pub version: Option<String>,
}

impl ModelRef {
    /// A model, any version.
    pub fn new(name: impl Into<String>, version: Option<String>) -> Self {
        Self {
            name: name.into(),
            version,
        }
    }

    /// The version asked for as a number (`Ok(None)`: none asked for). Triton's versions are
    /// numbers; a text that is not one names no version, and placement refuses it.
    pub fn version_number(&self) -> Result<Option<u64>, std::num::ParseIntError> {
        version_number(self.version.as_deref())
    }
}

/// A version as written (in a request or a route target) as a number: the one rule for both.
pub fn version_number(text: Option<&str>) -> Result<Option<u64>, std::num::ParseIntError> {
    text.map(str::parse).transpose()
}
