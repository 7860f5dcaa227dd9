//! Generates the peer protocol's Rust code (`src/cluster/peer.rs` includes it) from
//! `proto/sluice/peer/v1/peer.proto`, compiled in pure Rust by protox: no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/sluice/peer/v1/peer.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
