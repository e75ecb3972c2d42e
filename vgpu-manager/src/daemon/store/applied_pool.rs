//! Applied pools (`pools/<name>.toml`): the exact text each pool was last applied with, so that it
//! reads back as the same pool, and the file's modification time says when.
//!
//! The file is the pool file format itself (no `schema` line: it is whatever `vgpuctl pool apply`
//! accepts, and `pool::Pool` rejects unknown fields). The store checks what needs no profile catalog —
//! TOML syntax, known fields and their types, a `name` that matches the file name — and moves a file
//! failing that into `corrupt/`. Whether the pool's profiles still exist is the caller's question: a
//! profile removed since makes the pool unusable for now, not its file corrupt.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::record::{Record, Rejection};
use crate::pool::Pool;

/// What an applied pool's text is called in the messages of the pool parser.
const ORIGIN: &str = "pool";

/// A pool vgpud applied (`pools/<name>.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedPool {
    /// The pool's name, as its text says (also the file name).
    pub name: String,
    /// The pool file text it was applied with, unchanged.
    pub text: String,
    /// When it was last applied (seconds since the Unix epoch), kept as the file's modification time.
    pub applied_at: u64,
}

impl Record for AppliedPool {
    const KIND: &'static str = "applied pool";
    const KEY_FIELD: &'static str = "name";
    const NAME_RULE: &'static str = "`<pool name>.toml` (lower-case letters, digits and '-')";
    type Key = String;

    fn key(&self) -> &String {
        &self.name
    }

    fn key_of_file_name(name: &str) -> Option<String> {
        let stem = name.strip_suffix(".toml")?;
        Pool::is_valid_name(stem).then(|| stem.to_string())
    }

    fn encode(&self) -> Result<String, String> {
        Ok(self.text.clone())
    }

    fn decode(text: &str) -> Result<Self, Rejection> {
        let name = Pool::name_in(ORIGIN, text).map_err(|e| Rejection::Corrupt(e.to_string()))?;
        Ok(AppliedPool {
            name,
            text: text.to_string(),
            applied_at: 0,
        })
    }

    fn validate(&self) -> Result<(), String> {
        let named = Pool::name_in(ORIGIN, &self.text).map_err(|e| e.to_string())?;
        if named != self.name {
            return Err(format!(
                "the text names pool `{named}`, not `{}`",
                self.name
            ));
        }
        if i64::try_from(self.applied_at).is_err() {
            return Err(format!(
                "`applied_at = {}` is beyond what a file time can hold",
                self.applied_at
            ));
        }
        Ok(())
    }

    fn modified(&self) -> Option<SystemTime> {
        UNIX_EPOCH.checked_add(Duration::from_secs(self.applied_at))
    }

    fn with_modified(self, modified: SystemTime) -> Self {
        let applied_at = modified
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        AppliedPool { applied_at, ..self }
    }
}
