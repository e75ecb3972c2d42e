//! The samples host against values measured in the real-kernel test guest (QEMU q35 + intel-iommu,
//! stock Debian 6.12.117, default topology of scripts/vm/topologies.sh): sysfs contents and the errno
//! of every write in a recorded sequence.

use nix::errno::Errno;

use super::*;

const IGB: &str = "/sys/bus/pci/devices/0000:01:00.0";
const NVME: &str = "/sys/bus/pci/devices/0000:02:00.0";

/// Values measured in the real-kernel test guest (stock Debian 6.12.117, default topology): what the
/// samples host must reproduce for the parity harness.
#[test]
fn samples_host_matches_the_captured_guest() {
    let h = SimHost::builtin("samples").unwrap();
    let dev = |a: &str, f: &str| rd(&h, &format!("/sys/bus/pci/devices/{a}/{f}"));
    assert_eq!(dev("0000:00:02.0", "subsystem_vendor"), "0x1b36");
    assert_eq!(dev("0000:00:02.0", "subsystem_device"), "0x0000");
    assert_eq!(dev("0000:01:00.0", "subsystem_vendor"), "0x1af4");
    assert_eq!(dev("0000:02:00.0", "sriov_vf_device"), "10");
    assert_eq!(dev("0000:00:1f.0", "revision"), "0x02");
    assert_eq!(
        rd(&h, "/sys/kernel/iommu_groups/4/reserved_regions"),
        "0x0000000000000000 0x0000000000ffffff direct-relaxable\n0x00000000fee00000 0x00000000feefffff msi"
    );
    assert_eq!(rd(&h, "/sys/kernel/iommu_groups/4/type"), "identity");
    // An mdev takes group 7 …
    let u = "11111111-2222-4333-8444-555555555555";
    wr(
        &h,
        "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-medium/create",
        u,
    );
    assert_eq!(
        h.read_link(&p(&format!("/sys/bus/mdev/devices/{u}/iommu_group")))
            .unwrap(),
        p("../../../../../kernel/iommu_groups/7")
    );
    assert_eq!(
        h.read_link(&p(&format!("/sys/bus/mdev/devices/{u}/driver")))
            .unwrap(),
        p("../../../../../bus/mdev/drivers/mbochs")
    );
    assert_eq!(rd(&h, "/sys/kernel/iommu_groups/7/reserved_regions"), "");
    wr(&h, &format!("/sys/bus/mdev/devices/{u}/remove"), "1");
    // … and after its removal two igb VFs take 7 and 8, two nvme VFs 9 and 10.
    wr(&h, &format!("{IGB}/sriov_numvfs"), "2");
    wr(&h, &format!("{NVME}/sriov_numvfs"), "2");
    for (vf, g) in [
        ("0000:01:10.0", "7"),
        ("0000:01:10.2", "8"),
        ("0000:02:00.1", "9"),
        ("0000:02:00.2", "10"),
    ] {
        assert_eq!(
            link_name(&h, &format!("/sys/bus/pci/devices/{vf}/iommu_group")).as_deref(),
            Some(g)
        );
        assert_eq!(dev(vf, "subsystem_device"), "0x1100");
        assert_eq!(
            link_name(&h, &format!("/sys/bus/pci/devices/{vf}/driver")),
            None
        );
    }
    assert_eq!(dev("0000:01:10.2", "revision"), "0x01");
}

/// One sysfs write of the captured scenario: label, path, value, and the errno the guest answered
/// (`None`: success).
type PreflightStep = (&'static str, &'static str, &'static str, Option<Errno>);

/// A write sequence run in the real-kernel test guest (stock Debian 6.12.117, default topology, with
/// busybox `dd`), each write's result recorded; the samples host must answer every step the same way.
#[test]
fn samples_host_answers_the_captured_write_sequence() {
    let before_remove: &[PreflightStep] = &[
        (
            "create",
            "/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/create",
            "0b0c0d0e-0000-4000-8000-000000000001",
            None,
        ),
        (
            "dup on another parent",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
            "0b0c0d0e-0000-4000-8000-000000000001",
            Some(Errno::EEXIST),
        ),
        (
            "short",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
            "abc",
            Some(Errno::EINVAL),
        ),
        (
            "not a uuid",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
            "0b0c0d0e-0000-4000-8000-00000000000Z",
            Some(Errno::EINVAL),
        ),
        (
            "upper case",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
            "0B0C0D0E-0000-4000-8000-0000000000AA",
            None,
        ),
        (
            "37th char",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
            "0b0c0d0e-0000-4000-8000-0000000000abx",
            None,
        ),
        (
            "unknown type",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-huge/create",
            "0b0c0d0e-0000-4000-8000-000000000003",
            Some(Errno::ENOENT),
        ),
        (
            "large 1",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-large/create",
            "0b0c0d0e-0000-4000-8000-000000000101",
            None,
        ),
        (
            "large 2",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-large/create",
            "0b0c0d0e-0000-4000-8000-000000000102",
            None,
        ),
        (
            "large 3",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-large/create",
            "0b0c0d0e-0000-4000-8000-000000000103",
            None,
        ),
        (
            "large 4 (8 MB left)",
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-large/create",
            "0b0c0d0e-0000-4000-8000-000000000104",
            Some(Errno::ENOSPC),
        ),
        (
            "mdpy 1",
            "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create",
            "0b0c0d0e-0000-4000-8000-000000000201",
            None,
        ),
        (
            "mdpy 2",
            "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create",
            "0b0c0d0e-0000-4000-8000-000000000202",
            None,
        ),
        (
            "mdpy 3",
            "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create",
            "0b0c0d0e-0000-4000-8000-000000000203",
            None,
        ),
        (
            "mdpy 4",
            "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create",
            "0b0c0d0e-0000-4000-8000-000000000204",
            None,
        ),
        (
            "mdpy 5",
            "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create",
            "0b0c0d0e-0000-4000-8000-000000000205",
            Some(Errno::EUSERS),
        ),
    ];
    let after_mtty: &[PreflightStep] = &[
        (
            "remove: not a number",
            "/sys/bus/mdev/devices/0b0c0d0e-0000-4000-8000-000000000001/remove",
            "yes",
            Some(Errno::EINVAL),
        ),
        (
            "remove 0",
            "/sys/bus/mdev/devices/0b0c0d0e-0000-4000-8000-000000000001/remove",
            "0",
            None,
        ),
        (
            "remove",
            "/sys/bus/mdev/devices/0b0c0d0e-0000-4000-8000-000000000001/remove",
            "1",
            None,
        ),
        (
            "remove again",
            "/sys/bus/mdev/devices/0b0c0d0e-0000-4000-8000-000000000001/remove",
            "1",
            Some(Errno::ENOENT),
        ),
        (
            "numvfs word",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "two",
            Some(Errno::EINVAL),
        ),
        (
            "numvfs > u16",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "65536",
            Some(Errno::EINVAL),
        ),
        (
            "numvfs > total",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "8",
            Some(Errno::ERANGE),
        ),
        (
            "numvfs 2",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "2",
            None,
        ),
        (
            "numvfs 2 → 3",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "3",
            Some(Errno::EBUSY),
        ),
        (
            "numvfs 2 again",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "2",
            None,
        ),
        (
            "numvfs 0",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "0",
            None,
        ),
        (
            "autoprobe word",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_drivers_autoprobe",
            "maybe",
            Some(Errno::EINVAL),
        ),
        (
            "unbind igb",
            "/sys/bus/pci/drivers/igb/unbind",
            "0000:01:00.0",
            None,
        ),
        (
            "numvfs without driver",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "2",
            Some(Errno::ENOENT),
        ),
        (
            "numvfs 0 without driver",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "0",
            None,
        ),
        (
            "bind a device that is gone",
            "/sys/bus/pci/drivers/igb/bind",
            "0000:09:00.0",
            Some(Errno::ENODEV),
        ),
        (
            "bind by short address",
            "/sys/bus/pci/drivers/igb/bind",
            "01:00.0",
            Some(Errno::ENODEV),
        ),
        (
            "vfio-pci without override",
            "/sys/bus/pci/drivers/vfio-pci/bind",
            "0000:01:00.0",
            Some(Errno::ENODEV),
        ),
        (
            "override",
            "/sys/bus/pci/devices/0000:01:00.0/driver_override",
            "vfio-pci",
            None,
        ),
        (
            "igb against the override",
            "/sys/bus/pci/drivers/igb/bind",
            "0000:01:00.0",
            Some(Errno::ENODEV),
        ),
        (
            "vfio-pci bind",
            "/sys/bus/pci/drivers/vfio-pci/bind",
            "0000:01:00.0",
            None,
        ),
        (
            "vfio-pci bind again",
            "/sys/bus/pci/drivers/vfio-pci/bind",
            "0000:01:00.0",
            Some(Errno::EBUSY),
        ),
        (
            "numvfs under vfio-pci",
            "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs",
            "2",
            Some(Errno::ENOENT),
        ),
        (
            "unbind from the wrong driver",
            "/sys/bus/pci/drivers/igb/unbind",
            "0000:01:00.0",
            Some(Errno::ENODEV),
        ),
        (
            "drivers_probe a device that is gone",
            "/sys/bus/pci/drivers_probe",
            "0000:09:00.0",
            Some(Errno::ENODEV),
        ),
        (
            "nvme VFs",
            "/sys/bus/pci/devices/0000:02:00.0/sriov_numvfs",
            "2",
            None,
        ),
        (
            "nvme bind of a VF",
            "/sys/bus/pci/drivers/nvme/bind",
            "0000:02:00.1",
            Some(Errno::ENODEV),
        ),
        (
            "unbind nvme (VFs stay)",
            "/sys/bus/pci/drivers/nvme/unbind",
            "0000:02:00.0",
            None,
        ),
        (
            "override nvme PF",
            "/sys/bus/pci/devices/0000:02:00.0/driver_override",
            "vfio-pci",
            None,
        ),
        (
            "vfio-pci on a PF with VFs",
            "/sys/bus/pci/drivers/vfio-pci/bind",
            "0000:02:00.0",
            Some(Errno::EBUSY),
        ),
        (
            "unbind a root port",
            "/sys/bus/pci/drivers/pcieport/unbind",
            "0000:00:03.0",
            None,
        ),
        (
            "override root port",
            "/sys/bus/pci/devices/0000:00:03.0/driver_override",
            "vfio-pci",
            None,
        ),
        (
            "vfio-pci on a bridge",
            "/sys/bus/pci/drivers/vfio-pci/bind",
            "0000:00:03.0",
            Some(Errno::EINVAL),
        ),
        (
            "offline NUMA node",
            "/sys/bus/pci/devices/0000:00:01.0/numa_node",
            "1",
            Some(Errno::EINVAL),
        ),
        (
            "NUMA node -2",
            "/sys/bus/pci/devices/0000:00:01.0/numa_node",
            "-2",
            Some(Errno::EINVAL),
        ),
        (
            "read-only attribute",
            "/sys/bus/pci/devices/0000:00:01.0/vendor",
            "1",
            Some(Errno::EACCES),
        ),
    ];
    let h = SimHost::builtin("samples").unwrap();
    let run = |steps: &[PreflightStep]| {
        for (label, path, value, want) in steps {
            let got = h.write(&p(path), value).err().map(|e| e.errno);
            assert_eq!(got, *want, "{label}: {path} <- {value:?}");
        }
    };
    run(before_remove);
    // Then twelve dual-port mtty: 11 fit in the 23 ports the single-port one left, the 12th gets
    // ENOSPC.
    let mtty2 = "/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create";
    for i in 1..=12 {
        let got = h
            .write(
                &p(mtty2),
                &format!("0b0c0d0e-0000-4000-8000-0000000003{i:02}"),
            )
            .err()
            .map(|e| e.errno);
        assert_eq!(got, (i == 12).then_some(Errno::ENOSPC), "mtty-2 #{i}");
    }
    // Measured at this point: 1 port left; 14 small mbochs (256 - 3×64 - 2×4 = 56 MB).
    assert_eq!(
        rd(
            &h,
            "/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/available_instances"
        ),
        "1"
    );
    assert_eq!(
        rd(
            &h,
            "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/available_instances"
        ),
        "14"
    );
    run(after_mtty);
    assert_eq!(
        rd(&h, "/sys/bus/pci/devices/0000:01:00.0/sriov_totalvfs"),
        "8"
    );
    assert_eq!(
        rd(&h, "/sys/bus/pci/devices/0000:02:00.0/sriov_numvfs"),
        "2"
    );
}
