//! Generates the gRPC code of the kubelet's plugin APIs from `proto/` with protox (a protobuf compiler
//! in Rust, so building needs no system `protoc`) and tonic-prost-build. Servers are generated for
//! the plugin; clients too, for the fake kubelet of the integration tests.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/pluginregistration_v1.proto",
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/dra_health_v1alpha1.proto",
        "proto/dra_health_v1.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let files = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(files)?;
    Ok(())
}
