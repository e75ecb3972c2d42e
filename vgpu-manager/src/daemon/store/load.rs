//! Loading one record directory at start-up: leftovers of interrupted writes are deleted, bad files are
//! moved into `corrupt/`, everything else is loaded.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::batch::{batch_seq, decode_batch};
use super::error::{StoreError, StoreOp};
use super::fsio::{is_temp_name, move_aside, sync_dir};
use super::record::{LedgerEntry, Record, Rejection, SCHEMA};

/// What [`StateDir::open`](super::StateDir::open) found besides the good records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Definitions loaded.
    pub definitions: usize,
    /// Ledger entries loaded.
    pub ledger_entries: usize,
    /// Applied pools loaded.
    pub pools: usize,
    /// VF slot records loaded.
    pub vf_slots: usize,
    /// Files that were moved into `corrupt/`, with why.
    pub set_aside: Vec<SetAside>,
    /// Temporary files of interrupted writes that were deleted.
    pub temp_files_removed: Vec<PathBuf>,
}

/// One file moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    /// Where it was.
    pub file: PathBuf,
    /// Where it is now (`corrupt/<name>.<unix-ts>`).
    pub moved_to: PathBuf,
    /// Why.
    pub reason: AsideReason,
}

/// Why a file was moved aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsideReason {
    /// Its name or contents are not a valid record; the text says what is wrong.
    Corrupt(String),
    /// It was written by a newer vgpud with this schema version.
    FutureSchema {
        /// The file's `schema`.
        found: i64,
    },
}

impl fmt::Display for AsideReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsideReason::Corrupt(why) => f.write_str(why),
            AsideReason::FutureSchema { found } => write!(
                f,
                "it has `schema = {found}`, written by a newer vgpud; this one reads schema {SCHEMA} (upgrade vgpud, then move the file back)"
            ),
        }
    }
}

/// Loads every `<key>.toml` in `dir`, leaving alone the names `other` claims (another loader's).
pub(crate) fn load_dir<R: Record>(
    dir: &Path,
    corrupt_dir: &Path,
    report: &mut LoadReport,
    other: impl Fn(&str) -> bool,
) -> Result<BTreeMap<R::Key, R>, StoreError> {
    let mut records = BTreeMap::new();
    let entries = fs::read_dir(dir).map_err(|e| StoreError::io(StoreOp::ListDir, dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(StoreOp::ListDir, dir, e))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_temp_name(&name) {
            // We hold the directory lock, so no other writer can own it: it is a crash leftover.
            fs::remove_file(&path).map_err(|e| StoreError::io(StoreOp::Remove, &path, e))?;
            tracing::info!(
                "state directory: removed {} left by an interrupted write",
                path.display()
            );
            report.temp_files_removed.push(path);
            continue;
        }
        if other(&name) {
            continue;
        }
        let file_type = entry
            .file_type()
            .map_err(|e| StoreError::io(StoreOp::Read, &path, e))?;
        let verdict = if !file_type.is_file() {
            Err(AsideReason::Corrupt(format!(
                "not a regular file (a {} must be a plain {} file)",
                R::KIND,
                R::NAME_RULE
            )))
        } else if let Some(key) = R::key_of_file_name(&name) {
            read_record::<R>(&path, &key)
        } else {
            Err(AsideReason::Corrupt(format!(
                "the name is not {}, so it cannot be a {}",
                R::NAME_RULE,
                R::KIND
            )))
        };
        match verdict {
            Ok(record) => {
                records.insert(record.key().clone(), record);
            }
            Err(reason) => set_aside(path, corrupt_dir, R::KIND, reason, report)?,
        }
    }
    // Always: an unlink a crashed run made without its directory sync becomes durable now, so that
    // from here on a file the records do not list is known to be gone for good (the store skips
    // removing what it knows does not exist).
    sync_dir(dir)?;
    Ok(records)
}

/// Moves an unusable file into `corrupt/`, saying so.
fn set_aside(
    path: PathBuf,
    corrupt_dir: &Path,
    kind: &str,
    reason: AsideReason,
    report: &mut LoadReport,
) -> Result<(), StoreError> {
    let moved_to = move_aside(&path, corrupt_dir)?;
    tracing::warn!(
        "state directory: {} is not a usable {}: {}; moved it to {}",
        path.display(),
        kind,
        reason,
        moved_to.display()
    );
    report.set_aside.push(SetAside {
        file: path,
        moved_to,
        reason,
    });
    Ok(())
}

/// Loads every ledger batch (`batch-<n>.toml`) in `dir`, in batch order.
pub(crate) fn load_batches(
    dir: &Path,
    corrupt_dir: &Path,
    report: &mut LoadReport,
) -> Result<BTreeMap<u64, Vec<LedgerEntry>>, StoreError> {
    let mut batches = BTreeMap::new();
    let entries = fs::read_dir(dir).map_err(|e| StoreError::io(StoreOp::ListDir, dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(StoreOp::ListDir, dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(n) = batch_seq(&name) else { continue };
        let path = entry.path();
        let verdict = match fs::read(&path) {
            Err(e) => Err(AsideReason::Corrupt(format!("could not be read: {e}"))),
            Ok(bytes) => match std::str::from_utf8(&bytes) {
                Err(e) => Err(AsideReason::Corrupt(format!("not UTF-8 text ({e})"))),
                Ok(text) => decode_batch(text).map_err(|r| match r {
                    Rejection::Corrupt(why) => AsideReason::Corrupt(why),
                    Rejection::FutureSchema(found) => AsideReason::FutureSchema { found },
                }),
            },
        };
        match verdict {
            Ok(list) => {
                batches.insert(n, list);
            }
            Err(reason) => set_aside(path, corrupt_dir, "ledger batch", reason, report)?,
        }
    }
    Ok(batches)
}

/// Reads and decodes one file; `Err` means "move it aside".
fn read_record<R: Record>(path: &Path, key: &R::Key) -> Result<R, AsideReason> {
    let (bytes, modified) = match read_file(path) {
        Ok(b) => b,
        Err(e) => return Err(AsideReason::Corrupt(format!("could not be read: {e}"))),
    };
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| AsideReason::Corrupt(format!("not UTF-8 text ({e})")))?;
    let record = R::decode(text).map_err(|r| match r {
        Rejection::Corrupt(why) => AsideReason::Corrupt(why),
        Rejection::FutureSchema(found) => AsideReason::FutureSchema { found },
    })?;
    if record.key() != key {
        return Err(AsideReason::Corrupt(format!(
            "it says `{} = \"{}\"` but is named after {key}",
            R::KEY_FIELD,
            record.key()
        )));
    }
    Ok(record.with_modified(modified))
}

/// A file's bytes and modification time (one open, as `fs::read` costs).
fn read_file(path: &Path) -> std::io::Result<(Vec<u8>, SystemTime)> {
    let mut file = fs::File::open(path)?;
    let meta = file.metadata()?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok((bytes, meta.modified()?))
}
