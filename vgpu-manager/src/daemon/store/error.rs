//! Errors of the state directory. Each names the file and the operation that failed.

use std::fmt;
use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// A filesystem operation the store performs, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// Creating a directory.
    CreateDir,
    /// Listing a directory.
    ListDir,
    /// Opening or locking the lock file.
    Lock,
    /// Reading a file.
    Read,
    /// Creating or writing a temporary file.
    Write,
    /// Flushing a file or directory to disk (`fsync`).
    Sync,
    /// Renaming a temporary file over its final name.
    Rename,
    /// Removing a file.
    Remove,
    /// Moving a corrupted file into `corrupt/`.
    MoveAside,
}

impl fmt::Display for StoreOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreOp::CreateDir => "create directory",
            StoreOp::ListDir => "list directory",
            StoreOp::Lock => "lock",
            StoreOp::Read => "read",
            StoreOp::Write => "write",
            StoreOp::Sync => "fsync",
            StoreOp::Rename => "rename into place",
            StoreOp::Remove => "remove",
            StoreOp::MoveAside => "move aside",
        })
    }
}

/// Why the state directory could not be opened, read or written.
#[derive(Debug, Error)]
pub enum StoreError {
    /// A filesystem call failed.
    #[error(
        "state directory: could not {op} {path}: {source} (check that the directory is writable by vgpud and the disk is not full)"
    )]
    Io {
        /// What was being done.
        op: StoreOp,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The filesystem holding the state directory is full (`ENOSPC`, or `EDQUOT` for a quota): nothing
    /// was written (a record is replaced whole or not at all), and the request was refused.
    #[error(
        "state directory: could not {op} {path}: the disk is full ({source}); nothing was written: free space on the filesystem holding it (`df {dir}`), then retry; vgpud needs no restart",
        dir = dir_of(path)
    )]
    Full {
        /// What was being done.
        op: StoreOp,
        /// The record file (or directory) it was for.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The filesystem holding the state directory is mounted read-only (`EROFS`): nothing was written.
    #[error(
        "state directory: could not {op} {path}: the filesystem is read-only ({source}); nothing was written: remount it read-write (`mount -o remount,rw` on its mount point; a filesystem the kernel made read-only after errors needs `fsck` first), then retry; vgpud needs no restart"
    )]
    ReadOnly {
        /// What was being done.
        op: StoreOp,
        /// The record file (or directory) it was for.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Where a record file belongs there is a directory (`EISDIR`): someone replaced the file. The
    /// record stays as it was in memory and is written again by the next change once the path is free.
    #[error(
        "state directory: could not {op} {path}: it is a directory, not a record file ({source}); nothing was written: move the directory away (`mv {path} /root/`), then retry; vgpud needs no restart"
    )]
    NotAFile {
        /// What was being done.
        op: StoreOp,
        /// The path that is a directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the lock on the state directory.
    #[error(
        "state directory {dir} is in use by another vgpud{}: stop it first, or give this one a different --state-dir",
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Locked {
        /// The state directory.
        dir: PathBuf,
        /// The pid recorded in the lock file by the holder, if readable.
        holder: Option<u32>,
    },
    /// A record could not be encoded as TOML (e.g. a timestamp beyond the TOML integer range).
    #[error("state directory: could not encode {path}: {reason}")]
    Encode {
        /// The file that was to be written.
        path: PathBuf,
        /// The encoder's message.
        reason: String,
    },
    /// A record to be written is not valid (and would be rejected when loaded again).
    #[error("state directory: refusing to write {path}: {reason}")]
    Invalid {
        /// The file that was to be written.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// Wraps an I/O error with the operation and path.
    /// A full disk, a read-only filesystem and a directory where a file belongs are their own
    /// variants, each with its fix.
    pub(crate) fn io(op: StoreOp, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error().map(nix::errno::Errno::from_raw) {
            Some(nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT) => {
                StoreError::Full { op, path, source }
            }
            Some(nix::errno::Errno::EROFS) => StoreError::ReadOnly { op, path, source },
            Some(nix::errno::Errno::EISDIR) => StoreError::NotAFile { op, path, source },
            _ => StoreError::Io { op, path, source },
        }
    }
}

/// The directory a path is in, for the `df` of a full disk's fix.
fn dir_of(path: &std::path::Path) -> String {
    path.parent().unwrap_or(path).display().to_string()
}
