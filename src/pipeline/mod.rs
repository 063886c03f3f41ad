//! The walk every model request takes, whatever its wire format: check the caller (`auth`),
//! resolve the route to a target model (`route`), find or load a copy of it
//! (`Placement::acquire`), check the input (`validate`), then forward. Each stage is a plain function over the gateway state and the
//! request, so HTTP and gRPC share every rule.

pub mod auth;
pub mod mirror;
mod place;
pub mod repository;
mod route;

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
}
