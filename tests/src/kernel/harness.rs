//! Checks of the guest itself, so later suites (daemon, VFIO, KVM) can rely on it: the modules are
//! loaded and the device nodes exist.

use std::path::Path;

use vgpu_host::Host;

use super::guest::{Guest, KernelKind};
use super::runner::{Outcome, Test, TestError, TestResult, ensure};

/// The harness tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("harness_modules_loaded", modules_loaded),
        Test::new("harness_vfio_and_kvm_nodes", vfio_and_kvm_nodes),
        Test::new("harness_iommufd_node", iommufd_node),
    ]
}

/// Every driver scripts/vm/modules asks for is in /sys/module (loaded or built in).
fn modules_loaded(g: &Guest) -> TestResult {
    let wanted = [
        "vfio",
        "vfio_iommu_type1",
        "mdev",
        "vfio_pci",
        "vfio_pci_core",
        "mtty",
        "mdpy",
        "mbochs",
        "igb",
        "nvme",
        "kvm",
        "kvm_amd",
    ];
    let missing: Vec<&str> = wanted
        .into_iter()
        .filter(|m| !g.host.exists(&Path::new("/sys/module").join(m)))
        .collect();
    ensure(missing.is_empty(), || {
        format!("modules missing from /sys/module: {missing:?}")
    })?;
    Ok(Outcome::Passed)
}

/// /dev/vfio/vfio (the type1 container: always part of vfio in 6.1, CONFIG_VFIO_CONTAINER=y in both 6.12
/// kernels here) and /dev/kvm
/// (kvm_amd: QEMU's `-cpu max` offers SVM to the TCG guest) exist.
fn vfio_and_kvm_nodes(g: &Guest) -> TestResult {
    for node in ["/dev/vfio/vfio", "/dev/kvm"] {
        ensure(g.host.exists(Path::new(node)), || {
            format!("{node} is missing")
        })?;
    }
    Ok(Outcome::Passed)
}

/// /dev/iommu exists on the custom kernel (CONFIG_IOMMUFD=m, loaded by the harness); the stock Debian
/// kernels are built without IOMMUFD.
fn iommufd_node(g: &Guest) -> TestResult {
    match (g.kernel, g.has_iommufd()) {
        (KernelKind::Custom, true) => Ok(Outcome::Passed),
        (KernelKind::Custom, false) => Err(TestError::Check(
            "/dev/iommu is missing on the custom kernel (iommufd not loaded?)".into(),
        )),
        (_, true) => Err(TestError::Check(
            "/dev/iommu exists on a stock Debian kernel, which has CONFIG_IOMMUFD unset".into(),
        )),
        (_, false) => Ok(Outcome::Skipped(
            "kernel has no IOMMUFD (CONFIG_IOMMUFD unset in Debian's config)".into(),
        )),
    }
}
