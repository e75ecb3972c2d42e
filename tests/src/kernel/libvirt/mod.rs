//! Real libvirt in the guest (Debian bookworm's 9.0 and bookworm-backports' 11.3), against vgpud on the real kernel: the host's own udevd, system bus,
//! libvirtd and virsh (Debian packages on the host that boots the guest), run chrooted into a
//! writable copy of its root ([`sysroot`]), with our `vgpuctl` as libvirt's `mdevctl`.
//!
//! * [`sysroot`] — the overlay root and the one function that installs vgpu-manager in it;
//! * [`stack`] — the services, started in their systemd units' order, and `virsh`;
//! * [`nodedev`] — `virsh nodedev-*` checked against sysfs, `/etc/mdevctl.d` and vgpud;
//! * [`domain`] — a domain started by libvirt with our vGPU;
//! * [`boot_bench`] — benchmark: parent driver loaded to every autostart vGPU in `virsh`, vgpu-manager
//!   against the real mdevctl's udev rule;
//! * [`mixed`] — beside the real mdevctl 1.2.0, one `/etc/mdevctl.d` for both;
//! * [`migrate`] — `virsh migrate --live` of a domain with an mtty vGPU between two libvirt daemons;
//! * [`nova`] — OpenStack Nova's libvirt driver listing, making, restarting and deleting an mdev.

pub mod boot_bench;
pub mod domain;
pub mod migrate;
pub mod mixed;
pub mod nodedev;
pub mod nova;
pub mod stack;
pub mod sysroot;

use super::guest::Guest;
use super::runner::Test;
use sysroot::Libvirt;

/// The libvirt tests, each on Debian bookworm's libvirt 9.0 and on bookworm-backports' 11.3. They check
/// libvirt's and Nova's side of our devices, the same on every kernel the suite boots: a run of several
/// boots runs them on one ([`Scope::OneBoot`](super::runner::Scope::OneBoot)).
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::one_boot("libvirt90_nodedev_lists_mdev_parents", |g| {
            nodedev::lists_mdev_parents(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_nodedev_define_start_destroy_undefine", |g| {
            nodedev::define_start_destroy_undefine(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_nodedev_create_destroy", |g| {
            nodedev::create_destroy(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_nodedev_view_follows_vgpud", |g| {
            nodedev::view_follows_vgpud(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_domain_boots_with_mdev", |g| {
            domain::boots_with_mdev(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_domain_boots_with_vf", |g| {
            domain::boots_with_vf(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_hook_creates_and_removes", |g| {
            domain::hook_creates_and_removes(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_mixed_with_real_mdevctl", |g| {
            mixed::mixed_with_real_mdevctl(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_migrate_live_mtty", |g| {
            migrate::live_migrates_mtty(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_migrate_without_override_fails", |g| {
            migrate::fails_without_override(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt90_nova_manages_mdev", |g| {
            nova::manages_mdev(g, Libvirt::V9_0)
        }),
        Test::one_boot("libvirt113_nodedev_lists_mdev_parents", |g| {
            nodedev::lists_mdev_parents(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_nodedev_define_start_destroy_undefine", |g| {
            nodedev::define_start_destroy_undefine(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_nodedev_create_destroy", |g| {
            nodedev::create_destroy(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_nodedev_view_follows_vgpud", |g| {
            nodedev::view_follows_vgpud(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_nodedev_update_defined", |g| {
            nodedev::update_defined(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_domain_boots_with_mdev", |g| {
            domain::boots_with_mdev(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_domain_boots_with_vf", |g| {
            domain::boots_with_vf(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_hook_creates_and_removes", |g| {
            domain::hook_creates_and_removes(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_mixed_with_real_mdevctl", |g| {
            mixed::mixed_with_real_mdevctl(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_migrate_live_mtty", |g| {
            migrate::live_migrates_mtty(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_migrate_without_override_fails", |g| {
            migrate::fails_without_override(g, Libvirt::V11_3)
        }),
        Test::one_boot("libvirt113_nova_manages_mdev", |g| {
            nova::manages_mdev(g, Libvirt::V11_3)
        }),
    ]
}
