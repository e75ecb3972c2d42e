//! `sriov_numvfs` and VF life cycle on the test-guest host.

use nix::errno::Errno;

use super::*;

const IGB: &str = "/sys/bus/pci/devices/0000:01:00.0";
const NVME: &str = "/sys/bus/pci/devices/0000:02:00.0";

#[test]
fn numvfs_checks_in_the_kernels_order() {
    let h = SimHost::builtin("samples").unwrap();
    let numvfs = format!("{IGB}/sriov_numvfs");
    // igb lowers TotalVFs 8 to 7 while bound (igb_probe → pci_sriov_set_totalvfs).
    assert_eq!(rd(&h, &format!("{IGB}/sriov_totalvfs")), "7");
    assert_eq!(rd(&h, &format!("{IGB}/sriov_vf_device")), "10ca");
    assert_eq!(rd(&h, &format!("{IGB}/sriov_offset")), "128");
    assert_eq!(rd(&h, &format!("{IGB}/sriov_stride")), "2");
    assert_eq!(rd(&h, &numvfs), "0");
    assert_eq!(wr_err(&h, &numvfs, "two"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &numvfs, "-1"), Errno::EINVAL);
    // Beyond u16 is a kstrtou16 failure: EINVAL, not ERANGE.
    assert_eq!(wr_err(&h, &numvfs, "65536"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &numvfs, "8"), Errno::ERANGE);
    // Equal to the current count: success without a driver check.
    wr(&h, &numvfs, "0");
    wr(&h, &numvfs, "2\n");
    assert_eq!(rd(&h, &numvfs), "2");
    assert_eq!(wr_err(&h, &numvfs, "3"), Errno::EBUSY);
    wr(&h, &numvfs, "2");
    wr(&h, &numvfs, "0");
    assert_eq!(rd(&h, &numvfs), "0");
}

#[test]
fn vfs_appear_with_links_groups_and_drivers() {
    let h = SimHost::builtin("samples").unwrap();
    let groups_before = h.list(&p("/sys/kernel/iommu_groups")).unwrap();
    wr(&h, &format!("{IGB}/sriov_numvfs"), "2");
    // QEMU igb routing: offset 0x80, stride 2.
    let vfs = ["0000:01:10.0", "0000:01:10.2"];
    for (i, vf) in vfs.iter().enumerate() {
        let dev = format!("/sys/bus/pci/devices/{vf}");
        assert_eq!(rd(&h, &format!("{dev}/device")), "0x10ca");
        assert_eq!(rd(&h, &format!("{dev}/vendor")), "0x8086");
        assert_eq!(
            h.canonicalize(&p(&format!("{dev}/physfn"))).unwrap(),
            h.canonicalize(&p(IGB)).unwrap()
        );
        assert_eq!(
            h.canonicalize(&p(&format!("{IGB}/virtfn{i}"))).unwrap(),
            h.canonicalize(&p(&dev)).unwrap()
        );
        assert_eq!(
            h.read_link(&p(&format!("{IGB}/virtfn{i}"))).unwrap(),
            p(&format!("../{vf}"))
        );
        // Autoprobe is on, but the guest has no igbvf loaded: they stay free.
        assert_eq!(link_name(&h, &format!("{dev}/driver")), None);
        // Own groups, new numbers.
        let g = link_name(&h, &format!("{dev}/iommu_group")).unwrap();
        assert!(!groups_before.contains(&g));
        assert_eq!(
            h.list(&p(&format!("/sys/kernel/iommu_groups/{g}/devices")))
                .unwrap(),
            vec![vf.to_string()]
        );
        // VFs carry no SR-IOV attributes of their own.
        assert!(!h.exists(&p(&format!("{dev}/sriov_numvfs"))));
    }
    wr(&h, &format!("{IGB}/sriov_numvfs"), "0");
    for vf in vfs {
        assert!(!h.exists(&p(&format!("/sys/bus/pci/devices/{vf}"))));
    }
    assert!(!h.exists(&p(&format!("{IGB}/virtfn0"))));
    assert_eq!(
        h.list(&p("/sys/kernel/iommu_groups")).unwrap(),
        groups_before
    );
}

#[test]
fn numvfs_needs_a_bound_driver_with_sriov_configure() {
    let h = SimHost::builtin("samples").unwrap();
    wr(&h, "/sys/bus/pci/drivers/igb/unbind", "0000:01:00.0");
    // Unbound: the capability's TotalVFs again (pci_iov_remove resets driver_max_VFs).
    assert_eq!(rd(&h, &format!("{IGB}/sriov_totalvfs")), "8");
    assert_eq!(
        wr_err(&h, &format!("{IGB}/sriov_numvfs"), "2"),
        Errno::ENOENT
    );
    // vfio-pci has sriov_configure but returns ENOENT without enable_sriov.
    wr(&h, &format!("{IGB}/driver_override"), "vfio-pci");
    wr(&h, "/sys/bus/pci/drivers/vfio-pci/bind", "0000:01:00.0");
    assert_eq!(
        link_name(&h, &format!("{IGB}/driver")).as_deref(),
        Some("vfio-pci")
    );
    assert_eq!(
        wr_err(&h, &format!("{IGB}/sriov_numvfs"), "2"),
        Errno::ENOENT
    );
    assert_eq!(
        wr_err(&h, &format!("{IGB}/sriov_numvfs"), "9"),
        Errno::ERANGE
    );
}

#[test]
fn autoprobe_off_leaves_vfs_for_vfio_pci() {
    let h = SimHost::builtin("samples").unwrap();
    let ap = format!("{NVME}/sriov_drivers_autoprobe");
    assert_eq!(rd(&h, &ap), "1");
    assert_eq!(wr_err(&h, &ap, "maybe"), Errno::EINVAL);
    wr(&h, &ap, "0");
    assert_eq!(rd(&h, &ap), "0");
    wr(&h, &format!("{NVME}/sriov_numvfs"), "2");
    let vf = "/sys/bus/pci/devices/0000:02:00.1";
    assert!(h.exists(&p("/sys/bus/pci/devices/0000:02:00.2")));
    assert_eq!(link_name(&h, &format!("{vf}/driver")), None);
    // Without an override the VF cannot probe (pci_device_can_probe), even through bind.
    assert_eq!(
        wr_err(&h, "/sys/bus/pci/drivers/nvme/bind", "0000:02:00.1"),
        Errno::ENODEV
    );
    wr(&h, "/sys/bus/pci/drivers_probe", "0000:02:00.1");
    assert_eq!(link_name(&h, &format!("{vf}/driver")), None);
    // The documented flow: override, then drivers_probe.
    wr(&h, &format!("{vf}/driver_override"), "vfio-pci\n");
    assert_eq!(rd(&h, &format!("{vf}/driver_override")), "vfio-pci");
    wr(&h, "/sys/bus/pci/drivers_probe", "0000:02:00.1\n");
    assert_eq!(
        link_name(&h, &format!("{vf}/driver")).as_deref(),
        Some("vfio-pci")
    );
    assert!(h.exists(&p("/sys/bus/pci/drivers/vfio-pci/0000:02:00.1")));
    // And back.
    wr(&h, "/sys/bus/pci/drivers/vfio-pci/unbind", "0000:02:00.1");
    wr(&h, &format!("{vf}/driver_override"), "\n");
    assert_eq!(rd(&h, &format!("{vf}/driver_override")), "(null)");
    assert_eq!(link_name(&h, &format!("{vf}/driver")), None);
}

#[test]
fn unbinding_a_pf_disables_sriov_only_if_its_driver_does() {
    let h = SimHost::builtin("samples").unwrap();
    // igb_remove disables SR-IOV.
    wr(&h, &format!("{IGB}/sriov_numvfs"), "2");
    wr(&h, "/sys/bus/pci/drivers/igb/unbind", "0000:01:00.0");
    assert_eq!(rd(&h, &format!("{IGB}/sriov_numvfs")), "0");
    assert!(!h.exists(&p("/sys/bus/pci/devices/0000:01:10.0")));
    // nvme_remove does not: the VFs stay, and nothing can disable them without a driver.
    wr(&h, &format!("{NVME}/sriov_numvfs"), "2");
    wr(&h, "/sys/bus/pci/drivers/nvme/unbind", "0000:02:00.0");
    assert_eq!(rd(&h, &format!("{NVME}/sriov_numvfs")), "2");
    assert!(h.exists(&p("/sys/bus/pci/devices/0000:02:00.1")));
    assert_eq!(
        wr_err(&h, &format!("{NVME}/sriov_numvfs"), "0"),
        Errno::ENOENT
    );
    // vfio-pci refuses a PF with VFs enabled (vfio_pci_core_register_device: -EBUSY).
    wr(&h, &format!("{NVME}/driver_override"), "vfio-pci");
    assert_eq!(
        wr_err(&h, "/sys/bus/pci/drivers/vfio-pci/bind", "0000:02:00.0"),
        Errno::EBUSY
    );
    // Rebinding nvme lets SR-IOV be disabled again.
    wr(&h, &format!("{NVME}/driver_override"), "");
    wr(&h, "/sys/bus/pci/drivers/nvme/bind", "0000:02:00.0");
    wr(&h, &format!("{NVME}/sriov_numvfs"), "0");
    assert!(!h.exists(&p("/sys/bus/pci/devices/0000:02:00.1")));
}

#[test]
fn initial_vfs_and_driverless_sriov_pf_of_the_demo() {
    let h = SimHost::builtin("demo").unwrap();
    // GIM enabled 4 VFs at load; they match no driver and stay free.
    let mi = "/sys/bus/pci/devices/0000:86:00.0";
    assert_eq!(rd(&h, &format!("{mi}/sriov_numvfs")), "4");
    assert_eq!(rd(&h, &format!("{mi}/sriov_totalvfs")), "8");
    let vf = format!("{mi}/virtfn3");
    assert_eq!(rd(&h, &format!("{vf}/device")), "0x74b5");
    assert_eq!(link_name(&h, &format!("{vf}/driver")), None);
    // GIM has no sriov_configure.
    assert_eq!(
        wr_err(&h, &format!("{mi}/sriov_numvfs"), "0"),
        Errno::ENOENT
    );
    // The L40S has 32 VFs on nvidia.
    let l40s = "/sys/bus/pci/devices/0000:85:00.0";
    assert_eq!(rd(&h, &format!("{l40s}/sriov_numvfs")), "32");
    assert_eq!(
        link_name(&h, &format!("{l40s}/virtfn31/driver")).as_deref(),
        Some("nvidia")
    );
    assert_eq!(
        h.canonicalize(&p(&format!("{l40s}/virtfn0"))).unwrap(),
        p("/sys/devices/pci0000:80/0000:80:02.0/0000:85:00.4")
    );
}
