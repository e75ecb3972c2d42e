//! Where definitions persist: the state directory (through the store) and mdevctl's definition
//! directory (through [`crate::daemon::mdevctl_dir`]), kept in the order the crash rules of that
//! module state. [`Persist`] is the state directory with the definition calls replaced by ones that
//! also keep the mdevctl file; everything else of the store is reached through `Deref`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;

use tracing::{info, warn};

use mdev_types::ids::MdevUuid;
use qemu_glue::mdevctl::{MdevctlConfig, MdevctlError, check_parent};

use crate::daemon::api::{CoreError, DefinitionOwner, DefinitionView, StateError, parse_attrs};
use crate::daemon::mdevctl_dir::{MdevctlDir, MdevctlDirError, config_of};
use crate::daemon::store::{Definition, StateDir, StoreError, StoreOp};

/// The state directory and, when vgpud keeps one, mdevctl's definition directory.
#[derive(Debug)]
pub(crate) struct Persist {
    state: StateDir,
    mdevctl: Option<MdevctlDir>,
    /// Unreadable definition files already reported (each is reported once until it changes).
    reported: BTreeSet<PathBuf>,
    /// Fault injection for the crash tests: the number of durable steps still allowed.
    fail_after: Option<usize>,
}

impl Deref for Persist {
    type Target = StateDir;
    fn deref(&self) -> &StateDir {
        &self.state
    }
}

impl DerefMut for Persist {
    fn deref_mut(&mut self) -> &mut StateDir {
        &mut self.state
    }
}

/// The path an mdevctl parse or read error names.
fn error_path(e: &MdevctlError) -> Option<PathBuf> {
    match e {
        MdevctlError::Json { origin, .. } | MdevctlError::Shape { origin, .. } => {
            Some(PathBuf::from(origin))
        }
        MdevctlError::Io { path, .. } => Some(path.clone()),
        MdevctlError::BadParent(_) => None,
    }
}

/// `def` with the type, start mode and attributes of `config` (an edit of its file), or why the
/// edit cannot be taken.
fn edited(def: &Definition, config: &MdevctlConfig) -> Result<Definition, String> {
    let attrs = parse_attrs(config.attrs.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .map_err(|e| e.to_string())?;
    let mut new = def.clone();
    if new.type_id != config.mdev_type {
        new.type_id = config.mdev_type.clone();
        // The profile named the old type.
        new.profile = None;
    }
    new.autostart = config.start.is_auto();
    new.attrs = attrs;
    Ok(new)
}

impl Persist {
    /// `state`, keeping definition files in `mdevctl` when given. Call [`Persist::reconcile_files`]
    /// before anything else.
    pub(crate) fn new(state: StateDir, mdevctl: Option<MdevctlDir>) -> Persist {
        Persist {
            state,
            mdevctl,
            reported: BTreeSet::new(),
            fail_after: None,
        }
    }

    /// The mdevctl definition directory, if vgpud keeps one.
    pub(crate) fn mdevctl_dir(&self) -> Option<&MdevctlDir> {
        self.mdevctl.as_ref()
    }

    /// Fails every durable step after the next `n` (crash tests: what is left on disk is what a
    /// crash at that point leaves).
    #[cfg(test)]
    pub(crate) fn fail_after(&mut self, n: usize) {
        self.fail_after = Some(n);
    }

    /// One durable step is about to be taken; fails when fault injection says to stop here.
    fn step(&mut self) -> Result<(), CoreError> {
        match &mut self.fail_after {
            Some(0) => Err(StoreError::io(
                StoreOp::Write,
                "(crash injected by a test)",
                std::io::Error::other("injected crash"),
            )
            .into()),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Durably stores (creates or replaces) definition `def`: the store first, then its mdevctl file
    /// (and, when its parent changed, the old file is removed first). A file that cannot be written
    /// is logged, not an error: the definition is stored, and the next start writes the file.
    pub(crate) fn put_definition(&mut self, def: &Definition) -> Result<(), CoreError> {
        self.step()?;
        let old_parent = self
            .state
            .get_definition(&def.uuid)
            .map(|d| d.parent.clone());
        self.state.put_definition(def)?;
        let Some(dir) = self.mdevctl.clone() else {
            return Ok(());
        };
        if let Some(old) = old_parent.filter(|p| *p != def.parent) {
            self.step()?;
            if let Err(e) = dir.remove(&old, &def.uuid) {
                warn!(uuid = %def.uuid, parent = %old, error = %e, "the old mdevctl definition file could not be removed");
            }
        }
        self.step()?;
        if let Err(e) = dir.write(def) {
            warn!(uuid = %def.uuid, parent = %def.parent, error = %e, "the mdevctl definition file could not be written (written again at the next start)");
        }
        Ok(())
    }

    /// [`Persist::put_definition`] of each of `defs`, none of which is defined yet (a pool's new
    /// slots): the store first, all of them with one `fsync` of its directory, then their mdevctl
    /// files, likewise per parent. On a failure of the store the definitions before the one that
    /// failed are stored (and their files written): `Err((k, error))` with `k` stored.
    pub(crate) fn put_new_definitions(
        &mut self,
        defs: &[Definition],
    ) -> Result<(), (usize, CoreError)> {
        self.step().map_err(|e| (0, e))?;
        let stored = self.state.put_definitions(defs);
        let done = match &stored {
            Ok(()) => defs.len(),
            Err((k, _)) => *k,
        };
        if let Some(dir) = self.mdevctl.clone()
            && done > 0
        {
            self.step().map_err(|e| (done, e))?;
            for f in dir.write_all(&defs[..done]) {
                for (uuid, parent) in &f.defs {
                    warn!(%uuid, %parent, error = %f.error, "the mdevctl definition file could not be written (written again at the next start)");
                }
            }
        }
        stored.map_err(|(k, e)| (k, e.into()))
    }

    /// Durably deletes definition `uuid`: its mdevctl file first, then the store; returns it if there
    /// was one. A file that cannot be removed fails the call with the definition kept.
    pub(crate) fn remove_definition(
        &mut self,
        uuid: &MdevUuid,
    ) -> Result<Option<Definition>, CoreError> {
        let def = self.state.get_definition(uuid).cloned();
        let mut file_removed = None;
        if let (Some(dir), Some(def)) = (self.mdevctl.clone(), &def) {
            self.step()?;
            match dir.remove(&def.parent, uuid) {
                Ok(_) => file_removed = Some(dir),
                Err(MdevctlDirError::Parent { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.step()?;
        match self.state.remove_definition(uuid) {
            Ok(removed) => Ok(removed),
            Err(e) => {
                // The definition stays (a full or read-only state directory): so does its file.
                if let (Some(dir), Some(def)) = (file_removed, &def)
                    && let Err(w) = dir.write(def)
                {
                    warn!(%uuid, error = %w, "the mdevctl definition file of a definition kept could not be written back (written again at the next start)");
                }
                Err(e.into())
            }
        }
    }

    /// Durably deletes the definitions of `uuids` as [`Persist::remove_definition`] does each (their
    /// mdevctl files first, then the store), the store's part with one flush for all of them. A file
    /// that cannot be removed fails the call before the store changes; a store that cannot remove
    /// them keeps them, and their files are written back.
    pub(crate) fn remove_definitions(&mut self, uuids: &[MdevUuid]) -> Result<(), CoreError> {
        let mut files_removed = Vec::new();
        if let Some(dir) = self.mdevctl.clone() {
            // A parent that cannot be a directory name there has no file to remove.
            let defs: Vec<Definition> = uuids
                .iter()
                .filter_map(|u| self.state.get_definition(u).cloned())
                .filter(|d| check_parent(&d.parent).is_ok())
                .collect();
            if !defs.is_empty() {
                self.step()?;
                let keys: Vec<(MdevUuid, String)> =
                    defs.iter().map(|d| (d.uuid, d.parent.clone())).collect();
                let gone = dir.remove_all(&keys)?;
                files_removed = defs
                    .into_iter()
                    .filter(|d| gone.iter().any(|(u, p)| *u == d.uuid && *p == d.parent))
                    .collect();
            }
        }
        self.step()?;
        if let Err(e) = self.state.remove_definitions(uuids) {
            if let Some(dir) = &self.mdevctl {
                for def in &files_removed {
                    if let Err(w) = dir.write(def) {
                        warn!(uuid = %def.uuid, error = %w, "the mdevctl definition file of a definition kept could not be written back (written again at the next start)");
                    }
                }
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Durably stores (creates or replaces) `def` as an alternate of its UUID (a definition on
    /// another parent than the main one): the store first, then its mdevctl file, as
    /// [`Persist::put_definition`].
    pub(crate) fn put_alternate(&mut self, def: &Definition) -> Result<(), CoreError> {
        self.step()?;
        self.state.put_alternate(def)?;
        if let Some(dir) = self.mdevctl.clone() {
            self.step()?;
            if let Err(e) = dir.write(def) {
                warn!(uuid = %def.uuid, parent = %def.parent, error = %e, "the mdevctl definition file could not be written (written again at the next start)");
            }
        }
        Ok(())
    }

    /// Makes the definition of `uuid` on `parent` its main one (see
    /// [`StateDir::select_definition`]); the mdevctl files stay as they are (both definitions are
    /// still there).
    pub(crate) fn select_definition(
        &mut self,
        uuid: &MdevUuid,
        parent: &str,
    ) -> Result<bool, CoreError> {
        self.step()?;
        Ok(self.state.select_definition(uuid, parent)?)
    }

    /// Before a reconcile: a UUID whose main definition does not autostart but one of whose
    /// alternates does gets that alternate as its main definition (the first by parent), so that the
    /// autostart it asks for happens, as mdevctl's udev rule starts a parent's auto definitions
    /// (mdevctl `start-parent-mdevs`). UUIDs with a device (`exists`) are left as they are. Returns
    /// the UUIDs changed; a store error is logged, not returned (the reconcile goes on).
    pub(crate) fn prefer_autostart_alternates(
        &mut self,
        exists: impl Fn(&MdevUuid) -> bool,
    ) -> Vec<MdevUuid> {
        let wanted: Vec<(MdevUuid, String)> = self
            .state
            .definitions()
            .filter(|d| !d.autostart && !exists(&d.uuid))
            .filter_map(|d| {
                self.state
                    .alternates_of(&d.uuid)
                    .find(|a| a.autostart)
                    .map(|a| (d.uuid, a.parent.clone()))
            })
            .collect();
        let mut changed = Vec::new();
        for (uuid, parent) in wanted {
            match self.state.select_definition(&uuid, &parent) {
                Ok(_) => {
                    info!(%uuid, %parent, "its autostart definition on another parent is now the one vgpud acts on");
                    changed.push(uuid);
                }
                Err(e) => {
                    warn!(%uuid, %parent, error = %e, "the autostart definition on another parent could not be selected")
                }
            }
        }
        changed
    }

    /// Brings the mdevctl directory and the own definitions together (the rules of
    /// [`crate::daemon::mdevctl_dir`]): at start-up (`startup`: vgpud's leftover temporary files are
    /// removed first) and whenever the directory changed. Returns the definitions whose content
    /// changed (their file was edited). Never fails: what cannot be done is logged.
    pub(crate) fn reconcile_files(&mut self, startup: bool) -> Vec<MdevUuid> {
        let Some(dir) = self.mdevctl.clone() else {
            return Vec::new();
        };
        if startup {
            for t in dir.remove_stray_temps() {
                info!(file = %t.display(), "leftover of an interrupted mdevctl definition write removed");
            }
        }
        let scan = dir.scan();
        let unreadable: BTreeSet<PathBuf> = scan.unreadable.iter().filter_map(error_path).collect();
        for e in &scan.unreadable {
            let new = error_path(e).is_none_or(|p| !self.reported.contains(&p));
            if new {
                warn!(error = %e, "mdevctl definition file not used (fix or remove it)");
            }
        }
        self.reported = unreadable.clone();
        let files: BTreeMap<(&str, MdevUuid), &MdevctlConfig> = scan
            .devices
            .iter()
            .map(|d| ((d.parent.as_str(), d.uuid), &d.config))
            .collect();
        let own: Vec<(Definition, bool)> = self
            .state
            .definitions()
            .map(|d| (d.clone(), true))
            .chain(self.state.alternates().map(|d| (d.clone(), false)))
            .collect();
        let mut changed = Vec::new();
        for (def, main) in own {
            if check_parent(&def.parent).is_err() {
                continue;
            }
            let path = dir.file(&def.parent, &def.uuid);
            match files.get(&(def.parent.as_str(), def.uuid)) {
                Some(config) if **config == config_of(&def) => {}
                Some(config) => match edited(&def, config) {
                    Ok(new) => match if main {
                        self.state.put_definition(&new)
                    } else {
                        self.state.put_alternate(&new)
                    } {
                        Ok(()) => {
                            info!(uuid = %def.uuid, file = %path.display(), "mdevctl definition file edited by someone else: its content is now the definition");
                            changed.push(def.uuid);
                        }
                        Err(e) => {
                            warn!(uuid = %def.uuid, error = %e, "an edit of an mdevctl definition file could not be stored")
                        }
                    },
                    Err(reason) => {
                        if self.reported.insert(path.clone()) {
                            warn!(uuid = %def.uuid, file = %path.display(), %reason, "edit of an mdevctl definition file not taken (fix the file)");
                        }
                    }
                },
                None if unreadable.contains(&path) => {}
                None => {
                    warn!(uuid = %def.uuid, file = %path.display(), "mdevctl definition file of a vgpud definition is missing: written again (undefine it through vgpud)");
                    if let Err(e) = dir.write(&def) {
                        warn!(uuid = %def.uuid, error = %e, "the mdevctl definition file could not be written");
                    }
                }
            }
        }
        changed
    }

    /// The own definitions as listed, and the directory to read the foreign ones from (with
    /// [`foreign_definitions`], outside the store's lock: reading the directory must not hold up
    /// changes).
    pub(crate) fn own_definitions(&self) -> (Vec<DefinitionView>, Option<MdevctlDir>) {
        let own = self
            .state
            .definitions()
            .chain(self.state.alternates())
            .map(|d| {
                let c = config_of(d);
                DefinitionView {
                    parent: d.parent.clone(),
                    uuid: d.uuid,
                    type_id: c.mdev_type,
                    autostart: d.autostart,
                    attrs: c.attrs,
                    owner: DefinitionOwner::Daemon,
                }
            })
            .collect();
        (own, self.mdevctl.clone())
    }

    /// Every definition: the own ones from the store and the foreign files of the mdevctl directory
    /// (read now), sorted by parent then UUID.
    #[cfg(test)]
    pub(crate) fn all_definitions(&self) -> Vec<DefinitionView> {
        let (own, dir) = self.own_definitions();
        foreign_definitions(own, dir.as_ref())
    }

    /// A parent on which mdevctl's definition directory holds a definition of `uuid` that vgpud
    /// does not (see [`MdevctlDir::defining_parent`]).
    pub(crate) fn foreign_definition_parent(&self, uuid: &MdevUuid) -> Option<String> {
        if self.state.get_definition(uuid).is_some() {
            return None;
        }
        self.mdevctl.as_ref()?.defining_parent(uuid)
    }

    /// Every UUID that mdevctl's definition directory holds a definition of (vgpud's own files
    /// included: check the store too), read once; empty without a directory (see
    /// [`MdevctlDir::defined_uuids`]).
    pub(crate) fn mdevctl_defined_uuids(&self) -> std::collections::HashSet<MdevUuid> {
        self.mdevctl
            .as_ref()
            .map(MdevctlDir::defined_uuids)
            .unwrap_or_default()
    }

    /// The foreign definition of `uuid` on `parent`, as its file holds it.
    pub(crate) fn foreign_definition(
        &self,
        parent: &str,
        uuid: &MdevUuid,
    ) -> Result<MdevctlConfig, CoreError> {
        let missing = || StateError::NoDefinitionFile {
            uuid: *uuid,
            parent: parent.to_string(),
        };
        let Some(dir) = &self.mdevctl else {
            return Err(missing().into());
        };
        dir.read(parent, uuid)?.ok_or_else(|| missing().into())
    }
}

/// `own` and the foreign definitions of `dir` (the files that are not one of `own`), sorted by parent
/// then UUID.
pub(crate) fn foreign_definitions(
    mut own: Vec<DefinitionView>,
    dir: Option<&MdevctlDir>,
) -> Vec<DefinitionView> {
    if let Some(dir) = dir {
        let known: BTreeSet<(String, MdevUuid)> =
            own.iter().map(|d| (d.parent.clone(), d.uuid)).collect();
        for d in dir.scan().devices {
            if known.contains(&(d.parent.clone(), d.uuid)) {
                continue;
            }
            own.push(DefinitionView {
                parent: d.parent,
                uuid: d.uuid,
                type_id: d.config.mdev_type,
                autostart: d.config.start.is_auto(),
                attrs: d.config.attrs,
                owner: DefinitionOwner::Foreign,
            });
        }
    }
    own.sort_by(|a, b| (&a.parent, a.uuid).cmp(&(&b.parent, b.uuid)));
    own
}
