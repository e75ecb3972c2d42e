//! The profile file format: TOML read with spans, validated into a [`Profile`].
//!
//! A profile says what a tenant needs, vendor-neutral. Every field is checked here once, so matching
//! never sees an impossible value; every error names the file, the line and the field and says what
//! is allowed.
//!
//! ```toml
//! name = "vdi-2g"
//! description = "Business desktop, 2 GiB framebuffer"
//! class = "vdi"              # vdi | workstation | compute | passthrough | display-test
//! framebuffer = "2G"         # minimum; binary units M, G, T (1G = 1024M); default: no minimum
//! heads = 1                  # minimum display heads the virtual GPU itself presents; default 0
//! max_resolution = "1920x1200"  # minimum of the per-head maximum; needs heads >= 1
//! weight = 10                # compute weight 1-100, for time-slice scheduling
//! priority = "normal"        # optional: low | normal | high
//! vendors = ["nvidia", "intel", "amd"]      # default: nvidia, intel, amd (not virtual)
//! backends = ["mdev", "sriov-vf", "nvidia-vendor-vfio"]  # default depends on class
//! device_api = "vfio-pci"    # default vfio-pci
//! prefer = ["mdev"]          # optional: backends ranked before the others
//! ```

use std::fmt;
use std::ops::Range;

use mdev_types::model::Vendor;
use mdev_types::parse::{Resolution, parse_resolution, parse_size_mib};
use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::error::ProfileError;
use crate::spelling::spelled;
use crate::toml_file::{self, Source};

/// What kind of workload a profile is for. It steers which vGPU series fit best and whether a GPU
/// without a graphics engine can serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadClass {
    /// Virtual desktops (knowledge workers): NVIDIA B or Q series, GVT-g, xe VFs.
    Vdi,
    /// Professional 3D workstations: NVIDIA Q series first.
    Workstation,
    /// CUDA / ROCm / oneAPI compute: NVIDIA C series first, no display needed.
    Compute,
    /// A whole physical GPU through VFIO.
    Passthrough,
    /// A plain virtual display such as the kernel's sample mdev drivers provide.
    DisplayTest,
}

spelled!("workload class", WorkloadClass {
    Vdi => "vdi",
    Workstation => "workstation",
    Compute => "compute",
    Passthrough => "passthrough",
    DisplayTest => "display-test",
});

impl WorkloadClass {
    /// Whether the class renders graphics, so a compute-only accelerator cannot serve it.
    pub fn needs_graphics(self) -> bool {
        matches!(self, WorkloadClass::Vdi | WorkloadClass::Workstation)
    }
}

/// A way of giving a guest (part of) a GPU: how a vGPU is delivered. A profile lists the ones it
/// accepts in its `backends` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    /// A mediated device of an mdev parent (NVIDIA classic vGPU, Intel GVT-g, kernel samples).
    Mdev,
    /// An SR-IOV virtual function handed to the guest through vfio-pci (Intel xe/i915, AMD MxGPU).
    SriovVf,
    /// A VF with NVIDIA's vendor-specific VFIO interface (`nvidia/current_vgpu_type`).
    NvidiaVendorVfio,
    /// The whole physical GPU through vfio-pci.
    Passthrough,
}

spelled!("backend", Delivery {
    Mdev => "mdev",
    SriovVf => "sriov-vf",
    NvidiaVendorVfio => "nvidia-vendor-vfio",
    Passthrough => "passthrough",
});

impl Delivery {
    /// Whether a GPU of `vendor` can offer this backend at all. NVIDIA VFs carry vGPUs only through
    /// the vendor-specific VFIO interface (NVIDIA Virtual GPU Software User Guide, "vGPUs on
    /// SR-IOV GPUs"), AMD has no mdev driver, virtual parents are mdev-only, and the vendor-specific
    /// interface is NVIDIA's.
    pub fn offered_by(self, vendor: Vendor) -> bool {
        match (vendor, self) {
            (Vendor::Nvidia, Delivery::SriovVf) => false,
            (Vendor::Nvidia, _) => true,
            (Vendor::Intel, b) => b != Delivery::NvidiaVendorVfio,
            (Vendor::Amd, b) => matches!(b, Delivery::SriovVf | Delivery::Passthrough),
            (Vendor::Virtual, b) => b == Delivery::Mdev,
            (Vendor::Other, b) => b == Delivery::Passthrough,
        }
    }
}

/// Scheduling priority (Intel xe `sched_priority` has exactly these three; others map onto them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// Runs when nothing else wants to.
    Low,
    /// Neither preferred nor deferred: the default.
    Normal,
    /// Preferred over normal.
    High,
}

spelled!("priority", Priority {
    Low => "low",
    Normal => "normal",
    High => "high",
});

/// The vendors a profile or pool may name, with their spellings ([`Vendor::as_str`]): every vendor
/// but `other`, which names no vendor in particular.
pub fn nameable_vendors() -> Vec<(Vendor, &'static str)> {
    Vendor::ALL
        .into_iter()
        .filter(|v| *v != Vendor::Other)
        .map(|v| (v, v.as_str()))
        .collect()
}

/// VFIO device APIs (`VFIO_DEVICE_API_*_STRING` in include/uapi/linux/vfio.h). SR-IOV VFs and whole
/// GPUs are always `vfio-pci`; only mdev types may declare another.
const DEVICE_APIS: [&str; 5] = [
    "vfio-pci",
    "vfio-platform",
    "vfio-amba",
    "vfio-ccw",
    "vfio-ap",
];

/// The device API every PCI backend presents.
pub const VFIO_PCI: &str = "vfio-pci";

/// Most display heads any vGPU type offers is 4 (NVIDIA Virtual GPU Software User Guide, "Virtual
/// GPU Types"); 16 leaves room without accepting typos such as 40.
const MAX_HEADS: u32 = 16;

/// A validated profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// Unique name (`vdi-2g`): lower-case letters, digits and `-`.
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// Workload class.
    pub class: WorkloadClass,
    /// Minimum framebuffer in MiB (0: no minimum).
    pub framebuffer_mib: u64,
    /// Minimum display heads the virtual GPU itself presents (0: none needed, e.g. compute, or a
    /// desktop whose display comes from the remoting protocol).
    pub heads: u32,
    /// Minimum of the per-head maximum resolution, when the profile needs one.
    pub max_resolution: Option<Resolution>,
    /// Compute weight 1–100 (time-slice share, used by scheduling).
    pub weight: u32,
    /// Scheduling priority, when given.
    pub priority: Option<Priority>,
    /// Vendors whose GPUs may serve it.
    pub vendors: Vec<Vendor>,
    /// Backends that may serve it.
    pub backends: Vec<Delivery>,
    /// The VFIO device API the guest needs (`vfio-pci`).
    pub device_api: String,
    /// Backends ranked before all others, in this order (empty: rank by fit alone).
    pub prefer: Vec<Delivery>,
    /// Where it was read from (a path, or `builtin:NAME.toml`).
    pub origin: String,
}

impl Profile {
    /// Parses and validates one profile. `origin` names the source in errors (a path or
    /// `builtin:vdi-2g.toml`).
    pub fn from_toml(origin: &str, text: &str) -> Result<Profile, ProfileError> {
        let raw: RawProfile = toml_file::parse(origin, text)?;
        Validator(Source { origin, text }).validate(raw)
    }

    /// Whether `vendor` may serve this profile.
    pub fn allows_vendor(&self, vendor: Vendor) -> bool {
        self.vendors.contains(&vendor)
    }

    /// Whether `backend` may serve this profile.
    pub fn allows_backend(&self, backend: Delivery) -> bool {
        self.backends.contains(&backend)
    }

    /// Rank of `backend` under `prefer`: its index there, or `prefer.len()` for unlisted backends.
    pub fn preference_rank(&self, backend: Delivery) -> usize {
        self.prefer
            .iter()
            .position(|b| *b == backend)
            .unwrap_or(self.prefer.len())
    }
}

/// The file as written, with spans for error messages.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Spanned<String>,
    description: Spanned<String>,
    class: Spanned<String>,
    framebuffer: Option<Spanned<String>>,
    heads: Option<Spanned<i64>>,
    max_resolution: Option<Spanned<String>>,
    weight: Spanned<i64>,
    priority: Option<Spanned<String>>,
    vendors: Option<Spanned<Vec<Spanned<String>>>>,
    backends: Option<Spanned<Vec<Spanned<String>>>>,
    device_api: Option<Spanned<String>>,
    prefer: Option<Spanned<Vec<Spanned<String>>>>,
}

fn names<T>(table: &[(T, &'static str)]) -> String {
    table.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(", ")
}

/// Turns a [`RawProfile`] into a [`Profile`], or the first problem found.
struct Validator<'a>(Source<'a>);

impl Validator<'_> {
    fn field(
        &self,
        span: Range<usize>,
        field: &'static str,
        problem: impl Into<String>,
        allowed: impl Into<String>,
    ) -> ProfileError {
        self.0.field(span, field, problem, allowed)
    }

    /// Looks `value` up in `table`, or explains what is allowed.
    fn one_of<T: Copy>(
        &self,
        table: &[(T, &'static str)],
        value: &Spanned<String>,
        field: &'static str,
    ) -> Result<T, ProfileError> {
        table
            .iter()
            .find(|(_, n)| *n == value.get_ref())
            .map(|(v, _)| *v)
            .ok_or_else(|| {
                self.field(
                    value.span(),
                    field,
                    format!("has unknown value \"{}\"", value.get_ref()),
                    names(table),
                )
            })
    }

    /// A non-empty list without repeats, each entry from `table`.
    fn list_of<T: Copy + PartialEq>(
        &self,
        table: &[(T, &'static str)],
        list: &Spanned<Vec<Spanned<String>>>,
        field: &'static str,
    ) -> Result<Vec<T>, ProfileError> {
        if list.get_ref().is_empty() {
            return Err(self.field(
                list.span(),
                field,
                "is empty, so nothing could serve the profile",
                format!("one or more of {}", names(table)),
            ));
        }
        let mut out = Vec::new();
        for item in list.get_ref() {
            let v = self.one_of(table, item, field)?;
            if out.contains(&v) {
                return Err(self.field(
                    item.span(),
                    field,
                    format!("lists \"{}\" twice", item.get_ref()),
                    "each value once",
                ));
            }
            out.push(v);
        }
        Ok(out)
    }

    fn validate(&self, raw: RawProfile) -> Result<Profile, ProfileError> {
        let name = raw.name.get_ref();
        if !toml_file::valid_name(name) {
            return Err(self.field(
                raw.name.span(),
                "name",
                format!("\"{name}\" is not a valid profile name"),
                "1-64 lower-case letters, digits and '-', starting with a letter or digit, e.g. vdi-2g",
            ));
        }
        if raw.description.get_ref().trim().is_empty() {
            return Err(self.field(
                raw.description.span(),
                "description",
                "is empty",
                "one line saying what the profile is for",
            ));
        }
        let class = self.one_of(WorkloadClass::ALL, &raw.class, "class")?;
        let framebuffer_mib = match &raw.framebuffer {
            None => 0,
            Some(fb) => parse_size_mib(fb.get_ref()).map_err(|_| {
                self.field(
                    fb.span(),
                    "framebuffer",
                    format!("\"{}\" is not a size", fb.get_ref()),
                    "a whole number with unit M, G or T (binary: 1G = 1024M), e.g. \"512M\" or \"2G\"",
                )
            })?,
        };
        let heads = match &raw.heads {
            None => 0,
            Some(h) => u32::try_from(*h.get_ref())
                .ok()
                .filter(|&n| n <= MAX_HEADS)
                .ok_or_else(|| {
                    self.field(
                        h.span(),
                        "heads",
                        format!("is {}", h.get_ref()),
                        format!("0 to {MAX_HEADS}"),
                    )
                })?,
        };
        let max_resolution = match &raw.max_resolution {
            None => None,
            Some(r) => {
                let res = parse_resolution(r.get_ref()).map_err(|_| {
                    self.field(
                        r.span(),
                        "max_resolution",
                        format!("\"{}\" is not a resolution", r.get_ref()),
                        "WIDTHxHEIGHT with positive numbers, e.g. \"1920x1200\"",
                    )
                })?;
                if heads == 0 {
                    return Err(self.field(
                        r.span(),
                        "max_resolution",
                        "is set but heads is 0: a resolution needs a display head",
                        "heads = 1 or more together with max_resolution, or no max_resolution",
                    ));
                }
                Some(res)
            }
        };
        let weight = u32::try_from(*raw.weight.get_ref())
            .ok()
            .filter(|w| (1..=100).contains(w))
            .ok_or_else(|| {
                self.field(
                    raw.weight.span(),
                    "weight",
                    format!("is {}", raw.weight.get_ref()),
                    "a whole number from 1 to 100",
                )
            })?;
        let priority = match &raw.priority {
            None => None,
            Some(p) => Some(self.one_of(Priority::ALL, p, "priority")?),
        };
        let vendors = match &raw.vendors {
            None => vec![Vendor::Nvidia, Vendor::Intel, Vendor::Amd],
            Some(v) => self.list_of(&nameable_vendors(), v, "vendors")?,
        };
        let backends = match &raw.backends {
            None if class == WorkloadClass::Passthrough => vec![Delivery::Passthrough],
            None => vec![
                Delivery::Mdev,
                Delivery::SriovVf,
                Delivery::NvidiaVendorVfio,
            ],
            Some(b) => self.list_of(Delivery::ALL, b, "backends")?,
        };
        let device_api = match &raw.device_api {
            None => VFIO_PCI.to_string(),
            Some(d) => {
                let table: Vec<(&str, &'static str)> =
                    DEVICE_APIS.iter().map(|a| (*a, *a)).collect();
                self.one_of(&table, d, "device_api")?.to_string()
            }
        };
        let prefer = match &raw.prefer {
            None => Vec::new(),
            Some(p) if p.get_ref().is_empty() => Vec::new(),
            Some(p) => {
                let prefer = self.list_of(Delivery::ALL, p, "prefer")?;
                if let Some((b, item)) = prefer
                    .iter()
                    .zip(p.get_ref())
                    .find(|(b, _)| !backends.contains(b))
                {
                    return Err(self.field(
                        item.span(),
                        "prefer",
                        format!("lists \"{b}\", which backends does not allow"),
                        format!("backends from the backends list: {}", join(&backends)),
                    ));
                }
                prefer
            }
        };
        let profile = Profile {
            name: name.clone(),
            description: raw.description.get_ref().trim().to_string(),
            class,
            framebuffer_mib,
            heads,
            max_resolution,
            weight,
            priority,
            vendors,
            backends,
            device_api,
            prefer,
            origin: self.0.origin.to_string(),
        };
        let span = raw
            .backends
            .as_ref()
            .map_or_else(|| raw.class.span(), |b| b.span());
        match never_matches(&profile) {
            Some(reason) => Err(ProfileError::NeverMatches {
                origin: self.0.origin.to_string(),
                line: self.0.line(span),
                name: profile.name,
                reason,
            }),
            None => Ok(profile),
        }
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why no GPU on any host could ever serve `p`, if that is so.
fn never_matches(p: &Profile) -> Option<String> {
    if p.class == WorkloadClass::Passthrough && p.backends != [Delivery::Passthrough] {
        return Some(format!(
            "class passthrough means a whole GPU, which only backend passthrough gives, but backends \
             is [{}]; set backends = [\"passthrough\"]",
            join(&p.backends)
        ));
    }
    let vendor_names: Vec<&str> = p.vendors.iter().map(|v| v.as_str()).collect();
    let usable: Vec<Delivery> = p
        .backends
        .iter()
        .copied()
        .filter(|b| p.vendors.iter().any(|v| b.offered_by(*v)))
        .collect();
    if usable.is_empty() {
        let offered: Vec<String> = p
            .vendors
            .iter()
            .map(|v| {
                let bs: Vec<&str> = Delivery::ALL
                    .iter()
                    .filter(|(b, _)| b.offered_by(*v))
                    .map(|(_, n)| *n)
                    .collect();
                format!("{} offers {}", v.as_str(), bs.join(", "))
            })
            .collect();
        return Some(format!(
            "no allowed vendor offers an allowed backend: {}; backends is [{}]",
            offered.join("; "),
            join(&p.backends)
        ));
    }
    if p.device_api != VFIO_PCI && !usable.contains(&Delivery::Mdev) {
        return Some(format!(
            "device_api {} exists only on mdev types, but the usable backends for vendors [{}] are \
             [{}], which all present vfio-pci",
            p.device_api,
            vendor_names.join(", "),
            join(&usable)
        ));
    }
    if p.class.needs_graphics() && p.vendors == [Vendor::Virtual] {
        return Some(format!(
            "class {} needs a GPU with a graphics engine, and virtual mdev parents (the kernel's \
             sample drivers) only scan out a framebuffer; use class display-test",
            p.class.as_str()
        ));
    }
    None
}
