//! The exclusive lock on a state directory: one daemon per directory.
//!
//! `flock(2)` on `<dir>/lock`: the kernel drops the lock when the holder exits for any reason
//! (including `kill -9`), so a crashed daemon never leaves a stale lock behind. The holder writes its
//! pid into the file only so that a second daemon can name it in its error; the pid is never trusted
//! for anything else. The file itself is never deleted (deleting a lock file lets two processes lock
//! two different inodes).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::error::{StoreError, StoreOp};

/// Name of the lock file inside the state directory.
pub(crate) const LOCK_FILE: &str = "lock";

/// Holds the lock until dropped.
#[derive(Debug)]
pub(crate) struct DirLock {
    _flock: Flock<File>,
}

/// Takes the exclusive lock on `dir` without waiting.
pub(crate) fn lock_dir(dir: &Path) -> Result<DirLock, StoreError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| StoreError::io(StoreOp::Lock, &path, e))?;
    let mut flock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            return Err(StoreError::Locked {
                dir: dir.to_path_buf(),
                holder: read_pid(&mut file),
            });
        }
        Err((_, errno)) => {
            return Err(StoreError::io(StoreOp::Lock, &path, errno.into()));
        }
    };
    let pid = std::process::id();
    flock
        .set_len(0)
        .and_then(|()| flock.seek(SeekFrom::Start(0)).map(|_| ()))
        .and_then(|()| writeln!(&mut *flock, "{pid}"))
        .and_then(|()| flock.sync_all())
        .map_err(|e| StoreError::io(StoreOp::Write, &path, e))?;
    Ok(DirLock { _flock: flock })
}

/// The pid the holder wrote, if the file holds one.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
