//! Turning a request (profile or type, optional GPU) into a concrete parent and mdev type.

use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};
use tracing::warn;
use vgpu_host::discover::discover_without_groups;
use vgpu_host::{HostExt, paths};

use super::instances::Instances;
use crate::daemon::api::{CoreError, InstanceSpec, InstanceTarget, RequestError};
use crate::daemon::store::{Definition, unix_now};
use crate::profile::{ProfileTarget, match_profile};

/// Where an instance goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Placement {
    /// The mdev parent.
    pub parent: String,
    /// The GPU id clients see (the parent name for mdev parents).
    pub gpu: String,
    /// The type.
    pub type_id: MdevTypeId,
    /// The profile it came from.
    pub profile: Option<String>,
    /// vgpud chose `parent` among the SR-IOV VFs of `gpu` (the request named the GPU or a profile,
    /// not the VF): a create may take another free VF of the GPU instead.
    pub vf_chosen: bool,
}

impl Placement {
    /// The persistent definition of instance `uuid` placed here, as `req` asks for it (start mode,
    /// label, attributes), defined now.
    pub(super) fn definition(&self, uuid: MdevUuid, req: &InstanceSpec) -> Definition {
        Definition {
            uuid,
            parent: self.parent.clone(),
            gpu: self.gpu.clone(),
            type_id: self.type_id.clone(),
            profile: self.profile.clone(),
            autostart: req.autostart,
            label: req.label.clone(),
            created_at: unix_now(),
            attrs: req.attrs.clone(),
        }
    }
}

/// Accepts `3b:00.0` for `0000:3b:00.0`; other names (virtual parents) unchanged.
fn normalize_gpu(gpu: &str) -> String {
    gpu.parse::<PciAddress>()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| gpu.to_string())
}

impl Instances {
    /// Chooses parent and type. With `need_capacity` (Create), the type must have an instance left.
    pub(super) fn place(
        &self,
        req: &InstanceSpec,
        need_capacity: bool,
    ) -> Result<Placement, CoreError> {
        let gpu = req.gpu.as_deref().map(normalize_gpu);
        match &req.target {
            InstanceTarget::Type(type_id) => self.place_type(type_id, gpu, need_capacity),
            InstanceTarget::Profile(name) => self.place_profile(name, gpu, need_capacity),
        }
    }

    pub(super) fn available(&self, parent: &str, type_id: &MdevTypeId) -> Option<u32> {
        self.host
            .read_trimmed(&paths::mdev_type_dir(parent, type_id).join("available_instances"))
            .ok()
            .and_then(|s| s.parse().ok())
    }

    fn place_type(
        &self,
        type_id: &MdevTypeId,
        gpu: Option<String>,
        need_capacity: bool,
    ) -> Result<Placement, CoreError> {
        // Whether the named GPU is a registered parent, asked once.
        let exists = gpu.as_deref().is_some_and(|g| self.parent_exists(g));
        if let Some(g) = &gpu
            && !exists
            && let Some(first) = self.vf_parents(g).into_iter().next()
        {
            return self.place_type_on_vfs(type_id, g, first, need_capacity);
        }
        let parent = match gpu {
            Some(p) => {
                if !exists && !need_capacity {
                    // A definition may name a parent whose driver is not loaded yet: it waits for it.
                    return Ok(Placement {
                        gpu: p.clone(),
                        parent: p,
                        type_id: type_id.clone(),
                        profile: None,
                        vf_chosen: false,
                    });
                }
                if !exists {
                    return Err(RequestError::NoParent {
                        parent: p,
                        host: self.host.describe(),
                    }
                    .into());
                }
                // Checked before anything is written: a faulted GPU gets nothing new.
                if let Some(fault) = self.health.fault(self.host.as_ref(), &p) {
                    return Err(RequestError::Faulted {
                        gpu: p,
                        fault: Box::new(fault),
                    }
                    .into());
                }
                match self.available(&p, type_id) {
                    // mdevctl defines a type its parent does not list (yet) without a check (mdevctl
                    // src/main.rs `define_command_helper`); the kernel's error comes at start.
                    None if !need_capacity => {
                        warn!(parent = %p, %type_id, "defining a type the parent does not list: starting it fails until the parent offers it");
                        p
                    }
                    None => {
                        return Err(RequestError::TypeNotOffered {
                            parent: p,
                            type_id: type_id.clone(),
                        }
                        .into());
                    }
                    Some(0) if need_capacity => {
                        return Err(RequestError::TypeFull {
                            parent: p,
                            type_id: type_id.clone(),
                        }
                        .into());
                    }
                    Some(_) => p,
                }
            }
            None => {
                // Spread: the parent with the most instances of this type left.
                let inv = discover_without_groups(self.host.as_ref())?;
                let offers: Vec<(u32, String)> = inv
                    .mdev_parents
                    .iter()
                    .filter(|p| !is_faulted(&inv, p))
                    .filter_map(|p| {
                        p.types
                            .iter()
                            .find(|t| &t.id == type_id)
                            .map(|t| (t.available_instances, p.name.clone()))
                    })
                    .collect();
                if offers.is_empty() {
                    return Err(RequestError::NoGpuOffers {
                        type_id: type_id.clone(),
                        host: self.host.describe(),
                    }
                    .into());
                }
                let best = offers
                    .iter()
                    .max_by_key(|(n, name)| (*n, std::cmp::Reverse(name.clone())));
                match best {
                    Some((n, name)) if *n > 0 || !need_capacity => {
                        return Ok(Placement {
                            gpu: inv
                                .gpu_of_parent(name)
                                .map_or_else(|| name.clone(), |g| g.id.clone()),
                            parent: name.clone(),
                            type_id: type_id.clone(),
                            profile: None,
                            vf_chosen: false,
                        });
                    }
                    _ => {
                        return Err(RequestError::EveryGpuFull {
                            type_id: type_id.clone(),
                        }
                        .into());
                    }
                }
            }
        };
        Ok(Placement {
            // A VF named as the parent: its instance belongs to its physical GPU.
            gpu: self.gpu_of_parent(&parent),
            parent,
            type_id: type_id.clone(),
            profile: None,
            vf_chosen: false,
        })
    }

    /// [`Instances::place_type`] on GPU `gpu` whose SR-IOV VFs are its mdev parents (NVIDIA classic
    /// vGPU on Ampere and later, one vGPU per VF): the first VF that can take the type now, or — to
    /// define without capacity — the first VF. The create takes the GPU's lock and picks its VF
    /// again under it ([`Instances::create`]).
    fn place_type_on_vfs(
        &self,
        type_id: &MdevTypeId,
        gpu: &str,
        first: String,
        need_capacity: bool,
    ) -> Result<Placement, CoreError> {
        if let Some(fault) = self.health.fault(self.host.as_ref(), gpu) {
            return Err(RequestError::Faulted {
                gpu: gpu.to_string(),
                fault: Box::new(fault),
            }
            .into());
        }
        let parent = match self.free_vf_parent(gpu, type_id) {
            Some(vf) => vf,
            None if !need_capacity => first,
            None if self.available(&first, type_id).is_none() => {
                return Err(RequestError::TypeNotOffered {
                    parent: first,
                    type_id: type_id.clone(),
                }
                .into());
            }
            None => {
                return Err(RequestError::VfsFull {
                    gpu: gpu.to_string(),
                    type_id: type_id.clone(),
                }
                .into());
            }
        };
        Ok(Placement {
            parent,
            gpu: gpu.to_string(),
            type_id: type_id.clone(),
            profile: None,
            vf_chosen: true,
        })
    }

    fn place_profile(
        &self,
        name: &str,
        gpu: Option<String>,
        need_capacity: bool,
    ) -> Result<Placement, CoreError> {
        let profile = self
            .catalog
            .get(name)
            .ok_or_else(|| RequestError::UnknownProfile {
                name: name.to_string(),
                known: self.catalog.names().join(", "),
            })?;
        let inv = discover_without_groups(self.host.as_ref())?;
        if let Some(fault) = gpu.as_deref().and_then(|want| inv.fault_of(want)) {
            return Err(RequestError::Faulted {
                gpu: fault.device.clone(),
                fault: Box::new(fault.clone()),
            }
            .into());
        }
        let report = match_profile(profile, &inv);
        let candidates: Vec<_> = report
            .gpus
            .iter()
            .filter(|g| gpu.as_deref().is_none_or(|want| g.gpu == want))
            .collect();
        if let Some(want) = &gpu
            && candidates.is_empty()
        {
            return Err(RequestError::NoGpu {
                gpu: want.clone(),
                host: inv.host.clone(),
            }
            .into());
        }
        // Every mdev option of every candidate GPU, best first per GPU.
        let mut options = Vec::new();
        let mut other_backends = Vec::new();
        for g in &candidates {
            for opt in g.best.iter().chain(&g.alternatives) {
                match &opt.target {
                    ProfileTarget::Mdev {
                        parent, type_id, ..
                    } => {
                        if opt.capacity > 0 || !need_capacity {
                            options.push((
                                g.gpu.clone(),
                                parent.clone(),
                                type_id.clone(),
                                opt.capacity,
                            ));
                            break;
                        }
                    }
                    _ => {
                        if !other_backends.contains(&g.gpu) {
                            other_backends.push(g.gpu.clone());
                        }
                    }
                }
            }
        }
        // Spread: the GPU with the most capacity for its best mdev option.
        if let Some((gpu_id, parent, type_id, _)) = options
            .into_iter()
            .max_by_key(|(g, _, _, cap)| (*cap, std::cmp::Reverse(g.clone())))
        {
            return Ok(Placement {
                vf_chosen: parent != gpu_id,
                parent,
                gpu: gpu_id,
                type_id,
                profile: Some(profile.name.clone()),
            });
        }
        // One short reason per GPU (its closest miss); `vgpuctl match` shows them all.
        let mut why: Vec<String> = candidates
            .iter()
            .filter(|g| !other_backends.contains(&g.gpu))
            .filter_map(|g| {
                let first = g.refused.first()?;
                let more = g.refused.len() - 1;
                Some(if more > 0 {
                    format!("{}: {first} (+{more} more)", g.gpu)
                } else {
                    format!("{}: {first}", g.gpu)
                })
            })
            .collect();
        if !other_backends.is_empty() {
            why.push(format!(
                "{} could serve it through an SR-IOV VF or a vendor-VFIO vGPU, which vgpud assigns as pool slots: put the profile in a pool (`vgpuctl pool apply FILE`)",
                other_backends.join(", ")
            ));
        }
        Err(RequestError::NoRoom {
            profile: name.to_string(),
            why,
        }
        .into())
    }
}

/// Whether discovery could not read `parent` or its PCI function: nothing is placed on it then.
fn is_faulted(inv: &mdev_types::model::Inventory, parent: &mdev_types::model::MdevParent) -> bool {
    inv.fault_of(&parent.name).is_some()
        || parent
            .pci
            .is_some_and(|a| inv.fault_of(&a.to_string()).is_some())
}
