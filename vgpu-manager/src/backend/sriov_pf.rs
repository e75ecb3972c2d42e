//! The base of every backend that drives an SR-IOV physical function (Intel xe and i915, AMD GIM,
//! NVIDIA's vendor-specific VFIO): its VFs are the slots (`vf1`, `vf2`, …), a plan matches requests
//! to them, and by default a VF is given to a guest by binding it to vfio-pci and given back by
//! restoring the driver it had (`vgpu_host::ops`). A vendor module adds its interface line, its
//! scheduler, and whatever it does differently ([`PfVendor`]); [`SriovPfBackend`] is the
//! [`Backend`] of the pair.

use std::fmt;

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory};
use vgpu_host::ops::{bind_driver, restore_driver, set_sriov_autoprobe, set_sriov_numvfs};
use vgpu_host::{Host, HostError, HostExt, paths};

use super::common::{Slot, assign, device, unsupported};
use super::{Backend, BackendError, BackendKind, Capabilities, Created, NewVgpu, SchedCaps};
use crate::profile::{self, ProfileTarget};
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState};

/// The GPU and the PF's SR-IOV state a backend drives, as detection found them.
#[derive(Debug, Clone)]
pub(crate) struct SriovPfBase {
    /// The GPU (`Gpu::id`).
    pub gpu: String,
    /// The PF's PCI address, whose `sriov_numvfs` the backend drives.
    pub pf: PciAddress,
    /// How many VFs the PF supports (`sriov_totalvfs`).
    pub total_vfs: u32,
    /// How many are enabled (`sriov_numvfs`).
    pub num_vfs: u32,
    /// The enabled VFs, in `virtfnN` order.
    pub vfs: Vec<PciAddress>,
}

impl SriovPfBase {
    /// The base of `gpu` at `pf` with the SR-IOV state discovery read, or `None` when the PF has
    /// no SR-IOV capability.
    pub fn of(inv: &Inventory, gpu: &Gpu, pf: PciAddress) -> Option<Self> {
        let sriov = device(inv, &pf)?.sriov.as_ref()?;
        Some(SriovPfBase {
            gpu: gpu.id.clone(),
            pf,
            total_vfs: sriov.total_vfs,
            num_vfs: sriov.num_vfs,
            vfs: sriov.vfs.clone(),
        })
    }

    /// `vf1…vfN`: the enabled VFs, or every possible VF while none is enabled.
    pub fn vf_slots(&self) -> Vec<Slot> {
        if self.num_vfs > 0 {
            self.enabled_slots().collect()
        } else {
            (1..=self.total_vfs)
                .map(|i| Slot::new(format!("vf{i}"), None))
                .collect()
        }
    }

    /// The enabled VFs as slots `vf1…` with their addresses.
    pub fn enabled_slots(&self) -> impl Iterator<Item = Slot> + '_ {
        (1..)
            .zip(&self.vfs)
            .map(|(i, a)| Slot::new(format!("vf{i}"), Some(a.to_string())))
    }
}

/// How VFs come into existence on a PF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VfEnable {
    /// Through `sriov_numvfs`, after `sriov_drivers_autoprobe=0` so no host driver grabs them.
    Sysfs,
    /// Only when the driver loads (a module parameter): enabling is refused with this advice.
    AtModuleLoad(&'static str),
}

/// The first VF of `pf` (`virtfn0`), when enabled.
fn first_vf(host: &dyn Host, pf: &PciAddress) -> Result<Option<PciAddress>, HostError> {
    Ok(host
        .link_name(&paths::pci_attr(pf, "virtfn0"))?
        .and_then(|n| n.parse().ok()))
}

/// What a vendor adds to an SR-IOV PF: how it describes the interface and schedules its VFs, and
/// where it differs from the vfio-pci assignment the base does.
pub(crate) trait PfVendor: fmt::Debug + Send + Sync {
    /// Which interface.
    const KIND: BackendKind;
    /// The profile backend its options fall under.
    const OFFERS: profile::Delivery = profile::Delivery::SriovVf;

    /// The interface in a line (`SR-IOV VFs through vfio-pci, provisioned in sriov_admin`).
    fn interface(&self, base: &SriovPfBase) -> String;

    /// What its scheduler can do.
    fn scheduling(&self) -> SchedCaps;

    /// The slots a plan may use (by default [`SriovPfBase::vf_slots`]).
    fn slots(&self, base: &SriovPfBase) -> Vec<Slot> {
        base.vf_slots()
    }

    /// The slots there are now, for [`Capabilities::slots`] (by default those with a VF).
    fn current_slots(&self, base: &SriovPfBase) -> Vec<Slot> {
        self.slots(base)
            .into_iter()
            .filter(|s| s.device.is_some())
            .collect()
    }

    /// How many slots there can be at most (by default `sriov_totalvfs`).
    fn max_slots(&self, base: &SriovPfBase) -> u32 {
        base.total_vfs
    }

    /// How its VFs come into existence (by default through `sriov_numvfs`).
    fn vf_enable(&self) -> VfEnable {
        VfEnable::Sysfs
    }

    /// Creates a vGPU for `req` (by default: enables VFs when the target asks, then binds the VF to
    /// vfio-pci). `b` is the backend, for its errors.
    fn create(
        &self,
        b: &dyn Backend,
        base: &SriovPfBase,
        host: &dyn Host,
        req: &NewVgpu,
    ) -> Result<Created, BackendError> {
        let pf = &base.pf;
        let ProfileTarget::SriovVf {
            pf: tpf,
            vf,
            num_vfs,
            enable_vfs,
            ..
        } = &req.target
        else {
            return Err(unsupported(
                b,
                &format!("create {}", req.target),
                "it only assigns its SR-IOV VFs",
            ));
        };
        if tpf != pf {
            return Err(unsupported(
                b,
                &format!("create {}", req.target),
                &format!("the target's PF is not {pf}"),
            ));
        }
        if *enable_vfs {
            self.enable_vfs(b, base, host, *num_vfs)?;
        }
        let vf = match vf {
            Some(v) => *v,
            None => first_vf(host, pf)
                .map_err(|e| BackendError::host(b.gpu(), e))?
                .ok_or_else(|| {
                    unsupported(
                        b,
                        "assign a VF",
                        "no VF exists after enabling; check `dmesg` for the PF driver's error",
                    )
                })?,
        };
        let bind = bind_driver(host, &vf, "vfio-pci")?;
        Ok(Created::Vf { pf: *pf, vf, bind })
    }

    /// Undoes [`PfVendor::create`] (by default: gives the VF back to the driver it had).
    fn destroy(
        &self,
        b: &dyn Backend,
        host: &dyn Host,
        created: &Created,
    ) -> Result<(), BackendError> {
        match created {
            Created::Vf { bind, .. } => Ok(restore_driver(host, bind)?),
            other => Err(unsupported(
                b,
                &format!("destroy {other:?}"),
                "it only releases VFs it assigned",
            )),
        }
    }

    /// Enables `num_vfs` VFs the way [`PfVendor::vf_enable`] says, leaving them without a host
    /// driver. Writing the count that is already enabled changes nothing (drivers/pci/iov.c
    /// `sriov_numvfs_store`).
    fn enable_vfs(
        &self,
        b: &dyn Backend,
        base: &SriovPfBase,
        host: &dyn Host,
        num_vfs: u32,
    ) -> Result<(), BackendError> {
        match self.vf_enable() {
            VfEnable::Sysfs => {
                // Documentation/ABI/testing/sysfs-driver-intel-xe-sriov: set
                // sriov_drivers_autoprobe=0 before sriov_numvfs so the VFs stay free for vfio-pci.
                set_sriov_autoprobe(host, &base.pf, false)?;
                set_sriov_numvfs(host, &base.pf, num_vfs)?;
                Ok(())
            }
            VfEnable::AtModuleLoad(how) => Err(unsupported(b, "enable VFs", how)),
        }
    }

    /// The plan for requests already matched to `slots` (`pairs`), with the refusals of matching.
    fn plan(
        &self,
        base: &SriovPfBase,
        slots: &[Slot],
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan;

    /// Reads the scheduling the driver has programmed now, per slot.
    fn read_back(&self, base: &SriovPfBase, host: &dyn Host) -> Result<SchedState, BackendError>;
}

/// An SR-IOV PF backend: the shared base with one vendor's part.
#[derive(Debug)]
pub(crate) struct SriovPfBackend<V> {
    base: SriovPfBase,
    vendor: V,
}

impl<V: PfVendor + 'static> SriovPfBackend<V> {
    /// The backend of `base` with `vendor`, boxed as detection returns it.
    pub fn boxed(base: SriovPfBase, vendor: V) -> Box<dyn Backend> {
        Box::new(SriovPfBackend { base, vendor })
    }
}

impl<V: PfVendor> Backend for SriovPfBackend<V> {
    fn kind(&self) -> BackendKind {
        V::KIND
    }

    fn gpu(&self) -> &str {
        &self.base.gpu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: V::KIND,
            gpu: self.base.gpu.clone(),
            interface: self.vendor.interface(&self.base),
            offers: vec![V::OFFERS],
            // The VFs that exist; a plan may also name VFs still to be enabled.
            slots: self
                .vendor
                .current_slots(&self.base)
                .into_iter()
                .map(|s| s.name)
                .collect(),
            max_slots: self.vendor.max_slots(&self.base),
            scheduling: self.vendor.scheduling(),
        }
    }

    fn create(&self, host: &dyn Host, req: &NewVgpu) -> Result<Created, BackendError> {
        self.vendor.create(self, &self.base, host, req)
    }

    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        self.vendor.destroy(self, host, created)
    }

    fn enable_vfs(&self, host: &dyn Host, num_vfs: u32) -> Result<(), BackendError> {
        self.vendor.enable_vfs(self, &self.base, host, num_vfs)
    }

    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan {
        let slots = self.vendor.slots(&self.base);
        let (pairs, refusals) = assign(requests, &slots, "VF");
        self.vendor.plan(&self.base, &slots, &pairs, refusals, opts)
    }

    fn read_back(&self, host: &dyn Host) -> Result<SchedState, BackendError> {
        self.vendor.read_back(&self.base, host)
    }
}
