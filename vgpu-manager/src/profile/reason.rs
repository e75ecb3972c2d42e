//! Why an option (or a whole GPU) cannot serve a profile. Each reason is a sentence naming the
//! numbers or objects involved; JSON carries a stable `code` beside the sentence.

use std::fmt;

use mdev_types::ids::PciAddress;
use mdev_types::model::Vendor;
use mdev_types::parse::Resolution;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use super::spec::{Delivery, WorkloadClass};

/// `2048` → `2 GiB`, `640` → `640 MiB`, `1536` → `1.5 GiB`.
pub fn fmt_mib(mib: u64) -> String {
    if mib >= 1024 && mib.is_multiple_of(1024) {
        format!("{} GiB", mib / 1024)
    } else if mib >= 1024 && mib.checked_mul(10).is_some_and(|t| t % 1024 == 0) {
        format!("{:.1} GiB", mib as f64 / 1024.0)
    } else {
        format!("{mib} MiB")
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn vendors(items: &[Vendor]) -> String {
    items
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One reason an option or a GPU cannot serve a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The GPU's vendor is not among the profile's vendors.
    VendorNotAllowed {
        /// The GPU's vendor.
        vendor: Vendor,
        /// The profile's vendors.
        allowed: Vec<Vendor>,
    },
    /// The GPU offers none of the profile's backends.
    NoAllowedBackend {
        /// What the GPU offers.
        offered: Vec<Delivery>,
        /// What the profile allows.
        allowed: Vec<Delivery>,
    },
    /// The GPU is a compute accelerator and the class renders graphics.
    NoGraphics {
        /// The GPU's human model name (`Gpu::model`).
        model: String,
        /// The profile's class.
        class: WorkloadClass,
    },
    /// Less framebuffer than required.
    FramebufferTooSmall {
        /// What the option has, MiB.
        have_mib: u64,
        /// What the profile needs, MiB.
        need_mib: u64,
        /// How the option's size came about, when that explains the fix (an SR-IOV split).
        context: Option<String>,
    },
    /// The profile needs framebuffer and the option's size is not known.
    FramebufferUnknown {
        /// Why it is not known.
        why: String,
    },
    /// Fewer display heads than required.
    HeadsTooFew {
        /// What the option has.
        have: u32,
        /// What the profile needs.
        need: u32,
    },
    /// The profile needs display heads and the option's are not known.
    HeadsUnknown {
        /// Why they are not known.
        why: String,
    },
    /// Per-head maximum resolution below the required one.
    ResolutionTooLow {
        /// What the option has.
        have: Resolution,
        /// What the profile needs.
        need: Resolution,
    },
    /// The profile needs a resolution and the option's is not known.
    ResolutionUnknown {
        /// Why it is not known.
        why: String,
    },
    /// The mdev type's `device_api` differs from the profile's.
    DeviceApi {
        /// The type's.
        have: String,
        /// The profile's.
        need: String,
    },
    /// An mdev parent lists no types at all.
    NoTypes {
        /// The parent's name.
        parent: String,
    },
    /// `available_instances` is 0.
    NoInstances {
        /// Instances of this type that exist.
        existing: usize,
    },
    /// NVIDIA's homogeneous rule: other types have instances, so this one shows 0 available.
    Homogeneous {
        /// The mdev type ids that have instances now.
        existing_types: Vec<String>,
    },
    /// A device has no IOMMU group, so VFIO cannot isolate it.
    NoIommuGroup {
        /// The PCI address of the device without an IOMMU group.
        device: PciAddress,
    },
    /// The whole GPU cannot be assigned (the sentence discovery gave).
    NotAssignable {
        /// Why not.
        reason: String,
    },
    /// The whole GPU is in use by vGPUs.
    InUse {
        /// What uses it.
        what: String,
    },
    /// `sriov_numvfs` cannot be written without the PF bound to its driver.
    PfDriverMissing {
        /// The PCI address of the PF that has no driver bound.
        pf: PciAddress,
    },
    /// NVIDIA SR-IOV GPU without VFs enabled.
    VfsNotEnabled {
        /// The PCI address of the PF whose `sriov_numvfs` is 0.
        pf: PciAddress,
        /// How to enable them.
        how: String,
    },
    /// VFs exist but none has the NVIDIA vendor-specific VFIO interface.
    NoVendorInterface {
        /// The PCI address of the PF whose VFs lack `nvidia/`.
        pf: PciAddress,
    },
    /// Every VF already holds a vGPU.
    NoFreeVf {
        /// VFs enabled.
        num_vfs: u32,
    },
    /// Free VFs exist but `creatable_vgpu_types` lists nothing: the framebuffer is used up.
    FramebufferExhausted {
        /// VFs that hold a vGPU.
        occupied: usize,
    },
}

impl Reason {
    /// Stable machine-readable code (kebab-case), used in JSON.
    pub fn code(&self) -> &'static str {
        match self {
            Reason::VendorNotAllowed { .. } => "vendor-not-allowed",
            Reason::NoAllowedBackend { .. } => "no-allowed-backend",
            Reason::NoGraphics { .. } => "no-graphics",
            Reason::FramebufferTooSmall { .. } => "framebuffer-too-small",
            Reason::FramebufferUnknown { .. } => "framebuffer-unknown",
            Reason::HeadsTooFew { .. } => "heads-too-few",
            Reason::HeadsUnknown { .. } => "heads-unknown",
            Reason::ResolutionTooLow { .. } => "resolution-too-low",
            Reason::ResolutionUnknown { .. } => "resolution-unknown",
            Reason::DeviceApi { .. } => "device-api",
            Reason::NoTypes { .. } => "no-types",
            Reason::NoInstances { .. } => "no-instances",
            Reason::Homogeneous { .. } => "homogeneous",
            Reason::NoIommuGroup { .. } => "no-iommu-group",
            Reason::NotAssignable { .. } => "not-assignable",
            Reason::InUse { .. } => "in-use",
            Reason::PfDriverMissing { .. } => "pf-driver-missing",
            Reason::VfsNotEnabled { .. } => "vfs-not-enabled",
            Reason::NoVendorInterface { .. } => "no-vendor-interface",
            Reason::NoFreeVf { .. } => "no-free-vf",
            Reason::FramebufferExhausted { .. } => "framebuffer-exhausted",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::VendorNotAllowed { vendor, allowed } => write!(
                f,
                "vendor {} not allowed by profile (allows {})",
                vendor.as_str(),
                vendors(allowed)
            ),
            Reason::NoAllowedBackend { offered, allowed } => {
                let offered = if offered.is_empty() {
                    "nothing".to_string()
                } else {
                    list(offered)
                };
                write!(
                    f,
                    "offers {offered}, none of the profile's backends ({})",
                    list(allowed)
                )
            }
            Reason::NoGraphics { model, class } => write!(
                f,
                "{model} is a compute accelerator without a graphics engine; class {} needs one",
                class.as_str()
            ),
            Reason::FramebufferTooSmall {
                have_mib,
                need_mib,
                context,
            } => {
                write!(
                    f,
                    "framebuffer {} < {} required",
                    fmt_mib(*have_mib),
                    fmt_mib(*need_mib)
                )?;
                match context {
                    Some(c) => write!(f, " ({c})"),
                    None => Ok(()),
                }
            }
            Reason::FramebufferUnknown { why } => {
                write!(
                    f,
                    "framebuffer unknown ({why}), so it cannot be shown to suffice"
                )
            }
            Reason::HeadsTooFew { have, need } => {
                write!(f, "{have} display heads < {need} required")
            }
            Reason::HeadsUnknown { why } => write!(f, "display heads unknown ({why})"),
            Reason::ResolutionTooLow { have, need } => {
                write!(f, "max resolution {have} < {need} required")
            }
            Reason::ResolutionUnknown { why } => write!(f, "max resolution unknown ({why})"),
            Reason::DeviceApi { have, need } => {
                write!(f, "device_api {have}, profile needs {need}")
            }
            Reason::NoTypes { parent } => {
                write!(f, "{parent} lists no types in mdev_supported_types")
            }
            Reason::NoInstances { existing: 0 } => write!(f, "0 instances available"),
            Reason::NoInstances { existing } => {
                write!(f, "0 instances available ({existing} exist)")
            }
            Reason::Homogeneous { existing_types } => write!(
                f,
                "homogeneous: {} instances exist, other types unavailable",
                existing_types.join(", ")
            ),
            Reason::NoIommuGroup { device } => write!(
                f,
                "no IOMMU group: {device} has none, so VFIO cannot isolate it (enable VT-d/AMD-Vi \
                 and boot with intel_iommu=on or amd_iommu=on)"
            ),
            Reason::NotAssignable { reason } => write!(f, "not assignable: {reason}"),
            Reason::InUse { what } => write!(f, "in use: {what}"),
            Reason::PfDriverMissing { pf } => write!(
                f,
                "{pf} has no driver bound, and sriov_numvfs can only be written through the PF's \
                 driver; bind it to its GPU driver first"
            ),
            Reason::VfsNotEnabled { pf, how } => {
                write!(
                    f,
                    "SR-IOV VFs are not enabled on {pf}; enable them with `{how} {pf}`"
                )
            }
            Reason::NoVendorInterface { pf } => write!(
                f,
                "the VFs of {pf} have no nvidia/ directory: the NVIDIA vGPU manager with \
                 vendor-specific VFIO (vGPU 17+, kernel 6.8+) is not driving them"
            ),
            Reason::NoFreeVf { num_vfs } => {
                write!(f, "all {num_vfs} VFs already hold a vGPU")
            }
            Reason::FramebufferExhausted { occupied } => write!(
                f,
                "creatable_vgpu_types lists no type: the framebuffer is used up by {occupied} vGPUs"
            ),
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Reason", 2)?;
        st.serialize_field("code", self.code())?;
        st.serialize_field("message", &self.to_string())?;
        st.end()
    }
}

/// An option (or a whole backend of a GPU) that cannot serve the profile, with every reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// What was considered (`nvidia-222 (GRID T4-1B)`, `whole GPU`, `vendor`).
    pub candidate: String,
    /// Why it cannot serve; never empty.
    pub reasons: Vec<Reason>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.candidate)?;
        let msgs: Vec<String> = self.reasons.iter().map(|r| r.to_string()).collect();
        f.write_str(&msgs.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_naturally() {
        assert_eq!(fmt_mib(2048), "2 GiB");
        assert_eq!(fmt_mib(1536), "1.5 GiB");
        assert_eq!(fmt_mib(1280), "1280 MiB");
        assert_eq!(fmt_mib(640), "640 MiB");
        assert_eq!(fmt_mib(16), "16 MiB");
    }

    #[test]
    fn messages_name_the_numbers() {
        let r = Reason::FramebufferTooSmall {
            have_mib: 1024,
            need_mib: 2048,
            context: None,
        };
        assert_eq!(r.to_string(), "framebuffer 1 GiB < 2 GiB required");
        let r = Reason::VendorNotAllowed {
            vendor: Vendor::Intel,
            allowed: vec![Vendor::Nvidia, Vendor::Amd],
        };
        assert_eq!(
            r.to_string(),
            "vendor intel not allowed by profile (allows nvidia, amd)"
        );
        let r = Reason::Homogeneous {
            existing_types: vec!["nvidia-231".into()],
        };
        assert_eq!(
            r.to_string(),
            "homogeneous: nvidia-231 instances exist, other types unavailable"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["code"], "homogeneous");
        assert_eq!(json["message"], r.to_string());
    }
}
