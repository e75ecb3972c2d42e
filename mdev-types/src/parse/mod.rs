//! Pure parsers for the sysfs attribute texts vgpu-manager reads. No I/O; no input makes them panic.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why an attribute text could not be parsed. Each variant names the rejected text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// Placeholder until the parser module lands.
    #[error("cannot parse {what} from {text:?}: {why}")]
    Invalid {
        /// What was being parsed (e.g. `NVIDIA mdev description`).
        what: &'static str,
        /// The offending text (possibly shortened).
        text: String,
        /// What was wrong and what was expected.
        why: String,
    },
}

/// A display resolution `WIDTHxHEIGHT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Resolution {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// A parsed NVIDIA classic-mdev `description`
/// (`num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=5120x2880, max_instance=8`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaMdevDescription {
    /// `num_heads`.
    pub num_heads: u32,
    /// `frl_config` (frame-rate limit, fps).
    pub frl_config: u32,
    /// `framebuffer` in MiB.
    pub framebuffer_mib: u64,
    /// `max_resolution`.
    pub max_resolution: Resolution,
    /// `max_instance`.
    pub max_instance: u32,
}

/// A parsed Intel GVT-g type `description` (lines `low_gm_size: 128MB`, `high_gm_size: 512MB`,
/// `fence: 4`, `resolution: 1920x1200`, `weight: 4`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GvtDescription {
    /// Low (mappable) graphics memory in MiB.
    pub low_gm_mib: u64,
    /// High graphics memory in MiB.
    pub high_gm_mib: u64,
    /// Fence registers.
    pub fence: u32,
    /// Maximum resolution.
    pub resolution: Resolution,
    /// Scheduling weight (fixed per type).
    pub weight: u32,
}

/// A type description parsed by whichever vendor format it matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "kebab-case")]
pub enum TypeDescription {
    /// NVIDIA classic mdev.
    Nvidia(NvidiaMdevDescription),
    /// Intel GVT-g.
    Gvt(GvtDescription),
    /// Kernel sample `mbochs`: `virtual display, 16 MB video memory`.
    SampleVideoMemory {
        /// Video memory in MiB.
        mib: u64,
    },
    /// Kernel sample `mdpy`: `virtual display, 1920x1080 framebuffer`.
    SampleFramebuffer {
        /// Framebuffer resolution.
        resolution: Resolution,
    },
    /// No description, or one in no known format.
    Unknown,
}
