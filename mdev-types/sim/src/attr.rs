//! Which kernel store handler a write to a simulated attribute reaches.

use mdev_types::ids::{MdevUuid, PciAddress};

/// One Intel xe SR-IOV provisioning knob (Documentation/ABI/testing/sysfs-driver-intel-xe-sriov).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XeKnob {
    /// `exec_quantum_ms`.
    ExecQuantum,
    /// `preempt_timeout_us`.
    PreemptTimeout,
    /// `sched_priority`.
    Priority,
    /// `vram_quota`.
    VramQuota,
}

/// A writable attribute, named by what it controls rather than by where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attr {
    /// `<pci dev>/driver_override`.
    DriverOverride(PciAddress),
    /// `<pci dev>/numa_node`.
    NumaNode(PciAddress),
    /// `<pf>/sriov_numvfs`.
    SriovNumvfs(PciAddress),
    /// `<pf>/sriov_drivers_autoprobe`.
    SriovAutoprobe(PciAddress),
    /// `/sys/bus/pci/drivers/<drv>/bind`.
    Bind(String),
    /// `/sys/bus/pci/drivers/<drv>/unbind`.
    Unbind(String),
    /// `/sys/bus/pci/drivers/<drv>/new_id`.
    NewId(String),
    /// `/sys/bus/pci/drivers/<drv>/remove_id`.
    RemoveId(String),
    /// `/sys/bus/pci/drivers_probe`.
    DriversProbe,
    /// `<parent>/mdev_supported_types/<type>/create` (indexes into the model's parents and types).
    MdevCreate {
        /// Parent index.
        parent: usize,
        /// Type index within the parent.
        ty: usize,
    },
    /// `/sys/bus/mdev/devices/<uuid>/remove`.
    MdevRemove(MdevUuid),
    /// `<vf>/nvidia/current_vgpu_type`.
    NvidiaCurrentType(PciAddress),
    /// `<vf>/nvidia/vgpu_params`.
    NvidiaVgpuParams(PciAddress),
    /// `<pf>/sriov_admin/{pf,vfN}/profile/<knob>`; `func` 0 is the PF.
    XeProfile {
        /// The PCI address of the xe PF whose `sriov_admin/` holds the knob.
        pf: PciAddress,
        /// 0 for the PF, N for `vfN`.
        func: u16,
        /// Which knob.
        knob: XeKnob,
    },
    /// `<pf>/sriov_admin/.bulk_profile/<knob>`.
    XeBulk {
        /// The PCI address of the xe PF whose `sriov_admin/` holds the knob.
        pf: PciAddress,
        /// Which knob.
        knob: XeKnob,
    },
    /// `<pf>/drm/cardN/prelim_iov/{pf,vfN}/gt/<knob>`; `func` 0 is the PF.
    I915Iov {
        /// The PCI address of the i915 PF whose `prelim_iov/` holds the knob.
        pf: PciAddress,
        /// 0 for the PF, N for `vfN`.
        func: u16,
        /// Which knob.
        knob: super::i915_iov::I915Knob,
    },
    /// `<pf>/sriov_admin/vfN/stop`.
    XeStop {
        /// The PCI address of the xe PF that owns the VF.
        pf: PciAddress,
        /// The VF number (1-based).
        vf: u16,
    },
}
