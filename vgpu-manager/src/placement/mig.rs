//! MIG GPU-instance geometry: each GPU-instance profile may start at certain memory slices and spans a
//! fixed number of them; two instances conflict when their slice ranges overlap, and a profile allows
//! at most so many instances. MIG-backed vGPUs sit on one GPU instance each, so planning them is
//! placing GPU instances.
//!
//! Tables: A100-40GB as the NVIDIA MIG User Guide lists it ("Supported MIG Profiles", A100-SXM4-40GB),
//! and any GPU's table read through NVML (`nvmlDeviceGetGpuInstanceProfileInfo` and
//! `nvmlDeviceGetGpuInstancePossiblePlacements`), e.g. the H200 capture in
//! `tests/fixtures/h200-passthrough/nvml-mig-*.json`.

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;

use super::model::{Cost, Rule, Span};
use super::slots::{Item, mask, pack};

/// One GPU-instance profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigProfile {
    /// Name without NVML's `MIG ` prefix (`1g.5gb`, `3g.71gb`).
    pub name: String,
    /// NVML profile id.
    pub id: u32,
    /// Memory slices one instance spans.
    pub size: u32,
    /// Legal first memory slices.
    pub starts: Vec<u32>,
    /// Most instances of this profile on one GPU (NVML `instanceCount`).
    pub max_instances: u32,
    /// Memory of one instance in MiB, when known.
    pub memory_mib: Option<u64>,
}

impl MigProfile {
    /// Compute slices, from the `Ng` that starts the name (`3g.71gb`: 3); `u32::MAX` when absent.
    pub fn compute_slices(&self) -> u32 {
        self.name
            .split_once('g')
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or(u32::MAX)
    }
}

/// The MIG geometry of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigGeometry {
    /// The GPU model (`NVIDIA A100-SXM4-40GB`, `NVIDIA H200`).
    pub gpu: String,
    /// Memory slices (8 on A100 and H100/H200).
    pub slices: u32,
    /// Its GPU-instance profiles, with their sizes and legal start slices.
    pub profiles: Vec<MigProfile>,
}

/// A GPU instance: a profile at a start slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigInstance {
    /// Profile name.
    pub profile: String,
    /// First memory slice.
    pub start: u32,
}

/// Why a MIG table could not be read or instances cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MigError {
    /// A NVML JSON capture is not in the expected shape.
    #[error(
        "{what}: {problem}; expected NVML's shape ({{\"MIG 1g.18gb\": {{\"profile_id\": 19, \"placements\": [[0, 1], …]}}}} and {{\"gpu_instance_profiles\": [{{\"name\", \"id\", \"instanceCount\", \"memorySizeMB\"}}]}})"
    )]
    Json {
        /// Which input.
        what: String,
        /// What is wrong.
        problem: String,
    },
    /// A profile name the geometry does not have.
    #[error("{gpu} has no MIG profile '{name}'; its profiles are {known}")]
    UnknownProfile {
        /// The GPU model whose geometry was searched.
        gpu: String,
        /// The MIG profile name asked for.
        name: String,
        /// The profile names the geometry has, comma-separated.
        known: String,
    },
    /// More instances of a profile than the GPU allows.
    #[error(
        "{gpu} allows at most {max} instance(s) of MIG {profile}; {asked} asked for (existing included)"
    )]
    TooMany {
        /// The GPU model whose limit is exceeded.
        gpu: String,
        /// The MIG profile whose instance limit is exceeded.
        profile: String,
        /// The most instances of that profile the GPU allows.
        max: u32,
        /// How many in all.
        asked: u32,
    },
    /// An existing instance is not at a legal position, or overlaps another.
    #[error("existing MIG {profile} at slice {start} on {gpu} is not a legal or free position")]
    BadExisting {
        /// The GPU model the instance is on.
        gpu: String,
        /// The MIG profile name of the existing instance.
        profile: String,
        /// The memory slice the existing instance starts at.
        start: u32,
    },
    /// No arrangement of the wanted instances fits beside the existing ones.
    #[error(
        "no legal placement exists for MIG {wanted} on {gpu} with slices {taken} taken: every arrangement overlaps; ask for fewer or smaller instances, or destroy some"
    )]
    NoLegalPlacement {
        /// The GPU model for which no placement fits.
        gpu: String,
        /// The wanted profiles, comma-separated.
        wanted: String,
        /// The slices existing instances hold, e.g. `0-3`.
        taken: String,
    },
}

impl MigGeometry {
    /// A100-40GB: 8 memory slices (NVIDIA MIG User Guide, "A100 MIG Profiles":
    /// 1g.5gb starts 0–6 size 1, 7 instances; 1g.10gb 0,2,4,6 size 2, 4; 2g.10gb 0,2,4 size 2, 3;
    /// 3g.20gb 0,4 size 4, 2; 4g.20gb 0 size 4, 1; 7g.40gb 0 size 8, 1). Memory is the nominal GB
    /// of the name.
    pub fn a100_40gb() -> MigGeometry {
        let p = |name: &str, id, size, starts: &[u32], max, gb: u64| MigProfile {
            name: name.to_string(),
            id,
            size,
            starts: starts.to_vec(),
            max_instances: max,
            memory_mib: Some(gb * 1024),
        };
        MigGeometry {
            gpu: "NVIDIA A100-SXM4-40GB".into(),
            slices: 8,
            profiles: vec![
                // Profile ids as NVML numbers them (NVML_GPU_INSTANCE_PROFILE_*: 1_SLICE 0,
                // 2_SLICE 1, 3_SLICE 2, 4_SLICE 3, 7_SLICE 4, 1_SLICE_REV2 9 for the double-memory 1g).
                p("1g.5gb", 0, 1, &[0, 1, 2, 3, 4, 5, 6], 7, 5),
                p("1g.10gb", 9, 2, &[0, 2, 4, 6], 4, 10),
                p("2g.10gb", 1, 2, &[0, 2, 4], 3, 10),
                p("3g.20gb", 2, 4, &[0, 4], 2, 20),
                p("4g.20gb", 3, 4, &[0], 1, 20),
                p("7g.40gb", 4, 8, &[0], 1, 40),
            ],
        }
    }

    /// Reads NVML captures: `placements` maps profile name to `{profile_id, placements: [[start,
    /// size]…]}`; `profiles`, when given, is `{gpu_instance_profiles: [{id, name, instanceCount,
    /// memorySizeMB}…]}` (without it, a profile allows as many instances as it has placements).
    pub fn from_nvml_json(
        gpu: &str,
        placements: &str,
        profiles: Option<&str>,
    ) -> Result<MigGeometry, MigError> {
        let bad = |what: &str, problem: String| MigError::Json {
            what: what.to_string(),
            problem,
        };
        let pl: Value =
            serde_json::from_str(placements).map_err(|e| bad("placements", e.to_string()))?;
        let pl = pl
            .as_object()
            .ok_or_else(|| bad("placements", "not an object".into()))?;
        let info: Vec<Value> = match profiles {
            None => Vec::new(),
            Some(text) => {
                let v: Value =
                    serde_json::from_str(text).map_err(|e| bad("profiles", e.to_string()))?;
                v.get("gpu_instance_profiles")
                    .and_then(Value::as_array)
                    .cloned()
                    .ok_or_else(|| bad("profiles", "no gpu_instance_profiles array".into()))?
            }
        };
        let mut out = Vec::new();
        for (full, entry) in pl {
            let what = format!("placements of {full}");
            let id = entry
                .get("profile_id")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad(&what, "no profile_id".into()))?;
            let list = entry
                .get("placements")
                .and_then(Value::as_array)
                .ok_or_else(|| bad(&what, "no placements array".into()))?;
            let mut size = None;
            let mut starts = Vec::new();
            for p in list {
                let pair: Option<(u32, u32)> = p.as_array().and_then(|a| match a.as_slice() {
                    [s, z] => Some((
                        u32::try_from(s.as_u64()?).ok()?,
                        u32::try_from(z.as_u64()?).ok()?,
                    )),
                    _ => None,
                });
                let (s, z) = pair.ok_or_else(|| bad(&what, format!("{p} is not [start, size]")))?;
                if mask(s, z).is_none() {
                    return Err(bad(&what, format!("[{s}, {z}] is outside 64 slices")));
                }
                if size.is_some_and(|have| have != z) {
                    return Err(bad(&what, "placements of different sizes".into()));
                }
                size = Some(z);
                starts.push(s);
            }
            let Some(size) = size else {
                return Err(bad(&what, "no placements".into()));
            };
            let name = full.strip_prefix("MIG ").unwrap_or(full).to_string();
            let row = info.iter().find(|r| {
                r.get("id").and_then(Value::as_u64) == Some(u64::from(id))
                    || r.get("name").and_then(Value::as_str) == Some(full.as_str())
            });
            let max_instances = row
                .and_then(|r| r.get("instanceCount")?.as_u64())
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(u32::try_from(starts.len()).unwrap_or(u32::MAX));
            let memory_mib = row.and_then(|r| r.get("memorySizeMB")?.as_u64());
            out.push(MigProfile {
                name,
                id,
                size,
                starts,
                max_instances,
                memory_mib,
            });
        }
        out.sort_by_key(|p| (p.size, p.memory_mib, p.id));
        let slices = out
            .iter()
            .flat_map(|p| p.starts.iter().map(move |s| s + p.size))
            .max()
            .unwrap_or(0);
        Ok(MigGeometry {
            gpu: gpu.to_string(),
            slices,
            profiles: out,
        })
    }

    /// The profile called `name` (with or without the `MIG ` prefix).
    pub fn profile(&self, name: &str) -> Result<&MigProfile, MigError> {
        let name = name.strip_prefix("MIG ").unwrap_or(name);
        self.profiles
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| MigError::UnknownProfile {
                gpu: self.gpu.clone(),
                name: name.to_string(),
                known: self
                    .profiles
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The profile with the least memory of at least `need_mib`; among equals the fewest memory
    /// slices, then the fewest compute slices (the `Ng` of the name), so compute stays free.
    pub fn smallest_with_memory(&self, need_mib: u64) -> Option<&MigProfile> {
        self.profiles
            .iter()
            .filter(|p| p.memory_mib.is_some_and(|m| m >= need_mib))
            .min_by_key(|p| (p.memory_mib, p.size, p.compute_slices(), p.id))
    }

    /// The planner rule of a GPU with this geometry and these instances.
    pub fn rule(&self, existing: &[MigInstance]) -> Rule {
        let mut counts: Vec<(String, u32)> = Vec::new();
        let mut occupied = Vec::new();
        for i in existing {
            let size = self.profile(&i.profile).map_or(1, |p| p.size);
            occupied.push(Span {
                start: i.start,
                size,
            });
            match counts.iter_mut().find(|(k, _)| *k == i.profile) {
                Some((_, n)) => *n += 1,
                None => counts.push((i.profile.clone(), 1)),
            }
        }
        Rule::Geometry {
            span: self.slices,
            occupied,
            existing: counts,
        }
    }

    /// The planner cost of one instance of `profile` (its key is the profile name).
    pub fn cost(profile: &MigProfile) -> Cost {
        Cost::Geometry {
            size: profile.size,
            starts: profile.starts.clone(),
            limit: Some(profile.max_instances),
        }
    }
}

/// Finds a start for each wanted instance so that, with the existing ones, no two overlap and no
/// profile exceeds its instance limit, or says that none exists (the search is exhaustive).
pub fn place_instances(
    geometry: &MigGeometry,
    existing: &[MigInstance],
    wanted: &[&str],
) -> Result<Vec<MigInstance>, MigError> {
    let mut taken = 0u64;
    for i in existing {
        let p = geometry.profile(&i.profile)?;
        let m = mask(i.start, p.size)
            .filter(|m| p.starts.contains(&i.start) && taken & m == 0)
            .ok_or_else(|| MigError::BadExisting {
                gpu: geometry.gpu.clone(),
                profile: p.name.clone(),
                start: i.start,
            })?;
        taken |= m;
    }
    let profiles: Vec<&MigProfile> = wanted
        .iter()
        .map(|w| geometry.profile(w))
        .collect::<Result<_, _>>()?;
    for p in &profiles {
        let asked = existing.iter().filter(|i| i.profile == p.name).count()
            + profiles.iter().filter(|q| q.name == p.name).count();
        let asked = u32::try_from(asked).unwrap_or(u32::MAX);
        if asked > p.max_instances {
            return Err(MigError::TooMany {
                gpu: geometry.gpu.clone(),
                profile: p.name.clone(),
                max: p.max_instances,
                asked,
            });
        }
    }
    let items: Vec<Item<'_>> = profiles
        .iter()
        .map(|p| Item {
            size: p.size,
            starts: &p.starts,
        })
        .collect();
    match pack(taken, &items) {
        Some(starts) => Ok(profiles
            .iter()
            .zip(starts)
            .map(|(p, start)| MigInstance {
                profile: p.name.clone(),
                start,
            })
            .collect()),
        None => Err(MigError::NoLegalPlacement {
            gpu: geometry.gpu.clone(),
            wanted: profiles
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            taken: ranges(taken),
        }),
    }
}

/// `0-3,6` for the set bits of `taken`; `none` when empty.
fn ranges(taken: u64) -> String {
    let mut parts = Vec::new();
    let mut i = 0u32;
    while i < 64 {
        if taken >> i & 1 == 1 {
            let start = i;
            while i < 64 && taken >> i & 1 == 1 {
                i += 1;
            }
            parts.push(if i - 1 == start {
                start.to_string()
            } else {
                format!("{start}-{}", i - 1)
            });
        } else {
            i += 1;
        }
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(",")
    }
}
