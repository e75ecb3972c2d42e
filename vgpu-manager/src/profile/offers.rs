//! What each GPU of a host can give each profile of a catalog when it has room: the option
//! [`match_profile`] would choose on the GPU if nothing occupied it, with the GPU's current
//! occupancy beside it. Placement engines above vgpud (a Kubernetes DRA driver publishing one device
//! per profile slot, with counters per GPU) need the shape of a GPU, not only what fits now: a
//! profile whose type is full today is still a device of the GPU.
//!
//! Matching runs on a copy of the inventory in which every mdev parent is empty and each type shows
//! the instances it would hold alone (a homogeneous GPU that holds vGPUs keeps only their type); the
//! offers then carry the real `available_instances` and instance counts. Options are mdev types on the
//! GPU's own parent and VF-backed options of an SR-IOV PF (a VF on vfio-pci, an NVIDIA vGPU type on a
//! VF; see the `vf` submodule), which are counted from the PF's VFs and the VFs pool slots hold.

use mdev_types::ids::{MdevTypeId, PciAddress};
use mdev_types::model::{Inventory, MdevType, Vendor};
use mdev_types::parse::TypeDescription;
use vgpu_client::{GpuOffers, ProfileOffer};

use super::catalog::Catalog;
use super::matching::match_profile;
use super::options::{ProfileTarget, vf_capacity};

mod vf;

/// How many instances `t` holds when it is alone on its parent: the NVIDIA description's
/// `max_instance`, else what the kernel would still create plus what exists (exact when no other
/// type has instances on the parent, a lower bound otherwise).
pub fn max_instances(t: &MdevType) -> u32 {
    match &t.details {
        TypeDescription::Nvidia(d) if d.max_instance > 0 => d.max_instance,
        _ => t.available_instances.saturating_add(in_use(t)),
    }
}

/// How many instances of `t` exist now.
fn in_use(t: &MdevType) -> u32 {
    u32::try_from(t.instances.len()).unwrap_or(u32::MAX)
}

/// The host with every mdev parent empty, each type showing [`max_instances`] available. A GPU
/// bound by the homogeneous rule (an NVIDIA GPU's time-sliced vGPUs are all of one type) keeps only
/// the types it holds, so each profile is matched to what the GPU can still make. A GPU whose VFs are
/// its parents (one vGPU per VF) shows one instance on each of its first `max_instances` VFs.
fn emptied(inv: &Inventory) -> Inventory {
    let mut roomy = inv.clone();
    for gpu in &inv.gpus {
        let names: Vec<&str> = inv
            .gpu_parents(gpu)
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        let on_vfs = Inventory::mdev_on_vfs(gpu);
        let held: Vec<MdevTypeId> = inv
            .gpu_mdev_parent(gpu)
            .map(|p| p.types)
            .unwrap_or_default()
            .into_iter()
            .filter(|t| !t.instances.is_empty())
            .map(|t| t.id)
            .collect();
        let homogeneous = gpu.vendor == Vendor::Nvidia && !held.is_empty();
        for (k, p) in (0u32..).zip(
            roomy
                .mdev_parents
                .iter_mut()
                .filter(|p| names.contains(&p.name.as_str())),
        ) {
            if homogeneous {
                p.types.retain(|t| held.contains(&t.id));
            }
            for t in &mut p.types {
                let alone = max_instances(t);
                t.available_instances = match on_vfs {
                    true => u32::from(k < alone),
                    false => alone,
                };
                t.instances.clear();
            }
        }
    }
    roomy.mdev_instances.clear();
    roomy
}

/// One [`GpuOffers`] per GPU of `inv` that is an mdev parent or an SR-IOV PF, in inventory order;
/// `health` says `ok` or why a GPU is faulted (the daemon's wording). `held_vfs` are the VFs pool
/// slots hold (the daemon's records: a slot whose VF a reboot gave back still owns it), never free.
pub fn host_offers(
    catalog: &Catalog,
    inv: &Inventory,
    held_vfs: &[PciAddress],
    health: impl Fn(&str) -> String,
) -> Vec<GpuOffers> {
    let roomy = emptied(inv);
    let reports: Vec<_> = catalog
        .profiles()
        .iter()
        .map(|p| match_profile(p, &roomy))
        .collect();
    let mut out = Vec::new();
    for gpu in &inv.gpus {
        let parents = inv.gpu_parents(gpu);
        let parent = inv.gpu_mdev_parent(gpu);
        let pf = vf::sriov_pf(gpu, inv);
        if parent.is_none() && pf.is_none() {
            continue;
        }
        // One vGPU per VF when the VFs are the parents.
        let on_vfs = Inventory::mdev_on_vfs(gpu);
        let slots = match on_vfs {
            true => u32::try_from(parents.len()).unwrap_or(u32::MAX),
            false => u32::MAX,
        };
        let mut options: Vec<ProfileOffer> = reports
            .iter()
            .filter_map(|r| {
                let best = r.gpu(&gpu.id)?.best.as_ref()?;
                match &best.target {
                    ProfileTarget::Mdev {
                        parent: on,
                        type_id,
                        type_name,
                    } => {
                        parents.iter().find(|p| p.name == *on)?;
                        let t = parent.as_ref()?.types.iter().find(|t| &t.id == type_id)?;
                        Some(ProfileOffer {
                            profile: r.profile.clone(),
                            backend: "mdev".to_string(),
                            type_id: type_id.to_string(),
                            type_name: type_name.clone(),
                            framebuffer_mib: best.framebuffer_mib,
                            available: vf_capacity(t, on_vfs),
                            in_use: in_use(t),
                            max_instances: max_instances(t).min(slots),
                        })
                    }
                    _ => vf::offer(&r.profile, best, pf?, inv, held_vfs),
                }
            })
            .filter(|o| o.max_instances > 0)
            .collect();
        options.sort_by(|a, b| a.profile.cmp(&b.profile));
        // A PF that is no mdev parent serves by VFs alone, also when no profile fits now.
        let vfs = pf
            .filter(|_| parent.is_none() || options.iter().any(|o| o.backend != "mdev"))
            .map(|pf| vf::counts(pf, &options, inv, held_vfs));
        out.push(GpuOffers {
            gpu: gpu.id.clone(),
            pci: gpu.pci.map(|a| a.to_string()),
            vendor: gpu.vendor.as_str().to_string(),
            model: gpu.model.clone(),
            numa_node: gpu.numa_node,
            health: health(&gpu.id),
            homogeneous: gpu.vendor == Vendor::Nvidia,
            options,
            vfs,
        });
    }
    out
}
