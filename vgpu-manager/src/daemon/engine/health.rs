//! The health check a create makes of the GPU it is about to use, and how long a good answer holds.
//!
//! Before anything is written, a create that names its GPU (`Manager1.Create` with a GPU, a pool's run
//! of new slots) reads that GPU as discovery does — its PCI function and every mdev type of its parent,
//! five sysfs reads per type (`name`, `description`, `device_api`, `available_instances`, `devices/`),
//! each answered by the vendor's driver, so a card that lists 30 types costs 150 — and refuses a GPU
//! that cannot be read ([`device_fault`]). A burst of creates on
//! one GPU, such as a VDI host bringing its desktops back, reads it once per [`REUSE`]: a GPU found
//! readable is taken as readable for that long, unless meanwhile
//! - the kernel sent an event that can change what vgpud manages ([`Uevent::is_relevant`]) about
//!   anything but an mdev instance: a driver bound or unbound, a PCI device added or removed, a parent
//!   registered or unregistered, a module loaded; or
//! - a create on it failed.
//!
//! A fault is never reused: a GPU found faulted is read again at the next request, so one that recovers
//! is served at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mdev_types::fault::DeviceFault;
use vgpu_host::Host;
use vgpu_host::discover::device_fault;
use vgpu_host::uevent::Uevent;

use super::lock;

/// How long a GPU found readable is taken as readable without reading it again.
pub(super) const REUSE: Duration = Duration::from_secs(1);

/// The GPUs (mdev parent names, or PCI addresses) found readable, and when.
#[derive(Debug, Default)]
pub(super) struct HealthMemo {
    readable: Mutex<HashMap<String, Instant>>,
}

impl HealthMemo {
    /// The fault of `gpu` (see [`device_fault`]), or `None` when it reads, or was found readable less
    /// than [`REUSE`] ago with nothing in between that could have changed that.
    pub(super) fn fault(&self, host: &dyn Host, gpu: &str) -> Option<DeviceFault> {
        self.fault_at(host, gpu, Instant::now())
    }

    fn fault_at(&self, host: &dyn Host, gpu: &str, now: Instant) -> Option<DeviceFault> {
        let fresh = lock(&self.readable)
            .get(gpu)
            .is_some_and(|at| now.saturating_duration_since(*at) < REUSE);
        if fresh {
            return None;
        }
        let fault = device_fault(host, gpu);
        let mut readable = lock(&self.readable);
        if fault.is_none() {
            readable.insert(gpu.to_string(), now);
        } else {
            readable.remove(gpu);
        }
        fault
    }

    /// A create on `gpu` failed: the next one reads it again.
    pub(super) fn forget(&self, gpu: &str) {
        lock(&self.readable).remove(gpu);
    }

    /// Takes in the kernel event `ev`: a relevant one ([`Uevent::is_relevant`]) that is not an mdev
    /// instance's (its device made, removed, bound or unbound, which leaves its parent as it was)
    /// makes every GPU be read again. The VFIO group and device nodes that come and go with each mdev
    /// change nothing either.
    pub(super) fn note_uevent(&self, ev: &Uevent) {
        if ev.is_relevant() && ev.subsystem.as_deref() != Some("mdev") {
            lock(&self.readable).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use vgpu_host::SysfsHost;

    use super::*;

    const PARENT: &str = "mtty";
    const TYPE: &str = "mtty-1";

    /// A sysfs tree below `root` with the virtual mdev parent `mtty` and one type.
    fn tree(root: &Path) -> SysfsHost {
        let dev = root.join("sys/devices/virtual/mtty/mtty");
        let ty = dev.join("mdev_supported_types").join(TYPE);
        std::fs::create_dir_all(ty.join("devices")).unwrap();
        for (f, v) in [
            ("name", "Single port serial\n"),
            ("description", "serial\n"),
            ("device_api", "vfio-pci\n"),
            ("available_instances", "24\n"),
        ] {
            std::fs::write(ty.join(f), v).unwrap();
        }
        let drv = root.join("sys/bus/mdev/drivers/vfio_mdev");
        std::fs::create_dir_all(&drv).unwrap();
        std::os::unix::fs::symlink(&drv, dev.join("driver")).unwrap();
        let class = root.join("sys/class/mdev_bus");
        std::fs::create_dir_all(&class).unwrap();
        std::os::unix::fs::symlink("../../devices/virtual/mtty/mtty", class.join(PARENT)).unwrap();
        SysfsHost::new(root).unwrap()
    }

    /// Makes the type's `available_instances` unreadable as a number (a fault), or good again.
    fn break_type(root: &Path, broken: bool) {
        let f = root
            .join("sys/devices/virtual/mtty/mtty/mdev_supported_types")
            .join(TYPE);
        let text = if broken { "lots\n" } else { "24\n" };
        std::fs::write(f.join("available_instances"), text).unwrap();
    }

    #[test]
    fn a_readable_gpu_is_not_read_again_within_the_reuse_time() {
        let dir = tempfile::tempdir().unwrap();
        let host = tree(dir.path());
        let memo = HealthMemo::default();
        let t0 = Instant::now();
        assert!(device_fault(&host, PARENT).is_none(), "the tree reads");
        assert!(memo.fault_at(&host, PARENT, t0).is_none());
        break_type(dir.path(), true);
        assert!(
            device_fault(&host, PARENT).is_some(),
            "the broken tree is a fault"
        );
        // Within the reuse time the first answer holds; at its end the GPU is read again.
        let later = t0 + REUSE - Duration::from_millis(1);
        assert!(memo.fault_at(&host, PARENT, later).is_none());
        let f = memo
            .fault_at(&host, PARENT, t0 + REUSE)
            .expect("read again");
        assert_eq!(f.device, PARENT);
    }

    #[test]
    fn a_fault_is_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let host = tree(dir.path());
        break_type(dir.path(), true);
        let memo = HealthMemo::default();
        let t0 = Instant::now();
        assert!(memo.fault_at(&host, PARENT, t0).is_some());
        assert!(memo.fault_at(&host, PARENT, t0).is_some());
        break_type(dir.path(), false);
        assert!(
            memo.fault_at(&host, PARENT, t0).is_none(),
            "recovered at once"
        );
    }

    #[test]
    fn a_failed_create_or_a_device_event_makes_the_gpu_be_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let host = tree(dir.path());
        let memo = HealthMemo::default();
        let t0 = Instant::now();
        let read_then_break = || {
            break_type(dir.path(), false);
            assert!(memo.fault_at(&host, PARENT, t0).is_none());
            break_type(dir.path(), true);
            assert!(memo.fault_at(&host, PARENT, t0).is_none(), "reused");
        };
        read_then_break();
        memo.forget(PARENT);
        assert!(memo.fault_at(&host, PARENT, t0).is_some());

        // An mdev instance made or removed, with its VFIO nodes, leaves its parent as it was.
        read_then_break();
        let mdev = "/devices/virtual/mtty/mtty/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001";
        for action in ["add", "bind", "unbind", "remove"] {
            memo.note_uevent(&Uevent::new(action, mdev, Some("mdev")));
        }
        let vfio_dev = format!("{mdev}/vfio-dev/vfio0");
        memo.note_uevent(&Uevent::new("add", &vfio_dev, Some("vfio-dev")));
        memo.note_uevent(&Uevent::new("add", "/devices/virtual/vfio/7", Some("vfio")));
        assert!(memo.fault_at(&host, PARENT, t0).is_none(), "still reused");

        // A PCI device or driver, a parent, a module: read again.
        for (devpath, subsystem) in [
            ("/devices/pci0000:00/0000:00:02.0", "pci"),
            ("/bus/pci/drivers/nvidia", "drivers"),
            ("/devices/virtual/mtty/mtty", "mdev_bus"),
            ("/module/mtty", "module"),
        ] {
            let subsystem = Some(subsystem);
            read_then_break();
            memo.note_uevent(&Uevent::new("unbind", devpath, subsystem));
            assert!(
                memo.fault_at(&host, PARENT, t0).is_some(),
                "{devpath} {subsystem:?}"
            );
        }
    }
}
