//! Generated gRPC types, in one crate so the daemon, the bench and the CLI share one copy.
//!
//! # Layout
//!
//! - [`sluice::v1`]: `sluice.v1.Limiter` (Check, Release).

#![allow(missing_docs, clippy::all)] // generated code

/// Sluice's own API.
pub mod sluice {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("sluice.v1");
    }
}
