//! NVIDIA's time-sliced vGPU scheduler, shared by the classic mdev and the vendor-specific VFIO
//! interface: one policy per physical GPU, set by the `RmPVMRL` registry DWORD.
//!
//! Facts (NVIDIA Virtual GPU Software User Guide, "vGPU Schedulers" and "RmPVMRL Registry Key"):
//! * policies: best effort (default; idle VMs cede their slices), equal share (each running vGPU gets
//!   1/n), fixed share (each vGPU a fixed share set by its type, kept even while others idle);
//! * `RmPVMRL`: `0x00` best effort, `0x01` equal share, `0x11` fixed share; `0x00TT0001` /
//!   `0x00TT0011` with a time slice of `TT` ms (`0x01`–`0x1E`, i.e. 1–30 ms);
//! * default time slice: 2 ms (480 Hz) with up to 8 vGPUs, 1 ms (960 Hz) above;
//! * per GPU: `NVreg_RegistryDwordsPerDevice="pci=0000:86:00.0;RmPVMRL=0x…"` in modprobe configuration
//!   (read when the `nvidia` module loads), or at runtime with the vendor tool only while no VM runs on
//!   the GPU;
//! * fixed share is not supported with mixed-size (heterogeneous) vGPUs.
//!
//! The `nvidia` module's parameters are `module_param(x, charp, 0)` (nv-linux.h
//! `NV_MODULE_STRING_PARAMETER`): not in `/sys/module`; `/proc/driver/nvidia/params` lists them without
//! the `NVreg_` prefix (nv-procfs.c), which is where the policy is read back from.

use std::collections::BTreeSet;
use std::path::Path;

use mdev_types::ids::PciAddress;
use serde::{Deserialize, Serialize};
use vgpu_host::{Host, HostExt};

use super::common::{self, Slot, slot_plans};
use super::{BackendError, BackendKind};
use crate::sched::{
    PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, Setting, SettingTarget,
    SlotState, TakesEffect,
};

/// Where the driver lists its registry options.
pub const PARAMS: &str = "/proc/driver/nvidia/params";
/// The module option carrying per-GPU registry DWORDs.
pub const PER_DEVICE_OPTION: &str = "NVreg_RegistryDwordsPerDevice";
/// Shortest and longest configurable time slice, ms.
pub const SLICE_RANGE_MS: std::ops::RangeInclusive<u32> = 1..=30;

/// An NVIDIA vGPU scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvPolicy {
    /// Round robin over vGPUs with work; no guaranteed share (`0x00`).
    BestEffort,
    /// 1/n for each of n running vGPUs (`0x01`).
    EqualShare,
    /// A type-determined share kept even while others idle (`0x11`).
    FixedShare,
}

impl NvPolicy {
    /// The user guide's name.
    pub fn name(self) -> &'static str {
        match self {
            NvPolicy::BestEffort => "best effort",
            NvPolicy::EqualShare => "equal share",
            NvPolicy::FixedShare => "fixed share",
        }
    }
}

/// The `RmPVMRL` value for `policy` with a time slice (`None`: the default slice).
pub fn encode_rmpvmrl(policy: NvPolicy, slice_ms: Option<u8>) -> u32 {
    let base = match policy {
        NvPolicy::BestEffort => return 0,
        NvPolicy::EqualShare => 0x01,
        NvPolicy::FixedShare => 0x11,
    };
    base | u32::from(slice_ms.unwrap_or(0)) << 16
}

/// The policy and explicit time slice an `RmPVMRL` value selects, or `None` for a value outside the
/// documented forms.
pub fn decode_rmpvmrl(v: u32) -> Option<(NvPolicy, Option<u8>)> {
    let slice = u8::try_from((v >> 16) & 0xff).ok()?;
    if v >> 24 != 0 || (v >> 8) & 0xff != 0 {
        return None;
    }
    let slice = (slice != 0).then_some(slice);
    if slice.is_some_and(|s| !SLICE_RANGE_MS.contains(&u32::from(s))) {
        return None;
    }
    match (v & 0xff, slice) {
        (0x00, None) => Some((NvPolicy::BestEffort, None)),
        (0x01, s) => Some((NvPolicy::EqualShare, s)),
        (0x11, s) => Some((NvPolicy::FixedShare, s)),
        _ => None,
    }
}

/// `0x01`, `0x00030011`.
pub fn format_dword(v: u32) -> String {
    if v <= 0xff {
        format!("0x{v:02x}")
    } else {
        format!("0x{v:08x}")
    }
}

/// The default time slice for `vgpus` running vGPUs.
pub fn default_slice_ms(vgpus: usize) -> u8 {
    if vgpus <= 8 { 2 } else { 1 }
}

/// What the scheduler needs to know about one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NvSlotInfo {
    /// The vGPU's framebuffer, MiB, when known.
    pub framebuffer_mib: Option<u64>,
    /// How many vGPUs of its type fit the GPU (fixed share gives each 1/this).
    pub max_instances: Option<u32>,
}

/// The GPU a plan is for.
pub(crate) struct NvGpu<'a> {
    pub gpu: &'a str,
    pub kind: BackendKind,
    pub pci: PciAddress,
    /// vGPUs that exist now (a runtime change needs none running).
    pub existing: usize,
}

/// The plan for `pairs` (slots with their requests) with `infos` per pair.
pub(crate) fn plan(
    g: &NvGpu,
    pairs: &[(Slot, &SchedRequest)],
    infos: &[NvSlotInfo],
    refusals: Vec<SchedRefusal>,
    opts: &PlanOptions,
) -> SchedPlan {
    let policy = if opts.reserve {
        NvPolicy::FixedShare
    } else {
        NvPolicy::EqualShare
    };
    let mut plan = SchedPlan::new(g.gpu, g.kind.as_str(), policy.name(), opts.tolerance);
    plan.slots = slot_plans(pairs);
    plan.refusals = refusals;
    plan.refusals.extend(common::refuse_priorities(
        &plan.slots,
        "NVIDIA's vGPU scheduler",
    ));
    let n = plan.slots.len();
    if n == 0 {
        return plan;
    }
    let slice = match opts.time_slice_ms {
        Some(t) if !SLICE_RANGE_MS.contains(&t) => {
            plan.refusals.push(SchedRefusal::gpu(
                "time-slice-range",
                format!("time slice {t} ms is outside RmPVMRL's 1-30 ms"),
            ));
            None
        }
        t => t.and_then(|t| u8::try_from(t).ok()),
    };
    let sizes: BTreeSet<u64> = infos
        .iter()
        .zip(pairs)
        .filter_map(|(i, (_, r))| i.framebuffer_mib.or(r.framebuffer_mib))
        .collect();
    let mixed = sizes.len() > 1;
    if let Some(mut r) = common::refuse_unequal(
        &plan.slots,
        "NVIDIA's schedulers cannot weight vGPUs individually",
    ) {
        r.code = if mixed {
            r.reason.push_str(
                ": equal share gives every vGPU 1/n, and fixed share (shares by type) is not supported with mixed sizes; run the differently weighted vGPUs on separate GPUs",
            );
            "unequal-weights-mixed-sizes".to_string()
        } else {
            r.reason.push_str(
                ": equal share gives every vGPU 1/n and fixed share 1/(instances of its type); run the differently weighted vGPUs on separate GPUs",
            );
            "unequal-weights".to_string()
        };
        plan.refusals.push(r);
    }
    if policy == NvPolicy::FixedShare && mixed {
        plan.refusals.push(SchedRefusal::gpu(
            "fixed-share-mixed-sizes",
            "fixed share is not supported with mixed-size vGPUs (heterogeneous mode); drop --reserve or use one size",
        ));
    }
    let eff_slice = slice.unwrap_or(default_slice_ms(n));
    let (eff, round_slots): (Vec<f64>, usize) = match policy {
        NvPolicy::FixedShare => {
            let maxes: Vec<Option<u32>> = infos.iter().map(|i| i.max_instances).collect();
            if maxes.iter().any(Option::is_none) {
                plan.refusals.push(SchedRefusal::gpu(
                    "fixed-share-unknown-type",
                    "fixed share sizes each share by the vGPU type, and the type of a vGPU still to be created is unknown: give its framebuffer (a profile) or create it first",
                ));
            }
            let m = maxes.iter().flatten().copied().max().unwrap_or(1).max(1);
            (
                maxes
                    .iter()
                    .map(|x| 1.0 / f64::from(x.unwrap_or(m).max(1)))
                    .collect(),
                usize::try_from(m).unwrap_or(n),
            )
        }
        _ => (vec![1.0 / n as f64; n], n),
    };
    common::set_effective(&mut plan.slots, &eff);
    plan.period_ms = Some(f64::from(eff_slice) * round_slots as f64);
    plan.worst_case_wait_ms = Some(f64::from(eff_slice) * round_slots.saturating_sub(1) as f64);
    let dword = encode_rmpvmrl(policy, slice);
    plan.settings.push(Setting {
        target: SettingTarget::ModuleOption {
            module: "nvidia".to_string(),
            option: PER_DEVICE_OPTION.to_string(),
        },
        value: format!("pci={};RmPVMRL={}", g.pci, format_dword(dword)),
        takes_effect: TakesEffect::ModuleLoad,
    });
    plan.notes.push(format!(
        "RmPVMRL={} ({}, {} ms slices) takes effect when the nvidia module is next loaded: a driver reload, which stops every vGPU on the host",
        format_dword(dword),
        policy.name(),
        eff_slice
    ));
    plan.notes.push(format!(
        "at runtime NVIDIA's vendor tool can change the policy only while no VM runs on this GPU ({} vGPUs exist now)",
        g.existing
    ));
    plan.check_tolerance();
    plan
}

/// Per-device DWORDs of a `RegistryDwordsPerDevice` value (`pci=A;Key=0x..;pci=B;Key=..`).
pub fn per_device_dwords(value: &str) -> Vec<(PciAddress, String, u32)> {
    let mut out = Vec::new();
    let mut dev: Option<PciAddress> = None;
    for tok in value.trim().trim_matches('"').split(';') {
        let Some((k, v)) = tok.trim().split_once('=') else {
            continue;
        };
        if k.trim() == "pci" {
            dev = v.trim().parse().ok();
            continue;
        }
        let v = v.trim();
        let num = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(h) => u32::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        };
        if let (Some(d), Some(n)) = (dev, num) {
            out.push((d, k.trim().to_string(), n));
        }
    }
    out
}

/// The policy configured for `pci`, read from the driver's parameter listing.
pub(crate) fn read_back(
    host: &dyn Host,
    g: &NvGpu,
    slots: Vec<Slot>,
) -> Result<SchedState, BackendError> {
    let text = host
        .read_optional(Path::new(PARAMS))
        .map_err(|e| BackendError::host(g.gpu, e))?;
    let mut st = SchedState::new(g.gpu, g.kind.as_str(), "unknown");
    st.slots = slots
        .into_iter()
        .map(|s| SlotState {
            slot: s.name,
            device: s.device,
            quantum_ms: None,
            preempt_timeout_us: None,
            priority: None,
            weight: None,
            share: None,
        })
        .collect();
    let Some(text) = text else {
        st.notes.push(format!(
            "{PARAMS} is not readable (is the nvidia module loaded?): the policy is unknown"
        ));
        return Ok(st);
    };
    let value = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("RegistryDwordsPerDevice:"))
        .unwrap_or("")
        .trim()
        .to_string();
    st.raw
        .push((format!("{PARAMS}: RegistryDwordsPerDevice"), value.clone()));
    let dword = per_device_dwords(&value)
        .into_iter()
        .find(|(d, k, _)| *d == g.pci && k == "RmPVMRL")
        .map(|(_, _, v)| v);
    let (policy, slice) = match dword.map(|v| (v, decode_rmpvmrl(v))) {
        None => (NvPolicy::BestEffort, None),
        Some((_, Some(p))) => p,
        Some((v, None)) => {
            st.policy = format!("undocumented RmPVMRL {}", format_dword(v));
            return Ok(st);
        }
    };
    let slice = slice.unwrap_or(default_slice_ms(st.slots.len()));
    st.policy = format!(
        "{} ({} ms slices){}",
        policy.name(),
        slice,
        if dword.is_none() {
            ", the driver default: no RmPVMRL for this GPU"
        } else {
            ""
        }
    );
    if policy == NvPolicy::EqualShare && !st.slots.is_empty() {
        let share = 1.0 / st.slots.len() as f64;
        for s in &mut st.slots {
            s.share = Some(share);
        }
    }
    st.notes.push(
        "this is the policy the driver was loaded with; a runtime change made with the vendor tool is not visible here".to_string(),
    );
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmpvmrl_round_trips_the_documented_forms() {
        assert_eq!(encode_rmpvmrl(NvPolicy::BestEffort, Some(3)), 0x00);
        assert_eq!(encode_rmpvmrl(NvPolicy::EqualShare, None), 0x01);
        assert_eq!(encode_rmpvmrl(NvPolicy::FixedShare, None), 0x11);
        assert_eq!(encode_rmpvmrl(NvPolicy::EqualShare, Some(3)), 0x0003_0001);
        assert_eq!(encode_rmpvmrl(NvPolicy::FixedShare, Some(30)), 0x001e_0011);
        for v in [0x00, 0x01, 0x11, 0x0003_0001, 0x001e_0011] {
            let (p, s) = decode_rmpvmrl(v).unwrap();
            assert_eq!(encode_rmpvmrl(p, s), v);
        }
        // Outside the documented forms: unknown policy byte, slice above 30 ms, stray bits.
        for v in [0x02, 0x001f_0001, 0x0100_0001, 0x0000_0101, 0x0003_0000] {
            assert_eq!(decode_rmpvmrl(v), None, "{v:#x}");
        }
        assert_eq!(format_dword(0x11), "0x11");
        assert_eq!(format_dword(0x0003_0001), "0x00030001");
    }

    #[test]
    fn default_slices_follow_the_vgpu_count() {
        assert_eq!(default_slice_ms(1), 2);
        assert_eq!(default_slice_ms(8), 2);
        assert_eq!(default_slice_ms(9), 1);
    }

    #[test]
    fn per_device_values_name_their_gpu() {
        let v = per_device_dwords(
            "\"pci=0000:86:00.0;RmPVMRL=0x11;pci=0000:01:00.0;RmPVMRL=1;Other=0x5\"",
        );
        let a: PciAddress = "0000:86:00.0".parse().unwrap();
        let b: PciAddress = "0000:01:00.0".parse().unwrap();
        assert_eq!(
            v,
            vec![
                (a, "RmPVMRL".to_string(), 0x11),
                (b, "RmPVMRL".to_string(), 1),
                (b, "Other".to_string(), 5)
            ]
        );
        assert!(per_device_dwords("RmPVMRL=1").is_empty());
    }
}
