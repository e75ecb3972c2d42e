//! The VF-backed offers of an SR-IOV PF: an SR-IOV VF through vfio-pci (Intel xe/i915, AMD MxGPU) or
//! an NVIDIA vGPU type on a VF (vendor-specific VFIO). Each slot takes one VF, so what a profile can
//! still get is counted in VFs: the enabled VFs that are free (no pool slot holds them, no driver or
//! vGPU type uses them), or, while SR-IOV is off, the VFs enabling would make for the profile.

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory, PciDevice, SriovPf};
use vgpu_client::{ProfileOffer, VfOffers};

use crate::profile::facts::device_facts;
use crate::profile::options::{MatchOption, ProfileTarget};

/// A PF and its SR-IOV state.
pub(super) type Pf<'a> = (&'a PciDevice, &'a SriovPf);

/// The SR-IOV PF behind `gpu`, when it can have VFs.
pub(super) fn sriov_pf<'a>(gpu: &Gpu, inv: &'a Inventory) -> Option<Pf<'a>> {
    let dev = inv
        .pci_devices
        .iter()
        .find(|d| Some(d.address) == gpu.pci)?;
    let sriov = dev.sriov.as_ref().filter(|s| s.total_vfs > 0)?;
    Some((dev, sriov))
}

/// The enabled VFs of `pf` a new slot could take: VFIO can isolate them (an IOMMU group), no pool
/// slot holds them, and nothing uses them (an NVIDIA VF has no vGPU type; another VF has no driver).
fn free_vfs<'a>((_, sriov): Pf<'_>, inv: &'a Inventory, held: &[PciAddress]) -> Vec<&'a PciDevice> {
    sriov
        .vfs
        .iter()
        .filter(|a| !held.contains(a))
        .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
        .filter(|d| d.iommu_group.is_some())
        .filter(|d| match &d.nvidia_vf {
            Some(n) => n.current_type.is_none(),
            None => d.driver.is_none(),
        })
        .collect()
}

/// The offer of `profile` whose best option on the PF is `best`; `None` when that option is no VF of
/// this PF (an mdev elsewhere, whole-GPU passthrough).
pub(super) fn offer(
    profile: &str,
    best: &MatchOption,
    pf: Pf<'_>,
    inv: &Inventory,
    held: &[PciAddress],
) -> Option<ProfileOffer> {
    let (dev, sriov) = pf;
    let free = u32::try_from(free_vfs(pf, inv, held).len()).unwrap_or(u32::MAX);
    let (backend, type_id, type_name, available, in_use, max) = match &best.target {
        ProfileTarget::SriovVf {
            pf: on,
            num_vfs,
            enable_vfs,
            ..
        } if *on == dev.address => {
            let (available, max) = if *enable_vfs {
                (*num_vfs, *num_vfs)
            } else {
                (free, sriov.num_vfs)
            };
            (
                "sriov-vf",
                format!("vf-{num_vfs}"),
                None,
                available,
                max.saturating_sub(available),
                max,
            )
        }
        ProfileTarget::NvidiaVendorVfio {
            pf: on,
            type_id,
            type_name,
            ..
        } if *on == dev.address => {
            let in_use = sriov
                .vfs
                .iter()
                .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
                .filter(|d| {
                    d.nvidia_vf
                        .as_ref()
                        .is_some_and(|n| n.current_type == Some(*type_id))
                })
                .count();
            let in_use = u32::try_from(in_use).unwrap_or(u32::MAX);
            // The type alone on the GPU: as many VFs as its framebuffer fits, at most the VFs.
            let memory = device_facts(dev.vendor, dev.device).and_then(|f| f.memory_mib);
            let fits = memory
                .zip(best.framebuffer_mib.filter(|&f| f > 0))
                .map_or(sriov.num_vfs, |(m, f)| {
                    u32::try_from(m / f).unwrap_or(u32::MAX).min(sriov.num_vfs)
                });
            let available = best.capacity.min(free);
            (
                "nvidia-vendor-vfio",
                type_id.to_string(),
                Some(type_name.clone()),
                available,
                in_use,
                fits.max(available.saturating_add(in_use)),
            )
        }
        _ => return None,
    };
    Some(ProfileOffer {
        profile: profile.to_string(),
        backend: backend.to_string(),
        type_id,
        type_name,
        framebuffer_mib: best.framebuffer_mib,
        available,
        in_use,
        max_instances: max,
    })
}

/// The PF's VF counts beside its VF-backed `options`.
pub(super) fn counts(
    pf: Pf<'_>,
    options: &[ProfileOffer],
    inv: &Inventory,
    held: &[PciAddress],
) -> VfOffers {
    let (_, sriov) = pf;
    let free = if sriov.num_vfs == 0 {
        options
            .iter()
            .filter(|o| o.backend != "mdev")
            .map(|o| o.max_instances)
            .max()
            .unwrap_or(0)
    } else {
        u32::try_from(free_vfs(pf, inv, held).len()).unwrap_or(u32::MAX)
    };
    VfOffers {
        enabled: sriov.num_vfs,
        total: sriov.total_vfs,
        free,
    }
}
