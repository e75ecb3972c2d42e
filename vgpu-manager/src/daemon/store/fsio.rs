//! Crash-safe file primitives: atomic replace, durable removal, moving a bad file aside.
//!
//! Atomic replace follows the POSIX recipe: the new contents go to a temporary file in the *same*
//! directory (so `rename(2)` cannot cross filesystems), the file is `fsync`ed, renamed over the final
//! name (`rename(2)` replaces atomically: readers see the old or the new file, never a mix), and then
//! the directory is `fsync`ed so the rename itself survives a power loss (see `fsync(2)`: syncing a file
//! does not sync the directory entry that names it).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::{StoreError, StoreOp};

/// Prefix of temporary files. Record files are `<uuid>.toml` and never start with a dot, so anything
/// with this prefix is a leftover of an interrupted write and safe to delete while holding the lock.
pub(crate) const TEMP_PREFIX: &str = ".tmp.";

/// Distinguishes temporary files of concurrent writes within one process.
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// This process's id, read once: glibc asks the kernel on every `getpid`, and every durable write
/// names its temporary file with it (vgpud writes files from no forked child).
fn own_pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// Seconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// True for names of leftover temporary files.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Creates `dir` with mode 0700 if missing (the state holds which devices exist and who asked for
/// them; nobody but the daemon needs it). An existing directory keeps its mode.
pub(crate) fn ensure_dir(dir: &Path) -> Result<(), StoreError> {
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(StoreError::io(StoreOp::CreateDir, dir, e)),
    }
    // Make the new entry durable in its parent (harmless when it already existed).
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    Ok(())
}

/// `fsync`s a directory so that entries created, renamed or removed in it are on disk.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::io(StoreOp::Sync, dir, e))
}

/// Writes `bytes` to a new temporary file in `dir` (mode 0600) and `fsync`s it. Returns its path.
/// On error the temporary file is removed again.
#[cfg(test)]
pub(crate) fn write_temp(
    dir: &Path,
    final_name: &str,
    bytes: &[u8],
) -> Result<PathBuf, StoreError> {
    write_temp_at(dir, final_name, bytes, None)
}

/// [`write_temp`], giving the file the modification time `modified` when there is one.
fn write_temp_at(
    dir: &Path,
    final_name: &str,
    bytes: &[u8],
    modified: Option<SystemTime>,
) -> Result<PathBuf, StoreError> {
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("{TEMP_PREFIX}{final_name}.{}.{seq}", own_pid()));
    let result = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            if let Some(t) = modified {
                f.set_modified(t)?;
            }
            f.sync_all()
        });
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            // Best effort: a leftover is also removed on the next open.
            let _ = fs::remove_file(&tmp);
            // The record it was for, not the temporary name (which is gone again).
            Err(StoreError::io(StoreOp::Write, dir.join(final_name), e))
        }
    }
}

/// Atomically replaces `dir/name` with `bytes` (temp file, fsync, rename, fsync directory).
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic_at(dir, name, bytes, None)
}

/// [`write_atomic`], giving the file the modification time `modified` when there is one.
pub(crate) fn write_atomic_at(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    modified: Option<SystemTime>,
) -> Result<(), StoreError> {
    let tmp = write_temp_at(dir, name, bytes, modified)?;
    let target = dir.join(name);
    if let Err(e) = fs::rename(&tmp, &target) {
        let _ = fs::remove_file(&tmp);
        return Err(StoreError::io(StoreOp::Rename, target, e));
    }
    sync_dir(dir)
}

/// One file of [`write_all_atomic`]: its name in the directory, its contents, and the modification
/// time to give it (`None`: now).
pub(crate) struct NewFile<'a> {
    /// The final name in the directory.
    pub name: String,
    /// The whole contents.
    pub bytes: &'a [u8],
    /// The modification time to set, if any.
    pub modified: Option<SystemTime>,
}

/// Atomically replaces each of `files` in `dir`, in order, as [`write_atomic_at`] does, with one
/// `fsync` of the directory after the last rename instead of one per file. On a failure the files
/// before it are in place (the directory is synced for them) and the error names the file that
/// failed: `Err((k, error))` with `k` files written.
pub(crate) fn write_all_atomic(
    dir: &Path,
    files: &[NewFile<'_>],
) -> Result<(), (usize, StoreError)> {
    for (k, f) in files.iter().enumerate() {
        let placed = write_temp_at(dir, &f.name, f.bytes, f.modified).and_then(|tmp| {
            let target = dir.join(&f.name);
            fs::rename(&tmp, &target).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                StoreError::io(StoreOp::Rename, target, e)
            })
        });
        if let Err(e) = placed {
            // What was renamed so far must still reach the disk.
            let _ = sync_dir(dir);
            return Err((k, e));
        }
    }
    if files.is_empty() {
        return Ok(());
    }
    sync_dir(dir).map_err(|e| (0, e))
}

/// Removes `dir/name` durably (unlink, fsync directory). Returns whether it existed.
pub(crate) fn remove_durable(dir: &Path, name: &str) -> Result<bool, StoreError> {
    let path = dir.join(name);
    let existed = match fs::remove_file(&path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(StoreError::io(StoreOp::Remove, path, e)),
    };
    sync_dir(dir)?;
    Ok(existed)
}

/// Removes the files `names` of `dir` durably with one `fsync` of the directory after the last
/// unlink (none when `names` is empty). A file already gone is not an error. Returns which of
/// `names` existed (and are now gone), in order.
pub(crate) fn remove_all_durable<'n>(
    dir: &Path,
    names: &'n [String],
) -> Result<Vec<&'n str>, StoreError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut removed = Vec::new();
    for name in names {
        let path = dir.join(name);
        match fs::remove_file(&path) {
            Ok(()) => removed.push(name.as_str()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                // What was unlinked so far must still reach the disk.
                let _ = sync_dir(dir);
                return Err(StoreError::io(StoreOp::Remove, path, e));
            }
        }
    }
    sync_dir(dir)?;
    Ok(removed)
}

/// Moves `path` to `corrupt_dir/<file name>.<unix-ts>` (with `.1`, `.2`, … if that exists already)
/// and syncs both directories. Returns the new path.
pub(crate) fn move_aside(path: &Path, corrupt_dir: &Path) -> Result<PathBuf, StoreError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base = format!("{name}.{}", unix_now());
    let mut target = corrupt_dir.join(&base);
    let mut n = 0u32;
    while target.exists() {
        n += 1;
        target = corrupt_dir.join(format!("{base}.{n}"));
    }
    fs::rename(path, &target).map_err(|e| StoreError::io(StoreOp::MoveAside, path, e))?;
    sync_dir(corrupt_dir)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent)?;
    }
    Ok(target)
}
