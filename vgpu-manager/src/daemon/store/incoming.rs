//! Records of incoming instances (`incoming/<uuid>.toml`): an mdev vgpud made on this host as the
//! target of a live migration, held until a VM attaches (then it is an ordinary instance) or until
//! its deadline, when nothing took it (then it is released). The record is written before the device
//! is created and removed after the device is gone or completed, so a crash at any point leaves a
//! record the next start finishes: a record without its device is dropped; one whose deadline passed
//! is released as it would have been.
//!
//! ```toml
//! schema = 1
//! uuid = "…"          # the target instance
//! source = "…"        # the source instance's UUID, when the fingerprint named it
//! until = 1767225600  # the deadline, seconds since the Unix epoch
//! ```

use serde::{Deserialize, Serialize};

use mdev_types::ids::MdevUuid;

use super::record::{
    Record, Rejection, SCHEMA, UUID_NAME_RULE, check_time, decode_versioned, describe,
    uuid_of_file_name,
};

/// An incoming instance (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingRecord {
    /// The target instance's UUID (also the file name).
    pub uuid: MdevUuid,
    /// The source instance's UUID.
    pub source: Option<MdevUuid>,
    /// The deadline, seconds since the Unix epoch.
    pub until: u64,
}

/// Schema-1 on-disk form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct IncomingV1 {
    schema: i64,
    uuid: MdevUuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<MdevUuid>,
    until: u64,
}

impl Record for IncomingRecord {
    const KIND: &'static str = "incoming instance record";
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
        toml::to_string(&IncomingV1 {
            schema: SCHEMA,
            uuid: self.uuid,
            source: self.source,
            until: self.until,
        })
        .map_err(|e| e.to_string())
    }

    fn decode(text: &str) -> Result<Self, Rejection> {
        decode_versioned(text, |text| {
            let r: IncomingV1 = toml::from_str(text).map_err(|e| describe(text, &e))?;
            Ok((
                r.schema,
                IncomingRecord {
                    uuid: r.uuid,
                    source: r.source,
                    until: r.until,
                },
            ))
        })
    }

    fn validate(&self) -> Result<(), String> {
        check_time(self.until)
    }
}
