//! Options of an mdev parent: one per type in `mdev_supported_types`.

use mdev_types::ids::MdevTypeId;
use mdev_types::model::{MdevParent, MdevType, Vendor};
use mdev_types::parse::{Resolution, TypeDescription, parse_nvidia_vgpu_name};

use super::{Candidate, MatchOption, ProfileTarget};
use crate::profile::facts::{GVT_HEADS, SAMPLE_HEADS, mdpy_memory_mib};
use crate::profile::reason::Reason;

/// Framebuffer, heads, resolution a type description gives, or why they are unknown.
type Described = (Option<u64>, Option<u32>, Option<Resolution>, String);

/// Framebuffer, heads and resolution a type description gives, or why they are unknown.
fn describe(t: &MdevType) -> Described {
    match &t.details {
        TypeDescription::Nvidia(d) => (
            Some(d.framebuffer_mib),
            Some(d.num_heads),
            Some(d.max_resolution),
            String::new(),
        ),
        // GVT-g graphics memory is the aperture (low) plus the hidden (high) GGTT range
        // (drivers/gpu/drm/i915/gvt/vgpu.c, `intel_vgpu_configs`).
        TypeDescription::Gvt(d) => (
            Some(d.low_gm_mib.saturating_add(d.high_gm_mib)),
            Some(GVT_HEADS),
            Some(d.resolution),
            String::new(),
        ),
        TypeDescription::SampleVideoMemory { mib } => (
            Some(*mib),
            Some(SAMPLE_HEADS),
            None,
            "an mbochs description gives video memory, not a resolution".to_string(),
        ),
        TypeDescription::SampleFramebuffer { resolution } => (
            Some(mdpy_memory_mib(*resolution)),
            Some(SAMPLE_HEADS),
            Some(*resolution),
            String::new(),
        ),
        TypeDescription::Unknown => {
            let why = match &t.description {
                None => format!("type {} has no description", t.id),
                Some(d) => format!(
                    "the description {:?} of {} is in no known format",
                    d.trim(),
                    t.id
                ),
            };
            (None, None, None, why)
        }
    }
}

/// How many more instances of type `t` of a GPU's parent (`Inventory::gpu_mdev_parent`) the GPU
/// takes. On a parent of its own that is the type's `available_instances`. When the GPU's VFs are its
/// parents (`on_vfs`), each free VF shows one instance as long as the type still fits, however few fit
/// in all, so their sum is capped by NVIDIA's per-GPU `max_instance` less the instances that exist
/// (the homogeneous rule keeps them all of this type).
pub(crate) fn vf_capacity(t: &MdevType, on_vfs: bool) -> u32 {
    match &t.details {
        TypeDescription::Nvidia(d) if on_vfs => {
            let existing = u32::try_from(t.instances.len()).unwrap_or(u32::MAX);
            t.available_instances
                .min(d.max_instance.saturating_sub(existing))
        }
        _ => t.available_instances,
    }
}

/// The options of a GPU's mdev parent (`Inventory::gpu_mdev_parent`: its own, or its SR-IOV VFs'
/// seen as one), one per type. `target` names the parent a type's instance goes to: the parent
/// itself, or the first VF that can still take the type.
pub(super) fn mdev_candidates(
    vendor: Vendor,
    parent: &MdevParent,
    on_vfs: bool,
    target: &dyn Fn(&MdevTypeId) -> String,
) -> Vec<Candidate> {
    let with_instances: Vec<&MdevType> = parent
        .types
        .iter()
        .filter(|t| !t.instances.is_empty())
        .collect();
    parent
        .types
        .iter()
        .map(|t| {
            let available = vf_capacity(t, on_vfs);
            let (fb, heads, res, why) = describe(t);
            let series = t
                .name
                .as_deref()
                .filter(|_| vendor == Vendor::Nvidia)
                .and_then(|n| parse_nvidia_vgpu_name(n).ok())
                .map(|n| n.series);
            let mut blockers = Vec::new();
            if available == 0 {
                let others: Vec<String> = with_instances
                    .iter()
                    .filter(|o| o.id != t.id)
                    .map(|o| o.id.to_string())
                    .collect();
                // NVIDIA time-sliced vGPUs on one GPU must all be of one type (NVIDIA vGPU User
                // Guide, "Homogeneous vGPUs"), so other types show 0 available once one exists.
                if vendor == Vendor::Nvidia && t.instances.is_empty() && !others.is_empty() {
                    blockers.push(Reason::Homogeneous {
                        existing_types: others,
                    });
                } else {
                    blockers.push(Reason::NoInstances {
                        existing: t.instances.len(),
                    });
                }
            }
            Candidate {
                option: MatchOption {
                    target: ProfileTarget::Mdev {
                        parent: target(&t.id),
                        type_id: t.id.clone(),
                        type_name: t.name.clone(),
                    },
                    framebuffer_mib: fb,
                    heads,
                    max_resolution: res,
                    device_api: t.device_api.clone(),
                    series,
                    capacity: available,
                    waste_mib: None,
                },
                blockers,
                why_no_fb: why.clone(),
                why_no_display: why,
                fb_context: None,
            }
        })
        .collect()
}
