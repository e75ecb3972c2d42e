//! Plain sysfs numbers and flags.

use super::ParseError;

/// The value without the surrounding whitespace (sysfs `show` functions end with `\n`).
fn value(text: &str) -> &str {
    text.trim()
}

/// Whether `s` is one or more ASCII digits (no sign, no `_`: the kernel prints neither).
fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Parses a decimal `u32` attribute (e.g. `available_instances`, `sriov_numvfs`).
pub fn parse_u32(text: &str) -> Result<u32, ParseError> {
    const EXPECTED: &str = "a decimal number from 0 to 4294967295, e.g. 8";
    let v = value(text);
    if !all_digits(v) {
        return Err(ParseError::invalid(
            "unsigned 32-bit number",
            text,
            EXPECTED,
        ));
    }
    v.parse()
        .map_err(|_| ParseError::invalid("unsigned 32-bit number", text, EXPECTED))
}

/// Parses a decimal `u64` attribute.
pub fn parse_u64(text: &str) -> Result<u64, ParseError> {
    const EXPECTED: &str = "a decimal number from 0 to 18446744073709551615, e.g. 8";
    let v = value(text);
    if !all_digits(v) {
        return Err(ParseError::invalid(
            "unsigned 64-bit number",
            text,
            EXPECTED,
        ));
    }
    v.parse()
        .map_err(|_| ParseError::invalid("unsigned 64-bit number", text, EXPECTED))
}

/// Parses a signed decimal attribute, e.g. `numa_node`, which is `-1` when the platform reports no
/// NUMA affinity (Documentation/ABI/testing/sysfs-bus-pci, `numa_node`).
pub fn parse_i64(text: &str) -> Result<i64, ParseError> {
    const EXPECTED: &str = "a decimal number with optional leading '-', e.g. -1 or 0";
    let v = value(text);
    if !all_digits(v.strip_prefix('-').unwrap_or(v)) {
        return Err(ParseError::invalid("signed 64-bit number", text, EXPECTED));
    }
    v.parse()
        .map_err(|_| ParseError::invalid("signed 64-bit number", text, EXPECTED))
}

/// Parses a `0`/`1` flag such as `boot_vga` or `sriov_drivers_autoprobe`
/// (Documentation/ABI/testing/sysfs-bus-pci: both print `%u` of a boolean).
pub fn parse_bool01(text: &str) -> Result<bool, ParseError> {
    match value(text) {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(ParseError::invalid("0/1 flag", text, "0 or 1")),
    }
}

/// Parses the PCI `class` attribute: the 24-bit class code (base class, subclass, programming
/// interface). The kernel prints it as `0x%06x` (drivers/pci/pci-sysfs.c, `pci_config_attr(class, …)`),
/// e.g. `0x030200` for a 3D controller; the `0x` is optional here.
pub fn parse_class(text: &str) -> Result<u32, ParseError> {
    const EXPECTED: &str = "a 24-bit hex class code of 1 to 6 digits, e.g. 0x030200";
    let v = value(text);
    let hex = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    if hex.is_empty() || hex.len() > 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseError::invalid("PCI class", text, EXPECTED));
    }
    u32::from_str_radix(hex, 16).map_err(|_| ParseError::invalid("PCI class", text, EXPECTED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_numbers() {
        assert_eq!(parse_u32("8\n"), Ok(8));
        assert_eq!(parse_u32("0"), Ok(0));
        assert_eq!(parse_u32("4294967295\n"), Ok(u32::MAX));
        assert_eq!(parse_u64("18446744073709551615\n"), Ok(u64::MAX));
        assert_eq!(parse_u64("4294967296"), Ok(1 << 32));
    }

    #[test]
    fn unsigned_rejects() {
        for bad in [
            "",
            "\n",
            "4294967296",
            "-1",
            "+1",
            "1 2",
            "0x10",
            "eight",
            "1_000",
            "８",
        ] {
            let err = parse_u32(bad).unwrap_err();
            assert!(
                matches!(&err, ParseError::Invalid { what: "unsigned 32-bit number", text, .. } if text == bad),
                "{bad:?}: {err:?}"
            );
        }
        for bad in ["18446744073709551616", "-0", "x"] {
            assert!(parse_u64(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn signed_numbers() {
        assert_eq!(parse_i64("-1\n"), Ok(-1));
        assert_eq!(parse_i64("0\n"), Ok(0));
        assert_eq!(parse_i64("3"), Ok(3));
        assert_eq!(parse_i64("-9223372036854775808"), Ok(i64::MIN));
        for bad in ["", "-", "--1", "+1", "9223372036854775808", "1-", "one"] {
            assert!(parse_i64(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn flags() {
        assert_eq!(parse_bool01("1\n"), Ok(true));
        assert_eq!(parse_bool01("0\n"), Ok(false));
        for bad in ["", "2", "true", "01", "yes", "Y"] {
            let err = parse_bool01(bad).unwrap_err();
            assert!(err.to_string().contains("expected 0 or 1"), "{err}");
        }
    }

    #[test]
    fn pci_class() {
        assert_eq!(parse_class("0x030200\n"), Ok(0x03_02_00));
        assert_eq!(parse_class("0x030000"), Ok(0x03_00_00));
        assert_eq!(parse_class("0x0C0330"), Ok(0x0c_03_30));
        assert_eq!(parse_class("030200"), Ok(0x03_02_00));
        for bad in [
            "",
            "0x",
            "0x1000000",
            "0xgg0000",
            "3D controller",
            "0x03 02 00",
            "-0x1",
        ] {
            assert!(parse_class(bad).is_err(), "{bad:?}");
        }
    }
}
