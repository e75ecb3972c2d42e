//! A client of vgpud must not link the hardware layers: no KVM, no VFIO, no guest memory and no
//! simulator in vgpu-client's normal dependency graph (`cargo tree -p vgpu-client -e normal`). Front
//! ends and plugins that only talk to the daemon then build without them.

use std::process::Command;

/// Crates that belong to the daemon's side of the hardware boundary.
const FORBIDDEN: &[&str] = &[
    "kvm-ioctls",
    "kvm-bindings",
    "vfio-ioctls",
    "vfio-bindings",
    "iommufd-ioctls",
    "iommufd-bindings",
    "vm-memory",
    "vgpu-sim",
    "vgpu-vfio",
    "vgpu-host",
    "vgpu-manager",
];

#[test]
fn the_client_links_no_kvm_vfio_or_simulator() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", manifest])
        .args(["-p", "vgpu-client", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}"])
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crates: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        crates.first() == Some(&"vgpu-client"),
        "unexpected cargo tree output:\n{stdout}"
    );
    let linked: Vec<&&str> = FORBIDDEN.iter().filter(|f| crates.contains(f)).collect();
    assert!(
        linked.is_empty(),
        "vgpu-client links {linked:?}; a client must not depend on the hardware layers:\n{stdout}"
    );
}
