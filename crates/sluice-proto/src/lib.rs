//! Generated gRPC types, in one crate so the daemon, the bench and the CLI share one copy.
//!
//! # Layout
//!
//! - [`sluice::v1`]: `sluice.v1.Limiter` (Check, Release).
//! - [`envoy`]: Envoy's rate limit service v3 (`envoy.service.ratelimit.v3.RateLimitService`)
//!   and the messages it uses, wire-compatible with Envoy's ratelimit filter. Well-known
//!   types (`Duration`, `Struct`, `Timestamp`) are [`prost_types`]'.

#![allow(missing_docs, clippy::all)] // generated code

pub use prost_types;

/// Sluice's own API.
pub mod sluice {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("sluice.v1");
    }
}

/// Envoy's packages, nested as Envoy names them so generated `super::` paths resolve.
pub mod envoy {
    /// `envoy.service.*`
    pub mod service {
        /// `envoy.service.ratelimit.*`
        pub mod ratelimit {
            /// `envoy.service.ratelimit.v3`: the RLS service, request and response.
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    /// `envoy.extensions.*`
    pub mod extensions {
        /// `envoy.extensions.common.*`
        pub mod common {
            /// `envoy.extensions.common.ratelimit.*`
            pub mod ratelimit {
                /// `envoy.extensions.common.ratelimit.v3`: `RateLimitDescriptor`.
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    /// `envoy.type.*`
    pub mod r#type {
        /// `envoy.type.v3`: `RateLimitUnit`.
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    /// `envoy.config.*`
    pub mod config {
        /// `envoy.config.core.*`
        pub mod core {
            /// `envoy.config.core.v3`: `HeaderValue`.
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
}
