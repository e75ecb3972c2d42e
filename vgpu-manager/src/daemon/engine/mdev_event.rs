//! Whether a kernel event about one mdev tells the engine anything its instance views do not
//! already show.
//!
//! A command that makes or removes a device reads it back after the kernel is done with it: the
//! write to `create` returns once the device is added and its driver bound (`mdev_device_create` in
//! the kernel's drivers/vfio/mdev/mdev_core.c adds it with `device_add`, which probes the driver,
//! whose probe registers the VFIO device and its IOMMU group), and the write to `remove` once it is
//! unbound and deleted. The `add`/`bind` and `unbind`/`remove` events those writes send arrive
//! later and describe what the views already hold. Events are handled one at a time in the order
//! the kernel sent them, so an event that agrees with the views cannot hide an older change: a
//! device removed and made again behind the daemon's back sends `remove` first, which does not
//! agree with a running view and is read.

use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;
use vgpu_host::{Host, paths};

use crate::daemon::api::{InstanceState, InstanceView};

/// Whether `view` (the instance's current view, if any) already shows what an mdev event with
/// `action` for a device on `parent` reports. An event that agrees needs no re-read of the device;
/// any other event, and any action not named here, does.
pub(super) fn view_agrees(view: Option<&InstanceView>, action: &str, parent: &str) -> bool {
    let running = view.filter(|v| v.state == InstanceState::Running);
    match action {
        // The device exists, on this parent, with the IOMMU group its bound driver made.
        "add" | "bind" => running.is_some_and(|v| v.parent == parent && v.iommu_group.is_some()),
        // The device is gone.
        "unbind" | "remove" => running.is_none(),
        _ => false,
    }
}

/// Waits (briefly) until new mdev `uuid`'s `mdev_type` link exists on `host`. The kernel announces
/// the device (`add`, then `bind` when vfio-mdev probes it) from `device_add` and only afterwards
/// creates its `mdev_type` link and `remove` file (drivers/vfio/mdev/mdev_core.c
/// `mdev_device_create` → `mdev_create_sysfs_files`), so a view computed at the event could miss
/// the device for good. Gives up after about a second (the device may be gone again), leaving it to
/// the refresh, and stops as soon as `done` says the wait is moot (the views already show the
/// device: a command's own create read it back).
pub(super) fn wait_for_links(host: &dyn Host, uuid: &MdevUuid, done: &dyn Fn() -> bool) {
    let dir = paths::mdev_device(uuid);
    let mut pause = Duration::from_millis(1);
    let deadline = Instant::now() + Duration::from_secs(1);
    while host.exists(&dir)
        && !host.exists(&dir.join("mdev_type"))
        && !done()
        && Instant::now() < deadline
    {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::api::Ownership;

    /// The instance every test here is about.
    fn uuid() -> MdevUuid {
        "6d0c5a4e-7b1f-4c1e-9a55-766770757465".parse().unwrap()
    }

    fn view(state: InstanceState, parent: &str, group: Option<u32>) -> InstanceView {
        InstanceView {
            uuid: uuid(),
            gpu: parent.into(),
            parent: parent.into(),
            type_id: "mbochs-small".parse().unwrap(),
            profile: None,
            state,
            defined: false,
            autostart: false,
            ownership: Ownership::Daemon,
            label: None,
            iommu_group: group,
            created_at: 0,
            attrs: Vec::new(),
        }
    }

    #[test]
    fn a_device_the_views_show_running_needs_no_read_for_its_add_and_bind() {
        let v = view(InstanceState::Running, "mbochs", Some(7));
        assert!(view_agrees(Some(&v), "add", "mbochs"));
        assert!(view_agrees(Some(&v), "bind", "mbochs"));
        // On another parent, without its group yet, or not known at all: read it.
        assert!(!view_agrees(Some(&v), "add", "mdpy"));
        let unbound = view(InstanceState::Running, "mbochs", None);
        assert!(!view_agrees(Some(&unbound), "bind", "mbochs"));
        assert!(!view_agrees(None, "add", "mbochs"));
        let stopped = view(InstanceState::Stopped, "mbochs", None);
        assert!(!view_agrees(Some(&stopped), "add", "mbochs"));
    }

    #[test]
    fn a_device_the_views_show_gone_needs_no_read_for_its_unbind_and_remove() {
        for action in ["unbind", "remove"] {
            assert!(view_agrees(None, action, "mbochs"));
            let stopped = view(InstanceState::Stopped, "mbochs", None);
            assert!(view_agrees(Some(&stopped), action, "mbochs"));
            let waiting = view(InstanceState::WaitingForParent, "mbochs", None);
            assert!(view_agrees(Some(&waiting), action, "mbochs"));
            // Removed behind the daemon's back: read.
            let running = view(InstanceState::Running, "mbochs", Some(7));
            assert!(!view_agrees(Some(&running), action, "mbochs"));
        }
    }

    #[test]
    fn other_actions_are_always_read() {
        let running = view(InstanceState::Running, "mbochs", Some(7));
        for action in ["change", "move", "online", ""] {
            assert!(!view_agrees(Some(&running), action, "mbochs"));
            assert!(!view_agrees(None, action, "mbochs"));
        }
    }

    /// A sysfs tree below a temporary root with mdev `uuid`'s directory, and its `mdev_type` link
    /// when `linked`.
    fn tree(uuid: &MdevUuid, linked: bool) -> (tempfile::TempDir, vgpu_host::SysfsHost) {
        let root = tempfile::tempdir().unwrap();
        let dir = root
            .path()
            .join(paths::mdev_device(uuid).strip_prefix("/").unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        if linked {
            // Relative, and to a directory that exists, as the kernel's link is.
            std::fs::create_dir_all(dir.join("../mdev_supported_types/x")).unwrap();
            std::os::unix::fs::symlink("../mdev_supported_types/x", dir.join("mdev_type")).unwrap();
        }
        let host = vgpu_host::SysfsHost::new(root.path()).unwrap();
        (root, host)
    }

    #[test]
    fn the_wait_for_links_ends_once_the_views_show_the_device() {
        let uuid = uuid();
        let (_root, host) = tree(&uuid, false);
        let asked = std::cell::Cell::new(0);
        // The link never comes; the views show the device from the third look on.
        wait_for_links(&host, &uuid, &|| {
            asked.set(asked.get() + 1);
            asked.get() >= 3
        });
        assert_eq!(
            asked.get(),
            3,
            "the wait went on after the views showed the device"
        );
    }

    #[test]
    fn the_wait_for_links_ends_at_once_when_the_link_is_there() {
        let uuid = uuid();
        let (_root, host) = tree(&uuid, true);
        let asked = std::cell::Cell::new(0);
        wait_for_links(&host, &uuid, &|| {
            asked.set(asked.get() + 1);
            false
        });
        assert_eq!(asked.get(), 0);
    }
}
