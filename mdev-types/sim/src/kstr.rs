//! The kernel's parsers for text written to sysfs attributes, so the simulated store handlers accept
//! and reject exactly what the real ones do (lib/kstrtox.c, lib/string.c `sysfs_streq`).

use nix::errno::Errno;

/// `_parse_integer_fixup_radix`: base 0 picks 16 for `0x` followed by a hex digit, 8 for a leading
/// `0`, else 10; base 16 skips a `0x` prefix.
fn fixup_radix(s: &[u8], base: u32) -> (usize, u32) {
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    let mut base = base;
    if base == 0 {
        base = if at(0) == b'0' {
            if at(1).eq_ignore_ascii_case(&b'x') && at(2).is_ascii_hexdigit() {
                16
            } else {
                8
            }
        } else {
            10
        };
    }
    if base == 16 && at(0) == b'0' && at(1).eq_ignore_ascii_case(&b'x') {
        (2, base)
    } else {
        (0, base)
    }
}

/// `_kstrtoull`: digits, then at most one newline, then the end. Overflow is `ERANGE`, anything else
/// malformed is `EINVAL`.
fn kstrtoull_inner(s: &[u8], base: u32) -> Result<u64, Errno> {
    let (skip, base) = fixup_radix(s, base);
    let s = &s[skip..];
    let mut value: u64 = 0;
    let mut overflow = false;
    let mut n = 0;
    for &b in s {
        let Some(d) = (b as char).to_digit(16).filter(|d| *d < base) else {
            break;
        };
        match value
            .checked_mul(u64::from(base))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        n += 1;
    }
    if overflow {
        return Err(Errno::ERANGE);
    }
    if n == 0 {
        return Err(Errno::EINVAL);
    }
    let rest = &s[n..];
    let rest = rest.strip_prefix(b"\n").unwrap_or(rest);
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(Errno::EINVAL)
    }
}

/// `kstrtoull` (a leading `+` is allowed).
pub(crate) fn kstrtoull(s: &str, base: u32) -> Result<u64, Errno> {
    let b = s.as_bytes();
    kstrtoull_inner(b.strip_prefix(b"+").unwrap_or(b), base)
}

/// `kstrtou32`.
pub(crate) fn kstrtou32(s: &str, base: u32) -> Result<u32, Errno> {
    u32::try_from(kstrtoull(s, base)?).map_err(|_| Errno::ERANGE)
}

/// `kstrtou16`.
pub(crate) fn kstrtou16(s: &str, base: u32) -> Result<u16, Errno> {
    u16::try_from(kstrtoull(s, base)?).map_err(|_| Errno::ERANGE)
}

/// `kstrtoll` (and `kstrtol` on 64-bit).
pub(crate) fn kstrtoll(s: &str, base: u32) -> Result<i64, Errno> {
    let b = s.as_bytes();
    if let Some(rest) = b.strip_prefix(b"-") {
        let v = kstrtoull_inner(rest, base)?;
        if v > (i64::MAX as u64) + 1 {
            return Err(Errno::ERANGE);
        }
        Ok((v as i128).wrapping_neg() as i64)
    } else {
        let v = kstrtoull(s, base)?;
        i64::try_from(v).map_err(|_| Errno::ERANGE)
    }
}

/// `kstrtoint`.
pub(crate) fn kstrtoint(s: &str, base: u32) -> Result<i32, Errno> {
    i32::try_from(kstrtoll(s, base)?).map_err(|_| Errno::ERANGE)
}

/// `kstrtobool`: looks only at the first one or two characters.
pub(crate) fn kstrtobool(s: &str) -> Result<bool, Errno> {
    let b = s.as_bytes();
    match b.first() {
        Some(b'y' | b'Y' | b't' | b'T' | b'1') => Ok(true),
        Some(b'n' | b'N' | b'f' | b'F' | b'0') => Ok(false),
        Some(b'o' | b'O') => match b.get(1) {
            Some(b'n' | b'N') => Ok(true),
            Some(b'f' | b'F') => Ok(false),
            _ => Err(Errno::EINVAL),
        },
        _ => Err(Errno::EINVAL),
    }
}

/// `sysfs_streq`: equal, ignoring one trailing newline on either side.
pub(crate) fn sysfs_streq(a: &str, b: &str) -> bool {
    a == b || a.strip_suffix('\n') == Some(b) || b.strip_suffix('\n') == Some(a)
}

/// `__sysfs_match_string`: the index of the first entry equal to `s` by [`sysfs_streq`].
pub(crate) fn sysfs_match_string(list: &[&str], s: &str) -> Option<usize> {
    list.iter().position(|item| sysfs_streq(item, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_like_the_kernel() {
        assert_eq!(kstrtoull("12\n", 0), Ok(12));
        assert_eq!(kstrtoull("+12", 0), Ok(12));
        assert_eq!(kstrtoull("0x1f", 0), Ok(31));
        assert_eq!(kstrtoull("010", 0), Ok(8));
        assert_eq!(kstrtoull("08", 0), Err(Errno::EINVAL));
        assert_eq!(kstrtoull("0x", 0), Err(Errno::EINVAL));
        assert_eq!(kstrtoull("", 0), Err(Errno::EINVAL));
        assert_eq!(kstrtoull("1\n\n", 0), Err(Errno::EINVAL));
        assert_eq!(kstrtoull(" 1", 0), Err(Errno::EINVAL));
        assert_eq!(kstrtoull("-1", 0), Err(Errno::EINVAL));
        assert_eq!(kstrtoull("99999999999999999999", 10), Err(Errno::ERANGE));
        assert_eq!(kstrtou16("65536", 0), Err(Errno::ERANGE));
        assert_eq!(kstrtou32("4294967295", 0), Ok(u32::MAX));
        assert_eq!(kstrtoll("-5\n", 10), Ok(-5));
        assert_eq!(kstrtoll("-9223372036854775808", 10), Ok(i64::MIN));
        assert_eq!(kstrtoint("-2147483649", 10), Err(Errno::ERANGE));
        assert_eq!(kstrtoll("1147", 10), Ok(1147));
    }

    #[test]
    fn booleans_and_strings_parse_like_the_kernel() {
        assert_eq!(kstrtobool("1"), Ok(true));
        assert_eq!(kstrtobool("0\n"), Ok(false));
        assert_eq!(kstrtobool("on"), Ok(true));
        assert_eq!(kstrtobool("off"), Ok(false));
        assert_eq!(kstrtobool("o"), Err(Errno::EINVAL));
        assert_eq!(kstrtobool(""), Err(Errno::EINVAL));
        assert_eq!(kstrtobool("2"), Err(Errno::EINVAL));
        assert!(sysfs_streq("0000:01:00.0", "0000:01:00.0\n"));
        assert!(!sysfs_streq("0000:01:00.0", "01:00.0"));
        assert!(!sysfs_streq("a", "a\n\n"));
        assert_eq!(sysfs_match_string(&["low", "normal"], "normal\n"), Some(1));
        assert_eq!(sysfs_match_string(&["low", "normal"], "high"), None);
    }
}
