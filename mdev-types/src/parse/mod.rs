//! Pure parsers for the sysfs attribute texts vgpu-manager reads. No I/O; no input makes them panic.
//!
//! * `attr` — plain numbers, `0`/`1` flags, the PCI `class` code.
//! * `resolution` — `WIDTHxHEIGHT` and sizes such as `2048M` / `128MB`.
//! * `nvidia` — NVIDIA classic mdev `description`.
//! * `vgpu_name` — NVIDIA vGPU type names (`NVIDIA L40S-4Q`).
//! * `creatable` — NVIDIA vendor-specific VFIO `nvidia/creatable_vgpu_types`.
//! * `gvt` — Intel GVT-g type `description`.
//! * `sample` — the kernel's sample mdev drivers `mbochs` and `mdpy`.
//!
//! Every parser accepts the trailing newline sysfs adds. Errors name the kind of text, the rejected
//! text (shortened) and what was expected; callers add the sysfs path.

mod attr;
mod creatable;
mod fields;
mod gvt;
mod nvidia;
mod resolution;
mod sample;
mod vgpu_name;

#[cfg(test)]
mod props;

pub use attr::{parse_bool01, parse_class, parse_i64, parse_u32, parse_u64};
pub use creatable::{format_creatable_vgpu_types, parse_creatable_vgpu_types};
pub use gvt::parse_gvt_description;
pub use nvidia::parse_nvidia_description;
pub use resolution::{parse_resolution, parse_size_mib};
pub use sample::{
    format_mbochs_description, format_mdpy_description, parse_mbochs_description,
    parse_mdpy_description,
};
pub use vgpu_name::{NvidiaSeries, NvidiaVgpuName, parse_nvidia_vgpu_name};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why an attribute text could not be parsed. Each variant names what was being parsed, the
/// rejected text (shortened to [`MAX_QUOTED`] characters) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// The text does not have the expected form.
    #[error("cannot parse {what} from {text:?}: expected {expected}")]
    Invalid {
        /// What was being parsed (e.g. `NVIDIA mdev description`, `PCI class`).
        what: &'static str,
        /// The rejected text (possibly shortened).
        text: String,
        /// The form that was expected, with an example.
        expected: &'static str,
    },
    /// A required `key=value` / `key: value` entry is absent.
    #[error("{what} {text:?} has no `{key}` entry: expected {expected}")]
    MissingKey {
        /// What was being parsed.
        what: &'static str,
        /// The key that was looked for and not found.
        key: &'static str,
        /// The whole text (possibly shortened).
        text: String,
        /// The whole expected form, quoted in the message as the fix.
        expected: &'static str,
    },
    /// A key occurs twice, so which value holds is ambiguous.
    #[error("{what} {text:?} has the `{key}` entry twice: expected each key once")]
    DuplicateKey {
        /// What was being parsed.
        what: &'static str,
        /// The repeated key (possibly shortened).
        key: String,
        /// The whole text (possibly shortened).
        text: String,
    },
    /// The value of one entry is malformed.
    #[error("{what}: entry `{key}`: {source}")]
    Field {
        /// What was being parsed.
        what: &'static str,
        /// The key whose value was rejected.
        key: &'static str,
        /// Why the value was rejected.
        source: Box<ParseError>,
    },
}

/// Longest rejected text quoted in a [`ParseError`], in characters; longer texts are cut with `…`.
pub const MAX_QUOTED: usize = 80;

/// `text`, cut to [`MAX_QUOTED`] characters (on a character boundary) so errors stay readable.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

impl ParseError {
    /// An [`ParseError::Invalid`] for `text`, shortened.
    fn invalid(what: &'static str, text: &str, expected: &'static str) -> Self {
        Self::Invalid {
            what,
            text: shorten(text),
            expected,
        }
    }
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

/// Parses a type `description` by whichever known format it matches: NVIDIA classic mdev, Intel
/// GVT-g, kernel sample `mbochs`, kernel sample `mdpy`. Returns [`TypeDescription::Unknown`] when
/// there is no description or it matches none (never an error: descriptions are informational).
pub fn parse_type_description(description: Option<&str>) -> TypeDescription {
    let Some(text) = description else {
        return TypeDescription::Unknown;
    };
    // The formats are disjoint: NVIDIA entries need `=`, GVT-g lines need `:` and no `=`, the
    // samples start with `virtual display, `. So the order only matters for speed.
    if let Ok(d) = parse_nvidia_description(text) {
        TypeDescription::Nvidia(d)
    } else if let Ok(d) = parse_gvt_description(text) {
        TypeDescription::Gvt(d)
    } else if let Ok(mib) = parse_mbochs_description(text) {
        TypeDescription::SampleVideoMemory { mib }
    } else if let Ok(resolution) = parse_mdpy_description(text) {
        TypeDescription::SampleFramebuffer { resolution }
    } else {
        TypeDescription::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_picks_each_format() {
        let nv = "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=5120x2880, max_instance=8\n";
        assert!(matches!(
            parse_type_description(Some(nv)),
            TypeDescription::Nvidia(NvidiaMdevDescription {
                framebuffer_mib: 2048,
                ..
            })
        ));
        let gvt =
            "low_gm_size: 128MB\nhigh_gm_size: 512MB\nfence: 4\nresolution: 1920x1200\nweight: 4\n";
        assert!(matches!(
            parse_type_description(Some(gvt)),
            TypeDescription::Gvt(GvtDescription {
                high_gm_mib: 512,
                ..
            })
        ));
        assert_eq!(
            parse_type_description(Some("virtual display, 16 MB video memory\n")),
            TypeDescription::SampleVideoMemory { mib: 16 }
        );
        assert_eq!(
            parse_type_description(Some("virtual display, 1920x1080 framebuffer\n")),
            TypeDescription::SampleFramebuffer {
                resolution: Resolution {
                    width: 1920,
                    height: 1080
                }
            }
        );
    }

    #[test]
    fn dispatch_unknown_never_errors() {
        for text in [
            None,
            Some(""),
            Some("\n"),
            Some("a fast vGPU"),
            Some("num_heads=4"),
        ] {
            assert_eq!(
                parse_type_description(text),
                TypeDescription::Unknown,
                "{text:?}"
            );
        }
    }

    #[test]
    fn long_rejected_text_is_shortened() {
        let long = "x".repeat(1000);
        let err = parse_u32(&long).unwrap_err();
        let ParseError::Invalid { text, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(text.chars().count(), MAX_QUOTED + 1);
        assert!(text.ends_with('…'));
        // Multi-byte characters are cut on a boundary, not mid-character.
        assert!(parse_u32(&"é".repeat(200)).is_err());
    }

    #[test]
    fn field_error_message_names_key_and_value() {
        let err = parse_nvidia_description(
            "num_heads=4, frl_config=60, framebuffer=lots, max_resolution=5120x2880, max_instance=8",
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("framebuffer"), "{msg}");
        assert!(msg.contains("\"lots\""), "{msg}");
    }
}
