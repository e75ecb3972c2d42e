//! NVIDIA vendor-specific VFIO GPUs and Intel xe SR-IOV PFs.

use std::collections::BTreeMap;

use super::Ctx;
use crate::error::SimError;
use crate::model::{Model, NvidiaGpu, VgpuType, XeFunc, XePf};
use crate::nvidia;
use crate::spec::SimSpec;

pub(super) fn nvidia_gpus(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, g) in spec.nvidia_vfio.iter().enumerate() {
        let at = |f: &str| format!("nvidia_vfio[{i}].{f}");
        let ok = model.pci.get(&g.pf).is_some_and(|d| d.sriov.is_some());
        if !ok {
            return Err(cx.err(
                at("pf"),
                format!(
                    "{} must be a listed PCI device with an [pci.sriov] table",
                    g.pf
                ),
            ));
        }
        if model.nvidia.contains_key(&g.pf) {
            return Err(cx.err(at("pf"), format!("{} is listed twice", g.pf)));
        }
        let mut types: Vec<VgpuType> = Vec::new();
        for (j, t) in g.types.iter().enumerate() {
            if t.id == 0 || types.iter().any(|u| u.id == t.id) {
                return Err(cx.err(
                    format!("nvidia_vfio[{i}].type[{j}].id"),
                    format!(
                        "type id {} must be non-zero and unique (0 clears a VF)",
                        t.id
                    ),
                ));
            }
            types.push(VgpuType {
                id: t.id,
                name: t.name.clone(),
                framebuffer_mib: t.framebuffer_mib,
            });
        }
        model.nvidia.insert(
            g.pf,
            NvidiaGpu {
                framebuffer_mib: g.framebuffer_mib,
                heterogeneous: g.heterogeneous,
                types,
                vgpus: BTreeMap::new(),
                params: BTreeMap::new(),
            },
        );
    }
    Ok(())
}

pub(super) fn xe_pfs(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, x) in spec.xe_sriov.iter().enumerate() {
        let at = |f: &str| format!("xe_sriov[{i}].{f}");
        let Some(dev) = model.pci.get(&x.pf).filter(|d| d.sriov.is_some()) else {
            return Err(cx.err(
                at("pf"),
                format!(
                    "{} must be a listed PCI device with an [pci.sriov] table",
                    x.pf
                ),
            ));
        };
        let driver = x.driver.clone().unwrap_or_else(|| "xe".to_string());
        if model.driver(&driver).is_none() {
            return Err(cx.err(at("driver"), format!("driver '{driver}' is not declared")));
        }
        // One directory per possible VF: vf1 … vf<sriov_totalvfs> (pf_setup_tree).
        let total = model.total_vfs(dev);
        model.xe.insert(
            x.pf,
            XePf {
                driver,
                vram_bytes: x.vram_bytes,
                funcs: vec![XeFunc::default(); usize::from(total) + 1],
            },
        );
    }
    Ok(())
}

pub(super) fn vgpus(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, g) in spec.nvidia_vfio.iter().enumerate() {
        for (j, v) in g.vgpus.iter().enumerate() {
            let at = |f: &str| format!("nvidia_vfio[{i}].vgpu[{j}].{f}");
            let vf = model
                .vfs_of(&g.pf)
                .into_iter()
                .find(|(idx, _)| *idx == v.vf)
                .map(|(_, a)| a);
            let Some(vf) = vf else {
                return Err(cx.err(
                    at("vf"),
                    format!(
                        "VF {} of {} is not enabled; raise sriov.num_vfs",
                        v.vf, g.pf
                    ),
                ));
            };
            if !nvidia::vf_bound_to_pf_driver(model, &vf) {
                return Err(cx.err(
                    at("vf"),
                    format!("VF {vf} is not bound to its PF's driver, so it has no nvidia/ directory; set the PF's driver to match the VF device id"),
                ));
            }
            nvidia::store_current(model, &vf, &v.type_id.to_string()).map_err(|e| {
                cx.err(
                    at("type"),
                    format!(
                        "type {} cannot be created on VF {} ({e}): unknown type, VF not bound to the PF's driver, or framebuffer used up",
                        v.type_id, v.vf
                    ),
                )
            })?;
        }
    }
    Ok(())
}
