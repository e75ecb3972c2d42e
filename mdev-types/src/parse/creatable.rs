//! NVIDIA vendor-specific VFIO `nvidia/creatable_vgpu_types`.
//!
//! Source: NVIDIA Virtual GPU Software User Guide (vGPU 17+, Linux ≥ 6.8), "Creating an NVIDIA vGPU
//! that supports SR-IOV on Linux with KVM Hypervisor": `cat /sys/bus/pci/devices/<VF>/nvidia/
//! creatable_vgpu_types` prints a header row `ID    : vGPU Name` and then one row per type the VF can
//! take now, e.g. `557   : NVIDIA L40S-1Q`. Once the GPU's framebuffer is used up only the header
//! (or nothing) remains.

use super::ParseError;
use crate::model::NvidiaVgpuType;

const WHAT: &str = "NVIDIA creatable_vgpu_types";
const EXPECTED: &str =
    "a header `ID : vGPU Name` and rows `<decimal id> : <vGPU name>`, e.g. 557   : NVIDIA L40S-1Q";

/// Parses `nvidia/creatable_vgpu_types` into its rows, in text order. Blank lines and the header
/// row are skipped; any other row must be `<decimal id> : <non-empty name>`.
pub fn parse_creatable_vgpu_types(text: &str) -> Result<Vec<NvidiaVgpuType>, ParseError> {
    let mut types = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (id, name) = line
            .split_once(':')
            .map(|(id, name)| (id.trim(), name.trim()))
            .ok_or_else(|| ParseError::invalid(WHAT, line, EXPECTED))?;
        if id == "ID" {
            continue;
        }
        if name.is_empty() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseError::invalid(WHAT, line, EXPECTED));
        }
        let id = id
            .parse()
            .map_err(|_| ParseError::invalid(WHAT, line, EXPECTED))?;
        types.push(NvidiaVgpuType {
            id,
            name: name.to_owned(),
        });
    }
    Ok(types)
}

/// Formats rows the way the NVIDIA driver prints `creatable_vgpu_types` (header included, id
/// left-aligned in a 6-character column), e.g. for a simulated host.
pub fn format_creatable_vgpu_types(types: &[NvidiaVgpuType]) -> String {
    let mut out = String::from("ID    : vGPU Name\n");
    for t in types {
        out.push_str(&format!("{:<6}: {}\n", t.id, t.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u32, name: &str) -> NvidiaVgpuType {
        NvidiaVgpuType {
            id,
            name: name.to_owned(),
        }
    }

    #[test]
    fn parses_table() {
        let text = "ID    : vGPU Name\n557   : NVIDIA L40S-1Q\n558   : NVIDIA L40S-2Q\n1155  : NVIDIA L40S-48Q\n";
        let rows = parse_creatable_vgpu_types(text).unwrap();
        assert_eq!(
            rows,
            vec![
                t(557, "NVIDIA L40S-1Q"),
                t(558, "NVIDIA L40S-2Q"),
                t(1155, "NVIDIA L40S-48Q")
            ]
        );
        assert_eq!(format_creatable_vgpu_types(&rows), text);
    }

    #[test]
    fn header_only_or_empty_means_none_left() {
        assert_eq!(
            parse_creatable_vgpu_types("ID    : vGPU Name\n"),
            Ok(vec![])
        );
        assert_eq!(parse_creatable_vgpu_types(""), Ok(vec![]));
        assert_eq!(parse_creatable_vgpu_types("\n\n"), Ok(vec![]));
    }

    #[test]
    fn rejects_malformed_rows() {
        for bad in [
            "ID    : vGPU Name\n557 NVIDIA L40S-1Q\n",
            "ID    : vGPU Name\nabc   : NVIDIA L40S-1Q\n",
            "ID    : vGPU Name\n-1    : NVIDIA L40S-1Q\n",
            "ID    : vGPU Name\n557   :\n",
            "ID    : vGPU Name\n4294967296 : NVIDIA L40S-1Q\n",
            "   : NVIDIA L40S-1Q\n",
        ] {
            let err = parse_creatable_vgpu_types(bad).unwrap_err();
            assert!(
                matches!(err, ParseError::Invalid { what: WHAT, .. }),
                "{bad:?}: {err:?}"
            );
        }
    }
}
