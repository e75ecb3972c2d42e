//! Noticing changes others make in mdevctl's definition directory: inotify(7) on the directory and on
//! each parent's directory in it, debounced (libvirt's node-device driver watches the same directory
//! the same way, with 100 ms of quiet before it re-reads: src/node_device/node_device_udev.c
//! `mdevctlEnableMonitor`).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tracing::{debug, warn};

/// How long the directory must be quiet after a change before it is read again.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

/// Why the directory cannot be watched.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// inotify refused (no more instances or watches: `fs.inotify.max_user_*` sysctls).
    #[error(
        "cannot watch the mdevctl definition directory {path} for changes: {source} (raise fs.inotify.max_user_instances / max_user_watches; changes made there are then seen at the next start only)"
    )]
    Inotify {
        /// The directory.
        path: PathBuf,
        /// The error of inotify_init1 or inotify_add_watch.
        #[source]
        source: nix::Error,
    },
}

fn flags() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ONLYDIR
}

/// Watches `dir` and every directory in it (added again after each change, so a new parent's
/// directory is watched too).
fn add_watches(ino: &Inotify, dir: &Path) -> Result<(), WatchError> {
    ino.add_watch(dir, flags())
        .map_err(|source| WatchError::Inotify {
            path: dir.to_path_buf(),
            source,
        })?;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir()
            && let Err(err) = ino.add_watch(&e.path(), flags())
        {
            warn!(dir = %e.path().display(), error = %err, "cannot watch an mdevctl parent directory");
        }
    }
    Ok(())
}

/// Starts a thread that calls `changed` after each burst of changes in `dir` (created, mode 0755,
/// when missing and its own parent exists), once [`DEBOUNCE`] passed without another. The thread
/// ends when `changed` returns false.
pub fn watch(dir: &Path, changed: impl Fn() -> bool + Send + 'static) -> Result<(), WatchError> {
    if !dir.exists() && dir.parent().is_some_and(Path::exists) {
        let _ = std::fs::create_dir(dir);
    }
    let ino = Inotify::init(InitFlags::IN_CLOEXEC).map_err(|source| WatchError::Inotify {
        path: dir.to_path_buf(),
        source,
    })?;
    add_watches(&ino, dir)?;
    let dir = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("mdevctl-dir".into())
        .spawn(move || {
            loop {
                if let Err(e) = ino.read_events() {
                    warn!(dir = %dir.display(), error = %e, "watching the mdevctl definition directory stopped");
                    return;
                }
                // Debounce: wait until the directory has been quiet for DEBOUNCE.
                loop {
                    let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                    let timeout = PollTimeout::try_from(DEBOUNCE).unwrap_or(PollTimeout::NONE);
                    match poll(&mut fds, timeout) {
                        Ok(n) if n > 0 => {
                            let _ = ino.read_events();
                        }
                        _ => break,
                    }
                }
                if let Err(e) = add_watches(&ino, &dir) {
                    debug!(error = %e, "mdevctl definition directory not watched again");
                }
                if !changed() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the thread that watches the mdevctl definition directory");
    }
    Ok(())
}
