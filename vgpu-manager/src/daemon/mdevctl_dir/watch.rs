//! Noticing changes others make in mdevctl's definition directory: inotify(7) on the directory and on
//! each parent's directory in it, debounced (libvirt's node-device driver watches the same directory
//! the same way, with 100 ms of quiet before it re-reads: src/node_device/node_device_udev.c
//! `mdevctlEnableMonitor`).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use tracing::{debug, warn};

use super::{MdevctlDir, OwnChange, OwnChanges};
use mdev_types::ids::MdevUuid;

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

/// The watched directories: the directory itself (`None`) and each parent's in it (`Some(parent)`).
type Watched = HashMap<WatchDescriptor, Option<String>>;

/// Watches `dir` and every directory in it (added again after each change, so a new parent's
/// directory is watched too); returns what each watch is of.
fn add_watches(ino: &Inotify, dir: &Path) -> Result<Watched, WatchError> {
    let top = ino
        .add_watch(dir, flags())
        .map_err(|source| WatchError::Inotify {
            path: dir.to_path_buf(),
            source,
        })?;
    let mut watched = HashMap::from([(top, None)]);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !e.path().is_dir() {
            continue;
        }
        match ino.add_watch(&e.path(), flags()) {
            Ok(wd) => {
                watched.insert(wd, Some(e.file_name().to_string_lossy().into_owned()));
            }
            Err(err) => {
                warn!(dir = %e.path().display(), error = %err, "cannot watch an mdevctl parent directory");
            }
        }
    }
    Ok(watched)
}

/// Whether the event `ev`, in the directory `at` (see [`Watched`]; `None` when the watch is not
/// known), may change what the directory holds in a way vgpud did not announce ([`OwnChanges`]):
/// then the directory is read again. Events on names that are no definition (vgpud's temporary
/// files, which mdevctl skips too) change nothing; the one event each of vgpud's own writes and
/// removals causes on a definition's name is used up; anything else counts, and so does any event
/// of the directory itself (a parent's directory made or removed) and a lost event.
fn is_foreign(ev: &InotifyEvent, at: Option<&Option<String>>, own: &OwnChanges) -> bool {
    if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) || ev.mask.contains(AddWatchFlags::IN_IGNORED)
    {
        return true;
    }
    let (Some(Some(parent)), Some(name)) = (at, ev.name.as_ref().and_then(|n| n.to_str())) else {
        return true;
    };
    if name.parse::<MdevUuid>().is_err() {
        return false;
    }
    let change = if ev.mask.contains(AddWatchFlags::IN_MOVED_TO) {
        OwnChange::Placed
    } else if ev.mask.contains(AddWatchFlags::IN_DELETE) {
        OwnChange::Removed
    } else {
        return true;
    };
    !own.take(parent, name, change)
}

/// Starts a thread that calls `changed` after each burst of changes others make in `dir` (created,
/// mode 0755, when missing and its own parent exists), once [`DEBOUNCE`] passed without another.
/// A burst of vgpud's own writes and removals alone ([`MdevctlDir::own_changes`]) calls nothing.
/// The thread ends when `changed` returns false.
pub fn watch(
    dir: &MdevctlDir,
    changed: impl Fn() -> bool + Send + 'static,
) -> Result<(), WatchError> {
    let own = Arc::clone(dir.own_changes());
    let dir = dir.path().to_path_buf();
    if !dir.exists() && dir.parent().is_some_and(Path::exists) {
        let _ = std::fs::create_dir(&dir);
    }
    let ino = Inotify::init(InitFlags::IN_CLOEXEC).map_err(|source| WatchError::Inotify {
        path: dir.clone(),
        source,
    })?;
    let mut watched = add_watches(&ino, &dir)?;
    // Only once the watches are in place: a change announced before would cause no event.
    own.start_watching();
    let stop = Stop(Arc::clone(&own));
    let spawned = std::thread::Builder::new()
        .name("mdevctl-dir".into())
        .spawn(move || {
            let _stop = stop;
            loop {
                let mut foreign = false;
                let mut take = |events: Vec<InotifyEvent>| {
                    for ev in &events {
                        // Every event is looked at: each of vgpud's own is used up.
                        foreign |= is_foreign(ev, watched.get(&ev.wd), &own);
                    }
                };
                match ino.read_events() {
                    Ok(events) => take(events),
                    Err(e) => {
                        warn!(dir = %dir.display(), error = %e, "watching the mdevctl definition directory stopped");
                        return;
                    }
                }
                // Debounce: wait until the directory has been quiet for DEBOUNCE.
                loop {
                    let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                    let timeout = PollTimeout::try_from(DEBOUNCE).unwrap_or(PollTimeout::NONE);
                    match poll(&mut fds, timeout) {
                        Ok(n) if n > 0 => {
                            if let Ok(events) = ino.read_events() {
                                take(events);
                            }
                        }
                        _ => break,
                    }
                }
                if !foreign {
                    continue;
                }
                match add_watches(&ino, &dir) {
                    Ok(w) => watched = w,
                    Err(e) => debug!(error = %e, "mdevctl definition directory not watched again"),
                }
                // Read anew below: nothing announced so far needs its event any more, and a
                // change in a directory that was not watched yet sent none.
                own.forget_all();
                if !changed() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        // The closure, with its `Stop`, is dropped: nothing is announced any more.
        warn!(error = %e, "cannot start the thread that watches the mdevctl definition directory");
    }
    Ok(())
}

/// Stops the announcements when the watching thread ends, however it ends.
struct Stop(Arc<OwnChanges>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.stop_watching();
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
