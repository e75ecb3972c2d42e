//! The record kinds of the state directory, their on-disk (TOML, schema 1) form, and the definition
//! and ledger kinds (applied pools and VF slots have modules of their own).
//!
//! The in-memory types ([`Definition`], [`LedgerEntry`]) are separate from the private on-disk structs
//! so that a future schema can add a new on-disk struct and a conversion without changing callers.
//! Schema-1 files reject unknown fields: new fields come with a new schema number, so a typo in a
//! hand-edited file is reported instead of silently ignored.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use mdev_types::ids::{MdevTypeId, MdevUuid};

use crate::daemon::api::{MdevAttr, Ownership, parse_attrs};

/// The schema version this build reads and writes.
pub const SCHEMA: i64 = 1;

/// A persistent instance definition (`definitions/<uuid>.toml`): what the admin asked to exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// The instance's UUID (also the file name).
    pub uuid: MdevUuid,
    /// The mdev parent device name (`/sys/class/mdev_bus/<parent>`).
    pub parent: String,
    /// The GPU id as clients see it (PCI address or virtual parent name).
    pub gpu: String,
    /// The mdev type to create.
    pub type_id: MdevTypeId,
    /// The profile the type was chosen from, if any.
    pub profile: Option<String>,
    /// Create the device whenever the daemon starts or the parent appears.
    pub autostart: bool,
    /// Free-form label of who asked for it.
    pub label: Option<String>,
    /// When it was defined (seconds since the Unix epoch).
    pub created_at: u64,
    /// mdev attributes written, in order, to the device after each create (mdevctl's `attrs`).
    pub attrs: Vec<MdevAttr>,
}

/// How a ledger entry's device came to be ours. Foreign devices never get a ledger entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LedgerOwnership {
    /// The daemon created the device.
    Daemon,
    /// The device existed and was taken over by an explicit definition with its UUID.
    Adopted,
}

impl From<LedgerOwnership> for Ownership {
    fn from(o: LedgerOwnership) -> Self {
        match o {
            LedgerOwnership::Daemon => Ownership::Daemon,
            LedgerOwnership::Adopted => Ownership::Adopted,
        }
    }
}

/// An ownership-ledger entry (`ledger/<uuid>.toml`): a device the daemon created (or is about to
/// create) or adopted, and so may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    /// The device's UUID (also the file name).
    pub uuid: MdevUuid,
    /// Its mdev parent device name.
    pub parent: String,
    /// Its mdev type.
    pub type_id: MdevTypeId,
    /// Created or adopted.
    pub ownership: LedgerOwnership,
    /// When the entry was written (seconds since the Unix epoch).
    pub created_at: u64,
    /// The GPU id clients see, when known (transient instances have no definition to hold it).
    pub gpu: Option<String>,
    /// The profile the type was chosen from, if any.
    pub profile: Option<String>,
    /// Free-form label of who asked for it.
    pub label: Option<String>,
}

/// Why a file's contents were not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Unreadable: bad TOML, wrong field types, missing or unknown fields, invalid values.
    Corrupt(String),
    /// Written by a newer vgpud with a schema this build does not know.
    FutureSchema(i64),
}

/// What the loader and writer need from a record kind.
pub(crate) trait Record: Sized + Clone {
    /// Human name for messages (`definition`, `ledger entry`).
    const KIND: &'static str;
    /// The field that holds the key (`uuid`, `name`), for messages.
    const KEY_FIELD: &'static str;
    /// How the file of one record is named, for messages.
    const NAME_RULE: &'static str;
    /// What names the file (`<key>.toml`).
    type Key: Ord + Clone + fmt::Display;
    /// The key that names the file.
    fn key(&self) -> &Self::Key;
    /// The key named by a file name, when it is exactly `<canonical key>.toml`.
    fn key_of_file_name(name: &str) -> Option<Self::Key>;
    /// The TOML text to store.
    fn encode(&self) -> Result<String, String>;
    /// Parses and validates a file's text.
    fn decode(text: &str) -> Result<Self, Rejection>;
    /// Checks values the type system does not.
    fn validate(&self) -> Result<(), String>;
    /// The modification time to give the file, when it means something (`None`: the time of writing).
    fn modified(&self) -> Option<SystemTime> {
        None
    }
    /// The record as loaded from a file last modified at `_modified`.
    fn with_modified(self, _modified: SystemTime) -> Self {
        self
    }

    /// The name of the file holding the record of `key`.
    fn file_name(key: &Self::Key) -> String {
        format!("{key}.toml")
    }
}

/// The UUID named by a record file name, when it is exactly `<canonical uuid>.toml`.
pub(crate) fn uuid_of_file_name(name: &str) -> Option<MdevUuid> {
    let stem = name.strip_suffix(".toml")?;
    stem.parse::<MdevUuid>()
        .ok()
        .filter(|u| u.to_string() == stem)
}

/// The file-name rule of records named by UUID.
pub(crate) const UUID_NAME_RULE: &str = "`<uuid>.toml` (lower-case hyphenated UUID)";

/// Decodes a schema-versioned file: `decode_v1` parses it as schema 1 and returns its `schema` value
/// and the record, which is then validated.
pub(crate) fn decode_versioned<R: Record>(
    text: &str,
    decode_v1: impl FnOnce(&str) -> Result<(i64, R), String>,
) -> Result<R, Rejection> {
    // One parse in the common case (a valid schema-1 file); only when that fails or the schema
    // differs is the text parsed generically to tell a newer schema from corruption.
    let parsed = decode_v1(text);
    let schema = match &parsed {
        Ok((n, _)) => *n,
        Err(_) => schema_of(text)?,
    };
    check_schema(schema)?;
    let (_, record) = parsed.map_err(Rejection::Corrupt)?;
    record.validate().map_err(Rejection::Corrupt)?;
    Ok(record)
}

/// Accepts schema 1; a higher one is a newer vgpud's, a lower one was never written.
pub(crate) fn check_schema(schema: i64) -> Result<(), Rejection> {
    match schema {
        SCHEMA => Ok(()),
        n if n > SCHEMA => Err(Rejection::FutureSchema(n)),
        n => Err(Rejection::Corrupt(format!(
            "`schema = {n}` was never written by vgpud (this build writes {SCHEMA})"
        ))),
    }
}

/// Reads the `schema` key, before the rest is interpreted.
pub(super) fn schema_of(text: &str) -> Result<i64, Rejection> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| Rejection::Corrupt(describe(text, &e)))?;
    match table.get("schema") {
        Some(toml::Value::Integer(n)) => Ok(*n),
        Some(other) => Err(Rejection::Corrupt(format!(
            "`schema` must be an integer, found a {}",
            other.type_str()
        ))),
        None => Err(Rejection::Corrupt("no `schema` field".into())),
    }
}

impl LedgerV1 {
    /// The on-disk form of `e`, with `schema` when it is a file of its own.
    pub(super) fn from_entry(e: &LedgerEntry, schema: Option<i64>) -> LedgerV1 {
        let e = e.clone();
        LedgerV1 {
            schema,
            uuid: e.uuid,
            parent: e.parent,
            type_id: e.type_id,
            ownership: e.ownership,
            created_at: e.created_at,
            gpu: e.gpu,
            profile: e.profile,
            label: e.label,
        }
    }

    /// The in-memory entry.
    pub(super) fn into_entry(self) -> LedgerEntry {
        LedgerEntry {
            uuid: self.uuid,
            parent: self.parent,
            type_id: self.type_id,
            ownership: self.ownership,
            created_at: self.created_at,
            gpu: self.gpu,
            profile: self.profile,
            label: self.label,
        }
    }
}

/// One line: `line N: message` (the TOML error's own text spans several lines with a snippet).
pub(super) fn describe(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line = text
                .get(..span.start)
                .map_or(0, |s| s.matches('\n').count())
                + 1;
            format!("line {line}: {msg}")
        }
        None => msg,
    }
}

/// A device name as it appears under `/sys/class/mdev_bus/`: one path component.
pub(super) fn check_device_name(field: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{field} = {name:?}` is not a device name (one path component, no spaces)"
        ))
    }
}

/// An optional name field is either absent or non-blank.
pub(super) fn check_optional(field: &str, value: Option<&str>) -> Result<(), String> {
    if value.is_some_and(|v| v.trim().is_empty()) {
        Err(format!("`{field}` is empty (leave it out instead)"))
    } else {
        Ok(())
    }
}

/// TOML integers are signed 64-bit (TOML spec, "Integer"): larger values would be written by the
/// encoder but rejected by a reader, so they are refused before writing.
pub(super) fn check_time(created_at: u64) -> Result<(), String> {
    if i64::try_from(created_at).is_ok() {
        Ok(())
    } else {
        Err(format!(
            "`created_at = {created_at}` is beyond the TOML integer range (at most {})",
            i64::MAX
        ))
    }
}

/// Schema-1 on-disk form of a definition.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionV1 {
    schema: i64,
    uuid: MdevUuid,
    parent: String,
    gpu: String,
    type_id: MdevTypeId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    profile: Option<String>,
    autostart: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    created_at: u64,
    /// Absent in files written before attributes were kept: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    attrs: Vec<AttrV1>,
}

/// Schema-1 on-disk form of one attribute of a definition (`[[attrs]]`, in write order).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttrV1 {
    name: String,
    value: String,
}

impl Record for Definition {
    const KIND: &'static str = "definition";
    const KEY_FIELD: &'static str = "uuid";
    const NAME_RULE: &'static str = UUID_NAME_RULE;
    type Key = MdevUuid;

    fn key(&self) -> &MdevUuid {
        &self.uuid
    }

    fn key_of_file_name(name: &str) -> Option<MdevUuid> {
        uuid_of_file_name(name)
    }

    fn encode(&self) -> Result<String, String> {
        let d = self.clone();
        toml::to_string(&DefinitionV1 {
            schema: SCHEMA,
            uuid: d.uuid,
            parent: d.parent,
            gpu: d.gpu,
            type_id: d.type_id,
            profile: d.profile,
            autostart: d.autostart,
            label: d.label,
            created_at: d.created_at,
            attrs: d
                .attrs
                .iter()
                .map(|a| AttrV1 {
                    name: a.name().to_string(),
                    value: a.value().to_string(),
                })
                .collect(),
        })
        .map_err(|e| e.to_string())
    }

    fn decode(text: &str) -> Result<Self, Rejection> {
        decode_versioned(text, |text| {
            let d: DefinitionV1 = toml::from_str(text).map_err(|e| describe(text, &e))?;
            let attrs = parse_attrs(d.attrs.iter().map(|a| (a.name.as_str(), a.value.as_str())))
                .map_err(|e| format!("`attrs`: {e}"))?;
            Ok((
                d.schema,
                Definition {
                    uuid: d.uuid,
                    parent: d.parent,
                    gpu: d.gpu,
                    type_id: d.type_id,
                    profile: d.profile,
                    autostart: d.autostart,
                    label: d.label,
                    created_at: d.created_at,
                    attrs,
                },
            ))
        })
    }

    fn validate(&self) -> Result<(), String> {
        check_device_name("parent", &self.parent)?;
        if self.gpu.trim().is_empty() {
            return Err("`gpu` is empty".into());
        }
        check_optional("profile", self.profile.as_deref())?;
        parse_attrs(self.attrs.iter().map(|a| (a.name(), a.value())))
            .map_err(|e| format!("`attrs`: {e}"))?;
        check_time(self.created_at)
    }
}

/// Schema-1 on-disk form of a ledger entry (alone in its file, or one `[[entry]]` of a batch, where
/// the file's `schema` covers it).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LedgerV1 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) schema: Option<i64>,
    uuid: MdevUuid,
    parent: String,
    type_id: MdevTypeId,
    ownership: LedgerOwnership,
    created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    label: Option<String>,
}

impl Record for LedgerEntry {
    const KIND: &'static str = "ledger entry";
    const KEY_FIELD: &'static str = "uuid";
    const NAME_RULE: &'static str = UUID_NAME_RULE;
    type Key = MdevUuid;

    fn key(&self) -> &MdevUuid {
        &self.uuid
    }

    fn key_of_file_name(name: &str) -> Option<MdevUuid> {
        uuid_of_file_name(name)
    }

    fn encode(&self) -> Result<String, String> {
        toml::to_string(&LedgerV1::from_entry(self, Some(SCHEMA))).map_err(|e| e.to_string())
    }

    fn decode(text: &str) -> Result<Self, Rejection> {
        decode_versioned(text, |text| {
            let e: LedgerV1 = toml::from_str(text).map_err(|e| describe(text, &e))?;
            let schema = e
                .schema
                .ok_or_else(|| "missing field `schema`".to_string())?;
            Ok((schema, e.into_entry()))
        })
    }

    fn validate(&self) -> Result<(), String> {
        check_device_name("parent", &self.parent)?;
        check_optional("gpu", self.gpu.as_deref())?;
        check_optional("profile", self.profile.as_deref())?;
        check_time(self.created_at)
    }
}
