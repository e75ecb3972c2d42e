//! Discovery on trees where one device cannot be read: that device is reported as faulted (path, errno
//! or text, fix) and every other device is listed exactly as on the healthy tree; a device that goes
//! away while it is read is simply absent.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::path::{Path, PathBuf};

use mdev_types::fault::{DeviceFault, FaultCause, FaultScope};
use mdev_types::model::Inventory;
use vgpu_host::discover::discover;
use vgpu_host::{Errno, Host, HostError, HostOp, SysfsHost};
use vgpu_sim::SimHost;

/// The demo host (two T4 mdev parents, SR-IOV PFs, a running mdev) written out below a temp dir.
fn demo_tree() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    SimHost::builtin("demo")
        .unwrap()
        .materialize(tmp.path())
        .unwrap();
    tmp
}

fn read(root: &Path) -> Inventory {
    discover(&SysfsHost::new(root).unwrap()).expect("the host is read despite one faulty device")
}

/// The file a kernel path names below `root` (following the tree's links).
fn real(root: &Path, kernel: &str) -> PathBuf {
    std::fs::canonicalize(root.join(kernel.trim_start_matches('/'))).unwrap()
}

/// The first PCI mdev parent of the healthy tree (a T4).
fn pci_parent(inv: &Inventory) -> String {
    inv.mdev_parents
        .iter()
        .find(|p| p.pci.is_some())
        .expect("the demo host has PCI mdev parents")
        .name
        .clone()
}

/// Replaces the `PCI_ID=` line of `addr`'s `uevent` in the tree below `root` with `line`.
fn set_pci_id(root: &Path, addr: &str, line: &str) -> PathBuf {
    let path = real(root, &format!("/sys/bus/pci/devices/{addr}/uevent"));
    let text = std::fs::read_to_string(&path).unwrap();
    let edited: Vec<&str> = text
        .lines()
        .map(|l| if l.starts_with("PCI_ID=") { line } else { l })
        .collect();
    assert_ne!(edited.join("\n") + "\n", text, "no PCI_ID line in {text}");
    std::fs::write(&path, edited.join("\n") + "\n").unwrap();
    PathBuf::from(format!("/sys/bus/pci/devices/{addr}/uevent"))
}

/// Removes every PCI function's `uevent` from the tree below `root` (a tree captured without them).
fn remove_uevents(root: &Path) {
    for e in std::fs::read_dir(root.join("sys/bus/pci/devices")).unwrap() {
        let dev = std::fs::canonicalize(e.unwrap().path()).unwrap();
        std::fs::remove_file(dev.join("uevent")).unwrap();
    }
}

fn only_fault(inv: &Inventory) -> &DeviceFault {
    assert_eq!(inv.faults.len(), 1, "one fault: {:#?}", inv.faults);
    &inv.faults[0]
}

/// Everything but `gpu` (and, when `pci`, its PCI function) is listed as before.
fn rest_unchanged(before: &Inventory, after: &Inventory, gpu: &str, pci: bool) {
    let others = |i: &Inventory| -> Vec<String> {
        i.gpus
            .iter()
            .filter(|g| g.id != gpu)
            .map(|g| format!("{g:?}"))
            .collect()
    };
    assert_eq!(others(after), others(before));
    assert!(
        after.gpus.len() >= 2,
        "the other GPUs are listed: {:?}",
        after.gpus
    );
    if pci {
        let without: Vec<_> = before
            .pci_devices
            .iter()
            .filter(|d| d.address.to_string() != gpu)
            .collect();
        assert_eq!(after.pci_devices.iter().collect::<Vec<_>>(), without);
    } else {
        let without: Vec<_> = before
            .mdev_parents
            .iter()
            .filter(|p| p.name != gpu)
            .collect();
        assert_eq!(after.mdev_parents.iter().collect::<Vec<_>>(), without);
        assert_eq!(after.pci_devices, before.pci_devices);
    }
    assert!(after.fault_of(gpu).is_some());
}

#[test]
fn an_empty_pci_id_faults_that_device_only() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let victim = pci_parent(&before);
    let path = set_pci_id(tmp.path(), &victim, "PCI_ID=");
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert_eq!(f.scope, FaultScope::PciDevice);
    assert_eq!(f.device, victim);
    assert_eq!(f.path, path);
    assert!(
        matches!(&f.cause, FaultCause::Malformed { text: Some(t), .. } if t.is_empty()),
        "{f}"
    );
    assert!(f.to_string().contains("PCI_ID"), "{f}");
    assert!(f.fix.is_some());
    rest_unchanged(&before, &after, &victim, true);
    // Its mdev parent reads fine and stays listed: its instances are not lost.
    assert_eq!(after.mdev_parents, before.mdev_parents);
    assert_eq!(after.mdev_instances, before.mdev_instances);
}

/// A tree without `uevent` files (a capture that left them out) is read attribute by attribute:
/// the same inventory, and a fault in one attribute is that device's alone.
#[test]
fn without_uevent_files_the_same_host_is_read_from_the_attributes() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    remove_uevents(tmp.path());
    assert_eq!(read(tmp.path()), before);
    let victim = pci_parent(&before);
    std::fs::write(
        real(tmp.path(), &format!("/sys/bus/pci/devices/{victim}/vendor")),
        "",
    )
    .unwrap();
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert_eq!(f.device, victim);
    assert_eq!(
        f.path,
        PathBuf::from(format!("/sys/bus/pci/devices/{victim}/vendor"))
    );
    assert!(
        matches!(&f.cause, FaultCause::Malformed { text: Some(t), .. } if t.is_empty()),
        "{f}"
    );
    rest_unchanged(&before, &after, &victim, true);
}

/// The identity read from `uevent` is the one the separate attributes give, device by device,
/// drivers included, on a host whose drivers changed after it was built.
#[test]
fn the_uevent_identity_is_the_attributes_identity() {
    let sim = SimHost::builtin("demo").unwrap();
    let inv = discover(&sim).unwrap();
    // Bind one driverless VF to vfio-pci, so that a driver appears after the tree was built.
    let vf = inv
        .pci_devices
        .iter()
        .find(|d| d.physfn.is_some() && d.driver.is_none())
        .expect("a driverless VF")
        .address;
    vgpu_host::ops::bind_driver(&sim, &vf, "vfio-pci").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    sim.materialize(tmp.path()).unwrap();
    let with = read(tmp.path());
    assert_eq!(
        with.pci_devices
            .iter()
            .find(|d| d.address == vf)
            .unwrap()
            .driver
            .as_deref(),
        Some("vfio-pci")
    );
    remove_uevents(tmp.path());
    assert_eq!(read(tmp.path()), with);
}

#[test]
fn an_all_ones_vendor_is_a_device_off_the_bus() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let victim = pci_parent(&before);
    let path = set_pci_id(tmp.path(), &victim, "PCI_ID=FFFF:FFFF");
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert!(matches!(&f.cause, FaultCause::AllOnes { .. }), "{f}");
    assert_eq!(f.path, path);
    assert!(f.to_string().contains("no longer answers"), "{f}");
    rest_unchanged(&before, &after, &victim, true);
    // The same from the `vendor` attribute of a tree without `uevent`.
    let tmp = demo_tree();
    remove_uevents(tmp.path());
    std::fs::write(
        real(tmp.path(), &format!("/sys/bus/pci/devices/{victim}/vendor")),
        "0xffff\n",
    )
    .unwrap();
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert!(matches!(&f.cause, FaultCause::AllOnes { .. }), "{f}");
    assert!(f.path.ends_with("vendor"), "{f}");
    rest_unchanged(&before, &after, &victim, true);
}

fn first_type_dir(root: &Path, parent: &str) -> PathBuf {
    let dir = real(
        root,
        &format!("/sys/class/mdev_bus/{parent}/mdev_supported_types"),
    );
    let mut types: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    types.sort();
    types.remove(0)
}

#[test]
fn a_missing_available_instances_faults_that_parent_only() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let victim = pci_parent(&before);
    std::fs::remove_file(first_type_dir(tmp.path(), &victim).join("available_instances")).unwrap();
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert_eq!(f.scope, FaultScope::MdevParent);
    assert_eq!(f.device, victim);
    assert!(f.path.ends_with("available_instances"), "{f}");
    assert!(
        matches!(&f.cause, FaultCause::Errno { errno, code, .. } if errno == "ENOENT" && *code == Errno::ENOENT as i32),
        "{f}"
    );
    assert!(f.fix.is_some());
    rest_unchanged(&before, &after, &victim, false);
}

#[test]
fn an_out_of_range_available_instances_faults_that_parent_only() {
    for bad in ["-1\n", "4294967296\n", "\u{ff}\u{ff}\n"] {
        let tmp = demo_tree();
        let before = read(tmp.path());
        let victim = pci_parent(&before);
        std::fs::write(
            first_type_dir(tmp.path(), &victim).join("available_instances"),
            bad,
        )
        .unwrap();
        let after = read(tmp.path());
        let f = only_fault(&after);
        assert_eq!(
            (f.scope, f.device.as_str()),
            (FaultScope::MdevParent, victim.as_str())
        );
        assert!(
            matches!(&f.cause, FaultCause::Malformed { .. }),
            "{bad:?}: {f}"
        );
        rest_unchanged(&before, &after, &victim, false);
    }
}

#[test]
fn a_malformed_sriov_totalvfs_faults_that_pf_only() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let pf = before
        .gpus
        .iter()
        .find(|g| {
            before
                .pci_devices
                .iter()
                .any(|d| Some(d.address) == g.pci && d.sriov.is_some())
        })
        .expect("the demo host has an SR-IOV GPU")
        .id
        .clone();
    std::fs::write(
        real(
            tmp.path(),
            &format!("/sys/bus/pci/devices/{pf}/sriov_totalvfs"),
        ),
        "lots\n",
    )
    .unwrap();
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert_eq!(
        (f.scope, f.device.as_str()),
        (FaultScope::PciDevice, pf.as_str())
    );
    assert!(f.path.ends_with("sriov_totalvfs"), "{f}");
    assert!(f.to_string().contains("lots"), "{f}");
    rest_unchanged(&before, &after, &pf, true);
}

#[test]
fn a_symlink_loop_under_mdev_bus_faults_that_entry_only() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let class = tmp.path().join("sys/class/mdev_bus");
    std::os::unix::fs::symlink("looped", class.join("looped")).unwrap();
    let after = read(tmp.path());
    let f = only_fault(&after);
    assert_eq!(
        (f.scope, f.device.as_str()),
        (FaultScope::MdevParent, "looped")
    );
    assert!(
        matches!(&f.cause, FaultCause::Errno { errno, .. } if errno == "ELOOP"),
        "{f}"
    );
    assert!(f.fix.as_deref().is_some_and(|x| x.contains("loop")), "{f}");
    assert_eq!(after.mdev_parents, before.mdev_parents);
    assert_eq!(after.gpus, before.gpus);
    assert_eq!(after.mdev_instances, before.mdev_instances);
}

/// A host over a real tree where everything below `prefix` fails with `errno` and, when `gone`, no
/// longer exists (a device unplugged between the listing and the reads).
#[derive(Debug)]
struct Failing {
    inner: SysfsHost,
    prefix: PathBuf,
    errno: Errno,
    gone: bool,
}

impl Failing {
    fn check(&self, op: HostOp, path: &Path) -> Result<(), HostError> {
        if path.starts_with(&self.prefix) && path != self.prefix.parent().unwrap_or(Path::new("/"))
        {
            Err(HostError::new(op, path, self.errno))
        } else {
            Ok(())
        }
    }
}

impl Host for Failing {
    fn read(&self, path: &Path) -> Result<String, HostError> {
        self.check(HostOp::Read, path)?;
        self.inner.read(path)
    }
    fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
        self.inner.write(path, value)
    }
    fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
        self.check(HostOp::List, path)?;
        self.inner.list(path)
    }
    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.check(HostOp::ReadLink, path)?;
        self.inner.read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.check(HostOp::Canonicalize, path)?;
        self.inner.canonicalize(path)
    }
    fn exists(&self, path: &Path) -> bool {
        if self.gone && path.starts_with(&self.prefix) {
            return false;
        }
        self.inner.exists(path)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[test]
fn a_parent_that_vanishes_mid_walk_is_absent_not_faulted() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let victim = pci_parent(&before);
    let host = Failing {
        inner: SysfsHost::new(tmp.path()).unwrap(),
        prefix: PathBuf::from(format!("/sys/class/mdev_bus/{victim}")),
        errno: Errno::ENODEV,
        gone: true,
    };
    let after = discover(&host).unwrap();
    assert!(after.faults.is_empty(), "{:#?}", after.faults);
    let names: Vec<_> = after.mdev_parents.iter().map(|p| p.name.clone()).collect();
    let expected: Vec<_> = before
        .mdev_parents
        .iter()
        .map(|p| p.name.clone())
        .filter(|n| *n != victim)
        .collect();
    assert_eq!(names, expected);
}

#[test]
fn a_pci_device_that_vanishes_with_enodev_is_absent_not_faulted() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let victim = pci_parent(&before);
    let host = Failing {
        inner: SysfsHost::new(tmp.path()).unwrap(),
        prefix: PathBuf::from(format!("/sys/bus/pci/devices/{victim}")),
        errno: Errno::ENODEV,
        gone: true,
    };
    let after = discover(&host).unwrap();
    assert!(after.faults.is_empty(), "{:#?}", after.faults);
    assert!(
        after
            .pci_devices
            .iter()
            .all(|d| d.address.to_string() != victim)
    );
    assert_eq!(after.pci_devices.len(), before.pci_devices.len() - 1);
}

#[test]
fn an_eio_device_is_faulted_with_its_errno_and_a_fix() {
    let tmp = demo_tree();
    let before = read(tmp.path());
    let victim = pci_parent(&before);
    let host = Failing {
        inner: SysfsHost::new(tmp.path()).unwrap(),
        prefix: PathBuf::from(format!("/sys/bus/pci/devices/{victim}")),
        errno: Errno::EIO,
        gone: false,
    };
    let after = discover(&host).unwrap();
    let f = only_fault(&after);
    assert_eq!(
        (f.scope, f.device.as_str()),
        (FaultScope::PciDevice, victim.as_str())
    );
    assert!(
        matches!(&f.cause, FaultCause::Errno { errno, .. } if errno == "EIO"),
        "{f}"
    );
    assert!(f.fix.as_deref().is_some_and(|x| x.contains("dmesg")), "{f}");
    rest_unchanged(&before, &after, &victim, true);
}

#[test]
fn the_inventory_json_has_a_faults_list() {
    let tmp = demo_tree();
    let healthy = serde_json::to_value(read(tmp.path())).unwrap();
    assert_eq!(healthy["faults"], serde_json::json!([]));
    let class = tmp.path().join("sys/class/mdev_bus");
    std::os::unix::fs::symlink("looped", class.join("looped")).unwrap();
    let v = serde_json::to_value(read(tmp.path())).unwrap();
    let f = &v["faults"][0];
    assert_eq!(f["scope"], "mdev-parent");
    assert_eq!(f["device"], "looped");
    assert_eq!(f["cause"]["kind"], "errno");
    assert_eq!(f["cause"]["errno"], "ELOOP");
    // An inventory written before faults existed still reads.
    let mut old = healthy.clone();
    old.as_object_mut().unwrap().remove("faults");
    let back: Inventory = serde_json::from_value(old).unwrap();
    assert!(back.faults.is_empty());
}

/// `device_fault` reads just the GPU named and says what `discover` says of it: the fault of a GPU
/// whose PCI function reads back all ones, none for a healthy one, an absent one or a bad name.
#[test]
fn device_fault_of_one_gpu_is_what_discover_says() {
    let tmp = demo_tree();
    let healthy = read(tmp.path());
    let victim = pci_parent(&healthy);
    let host = SysfsHost::new(tmp.path()).unwrap();
    assert_eq!(vgpu_host::discover::device_fault(&host, &victim), None);
    set_pci_id(tmp.path(), &victim, "PCI_ID=FFFF:FFFF");
    let inv = read(tmp.path());
    let f = vgpu_host::discover::device_fault(&host, &victim).expect("a fault");
    assert_eq!(Some(&f), inv.fault_of(&victim));
    assert!(matches!(f.cause, FaultCause::AllOnes { .. }), "{f:?}");
    for other in healthy.gpus.iter().filter(|g| g.id != victim) {
        assert_eq!(
            vgpu_host::discover::device_fault(&host, &other.id),
            None,
            "{}",
            other.id
        );
    }
    assert_eq!(
        vgpu_host::discover::device_fault(&host, "0000:ff:1f.7"),
        None
    );
    assert_eq!(vgpu_host::discover::device_fault(&host, "../../etc"), None);
}

#[test]
fn discovery_without_groups_is_discovery_less_the_group_listings() {
    let tmp = demo_tree();
    let full = read(tmp.path());
    assert!(
        full.iommu_groups.len() >= 2,
        "the demo host has groups: {:?}",
        full.iommu_groups
    );
    // One group's listing becomes unreadable: a fault of the group in the full read only.
    let group = full.iommu_groups[0].group.0;
    let devices = real(
        tmp.path(),
        &format!("/sys/kernel/iommu_groups/{group}/devices"),
    );
    std::fs::remove_dir_all(&devices).unwrap();
    std::fs::write(&devices, "not a directory").unwrap();
    let host = SysfsHost::new(tmp.path()).unwrap();
    let mut full = discover(&host).unwrap();
    assert!(
        full.faults
            .iter()
            .any(|f| f.scope == FaultScope::IommuGroup),
        "{:#?}",
        full.faults
    );
    let lean = vgpu_host::discover::discover_without_groups(&host).unwrap();
    assert!(lean.iommu_groups.is_empty());
    full.iommu_groups.clear();
    full.faults.retain(|f| f.scope != FaultScope::IommuGroup);
    assert_eq!(lean, full, "everything else is read as discover reads it");
}

/// Counts the links read below `prefix`.
#[derive(Debug)]
struct CountingLinks {
    inner: SysfsHost,
    prefix: PathBuf,
    links: std::sync::atomic::AtomicUsize,
    /// Every file read, in order.
    reads: std::sync::Mutex<Vec<PathBuf>>,
}

impl Host for CountingLinks {
    fn read(&self, path: &Path) -> Result<String, HostError> {
        self.reads.lock().unwrap().push(path.to_path_buf());
        self.inner.read(path)
    }
    fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
        self.inner.write(path, value)
    }
    fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
        self.inner.list(path)
    }
    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
        if path.starts_with(&self.prefix) {
            self.links
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.inner.canonicalize(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[test]
fn an_instance_its_type_lists_is_read_without_its_identity_links() {
    let tmp = demo_tree();
    let host = || CountingLinks {
        inner: SysfsHost::new(tmp.path()).unwrap(),
        prefix: PathBuf::from("/sys/bus/mdev/devices"),
        links: Default::default(),
        reads: Default::default(),
    };
    let listed = host();
    let inv = discover(&listed).unwrap();
    let n = inv.mdev_instances.len();
    assert!(n >= 1, "the demo host runs an mdev");
    // Its IOMMU group and driver only: its parent and type come from its type's `devices`.
    assert_eq!(listed.links.into_inner(), 2 * n);

    // Not listed by its type (a tree in the middle of a change): read from its own links, alike.
    let i = &inv.mdev_instances[0];
    let entry = real(
        tmp.path(),
        &format!(
            "/sys/class/mdev_bus/{}/mdev_supported_types/{}",
            i.parent, i.type_id
        ),
    )
    .join("devices")
    .join(i.uuid.to_string());
    std::fs::remove_file(&entry).unwrap();
    let unlisted = host();
    let again = discover(&unlisted).unwrap();
    assert_eq!(again.mdev_instances, inv.mdev_instances);
    assert_eq!(unlisted.links.into_inner(), 2 * n + 2);
}

/// A PCI function's identity is one read of its `uevent`; `nvidia/` is looked for on NVIDIA VFs
/// only and `boot_vga` on VGA functions only, and both are still found there.
#[test]
fn a_pci_function_is_read_from_its_uevent_and_looked_at_only_for_what_it_can_have() {
    let tmp = demo_tree();
    let host = CountingLinks {
        inner: SysfsHost::new(tmp.path()).unwrap(),
        prefix: PathBuf::from("/sys/bus/pci/devices"),
        links: Default::default(),
        reads: Default::default(),
    };
    let inv = discover(&host).unwrap();
    let reads = host.reads.into_inner().unwrap();
    let of = |d: &mdev_types::model::PciDevice, tail: &str| -> usize {
        let dir = PathBuf::from(format!("/sys/bus/pci/devices/{}", d.address));
        reads
            .iter()
            .filter(|p| p.starts_with(&dir) && p.to_string_lossy().ends_with(tail))
            .count()
    };
    assert!(inv.pci_devices.iter().any(|d| d.nvidia_vf.is_some()));
    assert!(inv.pci_devices.iter().any(|d| d.boot_vga));
    for d in &inv.pci_devices {
        assert_eq!(of(d, "/uevent"), 1, "{}", d.address);
        for attr in ["/vendor", "/device", "/class", "/subsystem_vendor"] {
            assert_eq!(of(d, attr), 0, "{}{attr}", d.address);
        }
        let nvidia_vf = d.vendor.0 == 0x10de && d.physfn.is_some();
        assert_eq!(
            of(d, "/creatable_vgpu_types") > 0,
            nvidia_vf,
            "{}",
            d.address
        );
        assert_eq!(
            of(d, "/boot_vga") > 0,
            d.class >> 8 == 0x0300,
            "{}",
            d.address
        );
    }
}
