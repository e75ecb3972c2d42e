//! `vgpu_host::discover::discover` on the real kernel: what it reports about the sample parents, the
//! SR-IOV PFs and their VFs, mdev instances and IOMMU groups must match what sysfs says.

use mdev_types::ids::{IommuGroup, PciId};
use mdev_types::model::{Capability, Inventory, PciDevice, Vendor};
use mdev_types::parse::TypeDescription;
use vgpu_host::discover::discover;
use vgpu_host::paths;

use super::guest::{Guest, KernelKind, Topology};
use super::iommu::EDU;
use super::lifecycle::simulated_guest;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, SAMPLE_PARENTS, SAMPLE_TYPES, test_uuid};
use super::sriov::{IGB_VF, Pf, PfGuard};

/// The discovery tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("discover_sample_parents_and_types", sample_parents),
        Test::new("discover_sample_gpus", sample_gpus),
        Test::new("discover_sriov_pfs_and_vfs", sriov_pfs_and_vfs),
        Test::new("discover_mdev_instances_and_groups", mdev_instances),
        Test::new("discover_iommu_groups", iommu_groups),
        Test::new("discover_parity_with_simulated_host", parity),
    ]
}

fn inventory(g: &Guest) -> Result<Inventory, TestError> {
    discover(&g.host).map_err(|e| TestError::Check(format!("discover failed: {e}")))
}

fn pci<'i>(
    inv: &'i Inventory,
    addr: &mdev_types::ids::PciAddress,
) -> Result<&'i PciDevice, TestError> {
    inv.pci_devices
        .iter()
        .find(|d| d.address == *addr)
        .ok_or_else(|| TestError::Check(format!("discover does not list {addr}")))
}

/// The three sample parents with every type's attributes and parsed description.
fn sample_parents(g: &Guest) -> TestResult {
    let inv = inventory(g)?;
    let names: Vec<&str> = inv.mdev_parents.iter().map(|p| p.name.as_str()).collect();
    ensure_eq("mdev parents", names.as_slice(), SAMPLE_PARENTS)?;
    for p in &inv.mdev_parents {
        ensure_eq(format_args!("{} is not a PCI parent", p.name), p.pci, None)?;
        for t in SAMPLE_TYPES.iter().filter(|t| t.parent == p.name) {
            let found = p
                .types
                .iter()
                .find(|x| x.id.as_str() == t.id)
                .ok_or_else(|| TestError::Check(format!("{} lacks type {}", p.name, t.id)))?;
            ensure_eq(
                format_args!("{} name", t.id),
                found.name.as_deref(),
                Some(t.name),
            )?;
            ensure_eq(
                format_args!("{} description", t.id),
                found.description.as_deref().map(str::trim),
                t.description,
            )?;
            ensure_eq(
                format_args!("{} device_api", t.id),
                found.device_api.as_str(),
                "vfio-pci",
            )?;
            ensure_eq(
                format_args!("{} available_instances", t.id),
                found.available_instances,
                t.initial,
            )?;
            ensure(found.instances.is_empty(), || {
                format!("{} lists instances {:?}", t.id, found.instances)
            })?;
            let parsed_ok = match (&found.details, t.parent) {
                (TypeDescription::SampleVideoMemory { mib }, "mbochs") => {
                    t.description == Some(&*format!("virtual display, {mib} MB video memory"))
                }
                (TypeDescription::SampleFramebuffer { resolution }, "mdpy") => {
                    t.description == Some(&*format!("virtual display, {resolution} framebuffer"))
                }
                (TypeDescription::Unknown, "mtty") => true,
                _ => false,
            };
            ensure(parsed_ok, || {
                format!("{} description parsed as {:?}", t.id, found.details)
            })?;
        }
    }
    Ok(Outcome::Passed)
}

/// The display parents (mbochs, mdpy) are virtual GPUs with an mdev capability; mtty (serial) is not.
fn sample_gpus(g: &Guest) -> TestResult {
    let inv = inventory(g)?;
    let mut ids: Vec<&str> = inv
        .gpus
        .iter()
        .filter(|gpu| gpu.vendor == Vendor::Virtual)
        .map(|gpu| gpu.id.as_str())
        .collect();
    ids.sort_unstable();
    ensure_eq("virtual GPUs", ids.as_slice(), &["mbochs", "mdpy"][..])?;
    for gpu in inv.gpus.iter().filter(|gpu| gpu.vendor == Vendor::Virtual) {
        ensure_eq(
            format_args!("{} capabilities", gpu.id),
            gpu.capabilities.clone(),
            vec![Capability::Mdev { types: 3 }],
        )?;
    }
    Ok(Outcome::Passed)
}

/// Both PFs with their SR-IOV state; after enabling two igb VFs (autoprobe off) the PF lists them and
/// each VF points back to it, driverless.
fn sriov_pfs_and_vfs(g: &Guest) -> TestResult {
    let inv = inventory(g)?;
    for pf in [Pf::Igb, Pf::Nvme] {
        let addr = pf.find(&g.host)?;
        let d = pci(&inv, &addr)?;
        ensure_eq(
            format_args!("{addr} driver"),
            d.driver.as_deref(),
            Some(pf.driver()),
        )?;
        let s = d
            .sriov
            .as_ref()
            .ok_or_else(|| TestError::Check(format!("{addr} has no SR-IOV state")))?;
        ensure_eq(
            format_args!("{addr} total_vfs"),
            s.total_vfs,
            pf.total_vfs(),
        )?;
        ensure_eq(format_args!("{addr} num_vfs"), s.num_vfs, 0)?;
        ensure_eq(format_args!("{addr} autoprobe"), s.drivers_autoprobe, true)?;
        ensure(s.vfs.is_empty(), || format!("{addr} lists VFs {:?}", s.vfs))?;
    }
    let guard = PfGuard::new(&g.host, Pf::Igb)?;
    let vfs = guard.enable_vfs(2)?;
    let inv = inventory(g)?;
    let s = pci(&inv, &guard.addr())?
        .sriov
        .clone()
        .ok_or_else(|| TestError::Check("igb PF lost its SR-IOV state".into()))?;
    ensure_eq("igb num_vfs", s.num_vfs, 2)?;
    ensure_eq("igb autoprobe", s.drivers_autoprobe, false)?;
    ensure_eq("igb VFs", s.vfs.clone(), vfs.clone())?;
    // sriov_vf_device (Documentation/ABI/testing/sysfs-bus-pci) is the VF device id.
    ensure_eq("igb sriov_vf_device", s.vf_device, Some(PciId(IGB_VF.1)))?;
    for vf in &vfs {
        let d = pci(&inv, vf)?;
        ensure_eq(format_args!("{vf} physfn"), d.physfn, Some(guard.addr()))?;
        ensure_eq(format_args!("{vf} driver"), d.driver.clone(), None)?;
        ensure_eq(format_args!("{vf} device id"), d.device, PciId(IGB_VF.1))?;
        ensure(d.sriov.is_none(), || format!("VF {vf} claims SR-IOV state"))?;
    }
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}

/// Created mdevs appear as instances with parent, type, IOMMU group and driver, and in their type's
/// instance list with available_instances lowered.
fn mdev_instances(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    let a = test_uuid("discover_instances", 0);
    let b = test_uuid("discover_instances", 1);
    mdevs.create("mbochs", "mbochs-medium", a)?;
    mdevs.create("mtty", "mtty-2", b)?;
    let inv = inventory(g)?;
    for (uuid, parent, ty) in [(a, "mbochs", "mbochs-medium"), (b, "mtty", "mtty-2")] {
        let i = inv
            .mdev_instances
            .iter()
            .find(|i| i.uuid == uuid)
            .ok_or_else(|| TestError::Check(format!("discover does not list mdev {uuid}")))?;
        ensure_eq(format_args!("{uuid} parent"), i.parent.as_str(), parent)?;
        ensure_eq(format_args!("{uuid} type"), i.type_id.as_str(), ty)?;
        let group = g.iommu_group_of(&paths::mdev_device(&uuid))?;
        ensure_eq(
            format_args!("{uuid} group"),
            i.iommu_group,
            Some(IommuGroup(group)),
        )?;
        // The sample drivers register their mdev_driver under the parent's name (e.g. mbochs.c
        // `mbochs_driver.driver.name`).
        ensure_eq(
            format_args!("{uuid} driver"),
            i.driver.as_deref(),
            Some(parent),
        )?;
        let t = inv
            .mdev_parents
            .iter()
            .find(|p| p.name == parent)
            .and_then(|p| p.types.iter().find(|t| t.id.as_str() == ty))
            .ok_or_else(|| TestError::Check(format!("discover lost type {ty}")))?;
        ensure_eq(
            format_args!("{ty} instances"),
            t.instances.clone(),
            vec![uuid],
        )?;
        let info = inv
            .iommu_groups
            .iter()
            .find(|x| x.group == IommuGroup(group))
            .ok_or_else(|| TestError::Check(format!("discover lacks {uuid}'s group {group}")))?;
        ensure_eq(
            format_args!("group {group} mdevs"),
            info.mdevs.clone(),
            vec![uuid],
        )?;
        ensure(info.pci_devices.is_empty(), || {
            format!(
                "group {group} of {uuid} holds PCI devices {:?}",
                info.pci_devices
            )
        })?;
    }
    let small = inv
        .mdev_parents
        .iter()
        .find(|p| p.name == "mbochs")
        .and_then(|p| p.types.iter().find(|t| t.id.as_str() == "mbochs-small"))
        .map(|t| t.available_instances);
    ensure_eq("mbochs-small available with a medium", small, Some(60))?;
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// Every PCI device's group as discover reports it matches its iommu_group link; in the shared-group
/// topology one group holds the bridge and both edu devices.
fn iommu_groups(g: &Guest) -> TestResult {
    let inv = inventory(g)?;
    for d in &inv.pci_devices {
        let group = g.iommu_group_of(&paths::pci_device(&d.address))?;
        ensure_eq(
            format_args!("{} group", d.address),
            d.iommu_group,
            Some(IommuGroup(group)),
        )?;
        let info = inv
            .iommu_groups
            .iter()
            .find(|x| x.group == IommuGroup(group))
            .ok_or_else(|| TestError::Check(format!("discover lacks group {group}")))?;
        ensure(info.pci_devices.contains(&d.address), || {
            format!("group {group} as discovered lacks {}", d.address)
        })?;
    }
    let edus = g.pci_by_id(EDU.0, EDU.1)?;
    if g.topology == Topology::SharedGroup {
        let first = edus.first().ok_or_else(|| {
            TestError::Check("no edu devices in the shared-group topology".into())
        })?;
        let group = pci(&inv, first)?.iommu_group;
        let info = inv
            .iommu_groups
            .iter()
            .find(|x| Some(x.group) == group)
            .ok_or_else(|| TestError::Check(format!("discover lacks the edu group {group:?}")))?;
        ensure_eq("PCI members of the shared group", info.pci_devices.len(), 3)?;
        for e in &edus {
            ensure(info.pci_devices.contains(e), || {
                format!("shared group {:?} lacks {e}", info.pci_devices)
            })?;
        }
        let bridge = info
            .pci_devices
            .iter()
            .find(|a| !edus.contains(a))
            .ok_or_else(|| TestError::Check("the shared group has no bridge".into()))?;
        ensure(pci(&inv, bridge)?.is_bridge(), || {
            format!("{bridge}, the third member of the shared group, is not a bridge")
        })?;
    }
    Ok(Outcome::Passed)
}

/// discover on the simulated guest (mdev-types/sims/samples.toml) reports what it reports on the real
/// kernel: the same mdev parents and types, and — in the default topology, which the simulated host
/// mirrors — the same PCI devices, IOMMU groups and GPUs.
fn parity(g: &Guest) -> TestResult {
    let real = inventory(g)?;
    let mut sim = discover(&simulated_guest()?)
        .map_err(|e| TestError::Check(format!("discover on the simulated host failed: {e}")))?;
    if g.kernel == KernelKind::Custom {
        // The simulated host mirrors the stock 6.12 guest, where i2c-i801 is a module nobody loads; the
        // custom kernel builds it in (CONFIG_I2C_I801=y in ../shared/vm/.../config), so the q35 SMBus
        // function is bound there.
        for d in &mut sim.pci_devices {
            if d.address.to_string() == "0000:00:1f.3" {
                d.driver = Some("i801_smbus".to_string());
            }
        }
    }
    let mut diffs = Vec::new();
    if real.mdev_parents != sim.mdev_parents {
        diffs.push(format!(
            "mdev parents: real {:?} / simulated {:?}",
            real.mdev_parents, sim.mdev_parents
        ));
    }
    let addrs = |inv: &Inventory| -> Vec<String> {
        inv.pci_devices
            .iter()
            .map(|d| d.address.to_string())
            .collect()
    };
    for d in &sim.pci_devices {
        match real.pci_devices.iter().find(|r| r.address == d.address) {
            None => diffs.push(format!("{} is simulated but not in the guest", d.address)),
            Some(r) => {
                let mut r = r.clone();
                let mut s = d.clone();
                if g.topology != Topology::Default {
                    // Extra devices shift group numbers; only the default topology is mirrored.
                    r.iommu_group = None;
                    s.iommu_group = None;
                }
                if r != s {
                    diffs.push(format!("{}: real {r:?} / simulated {s:?}", d.address));
                }
            }
        }
    }
    if g.topology == Topology::Default {
        if addrs(&real) != addrs(&sim) {
            diffs.push(format!(
                "PCI devices: real {:?} / simulated {:?}",
                addrs(&real),
                addrs(&sim)
            ));
        }
        if real.iommu_groups != sim.iommu_groups {
            diffs.push(format!(
                "IOMMU groups: real {:?} / simulated {:?}",
                real.iommu_groups, sim.iommu_groups
            ));
        }
        if real.gpus != sim.gpus {
            diffs.push(format!(
                "GPUs: real {:?} / simulated {:?}",
                real.gpus, sim.gpus
            ));
        }
    }
    ensure(diffs.is_empty(), || {
        format!(
            "the simulated host differs from the guest:\n  {}",
            diffs.join("\n  ")
        )
    })?;
    Ok(Outcome::Passed)
}
