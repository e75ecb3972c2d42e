//! The whole-GPU option.

use mdev_types::model::{Assignability, Gpu, Inventory, MdevParent, PciDevice};

use super::{Candidate, MatchOption, ProfileTarget, not_in_table};
use crate::profile::facts::device_facts;
use crate::profile::reason::{Reason, Refusal};
use crate::profile::spec::VFIO_PCI;

pub(super) fn passthrough_candidate(
    gpu: &Gpu,
    dev: &PciDevice,
    parents: &[&MdevParent],
    inv: &Inventory,
) -> Result<Candidate, Refusal> {
    let iommu_group = match &gpu.passthrough {
        Assignability::Yes { iommu_group } => *iommu_group,
        Assignability::No { reason } => {
            return Err(Refusal {
                candidate: format!("whole GPU {}", dev.address),
                reasons: vec![Reason::NotAssignable {
                    reason: reason.clone(),
                }],
            });
        }
    };
    let mut blockers = Vec::new();
    let mdevs: usize = parents
        .iter()
        .flat_map(|p| &p.types)
        .map(|t| t.instances.len())
        .sum();
    if mdevs > 0 {
        blockers.push(Reason::InUse {
            what: format!("{mdevs} mdev instances exist on it"),
        });
    }
    let vgpus = dev
        .sriov
        .iter()
        .flat_map(|s| &s.vfs)
        .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
        .filter(|d| {
            d.nvidia_vf
                .as_ref()
                .is_some_and(|n| n.current_type.is_some())
        })
        .count();
    if vgpus > 0 {
        blockers.push(Reason::InUse {
            what: format!("{vgpus} of its VFs hold a vGPU"),
        });
    }
    let memory = device_facts(dev.vendor, dev.device).and_then(|f| f.memory_mib);
    Ok(Candidate {
        option: MatchOption {
            target: ProfileTarget::Passthrough {
                pci: dev.address,
                iommu_group,
            },
            framebuffer_mib: memory,
            heads: None,
            max_resolution: None,
            device_api: VFIO_PCI.to_string(),
            series: None,
            capacity: u32::from(blockers.is_empty()),
            waste_mib: None,
        },
        blockers,
        why_no_fb: not_in_table(dev),
        why_no_display: "a whole GPU's display heads depend on its outputs and the guest driver"
            .to_string(),
        fb_context: None,
    })
}
