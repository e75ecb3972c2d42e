//! Real libvirt in the guest, against vgpud on the real kernel: the host's own udevd, system bus,
//! libvirtd and virsh (Debian packages on the host that boots the guest), run chrooted into a
//! writable copy of its root ([`sysroot`]), with our `vgpuctl` as libvirt's `mdevctl`.
//!
//! * [`sysroot`] — the overlay root and the one function that installs vgpu-manager in it;
//! * [`stack`] — the services, started in their systemd units' order, and `virsh`;
//! * [`nodedev`] — `virsh nodedev-*` checked against sysfs, `/etc/mdevctl.d` and vgpud;
//! * [`domain`] — a domain started by libvirt with our vGPU.

pub mod domain;
pub mod nodedev;
pub mod stack;
pub mod sysroot;

use super::guest::Guest;
use super::runner::Test;

/// The libvirt tests (libvirt 9.0, Debian bookworm's).
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new(
            "libvirt90_nodedev_lists_mdev_parents",
            nodedev::lists_mdev_parents,
        ),
        Test::new(
            "libvirt90_nodedev_define_start_destroy_undefine",
            nodedev::define_start_destroy_undefine,
        ),
        Test::new("libvirt90_nodedev_create_destroy", nodedev::create_destroy),
        Test::new(
            "libvirt90_nodedev_view_follows_vgpud",
            nodedev::view_follows_vgpud,
        ),
        Test::new("libvirt90_domain_boots_with_mdev", domain::boots_with_mdev),
        Test::new(
            "libvirt90_hook_creates_and_removes",
            domain::hook_creates_and_removes,
        ),
    ]
}
