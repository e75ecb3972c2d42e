//! mdev attributes of a definition: (name, value) pairs written, in order, to the new device's
//! `/sys/bus/mdev/devices/<uuid>/<name>` after it is created, as mdevctl does (mdevctl(8), "attrs";
//! vfio_ap needs `assign_adapter`, `assign_domain`, … in that order).

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::limits::{self, clip};

/// The longest attribute name, in bytes: a file name (`NAME_MAX`, include/uapi/linux/limits.h).
pub const MAX_ATTR_NAME_BYTES: usize = 255;

/// The longest attribute value, in bytes: a sysfs store handler sees at most one page
/// (fs/sysfs/file.c `sysfs_kf_write`, 4096 bytes on the smallest pages).
pub const MAX_ATTR_VALUE_BYTES: usize = 4096;

/// The most attributes one definition carries (vfio_ap's, the longest real lists, hold a few dozen).
pub const MAX_ATTRS: usize = 256;

/// One attribute of an mdev definition: written to `/sys/bus/mdev/devices/<uuid>/<name>`. Its serde
/// form is the pair `[name, value]`, checked when read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "(String, String)", into = "(String, String)")]
pub struct MdevAttr {
    name: String,
    value: String,
}

/// Why an attribute (or a list of them) is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttrError {
    /// The name is not one plain file name.
    #[error(
        "mdev attribute name {:?} is not a file name of the device (non-empty, at most {MAX_ATTR_NAME_BYTES} bytes, no '/', no control characters, not '.' or '..')",
        clip(.0)
    )]
    BadName(String),
    /// The value is too long or holds a NUL byte.
    #[error(
        "the value of mdev attribute {name} is {bytes} bytes or holds a NUL byte: a sysfs attribute takes at most {MAX_ATTR_VALUE_BYTES} bytes of text"
    )]
    BadValue {
        /// The attribute.
        name: String,
        /// The value's length.
        bytes: usize,
    },
    /// Too many attributes.
    #[error("{count} mdev attributes given: at most {MAX_ATTRS} per definition")]
    TooMany {
        /// How many were given.
        count: usize,
    },
}

impl MdevAttr {
    /// The attribute `name` = `value`, checked: `name` is one file name (not `.`/`..`, no `/`, no
    /// control characters, at most [`MAX_ATTR_NAME_BYTES`]); `value` has no NUL byte and at most
    /// [`MAX_ATTR_VALUE_BYTES`].
    pub fn new(name: &str, value: &str) -> Result<MdevAttr, AttrError> {
        let name_ok = !name.is_empty()
            && name.len() <= MAX_ATTR_NAME_BYTES
            && name != "."
            && name != ".."
            && !name.contains('/')
            && !name.chars().any(char::is_control);
        if !name_ok {
            return Err(AttrError::BadName(name.to_string()));
        }
        if value.len() > MAX_ATTR_VALUE_BYTES || value.contains('\0') {
            return Err(AttrError::BadValue {
                name: name.to_string(),
                bytes: value.len(),
            });
        }
        Ok(MdevAttr {
            name: name.to_string(),
            value: value.to_string(),
        })
    }

    /// The attribute's file name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value written to it.
    pub fn value(&self) -> &str {
        &self.value
    }
}

/// Checks a list of (name, value) pairs and keeps their order.
pub fn parse_attrs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<MdevAttr>, AttrError> {
    let attrs = pairs
        .into_iter()
        .map(|(n, v)| MdevAttr::new(n, v))
        .collect::<Result<Vec<_>, _>>()?;
    if attrs.len() > MAX_ATTRS {
        return Err(AttrError::TooMany { count: attrs.len() });
    }
    Ok(attrs)
}

impl TryFrom<(String, String)> for MdevAttr {
    type Error = AttrError;

    fn try_from((name, value): (String, String)) -> Result<Self, AttrError> {
        MdevAttr::new(&name, &value)
    }
}

impl From<MdevAttr> for (String, String) {
    fn from(a: MdevAttr) -> Self {
        (a.name, a.value)
    }
}

impl fmt::Display for MdevAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}", self.name, limits::clip(&self.value))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_name_is_one_plain_file_name() {
        for good in ["assign_adapter", "example-attribute", "a.b", "x"] {
            assert!(MdevAttr::new(good, "1").is_ok(), "{good}");
        }
        let long = "n".repeat(MAX_ATTR_NAME_BYTES + 1);
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/etc",
            "../remove",
            "a\nb",
            long.as_str(),
        ] {
            assert!(
                matches!(MdevAttr::new(bad, "1"), Err(AttrError::BadName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_value_fits_one_page_without_nul() {
        assert!(MdevAttr::new("a", &"v".repeat(MAX_ATTR_VALUE_BYTES)).is_ok());
        let long = "v".repeat(MAX_ATTR_VALUE_BYTES + 1);
        assert!(matches!(
            MdevAttr::new("a", &long),
            Err(AttrError::BadValue { .. })
        ));
        assert!(MdevAttr::new("a", "x\0y").is_err());
    }

    #[test]
    fn a_list_keeps_its_order_and_is_bounded() {
        let attrs = parse_attrs([("b", "1"), ("a", "2"), ("b", "3")]).unwrap();
        let names: Vec<&str> = attrs.iter().map(MdevAttr::name).collect();
        assert_eq!(names, ["b", "a", "b"]);
        let many: Vec<(&str, &str)> = (0..=MAX_ATTRS).map(|_| ("a", "1")).collect();
        assert!(matches!(parse_attrs(many), Err(AttrError::TooMany { .. })));
    }
}
