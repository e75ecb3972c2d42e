//! The kernel's sample mdev display drivers (samples/vfio-mdev/).
//!
//! * mbochs.c `description_show`: `"virtual display, %d MB video memory\n"`.
//! * mdpy.c `description_show` / `mdpy_show_description`: `"virtual display, %dx%d framebuffer\n"`.

use super::{ParseError, Resolution, parse_resolution, parse_size_mib};

/// Common prefix of both sample descriptions.
const PREFIX: &str = "virtual display, ";

/// Parses an mbochs type description into its video memory in MiB
/// (`virtual display, 16 MB video memory` → 16).
pub fn parse_mbochs_description(text: &str) -> Result<u64, ParseError> {
    text.trim()
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(" video memory"))
        .and_then(|size| parse_size_mib(size).ok())
        .ok_or_else(|| {
            ParseError::invalid(
                "mbochs description",
                text,
                "virtual display, <N> MB video memory, e.g. virtual display, 16 MB video memory",
            )
        })
}

/// Parses an mdpy type description into its framebuffer resolution
/// (`virtual display, 1920x1080 framebuffer` → 1920x1080).
pub fn parse_mdpy_description(text: &str) -> Result<Resolution, ParseError> {
    text.trim()
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(" framebuffer"))
        .and_then(|res| parse_resolution(res).ok())
        .ok_or_else(|| {
            ParseError::invalid(
                "mdpy description",
                text,
                "virtual display, WIDTHxHEIGHT framebuffer, e.g. virtual display, 1920x1080 framebuffer",
            )
        })
}

/// The mbochs description for `mib` MiB of video memory, as mbochs.c prints it (with newline).
pub fn format_mbochs_description(mib: u64) -> String {
    format!("{PREFIX}{mib} MB video memory\n")
}

/// The mdpy description for a framebuffer of `resolution`, as mdpy.c prints it (with newline).
pub fn format_mdpy_description(resolution: Resolution) -> String {
    format!("{PREFIX}{resolution} framebuffer\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mbochs() {
        // mbochs.c `mbochs_types[]` offers 4, 16 and 64 MB.
        assert_eq!(
            parse_mbochs_description("virtual display, 16 MB video memory\n"),
            Ok(16)
        );
        assert_eq!(
            parse_mbochs_description(&format_mbochs_description(64)),
            Ok(64)
        );
        for bad in [
            "",
            "virtual display, 16 video memory",
            "virtual display, -4 MB video memory",
            "virtual display, 1920x1080 framebuffer",
            "16 MB video memory",
        ] {
            let err = parse_mbochs_description(bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    ParseError::Invalid {
                        what: "mbochs description",
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn mdpy() {
        // mdpy.c `mdpy_types[]`: vga (640x480), xga (1024x768), hd (1920x1080).
        let r = parse_mdpy_description("virtual display, 1920x1080 framebuffer\n").unwrap();
        assert_eq!((r.width, r.height), (1920, 1080));
        assert_eq!(parse_mdpy_description(&format_mdpy_description(r)), Ok(r));
        for bad in [
            "",
            "virtual display, 0x0 framebuffer",
            "virtual display, 16 MB video memory",
            "virtual display,1920x1080 framebuffer",
        ] {
            let err = parse_mdpy_description(bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    ParseError::Invalid {
                        what: "mdpy description",
                        ..
                    }
                ),
                "{bad:?}"
            );
        }
    }
}
