//! Further definitions of a UUID, on other parents (`definitions/<uuid>@<parent>.toml`).
//!
//! mdevctl keys definitions by parent and UUID: one UUID may be defined on several parents, and one
//! of them at a time runs (mdevctl src/environment.rs `get_defined_device`, mdevctl.rst "start").
//! vgpud acts on one definition per UUID, its *main* definition (`definitions/<uuid>.toml`: the
//! instance's, the one reconcile and autostart use); the others are *alternates*, kept with the same
//! content and durability, listed by `ListDefinitions`, and made the main one on an explicit request
//! that names their parent (see [`super::StateDir::select_definition`]).

use std::fmt;

use mdev_types::ids::MdevUuid;

use super::record::{Definition, Record, Rejection, uuid_of_file_name};

/// What names an alternate's file: its UUID and parent (`<uuid>@<parent>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct AlternateKey {
    /// The definition's UUID.
    pub(crate) uuid: MdevUuid,
    /// The definition's mdev parent.
    pub(crate) parent: String,
}

impl fmt::Display for AlternateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.uuid, self.parent)
    }
}

/// A definition of a UUID on another parent than the UUID's main definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Alternate {
    key: AlternateKey,
    def: Definition,
}

impl Alternate {
    /// `def` as an alternate (keyed by its own UUID and parent).
    pub(crate) fn new(def: Definition) -> Alternate {
        Alternate {
            key: AlternateKey {
                uuid: def.uuid,
                parent: def.parent.clone(),
            },
            def,
        }
    }

    /// The definition it holds.
    pub(crate) fn definition(&self) -> &Definition {
        &self.def
    }

    /// The definition it holds, taken out.
    pub(crate) fn def_owned(self) -> Definition {
        self.def
    }

    /// Whether a file name is an alternate's (`<uuid>@…`) rather than a main definition's.
    pub(crate) fn is_alternate_file(name: &str) -> bool {
        name.contains('@')
    }
}

impl Record for Alternate {
    const KIND: &'static str = "definition";
    const KEY_FIELD: &'static str = "uuid@parent";
    const NAME_RULE: &'static str =
        "`<uuid>@<parent>.toml` (lower-case hyphenated UUID, the definition's parent)";
    type Key = AlternateKey;

    fn key(&self) -> &AlternateKey {
        &self.key
    }

    fn key_of_file_name(name: &str) -> Option<AlternateKey> {
        let stem = name.strip_suffix(".toml")?;
        let (uuid, parent) = stem.split_once('@')?;
        let uuid = uuid_of_file_name(&format!("{uuid}.toml"))?;
        (!parent.is_empty()).then(|| AlternateKey {
            uuid,
            parent: parent.to_string(),
        })
    }

    fn encode(&self) -> Result<String, String> {
        self.def.encode()
    }

    fn decode(text: &str) -> Result<Self, Rejection> {
        Definition::decode(text).map(Alternate::new)
    }

    fn validate(&self) -> Result<(), String> {
        self.def.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_carry_uuid_and_parent() {
        let u: MdevUuid = "4b20d080-1b54-4048-85b3-a6a62d165c01".parse().unwrap();
        let key = AlternateKey {
            uuid: u,
            parent: "0000:00:02.0".into(),
        };
        let name = Alternate::file_name(&key);
        assert_eq!(
            name,
            "4b20d080-1b54-4048-85b3-a6a62d165c01@0000:00:02.0.toml"
        );
        assert_eq!(Alternate::key_of_file_name(&name), Some(key));
        assert!(Alternate::is_alternate_file(&name));
        assert!(!Alternate::is_alternate_file(&format!("{u}.toml")));
        for bad in [
            "4b20d080-1b54-4048-85b3-a6a62d165c01@.toml",
            "4B20D080-1b54-4048-85b3-a6a62d165c01@mtty.toml",
            "nope@mtty.toml",
            "4b20d080-1b54-4048-85b3-a6a62d165c01@mtty",
        ] {
            assert_eq!(Alternate::key_of_file_name(bad), None, "{bad}");
        }
    }
}
