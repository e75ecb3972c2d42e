//! What a kernel event means for the GPU objects a transport shows.
//!
//! Creating or removing an mdev changes only its parent's capacity, and the instance event the core
//! sends for it already makes that parent's GPU object be re-read. A full discovery (every PCI
//! device, every parent) is needed only when the set of devices or drivers may have changed, or when
//! the parent is an SR-IOV VF: there, a vGPU on one VF changes what its sibling VFs can still
//! create, and the kernel sends no event for the siblings.
//!
//! Whether a parent is a VF is read once per parent ([`ParentKinds`]): the kernel sends each mdev's
//! `add`, `bind`, `unbind` and `remove`, so a create and a destroy would otherwise each look it up
//! twice, and the answer cannot change while the device exists.

use std::collections::HashMap;
use std::sync::Mutex;

use vgpu_host::uevent::Uevent;
use vgpu_host::{Host, paths};

/// Parents remembered at most; past that the memo starts again (a host has far fewer).
const PARENTS_REMEMBERED: usize = 1024;

/// Whether each mdev parent seen in an event is an SR-IOV VF (has a `physfn` link), read once.
///
/// A PCI function is a VF or not for as long as it exists (a VF is made and removed whole, by the
/// PF's `sriov_numvfs`). A device, driver, module or parent that comes or goes sends an event of its
/// own, which empties the memo, so a name taken again by another device is read anew. The memo also
/// keeps the answer for the last mdev events of a VF that is being removed, when its directory may
/// already be gone.
#[derive(Debug, Default)]
pub(super) struct ParentKinds {
    is_vf: Mutex<HashMap<String, bool>>,
}

impl ParentKinds {
    /// The impact of `ev` on `host` (read right after the event): `All` for an event about devices,
    /// drivers, modules or parents, and for an mdev on a VF (its siblings); `None` for an mdev on
    /// any other parent and for events outside vGPU management. A parent's kind is read only the
    /// first time it is seen since the last event of the first kind.
    pub(super) fn impact(&self, host: &dyn Host, ev: &Uevent) -> GpuImpact {
        if !ev.is_relevant() {
            return GpuImpact::None;
        }
        let mut memo = super::lock(&self.is_vf);
        let Some(parent) = mdev_parent(ev) else {
            // Devices, drivers, parents, or an mdev without a parent.
            memo.clear();
            return GpuImpact::All;
        };
        let is_vf = match memo.get(parent) {
            Some(v) => *v,
            None => {
                let v = is_vf(host, parent);
                if memo.len() >= PARENTS_REMEMBERED {
                    memo.clear();
                }
                memo.insert(parent.to_string(), v);
                v
            }
        };
        if is_vf {
            GpuImpact::All
        } else {
            GpuImpact::None
        }
    }
}

/// The parent of the mdev an `mdev` event is about (its devpath ends in <parent>/<uuid>:
/// drivers/vfio/mdev/mdev_core.c puts the device below its parent); `None` for any other event, or
/// an mdev event whose devpath has no parent.
fn mdev_parent(ev: &Uevent) -> Option<&str> {
    if ev.subsystem.as_deref() != Some("mdev") {
        return None;
    }
    let mut parts = ev.devpath.rsplit('/');
    match (parts.next(), parts.next()) {
        (Some(_uuid), Some(parent)) if !parent.is_empty() => Some(parent),
        _ => None,
    }
}

/// Whether mdev parent `parent` is an SR-IOV VF.
fn is_vf(host: &dyn Host, parent: &str) -> bool {
    host.exists(&paths::mdev_parent(parent).join("physfn"))
}

/// How much of the GPU view a kernel event may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuImpact {
    /// Nothing beyond what the core's instance events already cover.
    None,
    /// Any GPU: re-discover them all.
    All,
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use vgpu_host::SysfsHost;

    use super::*;

    /// The impact of `ev` read afresh (a memo that has seen nothing).
    fn gpu_impact(host: &dyn Host, ev: &Uevent) -> GpuImpact {
        ParentKinds::default().impact(host, ev)
    }

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

    /// The mdev event `action` of a device on the VF 0000:85:00.4.
    fn vf_event(action: &str) -> Uevent {
        event(
            action,
            &format!("/devices/pci0000:80/0000:80:01.0/0000:85:00.4/{UUID}"),
            "mdev",
        )
    }

    #[test]
    fn a_parents_kind_is_read_once_until_a_device_event() {
        let (dir, host) = tree();
        let kinds = ParentKinds::default();
        assert_eq!(kinds.impact(&host, &vf_event("add")), GpuImpact::All);
        // The link gone: the memo still answers (as for the last events of a VF being removed).
        let link = dir
            .path()
            .join("sys/devices/pci0000:80/0000:80:01.0/0000:85:00.4/physfn");
        std::fs::remove_file(&link).unwrap();
        assert_eq!(kinds.impact(&host, &vf_event("bind")), GpuImpact::All);
        // A PCI event empties it: the next mdev event reads the parent again.
        let pci = event(
            "remove",
            "/devices/pci0000:80/0000:80:01.0/0000:85:00.4",
            "pci",
        );
        assert_eq!(kinds.impact(&host, &pci), GpuImpact::All);
        assert_eq!(kinds.impact(&host, &vf_event("remove")), GpuImpact::None);
        // Events outside vGPU management leave it alone.
        symlink("../0000:85:00.0", &link).unwrap();
        let net = event("add", "/devices/virtual/net/lo", "net");
        assert_eq!(kinds.impact(&host, &net), GpuImpact::None);
        assert_eq!(kinds.impact(&host, &vf_event("add")), GpuImpact::None);
    }

    #[test]
    fn a_memo_that_has_seen_events_answers_as_a_fresh_read_does() {
        let (_dir, host) = tree();
        let kinds = ParentKinds::default();
        let plain = event(
            "add",
            &format!("/devices/virtual/mbochs/mbochs/{UUID}"),
            "mdev",
        );
        let orphan = event("add", &format!("/{UUID}"), "mdev");
        let module = event("add", "/module/mbochs", "module");
        for _ in 0..2 {
            for ev in [&plain, &vf_event("add"), &orphan, &module] {
                assert_eq!(kinds.impact(&host, ev), gpu_impact(&host, ev), "{ev:?}");
            }
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
