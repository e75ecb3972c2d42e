//! Matching a profile against a discovered host: per GPU, the best concrete option, the others that
//! would also do, and why everything else cannot.
//!
//! Best = among the options that meet every minimum of the profile and can be created now: first the
//! profile's `prefer` order of backends, then the least framebuffer beyond the minimum (so big vGPUs
//! stay free for big tenants), then the NVIDIA series that fits the class (vdi → B then Q,
//! workstation → Q, compute → C), then the most capacity left, then the option's name so the answer
//! is the same on every run.
//!
//! A [`MatchReport`] serializes (for `--json`) with these stable names:
//!
//! ```json
//! { "profile": "vdi-2g", "host": "simulated host 'demo'",
//!   "gpus": [ { "gpu": "0000:01:00.0", "pci": "0000:01:00.0", "vendor": "nvidia",
//!               "model": "NVIDIA T4", "numa_node": 0,
//!               "best": { "backend": "mdev", "parent": "0000:01:00.0", "type_id": "nvidia-223",
//!                         "type_name": "GRID T4-2B", "framebuffer_mib": 2048, "heads": 4,
//!                         "max_resolution": { "width": 5120, "height": 2880 },
//!                         "device_api": "vfio-pci", "series": "B", "capacity": 8, "waste_mib": 0 },
//!               "alternatives": [ … same shape … ],
//!               "refused": [ { "candidate": "nvidia-222 (GRID T4-1B)",
//!                              "reasons": [ { "code": "framebuffer-too-small",
//!                                             "message": "framebuffer 1 GiB < 2 GiB required" } ] } ] } ] }
//! ```
//!
//! `best` is `null` when the GPU cannot serve the profile. The other `backend`s carry: `sriov-vf` —
//! `pf`, `vf` (null until VFs exist), `vf_driver`, `num_vfs`, `enable_vfs`; `nvidia-vendor-vfio` —
//! `pf`, `vf`, `type_id` (number), `type_name`; `passthrough` — `pci`, `iommu_group`. Reason codes
//! are listed at [`Reason::code`].

use std::cmp::Reverse;

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory, Vendor};
use mdev_types::parse::NvidiaSeries;
use serde::Serialize;

use super::facts::device_facts;
use super::options::{Candidate, MatchOption, offers};
use super::reason::{Reason, Refusal};
use super::spec::{Profile, WorkloadClass};

/// The answer for one profile on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatchReport {
    /// The profile's name.
    pub profile: String,
    /// Which host was read (`Inventory::host`).
    pub host: String,
    /// One entry per GPU, in inventory order.
    pub gpus: Vec<GpuMatch>,
}

impl MatchReport {
    /// The GPUs that can serve the profile.
    pub fn servable(&self) -> impl Iterator<Item = &GpuMatch> {
        self.gpus.iter().filter(|g| g.best.is_some())
    }

    /// The entry for the GPU with this id (PCI address or virtual parent name).
    pub fn gpu(&self, id: &str) -> Option<&GpuMatch> {
        self.gpus.iter().find(|g| g.gpu == id)
    }
}

/// The answer for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuMatch {
    /// The GPU's id (`Gpu::id`).
    pub gpu: String,
    /// Its PCI address, for PCI GPUs.
    pub pci: Option<PciAddress>,
    /// Its vendor, from the PCI vendor id.
    pub vendor: Vendor,
    /// Its human model name (`Gpu::model`, e.g. `NVIDIA T4`).
    pub model: String,
    /// Its NUMA node, when known.
    pub numa_node: Option<u32>,
    /// The best option, or `None` when the GPU cannot serve the profile (then `refused` says why).
    pub best: Option<MatchOption>,
    /// Other options that would also serve, best first.
    pub alternatives: Vec<MatchOption>,
    /// Everything considered that cannot serve, with reasons.
    pub refused: Vec<Refusal>,
}

impl GpuMatch {
    /// One line saying why the GPU cannot serve the profile (`None` when it can).
    pub fn why_not(&self) -> Option<String> {
        if self.best.is_some() {
            return None;
        }
        Some(
            self.refused
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" | "),
        )
    }
}

/// Matches `profile` against every GPU of `inv`.
pub fn match_profile(profile: &Profile, inv: &Inventory) -> MatchReport {
    MatchReport {
        profile: profile.name.clone(),
        host: inv.host.clone(),
        gpus: inv
            .gpus
            .iter()
            .map(|g| match_gpu(profile, g, inv))
            .collect(),
    }
}

fn match_gpu(profile: &Profile, gpu: &Gpu, inv: &Inventory) -> GpuMatch {
    let mut out = GpuMatch {
        gpu: gpu.id.clone(),
        pci: gpu.pci,
        vendor: gpu.vendor,
        model: gpu.model.clone(),
        numa_node: gpu.numa_node,
        best: None,
        alternatives: Vec::new(),
        refused: Vec::new(),
    };
    let whole = |reason| Refusal {
        candidate: gpu.model.clone(),
        reasons: vec![reason],
    };
    if !profile.allows_vendor(gpu.vendor) {
        out.refused.push(whole(Reason::VendorNotAllowed {
            vendor: gpu.vendor,
            allowed: profile.vendors.clone(),
        }));
        return out;
    }
    let device = gpu
        .pci
        .and_then(|a| inv.pci_devices.iter().find(|d| d.address == a));
    let graphics = device
        .and_then(|d| device_facts(d.vendor, d.device))
        .map(|f| f.graphics);
    if profile.class.needs_graphics() && graphics == Some(false) {
        out.refused.push(whole(Reason::NoGraphics {
            model: gpu.model.clone(),
            class: profile.class,
        }));
        return out;
    }
    let offers = offers(gpu, inv, &profile.backends, profile.framebuffer_mib);
    if !offers.offered.iter().any(|b| profile.allows_backend(*b)) {
        out.refused.push(whole(Reason::NoAllowedBackend {
            offered: offers.offered,
            allowed: profile.backends.clone(),
        }));
        return out;
    }
    out.refused.extend(offers.refusals);
    let mut fitting = Vec::new();
    for c in offers.candidates {
        let mut reasons = shortfalls(profile, &c);
        reasons.extend(c.blockers.iter().cloned());
        if reasons.is_empty() && c.option.capacity == 0 {
            reasons.push(Reason::NoInstances { existing: 0 });
        }
        if reasons.is_empty() {
            let mut option = c.option;
            option.waste_mib = option
                .framebuffer_mib
                .map(|fb| fb.saturating_sub(profile.framebuffer_mib));
            fitting.push(option);
        } else {
            out.refused.push(Refusal {
                candidate: c.option.target.to_string(),
                reasons,
            });
        }
    }
    fitting.sort_by_key(|o| {
        (
            profile.preference_rank(o.target.backend()),
            o.waste_mib.unwrap_or(u64::MAX),
            series_rank(profile.class, o.series),
            Reverse(o.capacity),
            o.target.to_string(),
        )
    });
    let mut fitting = fitting.into_iter();
    out.best = fitting.next();
    out.alternatives = fitting.collect();
    out
}

/// Which of the profile's minimums `c` misses (empty: it meets them all).
fn shortfalls(p: &Profile, c: &Candidate) -> Vec<Reason> {
    let o = &c.option;
    let mut r = Vec::new();
    if o.device_api != p.device_api {
        r.push(Reason::DeviceApi {
            have: o.device_api.clone(),
            need: p.device_api.clone(),
        });
    }
    if p.framebuffer_mib > 0 {
        match o.framebuffer_mib {
            None => r.push(Reason::FramebufferUnknown {
                why: c.why_no_fb.clone(),
            }),
            Some(fb) if fb < p.framebuffer_mib => r.push(Reason::FramebufferTooSmall {
                have_mib: fb,
                need_mib: p.framebuffer_mib,
                context: c.fb_context.clone(),
            }),
            Some(_) => {}
        }
    }
    if p.heads > 0 {
        match o.heads {
            None => r.push(Reason::HeadsUnknown {
                why: c.why_no_display.clone(),
            }),
            Some(h) if h < p.heads => r.push(Reason::HeadsTooFew {
                have: h,
                need: p.heads,
            }),
            Some(_) => {}
        }
    }
    // Heads already refused covers a missing display; only ask about resolution when heads passed.
    if let (Some(need), true) = (p.max_resolution, r.iter().all(|x| !is_heads(x))) {
        match o.max_resolution {
            None => r.push(Reason::ResolutionUnknown {
                why: c.why_no_display.clone(),
            }),
            Some(have) if have.width < need.width || have.height < need.height => {
                r.push(Reason::ResolutionTooLow { have, need })
            }
            Some(_) => {}
        }
    }
    r
}

fn is_heads(r: &Reason) -> bool {
    matches!(r, Reason::HeadsTooFew { .. } | Reason::HeadsUnknown { .. })
}

/// How well an NVIDIA series suits a class, 0 best (NVIDIA vGPU User Guide, "Virtual GPU Types":
/// B = virtual PC, Q = virtual workstation, C = compute, A = virtual applications). Options without
/// a series (other vendors) rank as well as the best series: they never compete with NVIDIA types
/// on one GPU.
fn series_rank(class: WorkloadClass, series: Option<NvidiaSeries>) -> u8 {
    use NvidiaSeries::{A, B, C, Q};
    let Some(s) = series else { return 0 };
    let order: &[NvidiaSeries] = match class {
        WorkloadClass::Vdi => &[B, Q, A, C],
        WorkloadClass::Workstation => &[Q, B, A, C],
        WorkloadClass::Compute => &[C, Q, B, A],
        WorkloadClass::Passthrough | WorkloadClass::DisplayTest => &[],
    };
    order
        .iter()
        .position(|x| *x == s)
        .map_or(0, |i| u8::try_from(i).unwrap_or(u8::MAX))
}
