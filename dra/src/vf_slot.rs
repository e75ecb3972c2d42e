//! VF-backed devices: an SR-IOV VF on vfio-pci (Intel xe/i915, AMD MxGPU) or an NVIDIA vGPU type on a
//! VF (vendor-specific VFIO). vgpud makes those only as pool slots, so the plugin has vgpud apply, per
//! allocated device, a pool of one slot of the device's profile pinned to its GPU, not started with
//! vgpud (`autostart = false`; the kubelet prepares the claim again after a reboot), and removes that
//! pool on unprepare. vgpud keeps the pool's one owner of the VF: its slot record.
//!
//! The pool is named `dra-<the device's vGPU UUID in hex>` (the UUID v5 of driver, claim UID and
//! device, [`crate::driver::Driver::vgpu_uuid`]), so a retry or a restart finds the pool it applied,
//! and described `vgpu-dra-plugin <driver>: claim <ns>/<name> device <device>`. Both together mark the
//! pools this driver made: at start, such a pool whose name the checkpoint does not list (an
//! unprepare whose removal the plugin did not see through) is removed; no other pool is touched.

use std::collections::HashSet;

use vgpu_client::{ClientError, GpuOffers, PoolStatus, SlotRow};

use crate::checkpoint::PreparedDevice;
use crate::device_name::canonical_pci;
use crate::vgpud::{SlotPool, Vgpud};

/// The start of every pool name the plugin gives vgpud.
pub const POOL_PREFIX: &str = "dra-";
/// The start of the description of every pool the plugin gives vgpud, before the driver name.
const DESCRIPTION_PREFIX: &str = "vgpu-dra-plugin";

/// Why a VF-backed device could not be made, found or given back.
#[derive(Debug, thiserror::Error)]
pub enum VfSlotError {
    /// A vgpud call failed.
    #[error(
        "vgpud could not {action} pool {pool} (one {profile} VF slot on {gpu}) for claim {claim}"
    )]
    Vgpud {
        /// `apply`, `remove`, `read the status of`.
        action: &'static str,
        /// The pool.
        pool: String,
        /// The profile.
        profile: String,
        /// The GPU.
        gpu: String,
        /// The claim `namespace/name`.
        claim: String,
        /// The daemon's or the bus's error.
        #[source]
        source: Box<ClientError>,
    },
    /// The pool applied, but its slot has no VF a container can be given.
    #[error(
        "pool {pool} applied, but its {profile} slot on {gpu} is {state} without a VF and IOMMU group; `vgpuctl pool status` shows it"
    )]
    NoVf {
        /// The pool.
        pool: String,
        /// The profile.
        profile: String,
        /// The GPU.
        gpu: String,
        /// The slot's state.
        state: String,
    },
}

/// The pool name of the device whose vGPU UUID is `vgpu_uuid`: `dra-` and the UUID's 32 hex digits.
pub fn pool_name(vgpu_uuid: &str) -> String {
    let hex: String = vgpu_uuid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!("{POOL_PREFIX}{hex}")
}

/// The description of the pool of `device` in claim `namespace/name` of `driver`; characters a pool
/// description cannot hold (quotes, backslashes, control characters) become `_`.
pub fn description(driver: &str, namespace: &str, name: &str, device: &str) -> String {
    format!("{DESCRIPTION_PREFIX} {driver}: claim {namespace}/{name} device {device}")
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Whether `p` is a pool this plugin (driver `driver`) made: its name and description say so.
pub fn is_ours(p: &PoolStatus, driver: &str) -> bool {
    let hex = p.pool.strip_prefix(POOL_PREFIX).unwrap_or_default();
    hex.len() == 32
        && hex.chars().all(|c| c.is_ascii_hexdigit())
        && p.description
            .starts_with(&format!("{DESCRIPTION_PREFIX} {driver}: "))
}

/// Whether vgpud's offers serve `profile` on GPU `gpu` (a canonical PCI address) with a VF: its
/// option there is VF-backed, or it has none there now (the GPU is full, or holds another type) and
/// the GPU serves by VFs — then the pool's apply says why it does not fit.
pub fn is_vf_backed(offers: &[GpuOffers], gpu: &str, profile: &str) -> bool {
    offers
        .iter()
        .filter(|g| {
            g.gpu == gpu || g.pci.as_deref().and_then(canonical_pci).as_deref() == Some(gpu)
        })
        .any(|g| match g.options.iter().find(|o| o.profile == profile) {
            Some(o) => o.backend != "mdev",
            None => g.vfs.is_some(),
        })
}

/// The slot of a one-slot pool, when it is set up: its VF and the VF's IOMMU group.
fn made(rows: &[SlotRow]) -> Option<(String, u32)> {
    let row = rows.first()?;
    if row.state != "running" {
        return None;
    }
    Some((row.vf.clone()?, row.iommu_group?))
}

/// The VF-backed device `d` of claim `claim` (`namespace/name`) set up: its pool applied when its slot
/// is not running (vgpud makes the slot again on a stopped one); its VF and IOMMU group.
pub async fn ensure(
    vgpud: &dyn Vgpud,
    driver: &str,
    claim: (&str, &str),
    d: &PreparedDevice,
    pool: &str,
) -> Result<(String, u32), VfSlotError> {
    let fail = |action, source| VfSlotError::Vgpud {
        action,
        pool: pool.to_string(),
        profile: d.profile.clone(),
        gpu: d.gpu.clone(),
        claim: format!("{}/{}", claim.0, claim.1),
        source: Box::new(source),
    };
    let status = vgpud
        .pool_status()
        .await
        .map_err(|e| fail("read the status of", e))?;
    if let Some(slot) = status
        .iter()
        .find(|p| p.pool == pool)
        .and_then(|p| made(&p.slots))
    {
        return Ok(slot);
    }
    let req = SlotPool {
        name: pool.to_string(),
        description: description(driver, claim.0, claim.1, &d.device),
        profile: d.profile.clone(),
        gpu: d.gpu.clone(),
    };
    let summary = vgpud.apply_pool(&req).await.map_err(|e| fail("apply", e))?;
    let slot = made(&summary.slots).ok_or_else(|| VfSlotError::NoVf {
        pool: pool.to_string(),
        profile: d.profile.clone(),
        gpu: d.gpu.clone(),
        state: summary
            .slots
            .first()
            .map_or_else(|| "missing".to_string(), |r| r.state.clone()),
    })?;
    tracing::info!(%pool, vf = %slot.0, gpu = %d.gpu, profile = %d.profile, "VF slot made");
    Ok(slot)
}

/// Removes the pool of device `d`; whether vgpud had it.
pub async fn remove(
    vgpud: &dyn Vgpud,
    claim: (&str, &str),
    d: &PreparedDevice,
    pool: &str,
) -> Result<bool, VfSlotError> {
    let r = vgpud
        .remove_pool(pool)
        .await
        .map_err(|source| VfSlotError::Vgpud {
            action: "remove",
            pool: pool.to_string(),
            profile: d.profile.clone(),
            gpu: d.gpu.clone(),
            claim: format!("{}/{}", claim.0, claim.1),
            source: Box::new(source),
        })?;
    Ok(r.applied || !r.removed.is_empty())
}

/// Removes every pool of driver `driver` whose name `keep` does not hold; the pools removed. A pool
/// that cannot be removed is logged and left for the next start.
pub async fn remove_orphans(
    vgpud: &dyn Vgpud,
    driver: &str,
    keep: &HashSet<String>,
) -> Result<Vec<String>, ClientError> {
    let mut removed = Vec::new();
    for p in vgpud.pool_status().await? {
        if !is_ours(&p, driver) || keep.contains(&p.pool) {
            continue;
        }
        match vgpud.remove_pool(&p.pool).await {
            Ok(_) => {
                tracing::info!(pool = %p.pool, description = %p.description, "orphaned VF slot pool removed");
                removed.push(p.pool);
            }
            Err(e) => {
                tracing::warn!(pool = %p.pool, error = %e, "orphaned VF slot pool could not be removed; the next start tries again")
            }
        }
    }
    Ok(removed)
}

/// Whether the slot of pool `pool` runs in `status`, and the words for it.
pub fn health(status: &[PoolStatus], pool: &str) -> (bool, String) {
    match status.iter().find(|p| p.pool == pool) {
        None => (false, format!("VF slot pool {pool} is gone")),
        Some(p) => match p.slots.first() {
            Some(r) if r.state == "running" => (
                true,
                format!(
                    "VF {} runs on {}",
                    r.vf.as_deref().unwrap_or("?"),
                    r.gpu.as_deref().unwrap_or("?")
                ),
            ),
            Some(r) => match &r.fault {
                Some(f) => (
                    false,
                    format!("GPU {}: {f}", r.gpu.as_deref().unwrap_or("?")),
                ),
                None => (false, format!("VF slot of pool {pool} is {}", r.state)),
            },
            None => (false, format!("VF slot pool {pool} has no slot")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, description: &str) -> PoolStatus {
        PoolStatus {
            pool: name.into(),
            description: description.into(),
            policy: "consolidate".into(),
            autostart: false,
            applied_at: 0,
            wanted: Default::default(),
            in_sync: true,
            slots: Vec::new(),
            gpus: Vec::new(),
        }
    }

    #[test]
    fn pool_names_are_short_valid_and_marked() {
        let n = pool_name("0f9b8c3a-5a1e-5d2b-9c4e-3f2a1b0c9d8e");
        assert_eq!(n, "dra-0f9b8c3a5a1e5d2b9c4e3f2a1b0c9d8e");
        assert!(n.len() <= 64);
        let d = description(
            "vgpu.vgpu-manager.io",
            "vms",
            "desk\"x",
            "gpu-0000-85-00-0-vdi-2g-0",
        );
        assert_eq!(
            d,
            "vgpu-dra-plugin vgpu.vgpu-manager.io: claim vms/desk_x device gpu-0000-85-00-0-vdi-2g-0"
        );
        let ours = status(&n, &d);
        assert!(is_ours(&ours, "vgpu.vgpu-manager.io"));
        // Another driver's, an operator's pool named alike, a look-alike name: not ours.
        assert!(!is_ours(&ours, "other.example.com"));
        assert!(!is_ours(&status(&n, "desktops"), "vgpu.vgpu-manager.io"));
        assert!(!is_ours(&status("dra-floor", &d), "vgpu.vgpu-manager.io"));
    }

    #[test]
    fn a_slot_is_healthy_while_it_runs() {
        let mut p = status("dra-a", "d");
        let row = |state: &str, fault: Option<&str>| SlotRow {
            profile: "vdi-2g".into(),
            index: 0,
            uuid: "u".into(),
            gpu: Some("0000:85:00.0".into()),
            numa_node: None,
            type_id: None,
            parent: None,
            type_name: None,
            state: state.into(),
            vf: Some("0000:85:00.4".into()),
            pci_id: None,
            iommu_group: Some(40),
            fault: fault.map(str::to_string),
        };
        p.slots = vec![row("running", None)];
        assert_eq!(
            health(std::slice::from_ref(&p), "dra-a"),
            (true, "VF 0000:85:00.4 runs on 0000:85:00.0".to_string())
        );
        p.slots = vec![row("stopped", None)];
        assert!(!health(std::slice::from_ref(&p), "dra-a").0);
        p.slots = vec![row("stopped", Some("unreadable"))];
        assert_eq!(
            health(std::slice::from_ref(&p), "dra-a").1,
            "GPU 0000:85:00.0: unreadable"
        );
        assert_eq!(
            health(&[], "dra-a"),
            (false, "VF slot pool dra-a is gone".to_string())
        );
        assert_eq!(made(&p.slots), None);
        p.slots = vec![row("running", None)];
        assert_eq!(made(&p.slots), Some(("0000:85:00.4".to_string(), 40)));
    }
}
