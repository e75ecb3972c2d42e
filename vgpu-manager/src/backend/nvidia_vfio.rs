//! NVIDIA vendor-specific VFIO (Ampere and later, vGPU 17+, kernel ≥ 6.8): SR-IOV VFs stay on the
//! `nvidia` driver, one vGPU per VF, through `<vf>/nvidia/{creatable_vgpu_types,current_vgpu_type,
//! vgpu_params}`. Writing a type id to `current_vgpu_type` creates the vGPU, `0` clears it; mixed sizes
//! need heterogeneous mode and a placement id written as `vgpu-placement-id=<id>` to `vgpu_params`
//! (NVIDIA vGPU user guide, "Creating an NVIDIA vGPU that supports SR-IOV on Linux with KVM").
//! Scheduling is the GPU-wide `RmPVMRL` policy ([`super::nvidia_sched`]).

use std::path::PathBuf;

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory, NvidiaVfState};
use mdev_types::parse::parse_nvidia_vgpu_name;
use vgpu_host::{Host, paths};

use super::common::{self, Slot, assign, unsupported};
use super::nvidia_sched::{self, NvGpu, NvSlotInfo};
use super::{
    Backend, BackendError, BackendKind, Capabilities, CreateRequest, Created, DetectResult,
    SchedCaps,
};
use crate::profile::facts::{device_facts, nvidia_name_framebuffer_mib};
use crate::profile::{self, Target};
use crate::sched::{PlanOptions, SchedPlan, SchedRequest, SchedState};

/// NVIDIA's host driver; the VFs stay bound to it.
const DRIVER: &str = "nvidia";

/// One VF with the vendor interface.
#[derive(Debug, Clone)]
struct Vf {
    index: u32,
    addr: PciAddress,
    state: NvidiaVfState,
}

/// An NVIDIA SR-IOV PF whose VFs carry the vendor-specific VFIO interface.
#[derive(Debug, Clone)]
pub struct NvidiaVfioBackend {
    gpu: String,
    pf: PciAddress,
    total_vfs: u32,
    memory_mib: Option<u64>,
    vfs: Vec<Vf>,
    /// Type id → name, from every VF's `creatable_vgpu_types`.
    names: Vec<(u32, String)>,
}

/// A PF on `nvidia` with SR-IOV whose VFs have `nvidia/` (or none enabled yet, and no mdev parent).
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = gpu.pci else { return Ok(None) };
    if gpu.driver.as_deref() != Some(DRIVER) {
        return Ok(None);
    }
    let Some(dev) = common::device(inv, &pf) else {
        return Ok(None);
    };
    let Some(sriov) = dev.sriov.as_ref().filter(|s| s.total_vfs > 0) else {
        return Ok(None);
    };
    let vfs: Vec<Vf> = (0u32..)
        .zip(&sriov.vfs)
        .filter_map(|(i, a)| {
            let d = common::device(inv, a)?;
            Some(Vf {
                index: i + 1,
                addr: *a,
                state: d.nvidia_vf.clone()?,
            })
        })
        .collect();
    let has_parent = inv.mdev_parents.iter().any(|p| p.pci == Some(pf));
    if vfs.is_empty() && (sriov.num_vfs > 0 || has_parent) {
        return Ok(None);
    }
    let mut names: Vec<(u32, String)> = Vec::new();
    for t in vfs.iter().flat_map(|v| &v.state.creatable) {
        if !names.iter().any(|(id, _)| *id == t.id) {
            names.push((t.id, t.name.clone()));
        }
    }
    Ok(Some(Box::new(NvidiaVfioBackend {
        gpu: gpu.id.clone(),
        pf,
        total_vfs: sriov.total_vfs,
        memory_mib: device_facts(dev.vendor, dev.device).and_then(|f| f.memory_mib),
        vfs,
        names,
    })))
}

impl NvidiaVfioBackend {
    fn nv(&self) -> NvGpu<'_> {
        NvGpu {
            gpu: &self.gpu,
            kind: self.kind(),
            pci: self.pf,
            existing: self
                .vfs
                .iter()
                .filter(|v| v.state.current_type.is_some())
                .count(),
        }
    }

    /// VFs with a vGPU first, then the free ones, each as `vfN`.
    fn slots(&self) -> Vec<Slot> {
        let (mut used, free): (Vec<&Vf>, Vec<&Vf>) = self
            .vfs
            .iter()
            .partition(|v| v.state.current_type.is_some());
        used.extend(free);
        used.into_iter()
            .map(|v| Slot::new(format!("vf{}", v.index), Some(v.addr.to_string())))
            .collect()
    }

    /// The VFs that carry a vGPU.
    fn used_slots(&self) -> Vec<Slot> {
        self.slots()
            .into_iter()
            .filter(|s| {
                self.vfs
                    .iter()
                    .any(|v| Some(v.addr.to_string()) == s.device && v.state.current_type.is_some())
            })
            .collect()
    }

    /// A type's framebuffer from its name (`NVIDIA L40S-4Q` → 4 GiB).
    fn type_fb(&self, id: u32) -> Option<u64> {
        let name = self.names.iter().find(|(i, _)| *i == id)?.1.as_str();
        let parsed = parse_nvidia_vgpu_name(name).ok()?;
        Some(nvidia_name_framebuffer_mib(parsed.framebuffer_gib))
    }

    fn info(&self, slot: &Slot, req: &SchedRequest) -> NvSlotInfo {
        let current = self
            .vfs
            .iter()
            .find(|v| Some(v.addr.to_string()) == slot.device)
            .and_then(|v| v.state.current_type);
        let fb = current
            .and_then(|id| self.type_fb(id))
            .or(req.framebuffer_mib);
        NvSlotInfo {
            framebuffer_mib: fb,
            max_instances: fb
                .zip(self.memory_mib)
                .and_then(|(f, m)| u32::try_from(m / f.max(1)).ok())
                .map(|m| m.min(self.total_vfs)),
        }
    }

    fn nvidia_attr(vf: &PciAddress, name: &str) -> PathBuf {
        paths::pci_attr(vf, "nvidia").join(name)
    }
}

impl Backend for NvidiaVfioBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::NvidiaVfio
    }

    fn gpu(&self) -> &str {
        &self.gpu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: self.kind(),
            gpu: self.gpu.clone(),
            interface:
                "NVIDIA vendor-specific VFIO: one vGPU per SR-IOV VF (nvidia/current_vgpu_type)"
                    .to_string(),
            offers: vec![profile::Backend::NvidiaVendorVfio],
            // The VFs with a vGPU; a plan may also name free VFs.
            slots: self.used_slots().into_iter().map(|s| s.name).collect(),
            max_slots: self.total_vfs,
            scheduling: SchedCaps {
                knob: "RmPVMRL policy and time slice (NVreg_RegistryDwordsPerDevice)".to_string(),
                per_slot_weights: false,
                priorities: false,
                reserve: true,
                runtime: false,
            },
        }
    }

    fn create(&self, host: &dyn Host, req: &CreateRequest) -> Result<Created, BackendError> {
        let Target::NvidiaVendorVfio {
            pf, vf, type_id, ..
        } = &req.target
        else {
            return Err(unsupported(
                self,
                &format!("create {}", req.target),
                "it only sets vGPU types on its VFs",
            ));
        };
        if *pf != self.pf {
            return Err(unsupported(
                self,
                &format!("create {}", req.target),
                &format!("the target's PF is not {}", self.pf),
            ));
        }
        if let Some(id) = req.placement_id {
            host.write(
                &Self::nvidia_attr(vf, "vgpu_params"),
                &format!("vgpu-placement-id={id}"),
            )
            .map_err(|e| BackendError::host(&self.gpu, e))?;
        }
        host.write(
            &Self::nvidia_attr(vf, "current_vgpu_type"),
            &type_id.to_string(),
        )
        .map_err(|e| BackendError::Unsupported {
            gpu: self.gpu.clone(),
            backend: self.kind().to_string(),
            what: format!("create vGPU type {type_id} on VF {vf}"),
            why: format!(
                "{e}; EPERM: the VF already has a vGPU; EIO: the type is not creatable now (framebuffer used up, or another size in homogeneous mode — see nvidia/creatable_vgpu_types)"
            ),
        })?;
        Ok(Created::NvidiaVgpu {
            pf: self.pf,
            vf: *vf,
            type_id: *type_id,
        })
    }

    fn enable_vfs(&self, _host: &dyn Host, num_vfs: u32) -> Result<(), BackendError> {
        Err(unsupported(
            self,
            &format!("enable {num_vfs} VFs"),
            &format!(
                "NVIDIA's VFs are enabled by the vGPU host driver's tool: `{}`",
                crate::profile::facts::NVIDIA_SRIOV_MANAGE
            ),
        ))
    }

    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        match created {
            Created::NvidiaVgpu { vf, .. } => host
                .write(&Self::nvidia_attr(vf, "current_vgpu_type"), "0")
                .map_err(|e| BackendError::host(&self.gpu, e)),
            other => Err(unsupported(
                self,
                &format!("destroy {other:?}"),
                "it only clears vGPUs on its VFs",
            )),
        }
    }

    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan {
        let (pairs, refusals) = assign(requests, &self.slots(), "VF");
        let infos: Vec<NvSlotInfo> = pairs.iter().map(|(s, r)| self.info(s, r)).collect();
        let mut plan = nvidia_sched::plan(&self.nv(), &pairs, &infos, refusals, opts);
        if self.vfs.is_empty() {
            plan.notes.push(format!(
                "no VF of {} is enabled yet (NVIDIA: `{}`)",
                self.pf,
                crate::profile::facts::NVIDIA_SRIOV_MANAGE
            ));
        }
        plan
    }

    fn read_back(&self, host: &dyn Host) -> Result<SchedState, BackendError> {
        nvidia_sched::read_back(host, &self.nv(), self.used_slots())
    }
}
