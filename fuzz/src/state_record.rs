//! The state directory's files, as `StateDir::open` decodes them (`vgpu_manager::daemon::store::codec`):
//! definitions, ledger entries, ledger batches, applied pools and VF slot records, chosen by the first
//! byte. Beyond "no panic": a record that decodes is one the writers accept, and the text they write
//! for it decodes to the same record (an applied pool is stored as its exact text).

use std::fmt::Debug;

use vgpu_manager::daemon::store::AsideReason;
use vgpu_manager::daemon::store::codec::{self, EncodeError};

/// The record kinds, chosen by the first byte (see [`crate::selector_and_text`]).
pub const KINDS: &[&str] = &["definition", "ledger", "batch", "pool", "vf-slot"];

fn round_trip<R: PartialEq + Debug>(
    text: &str,
    decode: impl Fn(&str) -> Result<R, AsideReason>,
    encode: impl Fn(&R) -> Result<String, EncodeError>,
) {
    let Ok(r) = decode(text) else { return };
    let written =
        encode(&r).unwrap_or_else(|e| panic!("{r:?} was loaded but cannot be stored: {e}"));
    match decode(&written) {
        Ok(again) => assert_eq!(again, r, "stored as\n{written}"),
        Err(e) => panic!("{r:?} stored as\n{written}\ndoes not load: {e}"),
    }
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Some((k, text)) = crate::selector_and_text(data, KINDS.len() as u8) else {
        return;
    };
    match k {
        0 => round_trip(text, codec::decode_definition, codec::encode_definition),
        1 => round_trip(text, codec::decode_ledger_entry, codec::encode_ledger_entry),
        2 => round_trip(text, codec::decode_ledger_batch, |e| {
            codec::encode_ledger_batch(e)
        }),
        3 => {
            round_trip(text, codec::decode_applied_pool, codec::encode_applied_pool);
            if let Ok(p) = codec::decode_applied_pool(text) {
                assert_eq!(p.text, text);
            }
        }
        _ => round_trip(text, codec::decode_vf_slot, codec::encode_vf_slot),
    }
}
