//! Ledger batches: `ledger/batch-<n>.toml`, the entries of many devices in one file.
//!
//! A reconcile after a host reboot (or a pool apply) creates hundreds of devices at once, and the
//! ledger protocol wants every entry on disk before its device exists. One file per entry costs a file
//! creation each, which dominates start-up on a real disk (about 0.15–0.4 ms per small file here); one
//! batch file costs one write and one `fsync` for all of them. A batch is as durable and atomic as any
//! record file (temporary file, `fsync`, rename, `fsync` of the directory).
//!
//! ```toml
//! schema = 1
//!
//! [[entry]]
//! uuid = "…"
//! parent = "0000:3b:00.0"
//! type_id = "nvidia-231"
//! ownership = "daemon"
//! created_at = 1767225600
//! ```
//!
//! Precedence: an entry's own file (`<uuid>.toml`, written by any later single update) overrides its
//! batch copies, and a later batch overrides an earlier one; a batch that renews an entry deletes the
//! entry's own file once the batch is on disk. Removing an entry rewrites every batch that
//! holds it (or deletes a batch left empty) *before* its own file goes, so a crash in between leaves
//! the entry in place, never a device without its entry.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use mdev_types::ids::MdevUuid;

use super::record::{
    LedgerEntry, LedgerV1, Record, Rejection, SCHEMA, check_schema, describe, schema_of,
};

/// Batch file names are `batch-<n>.toml`.
const PREFIX: &str = "batch-";

/// The file name of batch `n`.
pub(crate) fn batch_name(n: u64) -> String {
    format!("{PREFIX}{n}.toml")
}

/// The sequence number of a batch file name (`None` for any other name).
pub(crate) fn batch_seq(name: &str) -> Option<u64> {
    let n = name.strip_prefix(PREFIX)?.strip_suffix(".toml")?;
    // Only the canonical spelling, so that two names never denote one batch.
    n.parse::<u64>().ok().filter(|v| v.to_string() == n)
}

/// Schema-1 on-disk form of a batch.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchV1 {
    schema: i64,
    entry: Vec<LedgerV1>,
}

/// Validates and encodes entries as one batch file.
pub(crate) fn encode_batch(entries: &[LedgerEntry]) -> Result<String, String> {
    toml::to_string(&BatchV1 {
        schema: SCHEMA,
        entry: entries
            .iter()
            .map(|e| LedgerV1::from_entry(e, None))
            .collect(),
    })
    .map_err(|e| e.to_string())
}

/// Parses and validates a batch file's text: every entry must be valid and appear once.
pub(crate) fn decode_batch(text: &str) -> Result<Vec<LedgerEntry>, Rejection> {
    let parsed: Result<BatchV1, String> = toml::from_str(text).map_err(|e| describe(text, &e));
    let schema = match &parsed {
        Ok(b) => b.schema,
        Err(_) => schema_of(text)?,
    };
    check_schema(schema)?;
    let batch = parsed.map_err(Rejection::Corrupt)?;
    let mut seen = BTreeSet::new();
    let mut entries = Vec::with_capacity(batch.entry.len());
    for (i, e) in batch.entry.into_iter().enumerate() {
        if e.schema.is_some() {
            return Err(Rejection::Corrupt(format!(
                "entry {} has its own `schema`; in a batch only the file has one",
                i + 1
            )));
        }
        let e = e.into_entry();
        e.validate()
            .map_err(|why| Rejection::Corrupt(format!("entry {} ({}): {why}", i + 1, e.uuid)))?;
        if !seen.insert(e.uuid) {
            return Err(Rejection::Corrupt(format!(
                "entry {} repeats {}, which the batch already holds",
                i + 1,
                e.uuid
            )));
        }
        entries.push(e);
    }
    Ok(entries)
}

/// Which batches hold which UUIDs (the copies that must go when an entry is removed).
#[derive(Debug, Default)]
pub(crate) struct Batches {
    members: std::collections::BTreeMap<u64, BTreeSet<MdevUuid>>,
}

impl Batches {
    /// Records that batch `n` holds `uuids`.
    pub(crate) fn insert(&mut self, n: u64, uuids: impl IntoIterator<Item = MdevUuid>) {
        self.members.entry(n).or_default().extend(uuids);
    }

    /// The number for the next batch.
    pub(crate) fn next_seq(&self) -> u64 {
        self.members.keys().next_back().map_or(1, |n| n + 1)
    }

    /// The batches holding any of `uuids`, with the members each keeps once they are all gone.
    pub(crate) fn without_all(&self, uuids: &BTreeSet<MdevUuid>) -> Vec<(u64, Vec<MdevUuid>)> {
        self.members
            .iter()
            .filter(|(_, m)| !m.is_disjoint(uuids))
            .map(|(n, m)| (*n, m.difference(uuids).copied().collect()))
            .collect()
    }

    /// Forgets `uuid` in batch `n` (its file no longer holds it), and the batch once it is empty.
    pub(crate) fn forget(&mut self, n: u64, uuid: &MdevUuid) {
        if let Some(m) = self.members.get_mut(&n) {
            m.remove(uuid);
            if m.is_empty() {
                self.members.remove(&n);
            }
        }
    }
}
