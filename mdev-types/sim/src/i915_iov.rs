//! Intel i915 SR-IOV, out-of-tree driver: the PF's DRM card carries `prelim_iov/{pf,vfN}/gt/`
//! with `exec_quantum_ms`, `preempt_timeout_us` and, for VFs, `lmem_quota`, `ggtt_quota`,
//! `contexts_quota`, `doorbells_quota` (Intel's SR-IOV i915 `intel_iov_sysfs.c`, which
//! registers one kobject per function with a `gt` directory below the card). `/sys/class/drm/cardN`
//! links to `<pf>/drm/cardN`.
//!
//! Values are unsigned decimal or hex (`kstrtou32`/`kstrtou64`, errno as is); quanta and timeouts are
//! clamped to the GuC maxima like xe's (assumption: the same GuC KLVs underneath).

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::attr::Attr;
use super::build::Ctx;
use super::error::SimError;
use super::kstr::{kstrtou32, kstrtoull};
use super::model::Model;
use super::vfs::Vfs;
use mdev_types::ids::PciAddress;

/// `GUC_KLV_VF_CFG_EXEC_QUANTUM_MAX_VALUE` (drivers/gpu/drm/xe/abi/guc_klvs_abi.h).
const EXEC_QUANTUM_MAX_MS: u32 = 100_000;
/// `GUC_KLV_VF_CFG_PREEMPT_TIMEOUT_MAX_VALUE`.
const PREEMPT_TIMEOUT_MAX_US: u32 = 100_000_000;

/// An i915 PF with `prelim_iov`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct I915IovSpec {
    /// The PCI address of the i915 PF that gets `drm/card<N>/prelim_iov/`.
    pub pf: PciAddress,
    /// Its DRM card number (`card<N>`).
    pub card: u32,
    /// The PF driver that provides `prelim_iov` (default `i915`).
    pub driver: Option<String>,
}

/// One `prelim_iov` knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum I915Knob {
    ExecQuantum,
    PreemptTimeout,
    /// A VF resource quota (index into [`QUOTAS`]).
    Quota(usize),
}

/// The VF resource quota files.
const QUOTAS: [&str; 4] = [
    "lmem_quota",
    "ggtt_quota",
    "contexts_quota",
    "doorbells_quota",
];

/// One function's settings (index 0 is the PF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct I915Func {
    pub exec_quantum_ms: u32,
    pub preempt_timeout_us: u32,
    pub quotas: [u64; 4],
}

/// A PF's `prelim_iov` state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct I915Pf {
    pub card: u32,
    pub driver: String,
    /// Index 0 is the PF, N is `vfN`, up to `sriov_totalvfs`.
    pub funcs: Vec<I915Func>,
}

/// Checks and records the `[[i915_iov]]` tables.
pub(crate) fn build(cx: &Ctx, specs: &[I915IovSpec], model: &mut Model) -> Result<(), SimError> {
    for (i, s) in specs.iter().enumerate() {
        let at = |f: &str| format!("i915_iov[{i}].{f}");
        let Some(dev) = model.pci.get(&s.pf).filter(|d| d.sriov.is_some()) else {
            return Err(cx.err(
                at("pf"),
                format!(
                    "{} must be a listed PCI device with an [pci.sriov] table",
                    s.pf
                ),
            ));
        };
        let driver = s.driver.clone().unwrap_or_else(|| "i915".to_string());
        if model.driver(&driver).is_none() {
            return Err(cx.err(at("driver"), format!("driver '{driver}' is not declared")));
        }
        if model.i915.values().any(|p| p.card == s.card) || model.i915.contains_key(&s.pf) {
            return Err(cx.err(
                at("card"),
                format!("card{} or {} is listed twice", s.card, s.pf),
            ));
        }
        let total = model.total_vfs(dev);
        model.i915.insert(
            s.pf,
            I915Pf {
                card: s.card,
                driver,
                funcs: vec![I915Func::default(); usize::from(total) + 1],
            },
        );
    }
    Ok(())
}

/// Renders `prelim_iov` for every PF bound to its driver.
pub(crate) fn render(model: &Model, v: &mut Vfs) {
    for (pf, p) in &model.i915 {
        let bound = model.pci.get(pf).and_then(|d| d.driver.as_deref()) == Some(p.driver.as_str());
        if !bound {
            continue;
        }
        let card = format!("{}/drm/card{}", model.dev_dir(pf), p.card);
        v.link(&format!("/sys/class/drm/card{}", p.card), &card);
        for (func, f) in (0u16..).zip(&p.funcs) {
            let name = if func == 0 {
                "pf".to_string()
            } else {
                format!("vf{func}")
            };
            let gt = format!("{card}/prelim_iov/{name}/gt");
            let attr = |knob| Attr::I915Iov {
                pf: *pf,
                func,
                knob,
            };
            v.rw(
                &format!("{gt}/exec_quantum_ms"),
                format!("{}\n", f.exec_quantum_ms),
                attr(I915Knob::ExecQuantum),
            );
            v.rw(
                &format!("{gt}/preempt_timeout_us"),
                format!("{}\n", f.preempt_timeout_us),
                attr(I915Knob::PreemptTimeout),
            );
            if func > 0 {
                for (q, file) in QUOTAS.iter().enumerate() {
                    v.rw(
                        &format!("{gt}/{file}"),
                        format!("{}\n", f.quotas[q]),
                        attr(I915Knob::Quota(q)),
                    );
                }
            }
        }
    }
}

/// A write to `prelim_iov/{pf,vfN}/gt/<knob>`.
pub(crate) fn store(
    model: &mut Model,
    pf: &PciAddress,
    func: u16,
    knob: I915Knob,
    buf: &str,
) -> Result<(), Errno> {
    let f = model
        .i915
        .get_mut(pf)
        .and_then(|p| p.funcs.get_mut(usize::from(func)))
        .ok_or(Errno::ENODEV)?;
    match knob {
        I915Knob::ExecQuantum => f.exec_quantum_ms = kstrtou32(buf, 0)?.min(EXEC_QUANTUM_MAX_MS),
        I915Knob::PreemptTimeout => {
            f.preempt_timeout_us = kstrtou32(buf, 0)?.min(PREEMPT_TIMEOUT_MAX_US)
        }
        I915Knob::Quota(q) => {
            let slot = f.quotas.get_mut(q).ok_or(Errno::EINVAL)?;
            *slot = kstrtoull(buf, 0)?;
        }
    }
    Ok(())
}
