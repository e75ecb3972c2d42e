//! Every sysfs attribute parser of `mdev-types` (`mdev_types::parse`) and the identifiers read from
//! sysfs names (`mdev_types::ids`). Beyond "no panic": what parses formats to a text that parses to the
//! same value, and the four description formats are disjoint (at most one accepts a text), as
//! `parse_type_description` relies on.

use std::str::FromStr;

use mdev_types::ids::{IommuGroup, MdevTypeId, MdevUuid, PciAddress, PciId};
use mdev_types::parse::*;

/// The parsers, chosen by the first byte (see [`crate::selector_and_text`]).
pub const PARSERS: &[&str] = &[
    "numbers",
    "class",
    "resolution",
    "size",
    "nvidia-description",
    "gvt-description",
    "creatable-vgpu-types",
    "vgpu-name",
    "sample-descriptions",
    "type-description",
    "ids",
];

/// `parse(display(x)) == x` for an identifier that parsed.
fn id_round_trip<T>(text: &str)
where
    T: FromStr + ToString + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = text.parse::<T>() {
        let shown = v.to_string();
        match shown.parse::<T>() {
            Ok(again) => assert_eq!(again, v, "{text:?} shows as {shown:?}"),
            Err(_) => panic!("{text:?} parsed, but its display {shown:?} does not"),
        }
    }
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Some((k, text)) = crate::selector_and_text(data, PARSERS.len() as u8) else {
        return;
    };
    match k {
        0 => {
            if let Ok(n) = parse_u32(text) {
                assert_eq!(parse_u32(&format!("{n}\n")), Ok(n));
                assert_eq!(parse_u64(text), Ok(u64::from(n)));
            }
            if let Ok(n) = parse_u64(text) {
                assert_eq!(parse_u64(&format!("{n}\n")), Ok(n));
            }
            if let Ok(n) = parse_i64(text) {
                assert_eq!(parse_i64(&format!("{n}\n")), Ok(n));
            }
            if let Ok(b) = parse_bool01(text) {
                assert_eq!(parse_bool01(if b { "1\n" } else { "0\n" }), Ok(b));
            }
        }
        1 => {
            if let Ok(c) = parse_class(text) {
                // drivers/pci/pci-sysfs.c prints `0x%06x`.
                assert_eq!(parse_class(&format!("0x{c:06x}\n")), Ok(c), "{text:?}");
            }
        }
        2 => {
            if let Ok(r) = parse_resolution(text) {
                assert_eq!(parse_resolution(&r.to_string()), Ok(r), "{text:?}");
                assert_eq!(text.trim().parse::<Resolution>().ok(), Some(r), "{text:?}");
            }
        }
        3 => {
            if let Ok(mib) = parse_size_mib(text) {
                assert_eq!(parse_size_mib(&format!("{mib}M")), Ok(mib), "{text:?}");
            }
        }
        4 => {
            if let Ok(d) = parse_nvidia_description(text) {
                assert_eq!(parse_nvidia_description(&format!("{d}\n")), Ok(d.clone()));
                assert_eq!(
                    parse_type_description(Some(text)),
                    TypeDescription::Nvidia(d)
                );
            }
        }
        5 => {
            if let Ok(d) = parse_gvt_description(text) {
                assert_eq!(parse_gvt_description(&d.to_string()), Ok(d.clone()));
                assert_eq!(parse_type_description(Some(text)), TypeDescription::Gvt(d));
            }
        }
        6 => {
            if let Ok(rows) = parse_creatable_vgpu_types(text) {
                let shown = format_creatable_vgpu_types(&rows);
                assert_eq!(parse_creatable_vgpu_types(&shown), Ok(rows), "{shown:?}");
            }
        }
        7 => {
            if let Ok(n) = parse_nvidia_vgpu_name(text) {
                // `NVIDIA ` never starts a board name, so the rebuilt name means the same.
                let slices = n.mig_slices.map(|s| format!("{s}-")).unwrap_or_default();
                let heads = n.heads.map(|h| h.to_string()).unwrap_or_default();
                let shown = format!(
                    "NVIDIA {}-{slices}{}{}{heads}",
                    n.board,
                    n.framebuffer_gib,
                    n.series.letter()
                );
                assert_eq!(parse_nvidia_vgpu_name(&shown), Ok(n), "{shown:?}");
            }
        }
        8 => {
            if let Ok(mib) = parse_mbochs_description(text) {
                assert_eq!(
                    parse_mbochs_description(&format_mbochs_description(mib)),
                    Ok(mib)
                );
            }
            if let Ok(r) = parse_mdpy_description(text) {
                assert_eq!(parse_mdpy_description(&format_mdpy_description(r)), Ok(r));
            }
        }
        9 => {
            let accepted = [
                parse_nvidia_description(text).is_ok(),
                parse_gvt_description(text).is_ok(),
                parse_mbochs_description(text).is_ok(),
                parse_mdpy_description(text).is_ok(),
            ];
            assert!(
                accepted.iter().filter(|a| **a).count() <= 1,
                "{text:?} is accepted by more than one description format: {accepted:?}"
            );
            let _ = parse_type_description(Some(text));
        }
        _ => {
            id_round_trip::<PciAddress>(text);
            id_round_trip::<MdevUuid>(text);
            id_round_trip::<MdevTypeId>(text);
            id_round_trip::<PciId>(text);
            id_round_trip::<IommuGroup>(text);
        }
    }
}
