//! What a kernel event means for the GPU objects a transport shows.
//!
//! Creating or removing an mdev changes only its parent's capacity, and the instance event the core
//! sends for it already makes that parent's GPU object be re-read. A full discovery (every PCI
//! device, every parent) is needed only when the set of devices or drivers may have changed, or when
//! the parent is an SR-IOV VF: there, a vGPU on one VF changes what its sibling VFs can still
//! create, and the kernel sends no event for the siblings.

use vgpu_host::uevent::Uevent;
use vgpu_host::{Host, paths};

/// How much of the GPU view a kernel event may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuImpact {
    /// Nothing beyond what the core's instance events already cover.
    None,
    /// Any GPU: re-discover them all.
    All,
}

/// The impact of `ev` on `host` (read right after the event).
pub(super) fn gpu_impact(host: &dyn Host, ev: &Uevent) -> GpuImpact {
    if !ev.is_relevant() {
        return GpuImpact::None;
    }
    if ev.subsystem.as_deref() != Some("mdev") {
        return GpuImpact::All;
    }
    // An mdev's devpath ends in <parent>/<uuid> (drivers/vfio/mdev/mdev_core.c puts the device
    // below its parent).
    let mut parts = ev.devpath.rsplit('/');
    let parent = match (parts.next(), parts.next()) {
        (Some(_uuid), Some(parent)) if !parent.is_empty() => parent,
        _ => return GpuImpact::All,
    };
    if host.exists(&paths::mdev_parent(parent).join("physfn")) {
        GpuImpact::All
    } else {
        GpuImpact::None
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use vgpu_host::SysfsHost;

    use super::*;

    fn event(action: &str, devpath: &str, subsystem: &str) -> Uevent {
        Uevent::new(action, devpath, Some(subsystem))
    }

    /// A sysfs tree with a virtual parent (mbochs) and a parent that is a VF of 0000:85:00.0.
    fn tree() -> (tempfile::TempDir, SysfsHost) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let pci = root.join("sys/devices/pci0000:80/0000:80:01.0");
        std::fs::create_dir_all(pci.join("0000:85:00.0")).unwrap();
        std::fs::create_dir_all(pci.join("0000:85:00.4")).unwrap();
        symlink("../0000:85:00.0", pci.join("0000:85:00.4/physfn")).unwrap();
        std::fs::create_dir_all(root.join("sys/devices/virtual/mbochs/mbochs")).unwrap();
        let class = root.join("sys/class/mdev_bus");
        std::fs::create_dir_all(&class).unwrap();
        symlink("../../devices/virtual/mbochs/mbochs", class.join("mbochs")).unwrap();
        symlink(
            "../../devices/pci0000:80/0000:80:01.0/0000:85:00.4",
            class.join("0000:85:00.4"),
        )
        .unwrap();
        let host = SysfsHost::new(root).unwrap();
        (dir, host)
    }

    const UUID: &str = "6d0c5a4e-7b1f-4c1e-9a55-766770757465";

    #[test]
    fn an_mdev_on_a_plain_parent_needs_no_full_discovery() {
        let (_dir, host) = tree();
        for action in ["add", "bind", "unbind", "remove"] {
            let ev = event(
                action,
                &format!("/devices/virtual/mbochs/mbochs/{UUID}"),
                "mdev",
            );
            assert_eq!(gpu_impact(&host, &ev), GpuImpact::None, "{action}");
        }
    }

    #[test]
    fn an_mdev_on_a_vf_rereads_every_gpu_for_its_siblings() {
        let (_dir, host) = tree();
        let ev = event(
            "add",
            &format!("/devices/pci0000:80/0000:80:01.0/0000:85:00.4/{UUID}"),
            "mdev",
        );
        assert_eq!(gpu_impact(&host, &ev), GpuImpact::All);
    }

    #[test]
    fn devices_drivers_and_parents_coming_and_going_reread_every_gpu() {
        let (_dir, host) = tree();
        for (action, devpath, subsystem) in [
            (
                "bind",
                "/devices/pci0000:80/0000:80:01.0/0000:85:00.0",
                "pci",
            ),
            ("add", "/devices/virtual/mbochs/mbochs", "mdev_bus"),
            ("add", "/module/mbochs", "module"),
            ("add", "/bus/pci/drivers/nvidia", "drivers"),
        ] {
            assert_eq!(
                gpu_impact(&host, &event(action, devpath, subsystem)),
                GpuImpact::All,
                "{subsystem} {action}"
            );
        }
    }

    #[test]
    fn events_outside_vgpu_management_change_nothing() {
        let (_dir, host) = tree();
        let ev = event("add", "/devices/virtual/vfio/7", "vfio");
        assert_eq!(gpu_impact(&host, &ev), GpuImpact::None);
        let ev = event("add", "/devices/virtual/net/lo", "net");
        assert_eq!(gpu_impact(&host, &ev), GpuImpact::None);
    }
}
