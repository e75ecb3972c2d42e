//! The text codec of every record kind, without a directory: what [`StateDir::open`](super::StateDir::open)
//! does with one file's text once it has read it, and what the writers put into a file.
//!
//! vgpud itself never calls these; they exist so the parse-from-text half of the store can be driven
//! directly, e.g. by the coverage-guided fuzz targets in the repository's `fuzz/` directory, which feed
//! them arbitrary text and check that what decodes encodes to a text that decodes to the same record.
//! They are the very functions the loader and writers use, so no behaviour differs from a file read
//! through the store.

use super::batch::{decode_batch, encode_batch};
use super::load::AsideReason;
use super::record::{Record, Rejection};
use super::{AppliedPool, Definition, LedgerEntry, VfSlotRecord};

/// Why a record could not be encoded: the in-memory record holds a value its file format cannot
/// carry (one the store refuses before writing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode the {kind}: {why}")]
pub struct EncodeError {
    /// The record kind (`definition`, `ledger batch`, …).
    pub kind: &'static str,
    /// What the encoder or the pre-write check refused.
    pub why: String,
}

fn aside(r: Rejection) -> AsideReason {
    match r {
        Rejection::Corrupt(why) => AsideReason::Corrupt(why),
        Rejection::FutureSchema(found) => AsideReason::FutureSchema { found },
    }
}

fn decode<R: Record>(text: &str) -> Result<R, AsideReason> {
    R::decode(text).map_err(aside)
}

/// The writers check a record before encoding it (`put_*`); so does this.
fn encode<R: Record>(record: &R) -> Result<String, EncodeError> {
    let fail = |why| EncodeError { kind: R::KIND, why };
    record.validate().map_err(fail)?;
    record.encode().map_err(fail)
}

/// Decodes the text of `definitions/<uuid>.toml` (the file-name check is the loader's).
pub fn decode_definition(text: &str) -> Result<Definition, AsideReason> {
    decode(text)
}

/// The text `put_definition` writes for `d`.
pub fn encode_definition(d: &Definition) -> Result<String, EncodeError> {
    encode(d)
}

/// Decodes the text of `ledger/<uuid>.toml`.
pub fn decode_ledger_entry(text: &str) -> Result<LedgerEntry, AsideReason> {
    decode(text)
}

/// The text `put_ledger` writes for `e`.
pub fn encode_ledger_entry(e: &LedgerEntry) -> Result<String, EncodeError> {
    encode(e)
}

/// Decodes the text of `ledger/batch-<n>.toml`: its entries, in file order.
pub fn decode_ledger_batch(text: &str) -> Result<Vec<LedgerEntry>, AsideReason> {
    decode_batch(text).map_err(aside)
}

/// The batch text `put_ledgers` writes for `entries` (each valid, no UUID twice).
pub fn encode_ledger_batch(entries: &[LedgerEntry]) -> Result<String, EncodeError> {
    let fail = |why| EncodeError {
        kind: "ledger batch",
        why,
    };
    let mut seen = std::collections::BTreeSet::new();
    for e in entries {
        e.validate().map_err(fail)?;
        if !seen.insert(e.uuid) {
            return Err(fail(format!("{} appears twice in one batch", e.uuid)));
        }
    }
    encode_batch(entries).map_err(fail)
}

/// Decodes the text of `pools/<name>.toml` (its `applied_at` comes from the file's time: 0 here).
pub fn decode_applied_pool(text: &str) -> Result<AppliedPool, AsideReason> {
    decode(text)
}

/// The text `put_pool` writes for `p`.
pub fn encode_applied_pool(p: &AppliedPool) -> Result<String, EncodeError> {
    encode(p)
}

/// Decodes the text of `vf-slots/<uuid>.toml`.
pub fn decode_vf_slot(text: &str) -> Result<VfSlotRecord, AsideReason> {
    decode(text)
}

/// The text `put_vf_slot` writes for `r`.
pub fn encode_vf_slot(r: &VfSlotRecord) -> Result<String, EncodeError> {
    encode(r)
}
