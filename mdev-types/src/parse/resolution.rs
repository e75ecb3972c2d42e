//! Display resolutions (`5120x2880`) and memory sizes (`2048M`, `128MB`, `16 MB`, `1G`).

use std::fmt;
use std::str::FromStr;

use super::{ParseError, Resolution};

impl fmt::Display for Resolution {
    /// `WIDTHxHEIGHT`, the form every driver prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

impl FromStr for Resolution {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_resolution(s)
    }
}

/// A positive decimal number without sign, or `None`.
fn positive(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&n| n > 0)
}

/// Parses `WIDTHxHEIGHT` (e.g. `5120x2880`), as printed by NVIDIA `max_resolution`, the GVT-g
/// `resolution` line and mdpy. Both numbers must be positive: a `0x0` mode describes no display.
pub fn parse_resolution(text: &str) -> Result<Resolution, ParseError> {
    let v = text.trim();
    v.split_once('x')
        .and_then(|(w, h)| {
            Some(Resolution {
                width: positive(w)?,
                height: positive(h)?,
            })
        })
        .ok_or_else(|| {
            ParseError::invalid(
                "resolution",
                text,
                "WIDTHxHEIGHT with positive decimal numbers, e.g. 1920x1200",
            )
        })
}

/// Parses a memory size into MiB: a decimal number, optional spaces, then a unit `M`, `MB`, `MiB`,
/// `G`, `GB`, `GiB`, `T`, `TB` or `TiB` (any letter case). `MB`/`GB` are binary here, as in every
/// producer we read: NVIDIA prints the framebuffer as `2048M` in MiB, GVT-g prints `BYTES_TO_MB(x)`
/// = `x >> 20` followed by `MB` (drivers/gpu/drm/i915/gvt/gvt.h), mbochs prints `%d MB` of its
/// `mbytes` field which it multiplies by `1024 * 1024` (samples/vfio-mdev/mbochs.c).
/// A bare number is rejected: without a unit the scale is a guess.
pub fn parse_size_mib(text: &str) -> Result<u64, ParseError> {
    const EXPECTED: &str =
        "a decimal size with unit M, MB, MiB, G, GB, GiB, T, TB or TiB, e.g. 2048M";
    let invalid = || ParseError::invalid("memory size", text, EXPECTED);
    let v = text.trim();
    let digits_end = v.find(|c: char| !c.is_ascii_digit()).ok_or_else(invalid)?;
    let (number, unit) = v.split_at(digits_end);
    if number.is_empty() {
        return Err(invalid());
    }
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let factor: u64 = match unit.trim_start_matches(' ').to_ascii_lowercase().as_str() {
        "m" | "mb" | "mib" => 1,
        "g" | "gb" | "gib" => 1 << 10,
        "t" | "tb" | "tib" => 1 << 20,
        _ => return Err(invalid()),
    };
    number.checked_mul(factor).ok_or_else(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolutions() {
        let r = parse_resolution("5120x2880\n").unwrap();
        assert_eq!((r.width, r.height), (5120, 2880));
        assert_eq!(r.to_string(), "5120x2880");
        assert_eq!("1024x768".parse::<Resolution>().unwrap().height, 768);
    }

    #[test]
    fn resolution_rejects() {
        for bad in [
            "",
            "1920",
            "1920x",
            "x1080",
            "0x0",
            "1920x0",
            "1920X1080",
            "1920 x 1080",
            "-1x5",
            "1920x1080x60",
            "4294967296x1",
        ] {
            let err = parse_resolution(bad).unwrap_err();
            assert!(
                matches!(&err, ParseError::Invalid { what: "resolution", text, .. } if text == bad),
                "{bad:?}: {err:?}"
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size_mib("2048M"), Ok(2048));
        assert_eq!(parse_size_mib("128MB\n"), Ok(128));
        assert_eq!(parse_size_mib("16 MB"), Ok(16));
        assert_eq!(parse_size_mib("512MiB"), Ok(512));
        assert_eq!(parse_size_mib("1G"), Ok(1024));
        assert_eq!(parse_size_mib("48GB"), Ok(48 * 1024));
        assert_eq!(parse_size_mib("2gib"), Ok(2048));
        assert_eq!(parse_size_mib("1T"), Ok(1024 * 1024));
        assert_eq!(parse_size_mib("0M"), Ok(0));
    }

    #[test]
    fn size_rejects() {
        for bad in [
            "",
            "M",
            "2048",
            "2048K",
            "2048 kB",
            "1.5G",
            "-1M",
            "G1",
            "2048M2",
            "20 48M",
            "18446744073709551615G",
            "99999999999999999999M",
        ] {
            let err = parse_size_mib(bad).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ParseError::Invalid {
                        what: "memory size",
                        ..
                    }
                ),
                "{bad:?}: {err:?}"
            );
        }
    }
}
