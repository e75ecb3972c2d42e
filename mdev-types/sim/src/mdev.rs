//! Mediated devices: instance accounting, `create`, `remove`, parent unregistration, and the sysfs they
//! render (drivers/vfio/mdev/mdev_core.c and mdev_sysfs.c, Linux 6.12).

use nix::errno::Errno;

use super::attr::Attr;
use super::kstr::kstrtoull;
use super::model::{Counting, Mdev, Model, ParentLoc};
use super::vfs::Vfs;
use mdev_types::ids::{MdevUuid, PciAddress};

/// `UUID_STRING_LEN`.
const UUID_STRING_LEN: usize = 36;

/// What `available_instances` shows for type `t` of parent `p`.
///
/// * Core-counted parents (no `get_available`) show the parent-wide counter for every type.
/// * Driver-counted parents show how many more instances of this type fit in the pools the driver
///   keeps (mtty's ports, mbochs' megabytes, GVT-g's graphics memory and fences, NVIDIA framebuffer),
///   capped by the type's own limit. With NVIDIA's homogeneous rule, a type shows 0 while an
///   instance of another type exists on the GPU (NVIDIA vGPU user guide, "Homogeneous vGPUs").
/// * An SR-IOV VF of NVIDIA classic vGPU (`Parent::shares_gpu`) shows 0 once
///   it holds a vGPU, else 1 when the type can still be created on its physical GPU — counted over the
///   instances on every VF of that GPU — and 0 when it cannot (NVIDIA vGPU User Guide 13–16,
///   "Creating an NVIDIA vGPU on a Linux with KVM Hypervisor", GPUs that support SR-IOV:
///   `available_instances` is 1 on a free VF, 0 on one with a vGPU or when the type cannot be created).
pub(crate) fn available(model: &Model, p: usize, t: usize) -> u32 {
    let Some(parent) = model.parents.get(p) else {
        return 0;
    };
    let Some(ty) = parent.types.get(t) else {
        return 0;
    };
    if parent.shares_gpu.is_some() && model.mdevs.values().any(|m| m.parent == p) {
        return 0;
    }
    let counted = counted_with(model, p);
    match &parent.counting {
        Counting::Core { max } => max.saturating_sub(count(counted.len())),
        Counting::Driver { pools, .. } => {
            if parent.homogeneous && counted.iter().any(|m| m.ty != t) {
                return 0;
            }
            let of_type = count(counted.iter().filter(|m| m.ty == t).count());
            let mut avail = ty.max_instances.map_or(u64::from(u32::MAX), |m| {
                u64::from(m.saturating_sub(of_type))
            });
            for &(pool, need) in &ty.uses {
                let cap = pools.get(pool).map_or(0, |(_, c)| *c);
                let used: u64 = counted
                    .iter()
                    .filter_map(|m| model.parents.get(m.parent)?.types.get(m.ty))
                    .flat_map(|mt| mt.uses.iter())
                    .filter(|(pl, _)| *pl == pool)
                    .map(|(_, n)| *n)
                    .sum();
                let free = cap.saturating_sub(used);
                avail = avail.min(free.checked_div(need).unwrap_or(0));
            }
            if parent.shares_gpu.is_some() {
                // One vGPU per VF: a free VF offers at most one.
                avail = avail.min(1);
            }
            u32::try_from(avail).unwrap_or(u32::MAX)
        }
    }
}

/// The instances counted against parent `p`'s limits: its own, or for a VF of an SR-IOV GPU those of
/// every parent sharing the same physical GPU.
fn counted_with(model: &Model, p: usize) -> Vec<&Mdev> {
    let gpu = model.parents.get(p).and_then(|q| q.shares_gpu);
    model
        .mdevs
        .values()
        .filter(|m| match gpu {
            None => m.parent == p,
            Some(g) => {
                m.parent == p || model.parents.get(m.parent).and_then(|q| q.shares_gpu) == Some(g)
            }
        })
        .collect()
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The errno a driver-counted parent's probe returns when a type has nothing left, by mdev driver:
/// NVIDIA's `nv_vgpu_vfio_create` turns the resource manager's refusal into `EIO`; the samples
/// (`mtty_init_dev`, `mbochs_init_dev`) and GVT-g (aperture_gm.c `alloc_resource`) return `ENOSPC`,
/// which is also the default for other drivers.
pub(crate) fn default_full_errno(mdev_driver: &str) -> Errno {
    match mdev_driver {
        "nvidia-vgpu-vfio" => Errno::EIO,
        _ => Errno::ENOSPC,
    }
}

/// `create_store` → `mdev_device_create`:
/// length not 36 or 37 → `EINVAL`; not a UUID (`guid_parse`) → `EINVAL`; the UUID exists on any
/// parent → `EEXIST`; a core-counted parent with nothing left → `EUSERS`; a driver-counted type with
/// nothing left → the driver's probe errno (mtty/mbochs/GVT-g `ENOSPC`, NVIDIA `EIO`, also on an SR-IOV
/// VF that already holds a vGPU).
pub(crate) fn create(model: &mut Model, p: usize, t: usize, buf: &str) -> Result<(), Errno> {
    let b = buf.as_bytes();
    if b.len() < UUID_STRING_LEN || b.len() > UUID_STRING_LEN + 1 {
        return Err(Errno::EINVAL);
    }
    // guid_parse looks at the first 36 characters only (lib/uuid.c uuid_is_valid).
    let text = std::str::from_utf8(&b[..UUID_STRING_LEN]).map_err(|_| Errno::EINVAL)?;
    let uuid: MdevUuid = text.parse().map_err(|_| Errno::EINVAL)?;
    if model.mdevs.contains_key(&uuid) {
        return Err(Errno::EEXIST);
    }
    let parent = model.parents.get(p).ok_or(Errno::ENODEV)?;
    match &parent.counting {
        Counting::Core { max } => {
            let n = model.mdevs.values().filter(|m| m.parent == p).count();
            if count(n) >= *max {
                return Err(Errno::EUSERS);
            }
        }
        Counting::Driver {
            full_errno,
            create_limit,
            ..
        } => {
            let n = counted_with(model, p).len();
            if available(model, p, t) == 0 || create_limit.is_some_and(|l| count(n) >= l) {
                return Err(*full_errno);
            }
        }
    }
    // Each mdev gets a new (emulated-IOMMU) group: vfio_register_emulated_iommu_dev →
    // vfio_noiommu_group_alloc → iommu_group_alloc (drivers/vfio/group.c).
    let group = model.alloc_group();
    model.mdevs.insert(
        uuid,
        Mdev {
            parent: p,
            ty: t,
            iommu_group: group,
        },
    );
    Ok(())
}

/// `remove_store`: not a number (`kstrtoul`) → `EINVAL`; 0 does nothing; otherwise the device is
/// removed (a second write finds the file gone: `ENOENT` from the path lookup).
pub(crate) fn store_remove(model: &mut Model, uuid: &MdevUuid, buf: &str) -> Result<(), Errno> {
    let v = kstrtoull(buf, 0).map_err(|_| Errno::EINVAL)?;
    if v != 0 {
        model.mdevs.remove(uuid).ok_or(Errno::ENODEV)?;
    }
    Ok(())
}

/// `mdev_unregister_parent` when the driver registering a PCI parent releases the device: every
/// instance of those parents is removed. This covers an SR-IOV VF parent too, whether the VF is
/// unbound from the PF's driver or removed with `sriov_numvfs` 0 (`pci::remove_device` releases first).
pub(crate) fn unregister_parents_of(model: &mut Model, addr: &PciAddress, drv: &str) {
    let gone: Vec<usize> = model
        .parents
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            matches!(&p.loc, ParentLoc::Pci { addr: a, driver } if a == addr && driver == drv)
        })
        .map(|(i, _)| i)
        .collect();
    model.mdevs.retain(|_, m| !gone.contains(&m.parent));
}

/// Renders registered parents, their types, the instances and the mdev bus.
pub(crate) fn render(model: &Model, v: &mut Vfs) {
    if model.parents.is_empty() {
        return;
    }
    v.mkdir("/sys/class/mdev_bus");
    v.mkdir("/sys/bus/mdev/devices");
    for p in &model.parents {
        v.mkdir(&format!("/sys/bus/mdev/drivers/{}", p.mdev_driver));
    }
    for (pi, p) in model.parents.iter().enumerate() {
        if !model.parent_registered(p) {
            continue;
        }
        let dir = model.parent_dir(p);
        if let ParentLoc::Virtual { class, .. } = &p.loc {
            v.link(&format!("/sys/class/{class}/{}", p.name), &dir);
            v.link(&format!("{dir}/subsystem"), &format!("/sys/class/{class}"));
        }
        v.link(&format!("/sys/class/mdev_bus/{}", p.name), &dir);
        v.mkdir(&format!("{dir}/mdev_supported_types"));
        for (ti, t) in p.types.iter().enumerate() {
            let td = format!("{dir}/mdev_supported_types/{}", t.id);
            // mdev_sysfs.c: name_show prints the pretty name, else the sysfs name.
            let name = t
                .name
                .clone()
                .unwrap_or_else(|| sysfs_name(&t.id.to_string()));
            v.ro(&format!("{td}/name"), format!("{name}\n"));
            v.ro(&format!("{td}/device_api"), format!("{}\n", t.device_api));
            v.ro(
                &format!("{td}/available_instances"),
                format!("{}\n", available(model, pi, ti)),
            );
            if let Some(d) = &t.description {
                v.ro(&format!("{td}/description"), format!("{d}\n"));
            }
            v.wo(
                &format!("{td}/create"),
                Attr::MdevCreate { parent: pi, ty: ti },
            );
            v.mkdir(&format!("{td}/devices"));
        }
    }
    for (uuid, m) in &model.mdevs {
        let Some(p) = model.parents.get(m.parent) else {
            continue;
        };
        let Some(t) = p.types.get(m.ty) else { continue };
        let dir = format!("{}/{uuid}", model.parent_dir(p));
        let td = format!("{}/mdev_supported_types/{}", model.parent_dir(p), t.id);
        v.link(&format!("{dir}/mdev_type"), &td);
        v.link(&format!("{td}/devices/{uuid}"), &dir);
        v.wo(&format!("{dir}/remove"), Attr::MdevRemove(*uuid));
        v.link(&format!("{dir}/subsystem"), "/sys/bus/mdev");
        let drv = format!("/sys/bus/mdev/drivers/{}", p.mdev_driver);
        v.link(&format!("{dir}/driver"), &drv);
        v.link(&format!("{drv}/{uuid}"), &dir);
        v.link(&format!("/sys/bus/mdev/devices/{uuid}"), &dir);
        let group = format!("/sys/kernel/iommu_groups/{}", m.iommu_group);
        v.link(&format!("{dir}/iommu_group"), &group);
    }
}

/// The type's sysfs name: the directory name without the `<driver>-` prefix the core adds
/// (`mdev_type_add` names the kobject `"%s-%s", dev_driver_string(parent), sysfs_name`).
fn sysfs_name(id: &str) -> String {
    id.split_once('-').map_or(id, |(_, rest)| rest).to_string()
}
