//! NVIDIA classic mdev type `description`.
//!
//! Source: NVIDIA Virtual GPU Software User Guide, "Creating an NVIDIA vGPU on a Linux with KVM
//! Hypervisor": `cat mdev_supported_types/nvidia-*/description` prints one line of comma-separated
//! `key=value` entries, e.g.
//! `num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=5120x2880, max_instance=8`.

use std::fmt;

use super::fields::Fields;
use super::{NvidiaMdevDescription, ParseError, parse_resolution, parse_size_mib, parse_u32};

const WHAT: &str = "NVIDIA mdev description";
const EXPECTED: &str = "comma-separated key=value entries with num_heads, frl_config, framebuffer, \
     max_resolution and max_instance, e.g. num_heads=4, frl_config=60, framebuffer=2048M, \
     max_resolution=5120x2880, max_instance=8";

/// Parses an NVIDIA classic mdev `description`. Keys may come in any order and unknown keys are
/// ignored (newer drivers may add some); each of the five known keys is required.
pub fn parse_nvidia_description(text: &str) -> Result<NvidiaMdevDescription, ParseError> {
    let fields = Fields::split(WHAT, text, EXPECTED, ',', '=')?;
    Ok(NvidiaMdevDescription {
        num_heads: fields.get("num_heads", parse_u32)?,
        frl_config: fields.get("frl_config", parse_u32)?,
        framebuffer_mib: fields.get("framebuffer", parse_size_mib)?,
        max_resolution: fields.get("max_resolution", parse_resolution)?,
        max_instance: fields.get("max_instance", parse_u32)?,
    })
}

impl fmt::Display for NvidiaMdevDescription {
    /// The description as the NVIDIA driver prints it (without the trailing newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "num_heads={}, frl_config={}, framebuffer={}M, max_resolution={}, max_instance={}",
            self.num_heads,
            self.frl_config,
            self.framebuffer_mib,
            self.max_resolution,
            self.max_instance
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Resolution;

    const T4_2Q: &str =
        "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=5120x2880, max_instance=8\n";

    #[test]
    fn parses_driver_output() {
        let d = parse_nvidia_description(T4_2Q).unwrap();
        assert_eq!(
            d,
            NvidiaMdevDescription {
                num_heads: 4,
                frl_config: 60,
                framebuffer_mib: 2048,
                max_resolution: Resolution {
                    width: 5120,
                    height: 2880
                },
                max_instance: 8,
            }
        );
        assert_eq!(format!("{d}\n"), T4_2Q);
    }

    #[test]
    fn any_order_and_unknown_keys() {
        let d = parse_nvidia_description(
            "max_instance=1, framebuffer=16384M, future_key=yes,max_resolution=7680x4320, \
             num_heads=2, frl_config=45,",
        )
        .unwrap();
        assert_eq!(
            (d.max_instance, d.framebuffer_mib, d.num_heads),
            (1, 16384, 2)
        );
        assert_eq!(d.max_resolution.width, 7680);
    }

    #[test]
    fn each_missing_key_is_named() {
        let keys = [
            "num_heads",
            "frl_config",
            "framebuffer",
            "max_resolution",
            "max_instance",
        ];
        for missing in keys {
            let text = T4_2Q
                .trim()
                .split(", ")
                .filter(|e| !e.starts_with(&format!("{missing}=")))
                .collect::<Vec<_>>()
                .join(", ");
            let err = parse_nvidia_description(&text).unwrap_err();
            assert!(
                matches!(err, ParseError::MissingKey { key, .. } if key == missing),
                "{missing}: {err:?}"
            );
        }
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("num_heads=four", "num_heads"),
            ("frl_config=-1", "frl_config"),
            ("framebuffer=2048", "framebuffer"),
            ("max_resolution=5120*2880", "max_resolution"),
            ("max_instance=", "max_instance"),
        ];
        for (replacement, bad_key) in cases {
            let key = replacement.split('=').next().unwrap();
            let text = T4_2Q
                .trim()
                .split(", ")
                .map(|e| {
                    if e.starts_with(&format!("{key}=")) {
                        replacement
                    } else {
                        e
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let err = parse_nvidia_description(&text).unwrap_err();
            assert!(
                matches!(&err, ParseError::Field { key, .. } if *key == bad_key),
                "{text}: {err:?}"
            );
        }
    }

    #[test]
    fn garbage_and_duplicates() {
        for bad in [
            "",
            "\n",
            "GRID T4-2Q",
            "num_heads 4, frl_config 60",
            "=4, num_heads=4",
        ] {
            assert!(parse_nvidia_description(bad).is_err(), "{bad:?}");
        }
        let dup = format!("{}, num_heads=2", T4_2Q.trim());
        assert!(matches!(
            parse_nvidia_description(&dup),
            Err(ParseError::DuplicateKey { key, .. }) if key == "num_heads"
        ));
        // A GVT-g description is not an NVIDIA one.
        let gvt =
            "low_gm_size: 128MB\nhigh_gm_size: 512MB\nfence: 4\nresolution: 1920x1200\nweight: 4\n";
        assert!(matches!(
            parse_nvidia_description(gvt),
            Err(ParseError::Invalid { .. })
        ));
    }
}
