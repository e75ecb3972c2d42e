//! Intel GVT-g type `description`.
//!
//! Source: drivers/gpu/drm/i915/gvt/kvmgt.c (`description_show`, formerly in gvt.c) prints
//! `"low_gm_size: %dMB\nhigh_gm_size: %dMB\nfence: %d\nresolution: %s\nweight: %d\n"` with the sizes
//! as `BYTES_TO_MB(x)` = `x >> 20` (gvt.h) and the resolution from `vgpu_edid_str()` (display.h),
//! which yields `1024x768`, `1920x1200`, or an empty string for an unknown EDID id.

use std::fmt;

use super::fields::Fields;
use super::{GvtDescription, ParseError, parse_resolution, parse_size_mib, parse_u32};

const WHAT: &str = "GVT-g description";
const EXPECTED: &str = "lines `key: value` with low_gm_size, high_gm_size, fence, resolution and \
     weight, e.g. low_gm_size: 128MB / high_gm_size: 512MB / fence: 4 / resolution: 1920x1200 / weight: 4";

/// Parses an Intel GVT-g type `description`. Lines may come in any order and unknown keys are
/// ignored (out-of-tree GVT-g patches add e.g. `aggregation:`); each of the five known keys is
/// required. A type whose EDID id has no name prints an empty `resolution:` and is rejected.
pub fn parse_gvt_description(text: &str) -> Result<GvtDescription, ParseError> {
    let fields = Fields::split(WHAT, text, EXPECTED, '\n', ':')?;
    Ok(GvtDescription {
        low_gm_mib: fields.get("low_gm_size", parse_size_mib)?,
        high_gm_mib: fields.get("high_gm_size", parse_size_mib)?,
        fence: fields.get("fence", parse_u32)?,
        resolution: fields.get("resolution", parse_resolution)?,
        weight: fields.get("weight", parse_u32)?,
    })
}

impl fmt::Display for GvtDescription {
    /// The description as the i915 GVT-g driver prints it, including the final newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "low_gm_size: {}MB\nhigh_gm_size: {}MB\nfence: {}\nresolution: {}\nweight: {}\n",
            self.low_gm_mib, self.high_gm_mib, self.fence, self.resolution, self.weight
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::Resolution;

    // The i915-GVTg_V5_4 type on a Skylake/Kaby Lake host.
    const V5_4: &str =
        "low_gm_size: 128MB\nhigh_gm_size: 512MB\nfence: 4\nresolution: 1920x1200\nweight: 4\n";

    #[test]
    fn parses_driver_output() {
        let d = parse_gvt_description(V5_4).unwrap();
        assert_eq!(
            d,
            GvtDescription {
                low_gm_mib: 128,
                high_gm_mib: 512,
                fence: 4,
                resolution: Resolution {
                    width: 1920,
                    height: 1200
                },
                weight: 4,
            }
        );
        assert_eq!(d.to_string(), V5_4);
    }

    #[test]
    fn any_order_and_unknown_keys() {
        let d = parse_gvt_description(
            "weight: 16\naggregation: true\nresolution: 1024x768\nfence: 4\nhigh_gm_size: 384MB\nlow_gm_size: 64MB",
        )
        .unwrap();
        assert_eq!((d.low_gm_mib, d.high_gm_mib, d.weight), (64, 384, 16));
        assert_eq!(d.resolution.to_string(), "1024x768");
    }

    #[test]
    fn each_missing_key_is_named() {
        for missing in [
            "low_gm_size",
            "high_gm_size",
            "fence",
            "resolution",
            "weight",
        ] {
            let text: String = V5_4
                .lines()
                .filter(|l| !l.starts_with(&format!("{missing}:")))
                .map(|l| format!("{l}\n"))
                .collect();
            let err = parse_gvt_description(&text).unwrap_err();
            assert!(
                matches!(err, ParseError::MissingKey { key, .. } if key == missing),
                "{missing}: {err:?}"
            );
        }
    }

    #[test]
    fn bad_values_are_named() {
        for (line, bad_key) in [
            ("low_gm_size: 128", "low_gm_size"),
            ("high_gm_size: lots", "high_gm_size"),
            ("fence: -4", "fence"),
            ("resolution: ", "resolution"),
            ("weight: 4.5", "weight"),
        ] {
            let text: String = V5_4
                .lines()
                .map(|l| {
                    if l.starts_with(&line[..line.find(':').unwrap() + 1]) {
                        line
                    } else {
                        l
                    }
                })
                .map(|l| format!("{l}\n"))
                .collect();
            let err = parse_gvt_description(&text).unwrap_err();
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
            "low_gm_size 128MB",
            "virtual display, 16 MB video memory",
        ] {
            assert!(parse_gvt_description(bad).is_err(), "{bad:?}");
        }
        let dup = format!("{V5_4}fence: 8\n");
        assert!(matches!(
            parse_gvt_description(&dup),
            Err(ParseError::DuplicateKey { key, .. }) if key == "fence"
        ));
    }
}
