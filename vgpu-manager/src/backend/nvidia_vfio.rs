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

use super::common::{self, Slot, unsupported};
use super::nvidia_sched::{self, NvGpu, NvSlotInfo};
use super::sriov_pf::{PfVendor, SriovPfBackend, SriovPfBase};
use super::{Backend, BackendError, BackendKind, Created, DetectResult, NewVgpu, SchedCaps};
use crate::profile::facts::{NVIDIA_SRIOV_MANAGE, device_facts, nvidia_name_framebuffer_mib};
use crate::profile::{self, ProfileTarget};
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState};

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
pub(crate) struct NvidiaVfio {
    /// The GPU's memory, when known ([`device_facts`]).
    memory_mib: Option<u64>,
    /// The enabled VFs that have the vendor interface.
    vfs: Vec<Vf>,
    /// Type id → name, from every VF's `creatable_vgpu_types`.
    names: Vec<(u32, String)>,
}

/// A PF on `nvidia` with SR-IOV whose VFs have `nvidia/` (or none enabled yet, and no mdev parent).
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = common::pci_on(gpu, DRIVER) else {
        return Ok(None);
    };
    let Some(dev) = common::device(inv, &pf) else {
        return Ok(None);
    };
    let Some(base) = SriovPfBase::of(inv, gpu, pf).filter(|b| b.total_vfs > 0) else {
        return Ok(None);
    };
    let vfs: Vec<Vf> = (0u32..)
        .zip(&base.vfs)
        .filter_map(|(i, a)| {
            let d = common::device(inv, a)?;
            Some(Vf {
                index: i + 1,
                addr: *a,
                state: d.nvidia_vf.clone()?,
            })
        })
        .collect();
    // An mdev parent on the PF, or on its VFs (classic vGPU on Ampere and later), is another interface.
    let has_parent = !inv.gpu_parents(gpu).is_empty();
    if vfs.is_empty() && (base.num_vfs > 0 || has_parent) {
        return Ok(None);
    }
    let mut names: Vec<(u32, String)> = Vec::new();
    for t in vfs.iter().flat_map(|v| &v.state.creatable) {
        if !names.iter().any(|(id, _)| *id == t.id) {
            names.push((t.id, t.name.clone()));
        }
    }
    Ok(Some(SriovPfBackend::boxed(
        base,
        NvidiaVfio {
            memory_mib: device_facts(dev.vendor, dev.device).and_then(|f| f.memory_mib),
            vfs,
            names,
        },
    )))
}

impl NvidiaVfio {
    fn nv<'a>(&self, base: &'a SriovPfBase) -> NvGpu<'a> {
        NvGpu {
            gpu: &base.gpu,
            kind: Self::KIND,
            pci: base.pf,
            existing: self
                .vfs
                .iter()
                .filter(|v| v.state.current_type.is_some())
                .count(),
        }
    }

    /// VFs with a vGPU first, then the free ones, each as `vfN`.
    fn vf_slots(&self) -> Vec<Slot> {
        let (mut used, free): (Vec<&Vf>, Vec<&Vf>) = self
            .vfs
            .iter()
            .partition(|v| v.state.current_type.is_some());
        used.extend(free);
        used.into_iter()
            .map(|v| Slot::new(format!("vf{}", v.index), Some(v.addr.to_string())))
            .collect()
    }

    /// The VF slots whose VF has a vGPU type set.
    fn used_slots(&self) -> Vec<Slot> {
        self.vf_slots()
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

    fn info(&self, base: &SriovPfBase, slot: &Slot, req: &SchedRequest) -> NvSlotInfo {
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
                .map(|m| m.min(base.total_vfs)),
        }
    }

    fn nvidia_attr(vf: &PciAddress, name: &str) -> PathBuf {
        paths::pci_attr(vf, "nvidia").join(name)
    }
}

impl PfVendor for NvidiaVfio {
    const KIND: BackendKind = BackendKind::NvidiaVfio;
    const OFFERS: profile::Delivery = profile::Delivery::NvidiaVendorVfio;

    fn interface(&self, _base: &SriovPfBase) -> String {
        "NVIDIA vendor-specific VFIO: one vGPU per SR-IOV VF (nvidia/current_vgpu_type)".to_string()
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: "RmPVMRL policy and time slice (NVreg_RegistryDwordsPerDevice)".to_string(),
            per_slot_weights: false,
            priorities: false,
            reserve: true,
            runtime: false,
        }
    }

    fn slots(&self, _base: &SriovPfBase) -> Vec<Slot> {
        self.vf_slots()
    }

    /// The VFs with a vGPU; a plan may also name free VFs.
    fn current_slots(&self, _base: &SriovPfBase) -> Vec<Slot> {
        self.used_slots()
    }

    fn create(
        &self,
        b: &dyn Backend,
        base: &SriovPfBase,
        host: &dyn Host,
        req: &NewVgpu,
    ) -> Result<Created, BackendError> {
        let ProfileTarget::NvidiaVendorVfio {
            pf, vf, type_id, ..
        } = &req.target
        else {
            return Err(unsupported(
                b,
                &format!("create {}", req.target),
                "it only sets vGPU types on its VFs",
            ));
        };
        if *pf != base.pf {
            return Err(unsupported(
                b,
                &format!("create {}", req.target),
                &format!("the target's PF is not {}", base.pf),
            ));
        }
        host.write(
            &Self::nvidia_attr(vf, "current_vgpu_type"),
            &type_id.to_string(),
        )
        .map_err(|e| BackendError::Unsupported {
            gpu: base.gpu.clone(),
            backend: Self::KIND.to_string(),
            what: format!("create vGPU type {type_id} on VF {vf}"),
            why: format!(
                "{e}; EPERM: the VF already has a vGPU; EIO: the type is not creatable now (framebuffer used up, or another size in homogeneous mode — see nvidia/creatable_vgpu_types)"
            ),
        })?;
        Ok(Created::NvidiaVgpu {
            pf: base.pf,
            vf: *vf,
            type_id: *type_id,
        })
    }

    fn enable_vfs(
        &self,
        b: &dyn Backend,
        _base: &SriovPfBase,
        _host: &dyn Host,
        num_vfs: u32,
    ) -> Result<(), BackendError> {
        Err(unsupported(
            b,
            &format!("enable {num_vfs} VFs"),
            &format!(
                "NVIDIA's VFs are enabled by the vGPU host driver's tool: `{NVIDIA_SRIOV_MANAGE}`"
            ),
        ))
    }

    fn destroy(
        &self,
        b: &dyn Backend,
        host: &dyn Host,
        created: &Created,
    ) -> Result<(), BackendError> {
        match created {
            Created::NvidiaVgpu { vf, .. } => host
                .write(&Self::nvidia_attr(vf, "current_vgpu_type"), "0")
                .map_err(|e| BackendError::host(b.gpu(), e)),
            other => Err(unsupported(
                b,
                &format!("destroy {other:?}"),
                "it only clears vGPUs on its VFs",
            )),
        }
    }

    fn plan(
        &self,
        base: &SriovPfBase,
        _slots: &[Slot],
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan {
        let infos: Vec<NvSlotInfo> = pairs.iter().map(|(s, r)| self.info(base, s, r)).collect();
        let mut plan = nvidia_sched::plan(&self.nv(base), pairs, &infos, refusals, opts);
        if self.vfs.is_empty() {
            plan.notes.push(format!(
                "no VF of {} is enabled yet (NVIDIA: `{NVIDIA_SRIOV_MANAGE}`)",
                base.pf
            ));
        }
        plan
    }

    fn read_back(&self, base: &SriovPfBase, host: &dyn Host) -> Result<SchedState, BackendError> {
        nvidia_sched::read_back(host, &self.nv(base), self.used_slots())
    }
}
