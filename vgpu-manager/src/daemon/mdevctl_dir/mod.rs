//! mdevctl's definition directory (`/etc/mdevctl.d`) as the definitions shared by vgpud, the real
//! mdevctl and libvirt: this module is the only code of vgpud that writes there.
//!
//! # Layout and format
//!
//! ```text
//! /etc/mdevctl.d/                 (below `--sysfs-root R`: R/etc/mdevctl.d; or vgpud's --mdevctl-dir)
//!   <parent>/<uuid>               one definition: mdevctl's JSON {"mdev_type", "start", "attrs"}
//!   <parent>/.tmp.<uuid>.<pid>.<n> a write of vgpud in progress (mdevctl skips non-UUID names)
//!   scripts.d/                    mdevctl's call-out scripts; never touched
//! ```
//!
//! The file format is mdevctl's (mdevctl(8) "CONFIGURATION FILE FORMAT"; mdevctl src/mdev.rs
//! `to_json`, written pretty-printed without a final newline, as mdevctl's `write_config` writes it).
//! vgpud writes one file for each definition of its state directory (an *own* definition); every
//! other file there is a *foreign* definition (an administrator's or the real mdevctl's): listed,
//! never started by vgpud's automatic actions, taken into vgpud's store only on an explicit request
//! naming it.
//!
//! # Durability and crash rules
//!
//! Writes are atomic (temporary file in the parent's directory, fsync, rename, fsync of the
//! directory: the store's primitives), removals durable (unlink, fsync of the directory). The state
//! directory is written through the store, this directory through this module, always in this order:
//!
//! - **define and modify**: the store first, then the file. A crash in between leaves the store
//!   ahead of the file (an own definition without a file, or a file with the old content).
//! - **undefine**: the file first, then the store. A crash in between leaves an own definition
//!   without its file.
//! - **start-up** reconciles before anything else runs: temporary files of vgpud's interrupted
//!   writes (`.tmp.*` in a parent's directory) are removed; an own definition without its file gets
//!   its file written again; a file of an own definition with other, valid content wins (its type,
//!   start mode and attributes are taken into the store: it was edited while vgpud was down, or a
//!   modify was interrupted before it was acknowledged); a file that does not parse is left as it is
//!   and reported once.
//!
//! So an acknowledged define, modify or undefine survives a crash at any point (both writes were
//! done before the reply), and an interrupted one is either complete or not done at all once the
//! next start has reconciled.
//!
//! While vgpud runs, the same reconcile runs when the directory changes (see
//! [`MdevctlDir::scan`]): an edit of an own definition's file is taken in, a removed file of an own
//! definition is written again (undefine it through vgpud instead), and a file that does not parse is
//! reported once and left alone; nothing there is ever deleted but vgpud's own definitions' files on
//! an undefine, and vgpud's own temporary files.

mod own;
#[cfg(test)]
mod tests;
pub mod watch;

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;

use mdev_types::ids::MdevUuid;
use qemu_glue::mdevctl::{
    ConfigScan, MdevctlConfig, MdevctlError, StartMode, check_parent, scan_config_dir,
};

use crate::daemon::store::fsio::{
    NewFile, is_temp_name, remove_all_durable, remove_durable, sync_dir, write_all_atomic,
};
use crate::daemon::store::{Definition, StoreError, StoreOp};

/// mdevctl's definition directory, relative to the root of the host (mdevctl src/environment.rs
/// `config_base`).
pub const MDEVCTL_DIR: &str = "etc/mdevctl.d";

/// Why the mdevctl definition directory could not be written or read. Each names the file.
#[derive(Debug, Error)]
pub enum MdevctlDirError {
    /// The definition's parent cannot be a directory name there.
    #[error("definition {uuid} cannot be kept in the mdevctl directory: {source}")]
    Parent {
        /// The definition.
        uuid: MdevUuid,
        /// Why its parent name is refused.
        #[source]
        source: MdevctlError,
    },
    /// A file or directory operation failed.
    #[error("mdevctl definition directory: {0}")]
    Io(#[source] StoreError),
    /// A definition file exists but does not parse.
    #[error("{0} (fix or remove the file)")]
    Unreadable(#[source] MdevctlError),
}

impl From<StoreError> for MdevctlDirError {
    fn from(e: StoreError) -> Self {
        MdevctlDirError::Io(e)
    }
}

/// Files [`MdevctlDir::write_all`] did not write: the definitions (UUID, parent) and why.
#[derive(Debug)]
pub struct WriteFailure {
    /// The definitions whose files were not written.
    pub defs: Vec<(MdevUuid, String)>,
    /// Why.
    pub error: MdevctlDirError,
}

pub use own::{OwnChange, OwnChanges};

/// The definition directory at one path. Every call reads or writes the directory; what it keeps is
/// the changes it is making, for the watcher ([`OwnChanges`], shared by its clones).
#[derive(Debug, Clone)]
pub struct MdevctlDir {
    dir: PathBuf,
    own: Arc<OwnChanges>,
}

/// The mdevctl configuration of an own definition: its type, start mode and attributes.
pub fn config_of(def: &Definition) -> MdevctlConfig {
    MdevctlConfig {
        mdev_type: def.type_id.clone(),
        start: StartMode::from_autostart(def.autostart),
        attrs: def
            .attrs
            .iter()
            .map(|a| (a.name().to_string(), a.value().to_string()))
            .collect(),
    }
}

impl MdevctlDir {
    /// The directory at `dir` (created, with its parents' directories, on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> MdevctlDir {
        MdevctlDir {
            dir: dir.into(),
            own: Arc::default(),
        }
    }

    /// The changes vgpud is making here, announced to the directory's watcher.
    pub fn own_changes(&self) -> &Arc<OwnChanges> {
        &self.own
    }

    /// The directory for a host below `root` (`/` for the live host): `<root>/etc/mdevctl.d`, as
    /// mdevctl derives it from its root.
    pub fn below_root(root: &Path) -> MdevctlDir {
        MdevctlDir::new(root.join(MDEVCTL_DIR))
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The file of definition `uuid` on `parent`.
    pub fn file(&self, parent: &str, uuid: &MdevUuid) -> PathBuf {
        self.dir.join(parent).join(uuid.to_string())
    }

    /// The directory of `parent`'s definitions, checked as one path element.
    fn parent_dir(&self, parent: &str, uuid: &MdevUuid) -> Result<PathBuf, MdevctlDirError> {
        check_parent(parent).map_err(|source| MdevctlDirError::Parent {
            uuid: *uuid,
            source,
        })?;
        Ok(self.dir.join(parent))
    }

    /// Atomically writes the file of own definition `def` (creating its parent's directory, mode
    /// 0755 as mdevctl's are); returns the file.
    pub fn write(&self, def: &Definition) -> Result<PathBuf, MdevctlDirError> {
        match self.write_all(std::slice::from_ref(def)).pop() {
            Some(failure) => Err(failure.error),
            None => Ok(self.file(&def.parent, &def.uuid)),
        }
    }

    /// [`MdevctlDir::write`] of each of `defs`, with one `fsync` of each parent's directory for all
    /// of its files. Every parent's files are attempted; what was not written is returned, per
    /// failure.
    pub fn write_all(&self, defs: &[Definition]) -> Vec<WriteFailure> {
        let mut failures = Vec::new();
        let mut parents: Vec<&str> = defs.iter().map(|d| d.parent.as_str()).collect();
        parents.sort_unstable();
        parents.dedup();
        for parent in parents {
            let of_parent: Vec<&Definition> = defs.iter().filter(|d| d.parent == parent).collect();
            let failed = |from: usize, error: MdevctlDirError| WriteFailure {
                defs: of_parent[from..]
                    .iter()
                    .map(|d| (d.uuid, d.parent.clone()))
                    .collect(),
                error,
            };
            let pdir = match self.parent_dir(parent, &of_parent[0].uuid) {
                Ok(p) => p,
                Err(e) => {
                    failures.push(failed(0, e));
                    continue;
                }
            };
            // A directory made now is not watched yet: its files cause no events to announce.
            let watched = pdir.is_dir();
            if !watched {
                let made = fs::create_dir_all(&pdir)
                    .map_err(|e| StoreError::io(StoreOp::CreateDir, pdir.clone(), e))
                    .and_then(|()| sync_dir(&self.dir));
                if let Err(e) = made {
                    failures.push(failed(0, e.into()));
                    continue;
                }
            }
            let texts: Vec<String> = of_parent
                .iter()
                .map(|d| config_of(d).to_json_pretty())
                .collect();
            let files: Vec<NewFile<'_>> = of_parent
                .iter()
                .zip(&texts)
                .map(|(d, t)| NewFile {
                    name: d.uuid.to_string(),
                    bytes: t.as_bytes(),
                    modified: None,
                })
                .collect();
            if watched {
                for f in &files {
                    self.own.expect(parent, &f.name, OwnChange::Placed);
                }
            }
            if let Err((k, e)) = write_all_atomic(&pdir, &files) {
                // The files from the failed one on were not placed (a failed last sync reports
                // the first: then events come that are no longer expected, which costs a re-read).
                if watched {
                    for f in &files[k..] {
                        self.own.withdraw(parent, &f.name, OwnChange::Placed);
                    }
                }
                failures.push(failed(k, e.into()));
            }
        }
        failures
    }

    /// Durably removes the file of definition `uuid` on `parent`; whether there was one.
    pub fn remove(&self, parent: &str, uuid: &MdevUuid) -> Result<bool, MdevctlDirError> {
        let pdir = self.parent_dir(parent, uuid)?;
        if !pdir.is_dir() {
            return Ok(false);
        }
        let name = uuid.to_string();
        self.own.expect(parent, &name, OwnChange::Removed);
        let removed = remove_durable(&pdir, &name);
        if !matches!(removed, Ok(true)) {
            // Nothing was there, or the unlink failed (a failed sync after it costs a re-read).
            self.own.withdraw(parent, &name, OwnChange::Removed);
        }
        Ok(removed?)
    }

    /// [`MdevctlDir::remove`] of each of `defs` (UUID, parent), with one `fsync` of each parent's
    /// directory for all of its files. Returns those that had a file (and no longer have one); the
    /// first failure stops the removal, after the directory of what was removed so far is synced.
    pub fn remove_all(
        &self,
        defs: &[(MdevUuid, String)],
    ) -> Result<Vec<(MdevUuid, String)>, MdevctlDirError> {
        let mut removed = Vec::new();
        let mut parents: Vec<&str> = defs.iter().map(|(_, p)| p.as_str()).collect();
        parents.sort_unstable();
        parents.dedup();
        for parent in parents {
            let of_parent: Vec<MdevUuid> = defs
                .iter()
                .filter(|(_, p)| p == parent)
                .map(|(u, _)| *u)
                .collect();
            let pdir = self.parent_dir(parent, &of_parent[0])?;
            if !pdir.is_dir() {
                continue;
            }
            let names: Vec<String> = of_parent.iter().map(|u| u.to_string()).collect();
            for name in &names {
                self.own.expect(parent, name, OwnChange::Removed);
            }
            let gone = remove_all_durable(&pdir, &names);
            // What was not there causes no event; after a failure, every event costs a re-read.
            for name in &names {
                let unlinked = gone.as_ref().is_ok_and(|g| g.contains(&name.as_str()));
                if !unlinked {
                    self.own.withdraw(parent, name, OwnChange::Removed);
                }
            }
            for name in gone? {
                if let Some(u) = of_parent.iter().find(|u| u.to_string() == name) {
                    removed.push((*u, parent.to_string()));
                }
            }
        }
        Ok(removed)
    }

    /// The definition of `uuid` on `parent` as its file holds it: `None` when there is no file.
    pub fn read(
        &self,
        parent: &str,
        uuid: &MdevUuid,
    ) -> Result<Option<MdevctlConfig>, MdevctlDirError> {
        let path = self.parent_dir(parent, uuid)?.join(uuid.to_string());
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(StoreOp::Read, path, e).into()),
        };
        MdevctlConfig::from_json(&text, &path.display().to_string())
            .map(Some)
            .map_err(MdevctlDirError::Unreadable)
    }

    /// A parent that has a definition file of `uuid`, looked up without reading any file (one
    /// directory listing and a lookup per parent); `None` when no parent has one.
    pub fn defining_parent(&self, uuid: &MdevUuid) -> Option<String> {
        let name = uuid.to_string();
        fs::read_dir(&self.dir).ok()?.flatten().find_map(|p| {
            p.path()
                .join(&name)
                .is_file()
                .then(|| p.file_name().to_string_lossy().into_owned())
        })
    }

    /// The UUIDs some parent there has a definition file of ([`MdevctlDir::defining_parent`] for
    /// all of them at once): one listing of the directory and one of each parent's, where a
    /// lookup per UUID lists the directory each time. No file is read. Never fails: what cannot be
    /// listed holds no definitions, as for `defining_parent`.
    pub fn defined_uuids(&self) -> HashSet<MdevUuid> {
        let Ok(parents) = fs::read_dir(&self.dir) else {
            return HashSet::new();
        };
        parents
            .flatten()
            .filter_map(|p| fs::read_dir(p.path()).ok())
            .flat_map(|files| files.flatten())
            // `is_file` follows a link, as `defining_parent`'s lookup does.
            .filter(|f| f.path().is_file())
            // The name as `defining_parent` looks it up: the UUID's own spelling.
            .filter_map(|f| {
                let name = f.file_name();
                let name = name.to_str()?;
                name.parse::<MdevUuid>()
                    .ok()
                    .filter(|u| u.to_string() == name)
            })
            .collect()
    }

    /// Every definition file there, and each one that cannot be read or parsed. Never fails: a
    /// missing directory holds no definitions.
    pub fn scan(&self) -> ConfigScan {
        scan_config_dir(&self.dir)
    }

    /// Removes leftovers of vgpud's interrupted writes (`.tmp.*` in a parent's directory; nothing
    /// else is touched) and returns them. Call only at start-up, before any write.
    pub fn remove_stray_temps(&self) -> Vec<PathBuf> {
        let mut removed = Vec::new();
        let Ok(parents) = fs::read_dir(&self.dir) else {
            return removed;
        };
        for p in parents.flatten() {
            let Ok(children) = fs::read_dir(p.path()) else {
                continue;
            };
            for c in children.flatten() {
                let is_temp = c.file_name().to_str().is_some_and(is_temp_name);
                if is_temp && c.path().is_file() && fs::remove_file(c.path()).is_ok() {
                    removed.push(c.path());
                }
            }
        }
        removed
    }
}
