//! Driver binding: `bind`, `unbind`, `driver_override`, `drivers_probe`, `new_id`, `remove_id`,
//! `numa_node`.

use nix::errno::Errno;

use super::*;

const DRV: &str = "/sys/bus/pci/drivers";

#[test]
fn bind_and_unbind_errnos() {
    let h = SimHost::builtin("samples").unwrap();
    // Missing device, or not the full name sysfs_streq needs.
    assert_eq!(
        wr_err(&h, &format!("{DRV}/igb/bind"), "0000:09:00.0"),
        Errno::ENODEV
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/igb/bind"), "01:00.0"),
        Errno::ENODEV
    );
    // Already bound (to this driver).
    assert_eq!(
        wr_err(&h, &format!("{DRV}/igb/bind"), "0000:01:00.0"),
        Errno::EBUSY
    );
    // Not matching: vfio-pci without override, nvme for a NIC.
    assert_eq!(
        wr_err(&h, &format!("{DRV}/vfio-pci/bind"), "0000:01:00.0"),
        Errno::ENODEV
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/nvme/bind"), "0000:01:00.0"),
        Errno::ENODEV
    );
    // Matching through the override but bound elsewhere.
    wr(
        &h,
        "/sys/bus/pci/devices/0000:01:00.0/driver_override",
        "vfio-pci",
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/vfio-pci/bind"), "0000:01:00.0"),
        Errno::EBUSY
    );
    // With an override, the device's own driver no longer matches it.
    wr(&h, &format!("{DRV}/igb/unbind"), "0000:01:00.0\n");
    assert_eq!(
        wr_err(&h, &format!("{DRV}/igb/bind"), "0000:01:00.0"),
        Errno::ENODEV
    );
    // Unbind from a driver it is not bound to.
    assert_eq!(
        wr_err(&h, &format!("{DRV}/igb/unbind"), "0000:01:00.0"),
        Errno::ENODEV
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/nvme/unbind"), "0000:01:00.0"),
        Errno::ENODEV
    );
    wr(&h, &format!("{DRV}/vfio-pci/bind"), "0000:01:00.0");
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:01:00.0/driver").as_deref(),
        Some("vfio-pci")
    );
    assert!(!h.exists(&p(&format!("{DRV}/igb/0000:01:00.0"))));
    assert!(h.exists(&p(&format!("{DRV}/vfio-pci/0000:01:00.0"))));
}

#[test]
fn vfio_pci_probe_refusals() {
    let h = SimHost::builtin("samples").unwrap();
    // A bridge: vfio_pci_core_register_device refuses non-normal headers with EINVAL.
    wr(&h, &format!("{DRV}/pcieport/unbind"), "0000:00:02.0");
    wr(
        &h,
        "/sys/bus/pci/devices/0000:00:02.0/driver_override",
        "vfio-pci",
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/vfio-pci/bind"), "0000:00:02.0"),
        Errno::EINVAL
    );
    // drivers_probe hides probe failures.
    wr(&h, "/sys/bus/pci/drivers_probe", "0000:00:02.0");
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:00:02.0/driver"),
        None
    );
    assert_eq!(
        wr_err(&h, "/sys/bus/pci/drivers_probe", "0000:0f:00.0"),
        Errno::ENODEV
    );
}

#[test]
fn vfio_pci_needs_an_iommu_group() {
    let text = "
[[driver]]
name = \"vfio-pci\"
kind = \"vfio-pci\"

[[pci]]
address = \"0000:00:06.0\"
vendor = \"10de\"
device = \"2335\"
class = 0x030200
driver_override = \"vfio-pci\"
";
    let h = SimHost::from_toml("noiommu.toml", text).unwrap();
    // drivers/vfio/group.c vfio_group_find_or_alloc: no group and no noiommu → -EINVAL.
    assert_eq!(
        wr_err(&h, &format!("{DRV}/vfio-pci/bind"), "0000:00:06.0"),
        Errno::EINVAL
    );
    assert!(h.list(&p("/sys/kernel/iommu_groups")).unwrap().is_empty());
}

#[test]
fn driver_override_store_rules() {
    let h = SimHost::builtin("samples").unwrap();
    let o = "/sys/bus/pci/devices/0000:02:00.0/driver_override";
    assert_eq!(rd(&h, o), "(null)");
    wr(&h, o, "pci-stub\nignored");
    assert_eq!(rd(&h, o), "pci-stub");
    wr(&h, o, "");
    assert_eq!(rd(&h, o), "(null)");
    assert_eq!(wr_err(&h, o, &"x".repeat(4095)), Errno::EINVAL);
    wr(&h, o, &"x".repeat(4094));
    assert_eq!(rd(&h, o).len(), 4094);
}

#[test]
fn new_id_and_remove_id() {
    let h = SimHost::builtin("demo").unwrap();
    // The MI300X VFs match no driver; pci-stub has no static ids. A new id binds every unbound
    // matching device at once (do_pci_add_dynid → driver_attach).
    assert_eq!(
        wr_err(&h, &format!("{DRV}/pci-stub/new_id"), "1002"),
        Errno::EINVAL
    );
    wr(&h, &format!("{DRV}/pci-stub/new_id"), "1002 74b5\n");
    for vf in 0..4 {
        assert_eq!(
            link_name(
                &h,
                &format!("/sys/bus/pci/devices/0000:86:00.0/virtfn{vf}/driver")
            )
            .as_deref(),
            Some("pci-stub")
        );
    }
    // The PF stays with gim.
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:86:00.0/driver").as_deref(),
        Some("gim")
    );
    // The same id again, or one the static table has.
    assert_eq!(
        wr_err(&h, &format!("{DRV}/pci-stub/new_id"), "1002 74b5"),
        Errno::EEXIST
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/igb/new_id"), "8086 1521"),
        Errno::EEXIST
    );
    // vfio-pci's only static entry is override-only: a new id is accepted, and takes nothing
    // already bound.
    wr(&h, &format!("{DRV}/vfio-pci/new_id"), "10de 1eb8");
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:01:00.0/driver").as_deref(),
        Some("nvidia")
    );
    wr(&h, &format!("{DRV}/pci-stub/remove_id"), "1002 74b5");
    assert_eq!(
        wr_err(&h, &format!("{DRV}/pci-stub/remove_id"), "1002 74b5"),
        Errno::ENODEV
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/pci-stub/remove_id"), "zz"),
        Errno::EINVAL
    );
}

#[test]
fn a_driver_whose_probe_fails_on_vfs() {
    let h = SimHost::builtin("samples").unwrap();
    wr(&h, "/sys/bus/pci/devices/0000:02:00.0/sriov_numvfs", "2");
    // nvme_probe on QEMU's offline secondary controllers: -ENODEV; autoprobe left them unbound.
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:02:00.1/driver"),
        None
    );
    assert_eq!(
        wr_err(&h, &format!("{DRV}/nvme/bind"), "0000:02:00.1"),
        Errno::ENODEV
    );
    wr(
        &h,
        "/sys/bus/pci/devices/0000:02:00.1/driver_override",
        "vfio-pci",
    );
    wr(&h, &format!("{DRV}/vfio-pci/bind"), "0000:02:00.1");
}

#[test]
fn numa_node_store_rules() {
    let h = SimHost::builtin("samples").unwrap();
    let n = "/sys/bus/pci/devices/0000:01:00.0/numa_node";
    assert_eq!(rd(&h, n), "-1");
    assert_eq!(wr_err(&h, n, "-2"), Errno::EINVAL);
    assert_eq!(wr_err(&h, n, "1"), Errno::EINVAL);
    assert_eq!(wr_err(&h, n, "node0"), Errno::EINVAL);
    wr(&h, n, "0");
    assert_eq!(rd(&h, n), "0");
}
