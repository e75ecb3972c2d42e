//! The crates' layering, checked on the real dependency graph (`cargo tree -e normal`): the pure model
//! does no I/O, the kernel boundary links no VFIO, KVM or simulator, a client of vgpud links no
//! hardware layer, and the daemon's library builds without the simulator and the embedded bus. Front
//! ends and plugins that only talk to the daemon then build without the hardware crates.

#![allow(clippy::expect_used)]
use std::process::Command;

/// The rust-vmm crates behind VFIO and KVM.
const VFIO_KVM: &[&str] = &[
    "kvm-ioctls",
    "kvm-bindings",
    "vfio-ioctls",
    "vfio-bindings",
    "iommufd-ioctls",
    "iommufd-bindings",
    "vm-memory",
    "vgpu-vfio",
];

/// The crates `package` links (normal dependencies, with `features` given to cargo), itself first.
fn linked(package: &str, features: &[&str]) -> Vec<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", manifest])
        .args(["-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}"])
        .args(features)
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crates: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(
        crates.first().map(String::as_str) == Some(package),
        "unexpected cargo tree output:\n{stdout}"
    );
    crates
}

/// Fails naming every crate of `forbidden` that `package` links.
fn assert_links_none(package: &str, features: &[&str], forbidden: &[&str], why: &str) {
    let crates = linked(package, features);
    let found: Vec<&&str> = forbidden
        .iter()
        .filter(|f| crates.iter().any(|c| c == **f))
        .collect();
    assert!(
        found.is_empty(),
        "{package} links {found:?}; {why}:\n{}",
        crates.join("\n")
    );
}

#[test]
fn the_client_links_no_kvm_vfio_or_simulator() {
    let mut forbidden = VFIO_KVM.to_vec();
    forbidden.extend(["vgpu-sim", "vgpu-host", "vgpu-manager"]);
    assert_links_none(
        "vgpu-client",
        &[],
        &forbidden,
        "a client must not depend on the hardware layers",
    );
}

#[test]
fn the_model_does_no_io() {
    let mut forbidden = VFIO_KVM.to_vec();
    forbidden.extend(["vgpu-host", "vgpu-sim", "nix", "tokio", "zbus"]);
    assert_links_none(
        "mdev-types",
        &[],
        &forbidden,
        "the model is pure data and parsers",
    );
    assert_links_none(
        "qemu-glue",
        &[],
        &forbidden,
        "XML and argument output needs only the model",
    );
}

#[test]
fn the_kernel_boundary_links_no_vfio_or_simulator() {
    let mut forbidden = VFIO_KVM.to_vec();
    forbidden.push("vgpu-sim");
    assert_links_none(
        "vgpu-host",
        &[],
        &forbidden,
        "the boundary is sysfs and uevents only",
    );
}

#[test]
fn the_daemon_library_builds_without_the_simulator_and_the_embedded_bus() {
    assert_links_none(
        "vgpu-manager",
        &["--no-default-features"],
        &["vgpu-sim", "busd"],
        "the simulator and the embedded bus are the default features `sim` and `embedded-bus`",
    );
    let with_defaults = linked("vgpu-manager", &[]);
    for c in ["vgpu-sim", "busd"] {
        assert!(
            with_defaults.iter().any(|l| l == c),
            "the default build of vgpu-manager should include {c}"
        );
    }
}

#[test]
fn the_dra_plugin_links_no_hardware_layer_tls_or_axum() {
    let mut forbidden = VFIO_KVM.to_vec();
    forbidden.extend(["vgpu-sim", "vgpu-host", "vgpu-manager"]);
    // It reaches the API server through a local proxy and the kubelet over Unix sockets.
    forbidden.extend(["rustls", "tokio-rustls", "openssl", "native-tls", "axum"]);
    // Its gRPC code is generated at build time: the generator is not linked.
    forbidden.extend(["protox", "prost-build", "tonic-build", "tonic-prost-build"]);
    assert_links_none(
        "vgpu-dra",
        &[],
        &forbidden,
        "the DRA plugin talks to vgpud through vgpu-client only and links no TLS",
    );
}
