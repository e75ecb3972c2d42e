//! NVIDIA vendor-specific VFIO (vGPU 17+, kernels ≥ 6.8): each SR-IOV VF stays on the `nvidia` driver
//! and carries `nvidia/{creatable_vgpu_types,current_vgpu_type,vgpu_params}`.
//!
//! Sources: the vGPU host driver's open kernel interface, `nvidia-vgpu-vfio` `vfio_pci_core.c`
//! (`creatable_vgpu_types_show`, `current_vgpu_type_show/store`, `nv_vfio_pci_create/remove`) and
//! `nvidia-vgpu-vfio.c` (`nv_vgpu_vfio_create`); NVIDIA vGPU user guide, "Creating an NVIDIA vGPU that
//! supports SR-IOV on Linux with KVM" and "Homogeneous/heterogeneous vGPUs".

use nix::errno::Errno;

use super::attr::Attr;
use super::kstr::kstrtoll;
use super::model::{Model, NvidiaGpu, VgpuType};
use super::vfs::Vfs;
use mdev_types::ids::PciAddress;

/// The GPU state and VF index for a VF address, when the VF belongs to a vendor-VFIO GPU.
fn gpu_of(model: &Model, vf: &PciAddress) -> Option<(PciAddress, u16)> {
    let (pf, idx) = model.pci.get(vf)?.vf_of?;
    model.nvidia.contains_key(&pf).then_some((pf, idx))
}

/// The `nvidia/` group exists while the VF is bound to its PF's driver (`nv_vfio_pci_core_init` at
/// probe creates it, `nv_vfio_pci_core_uninit` at remove deletes it).
pub(crate) fn vf_bound_to_pf_driver(model: &Model, vf: &PciAddress) -> bool {
    let Some(dev) = model.pci.get(vf) else {
        return false;
    };
    let Some((pf, _)) = dev.vf_of else {
        return false;
    };
    let pf_driver = model.pci.get(&pf).and_then(|d| d.driver.as_deref());
    dev.driver.is_some() && dev.driver.as_deref() == pf_driver
}

/// The types `creatable_vgpu_types` lists on VF `idx`: none once the VF has a vGPU (assumption: the
/// driver offers nothing further on an occupied VF); otherwise those whose framebuffer still fits in
/// what the GPU's vGPUs leave free and — in the default homogeneous (equal-size) mode — whose size
/// equals the existing vGPUs' size.
pub(crate) fn creatable(gpu: &NvidiaGpu, idx: u16) -> Vec<&VgpuType> {
    if gpu.vgpus.contains_key(&idx) {
        return Vec::new();
    }
    let fb_of = |id: u32| {
        gpu.types
            .iter()
            .find(|t| t.id == id)
            .map_or(0, |t| t.framebuffer_mib)
    };
    let used: u64 = gpu.vgpus.values().map(|id| fb_of(*id)).sum();
    let free = gpu.framebuffer_mib.saturating_sub(used);
    let size = gpu.vgpus.values().next().map(|id| fb_of(*id));
    gpu.types
        .iter()
        .filter(|t| t.framebuffer_mib <= free)
        .filter(|t| gpu.heterogeneous || size.is_none_or(|s| s == t.framebuffer_mib))
        .collect()
}

/// `current_vgpu_type_store`: `kstrtol(buf, 10)` errors as is (`EINVAL`, `ERANGE`); 0 without a vGPU
/// → `EPERM` (`nv_vfio_pci_remove`); a type while one exists → `EPERM` (`nv_vfio_pci_create`); a type
/// the GPU cannot create now → `EIO` (the resource manager's `vgpu_create` fails in
/// `nv_vgpu_vfio_create`).
pub(crate) fn store_current(model: &mut Model, vf: &PciAddress, buf: &str) -> Result<(), Errno> {
    let id = kstrtoll(buf, 10)?;
    let (pf, idx) = gpu_of(model, vf).ok_or(Errno::ENODEV)?;
    let gpu = model.nvidia.get_mut(&pf).ok_or(Errno::ENODEV)?;
    if id == 0 {
        gpu.vgpus.remove(&idx).ok_or(Errno::EPERM)?;
        return Ok(());
    }
    if gpu.vgpus.contains_key(&idx) {
        return Err(Errno::EPERM);
    }
    // The driver casts to NvU32; anything not creatable right now fails in the resource manager.
    let id = u32::try_from(id).map_err(|_| Errno::EIO)?;
    if !creatable(gpu, idx).iter().any(|t| t.id == id) {
        return Err(Errno::EIO);
    }
    gpu.vgpus.insert(idx, id);
    Ok(())
}

/// `vgpu_params` store (assumption, newer drivers: free text such as `vgpu-placement-id=<id>`, kept
/// until overwritten; an empty write clears it).
pub(crate) fn store_params(model: &mut Model, vf: &PciAddress, buf: &str) -> Result<(), Errno> {
    let (pf, idx) = gpu_of(model, vf).ok_or(Errno::ENODEV)?;
    let gpu = model.nvidia.get_mut(&pf).ok_or(Errno::ENODEV)?;
    let text = buf.trim_end_matches('\n');
    if text.is_empty() {
        gpu.params.remove(&idx);
    } else {
        gpu.params.insert(idx, text.to_string());
    }
    Ok(())
}

/// A VF's `nvidia` binding is released: its vGPU is destroyed with it.
pub(crate) fn release_vf(model: &mut Model, vf: &PciAddress, drv: &str) {
    let Some((pf, idx)) = gpu_of(model, vf) else {
        return;
    };
    let pf_driver = model.pci.get(&pf).and_then(|d| d.driver.clone());
    if pf_driver.as_deref() != Some(drv) {
        return;
    }
    if let Some(gpu) = model.nvidia.get_mut(&pf) {
        gpu.vgpus.remove(&idx);
        gpu.params.remove(&idx);
    }
}

/// `creatable_vgpu_types_show`: a header, then `"%-5d : %s"` per type (the name ends in a newline).
pub(crate) fn creatable_text(gpu: &NvidiaGpu, idx: u16) -> String {
    let mut s = String::from("ID    : vGPU Name\n");
    for t in creatable(gpu, idx) {
        s.push_str(&format!("{:<5} : {}\n", t.id, t.name));
    }
    s
}

/// Renders `nvidia/` on every VF bound to its PF's driver.
pub(crate) fn render(model: &Model, v: &mut Vfs) {
    for (pf, gpu) in &model.nvidia {
        for (idx, vf) in model.vfs_of(pf) {
            if !vf_bound_to_pf_driver(model, &vf) {
                continue;
            }
            let dir = format!("{}/nvidia", model.dev_dir(&vf));
            v.ro(
                &format!("{dir}/creatable_vgpu_types"),
                creatable_text(gpu, idx),
            );
            // current_vgpu_type_show: "%d\n", 0 without a vGPU.
            let current = gpu.vgpus.get(&idx).copied().unwrap_or(0);
            v.rw(
                &format!("{dir}/current_vgpu_type"),
                format!("{current}\n"),
                Attr::NvidiaCurrentType(vf),
            );
            let params = gpu
                .params
                .get(&idx)
                .map(|p| format!("{p}\n"))
                .unwrap_or_default();
            v.rw(
                &format!("{dir}/vgpu_params"),
                params,
                Attr::NvidiaVgpuParams(vf),
            );
        }
    }
}
