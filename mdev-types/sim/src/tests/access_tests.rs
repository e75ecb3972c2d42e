//! VFS-level behaviour: permissions, missing paths, links, describe.

use std::path::Path;

use nix::errno::Errno;

use super::*;

const MTTY1: &str = "/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1";

#[test]
fn kernfs_access_errnos() {
    let h = SimHost::builtin("samples").unwrap();
    // Write-only attribute read, read-only attribute written: kernfs_fop_open → EACCES.
    assert_eq!(errno(h.read(&p(&format!("{MTTY1}/create")))), Errno::EACCES);
    assert_eq!(
        wr_err(&h, &format!("{MTTY1}/available_instances"), "3"),
        Errno::EACCES
    );
    assert_eq!(
        errno(h.read(Path::new("/sys/bus/pci/drivers/igb/bind"))),
        Errno::EACCES
    );
    // Directories.
    assert_eq!(wr_err(&h, MTTY1, "x"), Errno::EISDIR);
    assert_eq!(errno(h.read(&p(MTTY1))), Errno::EISDIR);
    assert_eq!(errno(h.list(&p(&format!("{MTTY1}/name")))), Errno::ENOTDIR);
    assert_eq!(
        errno(h.read(&p(&format!("{MTTY1}/name/x")))),
        Errno::ENOTDIR
    );
    // Missing paths, for every operation.
    let missing = p("/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-3/create");
    assert_eq!(errno(h.read(&missing)), Errno::ENOENT);
    assert_eq!(errno(h.write(&missing, "x")), Errno::ENOENT);
    assert_eq!(errno(h.list(&missing)), Errno::ENOENT);
    assert_eq!(errno(h.read_link(&missing)), Errno::ENOENT);
    assert_eq!(errno(h.canonicalize(&missing)), Errno::ENOENT);
    assert!(!h.exists(&missing));
    // readlink on a non-link.
    assert_eq!(
        errno(h.read_link(&p(&format!("{MTTY1}/name")))),
        Errno::EINVAL
    );
    let e = h.write(&missing, "abc").unwrap_err();
    assert_eq!(e.path, missing);
    assert_eq!(e.value.as_deref(), Some("abc"));
}

#[test]
fn links_are_relative_and_resolve() {
    let h = SimHost::builtin("samples").unwrap();
    assert_eq!(
        h.read_link(&p("/sys/bus/pci/devices/0000:01:00.0"))
            .unwrap(),
        p("../../../devices/pci0000:00/0000:00:02.0/0000:01:00.0")
    );
    assert_eq!(
        h.read_link(&p("/sys/bus/pci/devices/0000:01:00.0/driver"))
            .unwrap(),
        p("../../../../bus/pci/drivers/igb")
    );
    assert_eq!(
        h.canonicalize(&p("/sys/class/mdev_bus/mbochs")).unwrap(),
        p("/sys/devices/virtual/mbochs/mbochs")
    );
    assert_eq!(
        h.read_link(&p("/sys/class/mdev_bus/mbochs")).unwrap(),
        p("../../devices/virtual/mbochs/mbochs")
    );
    assert_eq!(
        rd(
            &h,
            "/sys/bus/pci/devices/0000:01:00.0/iommu_group/devices/0000:01:00.0/vendor"
        ),
        "0x8086"
    );
    let mut names = h.list(&p("/sys/class/mdev_bus")).unwrap();
    names.sort();
    assert_eq!(names, vec!["mbochs", "mdpy", "mtty"]);
}

#[test]
fn pci_attributes_print_like_the_kernel() {
    let h = SimHost::builtin("demo").unwrap();
    let t4 = "/sys/bus/pci/devices/0000:01:00.0";
    assert_eq!(rd(&h, &format!("{t4}/vendor")), "0x10de");
    assert_eq!(rd(&h, &format!("{t4}/device")), "0x1eb8");
    assert_eq!(rd(&h, &format!("{t4}/subsystem_vendor")), "0x10de");
    assert_eq!(rd(&h, &format!("{t4}/subsystem_device")), "0x12a2");
    assert_eq!(rd(&h, &format!("{t4}/class")), "0x030200");
    assert_eq!(rd(&h, &format!("{t4}/numa_node")), "0");
    assert_eq!(rd(&h, &format!("{t4}/driver_override")), "(null)");
    // boot_vga exists only on VGA-class devices.
    assert!(!h.exists(&p(&format!("{t4}/boot_vga"))));
    assert_eq!(rd(&h, "/sys/bus/pci/devices/0000:00:02.0/boot_vga"), "1");
    assert_eq!(
        rd(&h, "/sys/bus/pci/devices/0000:00:02.0/class"),
        "0x030000"
    );
    // The second T4 sits under the switch, on node 1, in the group with the host NIC.
    assert_eq!(
        h.canonicalize(&p("/sys/bus/pci/devices/0000:83:00.0"))
            .unwrap(),
        p("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:83:00.0")
    );
    assert_eq!(rd(&h, "/sys/bus/pci/devices/0000:83:00.0/numa_node"), "1");
    let members = h.list(&p("/sys/kernel/iommu_groups/11/devices")).unwrap();
    assert!(members.contains(&"0000:83:00.0".to_string()));
    assert!(members.contains(&"0000:84:00.0".to_string()));
    assert_eq!(
        link_name(&h, "/sys/bus/pci/devices/0000:84:00.0/driver").as_deref(),
        Some("igb")
    );
    assert_eq!(rd(&h, "/sys/kernel/iommu_groups/11/type"), "DMA");
    // Node numbers used by the demo.
    let nodes: std::collections::BTreeSet<String> = h
        .list(&p("/sys/bus/pci/devices"))
        .unwrap()
        .iter()
        .map(|a| rd(&h, &format!("/sys/bus/pci/devices/{a}/numa_node")))
        .collect();
    assert!(nodes.contains("0") && nodes.contains("1"), "{nodes:?}");
}

#[test]
fn clones_share_one_kernel() {
    let a = SimHost::builtin("samples").unwrap();
    let b = a.clone();
    wr(
        &a,
        &format!("{MTTY1}/create"),
        "6a1f3d7e-0c2b-4e8f-9a51-3b7c2d4e5f60",
    );
    assert_eq!(rd(&b, &format!("{MTTY1}/available_instances")), "23");
    assert_eq!(a.name(), "samples");
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimHost>();
}
