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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::api::Ownership;

    fn view(state: InstanceState, parent: &str, group: Option<u32>) -> InstanceView {
        InstanceView {
            uuid: "6d0c5a4e-7b1f-4c1e-9a55-766770757465".parse().unwrap(),
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
}
