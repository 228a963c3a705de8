//! Generates the gRPC code from proto/. The files are compiled by protox, a protobuf compiler
//! in Rust, into descriptors that tonic's generator turns into code: a fresh machine on any
//! platform builds without protoc, and no binary is shipped in a crate.
//!
//! The Envoy RLS v3 protos are compiled with the server (sluiced serves them) and the client
//! (sluice-bench and the tests call them). The few google.protobuf well-known types they use
//! come from proto/google/protobuf, so libprotobuf-dev is not needed; prost maps them to
//! prost-types either way.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read when the script runs, not baked in when it is compiled: a target directory shared
    // by several checkouts reuses one compiled script for all of them.
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "sluice/v1/limiter.proto",
        "envoy/service/ratelimit/v3/rls.proto",
        "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        "envoy/type/v3/ratelimit_unit.proto",
        "envoy/config/core/v3/base.proto",
        "google/protobuf/duration.proto",
        "google/protobuf/struct.proto",
        "google/protobuf/timestamp.proto",
        "google/protobuf/wrappers.proto",
    ];
    let paths: Vec<_> = files.iter().map(|f| root.join(f)).collect();
    for p in &paths {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let descriptors = protox::compile(&paths[..2], [&root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
