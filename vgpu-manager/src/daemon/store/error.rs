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
    pub(crate) fn io(op: StoreOp, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
