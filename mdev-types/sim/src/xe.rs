//! Intel xe SR-IOV PF administration: `<pf>/sriov_admin/` (Documentation/ABI/testing/
//! sysfs-driver-intel-xe-sriov; drivers/gpu/drm/xe/xe_sriov_pf_sysfs.c; limits from
//! drivers/gpu/drm/xe/abi/guc_klvs_abi.h and xe_gt_sriov_pf_config.c).

use nix::errno::Errno;

use super::attr::{Attr, XeKnob};
use super::kstr::{kstrtobool, kstrtou32, kstrtoull, sysfs_match_string};
use super::model::{Model, XeFunc};
use super::vfs::Vfs;
use mdev_types::ids::PciAddress;

/// `GUC_KLV_VF_CFG_EXEC_QUANTUM_MAX_VALUE`: larger values are silently clamped
/// (`pf_push_vf_cfg_exec_quantum`).
const EXEC_QUANTUM_MAX_MS: u32 = 100_000;
/// `GUC_KLV_VF_CFG_PREEMPT_TIMEOUT_MAX_VALUE`, clamped the same way.
const PREEMPT_TIMEOUT_MAX_US: u32 = 100_000_000;
/// VRAM provisioning granularity (`pf_get_lmem_alignment`: 2 MiB).
const VRAM_ALIGN: u64 = 2 << 20;
/// `sched_priority_names`; only the PF may select `high` (`sched_priority_high_allowed`).
const PRIORITIES: [&str; 3] = ["low", "normal", "high"];

/// `emit_choice`: the choices with the active one in brackets, e.g. `[low] normal high`.
fn emit_choice(choice: usize, n: usize) -> String {
    let items: Vec<String> = PRIORITIES[..n]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if i == choice {
                format!("[{p}]")
            } else {
                (*p).to_string()
            }
        })
        .collect();
    format!("{}\n", items.join(" "))
}

/// The PF's `sriov_admin` exists while it is bound to the driver that provides it.
fn admin_active(model: &Model, pf: &PciAddress) -> bool {
    let Some(x) = model.xe.get(pf) else {
        return false;
    };
    model.pci.get(pf).and_then(|d| d.driver.as_deref()) == Some(x.driver.as_str())
}

/// Renders `sriov_admin/` for every bound xe PF.
pub(crate) fn render(model: &Model, v: &mut Vfs) {
    for (pf, x) in &model.xe {
        if !admin_active(model, pf) {
            continue;
        }
        let dir = format!("{}/sriov_admin", model.dev_dir(pf));
        let bulk = format!("{dir}/.bulk_profile");
        for (file, knob) in [
            ("exec_quantum_ms", XeKnob::ExecQuantum),
            ("preempt_timeout_us", XeKnob::PreemptTimeout),
            ("sched_priority", XeKnob::Priority),
        ] {
            v.wo(&format!("{bulk}/{file}"), Attr::XeBulk { pf: *pf, knob });
        }
        if x.vram_bytes.is_some() {
            v.wo(
                &format!("{bulk}/vram_quota"),
                Attr::XeBulk {
                    pf: *pf,
                    knob: XeKnob::VramQuota,
                },
            );
        }
        let vfs = model.vfs_of(pf);
        for (func, f) in (0u16..).zip(&x.funcs) {
            let fdir = if func == 0 {
                format!("{dir}/pf")
            } else {
                format!("{dir}/vf{func}")
            };
            let attr = |knob| Attr::XeProfile {
                pf: *pf,
                func,
                knob,
            };
            let prof = format!("{fdir}/profile");
            v.rw(
                &format!("{prof}/exec_quantum_ms"),
                format!("{}\n", f.exec_quantum_ms),
                attr(XeKnob::ExecQuantum),
            );
            v.rw(
                &format!("{prof}/preempt_timeout_us"),
                format!("{}\n", f.preempt_timeout_us),
                attr(XeKnob::PreemptTimeout),
            );
            if func == 0 {
                v.rw(
                    &format!("{prof}/sched_priority"),
                    emit_choice(f.priority, 3),
                    attr(XeKnob::Priority),
                );
                v.link(&format!("{fdir}/device"), &model.dev_dir(pf));
            } else {
                // VFs cannot change their priority: the attribute is read-only
                // (profile_vf_attr_is_visible) and lists only low and normal.
                v.ro(
                    &format!("{prof}/sched_priority"),
                    emit_choice(f.priority, 2),
                );
                if x.vram_bytes.is_some() {
                    let shown = if f.vram_quota > 0 {
                        f.vram_quota
                    } else {
                        f.vram_auto
                    };
                    v.rw(
                        &format!("{prof}/vram_quota"),
                        format!("{shown}\n"),
                        attr(XeKnob::VramQuota),
                    );
                }
                v.wo(&format!("{fdir}/stop"), Attr::XeStop { pf: *pf, vf: func });
                // The device link exists only while the VF is enabled.
                if let Some((_, vf)) = vfs.iter().find(|(i, _)| *i + 1 == func) {
                    v.link(&format!("{fdir}/device"), &model.dev_dir(vf));
                }
            }
        }
    }
}

/// Applies one knob value to function `func`.
fn apply(
    model: &mut Model,
    pf: &PciAddress,
    func: usize,
    knob: XeKnob,
    buf: &str,
    bulk: bool,
) -> Result<(), Errno> {
    let x = model.xe.get_mut(pf).ok_or(Errno::ENODEV)?;
    let vram = x.vram_bytes;
    let others: u64 = x
        .funcs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != func && *i != 0)
        .map(|(_, f)| f.vram_quota)
        .sum();
    let f = x.funcs.get_mut(func).ok_or(Errno::ENODEV)?;
    match knob {
        XeKnob::ExecQuantum => f.exec_quantum_ms = kstrtou32(buf, 0)?.min(EXEC_QUANTUM_MAX_MS),
        XeKnob::PreemptTimeout => {
            f.preempt_timeout_us = kstrtou32(buf, 0)?.min(PREEMPT_TIMEOUT_MAX_US)
        }
        XeKnob::Priority => {
            // Bulk and VF writes may not select `high`; only the PF's own file may.
            let n = if bulk || func != 0 { 2 } else { 3 };
            if !bulk && func != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            f.priority = sysfs_match_string(&PRIORITIES[..n], buf).ok_or(Errno::EINVAL)?;
        }
        XeKnob::VramQuota => {
            let total = vram.ok_or(Errno::EPERM)?;
            let want = kstrtoull(buf, 0)?;
            let aligned = want.div_ceil(VRAM_ALIGN).saturating_mul(VRAM_ALIGN);
            // Assumption: provisioning beyond the VRAM not given to other VFs fails to allocate.
            if aligned.saturating_add(others) > total {
                return Err(Errno::ENOSPC);
            }
            f.vram_quota = aligned;
        }
    }
    Ok(())
}

/// A write to `sriov_admin/{pf,vfN}/profile/<knob>`: unsigned numbers via `kstrtou32`/`kstrtou64`
/// (their errno as is: `EINVAL`, `ERANGE`), clamped to the GuC maximum; priority by name.
pub(crate) fn store_profile(
    model: &mut Model,
    pf: &PciAddress,
    func: u16,
    knob: XeKnob,
    buf: &str,
) -> Result<(), Errno> {
    apply(model, pf, usize::from(func), knob, buf, false)
}

/// A write to `sriov_admin/.bulk_profile/<knob>`: applied to every function (VRAM to every VF); the
/// bulk priority may not be `high` (`sched_priority_bulk_high_allowed`).
pub(crate) fn store_bulk(
    model: &mut Model,
    pf: &PciAddress,
    knob: XeKnob,
    buf: &str,
) -> Result<(), Errno> {
    let n = model.xe.get(pf).map_or(0, |x| x.funcs.len());
    let first = if knob == XeKnob::VramQuota { 1 } else { 0 };
    if knob == XeKnob::VramQuota {
        // All-or-nothing: check the whole set fits before provisioning any VF.
        let total = model
            .xe
            .get(pf)
            .and_then(|x| x.vram_bytes)
            .ok_or(Errno::EPERM)?;
        let want = kstrtoull(buf, 0)?;
        let aligned = want.div_ceil(VRAM_ALIGN).saturating_mul(VRAM_ALIGN);
        let vfs = u64::try_from(n.saturating_sub(1)).unwrap_or(u64::MAX);
        if aligned.saturating_mul(vfs) > total {
            return Err(Errno::ENOSPC);
        }
        if let Some(x) = model.xe.get_mut(pf) {
            for f in x.funcs.iter_mut().skip(1) {
                f.vram_quota = aligned;
            }
        }
        return Ok(());
    }
    for func in first..n {
        apply(model, pf, func, knob, buf, true)?;
    }
    Ok(())
}

/// `sriov_admin/vfN/stop`: `kstrtobool`, else `EINVAL`; true stops the VF's scheduling until its FLR.
pub(crate) fn store_stop(
    model: &mut Model,
    pf: &PciAddress,
    vf: u16,
    buf: &str,
) -> Result<(), Errno> {
    let stop = kstrtobool(buf)?;
    let f = model
        .xe
        .get_mut(pf)
        .and_then(|x| x.funcs.get_mut(usize::from(vf)))
        .ok_or(Errno::ENODEV)?;
    if stop {
        f.stopped = true;
    }
    Ok(())
}

/// VFs were enabled: without explicit quotas the PF auto-provisions VRAM evenly across them (ABI file:
/// "Without initial VRAM provisioning those files will show result of the VRAM auto-provisioning").
pub(crate) fn vfs_enabled(model: &mut Model, pf: &PciAddress, num: u16) {
    let Some(x) = model.xe.get_mut(pf) else {
        return;
    };
    let Some(vram) = x.vram_bytes else { return };
    if num == 0 || x.funcs.iter().any(|f| f.vram_quota > 0) {
        return;
    }
    let each = (vram / u64::from(num)) / VRAM_ALIGN * VRAM_ALIGN;
    for f in x.funcs.iter_mut().skip(1).take(usize::from(num)) {
        f.vram_auto = each;
    }
}

/// VFs were disabled: "Once the VFs are disabled, all VRAM provisioning will be released."
pub(crate) fn vfs_disabled(model: &mut Model, pf: &PciAddress) {
    if let Some(x) = model.xe.get_mut(pf) {
        for f in x.funcs.iter_mut().skip(1) {
            f.vram_quota = 0;
            f.vram_auto = 0;
            f.stopped = false;
        }
    }
}

/// The PF left its driver: `sriov_admin` is gone and comes back with defaults on the next probe.
pub(crate) fn release_pf(model: &mut Model, pf: &PciAddress, drv: &str) {
    if let Some(x) = model.xe.get_mut(pf)
        && x.driver == drv
    {
        for f in &mut x.funcs {
            *f = XeFunc::default();
        }
    }
}
