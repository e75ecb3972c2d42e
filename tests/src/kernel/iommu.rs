//! IOMMU group tests: the emulated Intel IOMMU is active, and groups follow the PCI topology.
//!
//! Kernel source: drivers/iommu/iommu.c `pci_device_group` — a device shares its group with every
//! device it can alias (pci_for_each_dma_alias: devices behind a PCIe-to-PCI bridge all use the
//! bridge's requester ID) and with every device behind an upstream port without ACS isolation.

use std::collections::BTreeMap;
use std::path::Path;

use mdev_types::ids::PciAddress;
use vgpu_host::{Host, paths};

use super::guest::{Guest, Topology};
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::sriov::{Pf, PfGuard};

/// QEMU's "edu" teaching device (hw/misc/edu.c): vendor 1234, device 11e8.
pub const EDU: (u16, u16) = (0x1234, 0x11e8);

/// The IOMMU group tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("iommu_intel_active", intel_active),
        Test::new("iommu_pf_groups_isolated", pf_groups_isolated),
        Test::new("iommu_vf_groups", vf_groups),
        Test::new("iommu_shared_group_behind_pci_bridge", shared_group),
    ]
}

/// Group number -> members, for every PCI function.
fn groups(g: &Guest) -> Result<BTreeMap<u32, Vec<String>>, TestError> {
    let mut map: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for name in g.host.list(Path::new(paths::PCI_DEVICES))? {
        let dev = Path::new(paths::PCI_DEVICES).join(&name);
        let group = g.iommu_group_of(&dev)?;
        map.entry(group).or_default().push(name);
    }
    for members in map.values_mut() {
        members.sort();
    }
    Ok(map)
}

/// intel_iommu=on took effect: /sys/class/iommu has the DMAR unit and every PCI function has a group
/// whose devices/ lists it.
fn intel_active(g: &Guest) -> TestResult {
    let units = g.host.list(Path::new("/sys/class/iommu"))?;
    ensure(units.iter().any(|u| u.starts_with("dmar")), || {
        format!("/sys/class/iommu holds {units:?}, no dmar unit")
    })?;
    for (group, members) in groups(g)? {
        ensure_eq(
            format_args!("/sys/kernel/iommu_groups/{group}/devices"),
            g.iommu_group_members(group)?,
            members,
        )?;
    }
    Ok(Outcome::Passed)
}

/// Behind their own root ports (which QEMU gives ACS), the igb and nvme PFs are each alone in a group.
fn pf_groups_isolated(g: &Guest) -> TestResult {
    for pf in [Pf::Igb, Pf::Nvme] {
        let addr = pf.find(&g.host)?;
        let group = g.iommu_group_of(&paths::pci_device(&addr))?;
        ensure_eq(
            format_args!("members of the {} PF's group {group}", pf.driver()),
            g.iommu_group_members(group)?,
            vec![addr.to_string()],
        )?;
    }
    Ok(Outcome::Passed)
}

/// Enabled VFs get IOMMU groups, none shared with another VF or the PF.
fn vf_groups(g: &Guest) -> TestResult {
    let guard = PfGuard::new(&g.host, Pf::Igb)?;
    let vfs = guard.enable_vfs(2)?;
    let pf_group = g.iommu_group_of(&paths::pci_device(&guard.addr()))?;
    let mut seen = vec![pf_group];
    for vf in &vfs {
        let group = g.iommu_group_of(&paths::pci_device(vf))?;
        ensure(!seen.contains(&group), || {
            format!("VF {vf} shares group {group} (groups so far {seen:?})")
        })?;
        ensure_eq(
            format_args!("members of VF {vf}'s group {group}"),
            g.iommu_group_members(group)?,
            vec![vf.to_string()],
        )?;
        seen.push(group);
    }
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}

/// In the shared-group topology both edu devices and their PCIe-to-PCI bridge form one group; in the
/// default topology there are no edu devices.
fn shared_group(g: &Guest) -> TestResult {
    let edus = g.pci_by_id(EDU.0, EDU.1)?;
    if g.topology == Topology::Default {
        ensure_eq("edu devices in the default topology", edus, Vec::new())?;
        return Ok(Outcome::Passed);
    }
    let [a, b] = edus.as_slice() else {
        return Err(TestError::Check(format!(
            "expected two edu devices behind the bridge, found {edus:?}"
        )));
    };
    let ga = g.iommu_group_of(&paths::pci_device(a))?;
    let gb = g.iommu_group_of(&paths::pci_device(b))?;
    ensure_eq(format_args!("group of {b} (same as {a})"), gb, ga)?;
    let bridge = upstream_bridge(g, a)?;
    let mut expected = vec![bridge.to_string(), a.to_string(), b.to_string()];
    expected.sort();
    ensure_eq(
        format_args!("members of the shared group {ga}"),
        g.iommu_group_members(ga)?,
        expected,
    )?;
    Ok(Outcome::Passed)
}

/// The PCI device whose secondary bus `addr` sits on (the parent directory in /sys/devices).
fn upstream_bridge(g: &Guest, addr: &PciAddress) -> Result<PciAddress, TestError> {
    let canonical = g.host.canonicalize(&paths::pci_device(addr))?;
    let parent = canonical
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent.parse().map_err(|_| {
        TestError::Check(format!(
            "{addr} sits at {}, not below a PCI bridge",
            canonical.display()
        ))
    })
}
