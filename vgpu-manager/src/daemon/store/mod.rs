//! The state directory: persistent definitions, the ownership ledger, applied pools and VF slots. It
//! is the only code that writes into the directory.
//!
//! # Layout
//!
//! ```text
//! /var/lib/vgpu-manager/          (mode 0700, created if missing)
//!   lock                          flock(2)-ed by the running daemon; holds its pid
//!   definitions/<uuid>.toml       one persistent instance definition per file (the UUID's main one)
//!   definitions/<uuid>@<parent>.toml  a further definition of the UUID on another parent (see
//!                                 `alternate`: mdevctl keys definitions by parent and UUID)
//!   ledger/<uuid>.toml            one file per device the daemon created or adopted
//!   ledger/batch-<n>.toml         entries of many devices written at once (see `batch`)
//!   pools/<name>.toml             the text of each pool vgpud applied (see `applied_pool`)
//!   applying/<name>.toml          the text of a pool apply in progress (an applied pool's format):
//!                                 left by an apply that vgpud's shutdown or a crash stopped, and
//!                                 finished by the next start
//!   vf-slots/<uuid>.toml          one file per pool slot held by an SR-IOV VF (see `vf_slot`)
//!   incoming/<uuid>.toml          one file per incoming live-migration target (see `incoming`)
//!   corrupt/<name>.<unix-ts>      files that could not be loaded, moved aside
//! ```
//!
//! Files other than applied pools (which are pool files, as `vgpuctl pool apply` takes them, with
//! their modification time as the time of the apply) are TOML with `schema = 1` on the first line
//! (TOML because admins read and occasionally edit these; the daemon never needs anything TOML
//! cannot express). A definition:
//!
//! ```toml
//! schema = 1
//! uuid = "4b20d080-1b54-4048-85b3-a6a62d165c01"
//! parent = "0000:3b:00.0"          # mdev parent device name
//! gpu = "0000:3b:00.0"             # GPU id as clients see it
//! type_id = "nvidia-231"
//! profile = "vdi-2g"               # optional
//! autostart = true
//! label = "vm-42"                  # optional
//! created_at = 1767225600          # seconds since the Unix epoch
//! ```
//!
//! A ledger entry has `schema`, `uuid`, `parent`, `type_id`, `ownership` (`"daemon"` or `"adopted"`)
//! and `created_at`, plus optional `gpu`, `profile` and `label` (what clients see of a transient
//! instance, which has no definition to hold them). Unknown fields are rejected in every kind; a file
//! with a higher `schema` (from a newer vgpud) is moved aside with a message naming its version rather
//! than misread.
//!
//! # Durability
//!
//! Every write is atomic: temporary file in the same directory, write, `fsync`, `rename` over the
//! final name, `fsync` the directory. Every removal is `unlink` plus `fsync` of the directory. A crash
//! at any instant therefore leaves each file either in its old or its new state, plus at most a
//! leftover `.tmp.*` file, which [`StateDir::open`] deletes. A file that does not load (bad TOML, wrong
//! field types, unknown fields, a `uuid` or `name` that differs from its file name, …) is moved to
//! `corrupt/` with a warning naming it and the reason, and everything else still loads
//! ([`LoadReport`] lists what was set aside).
//!
//! # Ownership ledger protocol
//!
//! The daemon removes only devices recorded in the ledger, so the ledger must never miss a device the
//! daemon made. The rule is *the ledger entry covers the whole life of the device, with margin at both
//! ends*:
//!
//! 1. **Create**: write `ledger/<uuid>.toml` (durably) *before* writing the UUID into the parent's
//!    `create` attribute — or, when a reconcile creates many devices, one `ledger/batch-<n>.toml`
//!    holding all their entries before the first of them. If the kernel refuses, remove the entry
//!    again (only when the device really does not exist).
//! 2. **Remove**: write the parent's `remove` attribute, confirm the device is gone, *then* remove the
//!    ledger entry.
//! 3. **Adopt**: write the entry with `ownership = "adopted"` before reporting the device as ours,
//!    and before removing a foreign device that an explicit stop or destroy names (then step 2).
//!
//! A crash between the two halves of any step leaves an entry whose device may or may not exist.
//! Reconcile on the next start resolves it: entry and device both present → still ours (kept, never
//! removed automatically, a VM may use it); entry without device → stale, dropped (or the device is
//! created again if an autostart definition asks for it). A device without an entry is always
//! someone else's: it is shown as foreign and never touched. So no interleaving of crashes can make
//! the daemon forget a device it created, nor remove one it did not.
//!
//! # Concurrency
//!
//! One daemon per directory: [`StateDir::open`] takes an exclusive `flock(2)` on `lock` and fails with
//! [`StoreError::Locked`] (naming the holder's pid) if another process has it. Within the daemon the
//! caller serializes access (`&mut self`).
//!
//! # Errors
//!
//! A failed `put_*`/`remove_*` leaves the in-memory view unchanged. If the failure came after the
//! rename or unlink (the directory `fsync`), the file on disk may already be in its new state; the
//! next [`StateDir::open`] shows which, and both states are safe under the ledger protocol above.

mod alternate;
mod applied_pool;
mod batch;
pub mod codec;
mod error;
pub(crate) mod fsio;
mod incoming;
mod load;
mod lock;
mod record;
#[cfg(test)]
mod tests;
mod vf_slot;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mdev_types::ids::MdevUuid;

pub use applied_pool::AppliedPool;
pub use error::{StoreError, StoreOp};
pub use incoming::IncomingRecord;
pub use load::{AsideReason, LoadReport, SetAside};
pub use record::{Definition, LedgerEntry, LedgerOwnership, SCHEMA};
pub use vf_slot::{VfKind, VfSlotRecord};

use alternate::{Alternate, AlternateKey};
use batch::{Batches, batch_name, batch_seq, encode_batch};
use fsio::{
    NewFile, ensure_dir, remove_all_durable, remove_durable, write_all_atomic, write_atomic,
    write_atomic_at,
};
use load::{load_batches, load_dir};
use lock::{DirLock, lock_dir};
use record::Record;

/// The default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/vgpu-manager";

/// Subdirectory of definitions.
const DEFINITIONS: &str = "definitions";
/// Subdirectory of ledger entries.
const LEDGER: &str = "ledger";
/// Subdirectory of applied pools.
const POOLS: &str = "pools";
/// Subdirectory of pool applies in progress.
const APPLYING: &str = "applying";
/// Subdirectory of VF slot records.
const VF_SLOTS: &str = "vf-slots";
/// Subdirectory of incoming instance records.
const INCOMING: &str = "incoming";
/// Subdirectory of files moved aside.
const CORRUPT: &str = "corrupt";

/// Seconds since the Unix epoch, for `created_at` fields.
pub fn unix_now() -> u64 {
    fsio::unix_now()
}

/// An open, locked state directory with everything in it loaded. Dropping it releases the lock.
#[derive(Debug)]
pub struct StateDir {
    root: PathBuf,
    definitions: BTreeMap<MdevUuid, Definition>,
    /// Definitions of a UUID on other parents than its main one.
    alternates: BTreeMap<AlternateKey, Alternate>,
    ledger: BTreeMap<MdevUuid, LedgerEntry>,
    batches: Batches,
    /// Ledger entries that have their own file (which overrides any batch copy).
    own_files: BTreeSet<MdevUuid>,
    pools: BTreeMap<String, AppliedPool>,
    applying: BTreeMap<String, AppliedPool>,
    vf_slots: BTreeMap<MdevUuid, VfSlotRecord>,
    incoming: BTreeMap<MdevUuid, IncomingRecord>,
    _lock: DirLock,
}

impl StateDir {
    /// Opens (creating if missing, mode 0700) and locks the state directory at `path`, removes
    /// leftovers of interrupted writes, and loads all records, moving unusable files aside.
    pub fn open(path: impl AsRef<Path>) -> Result<(StateDir, LoadReport), StoreError> {
        let root = path.as_ref().to_path_buf();
        ensure_dir(&root)?;
        let lock = lock_dir(&root)?;
        for sub in [
            DEFINITIONS,
            LEDGER,
            POOLS,
            APPLYING,
            VF_SLOTS,
            INCOMING,
            CORRUPT,
        ] {
            ensure_dir(&root.join(sub))?;
        }
        let corrupt = root.join(CORRUPT);
        let mut report = LoadReport::default();
        let mut definitions: BTreeMap<MdevUuid, Definition> = load_dir(
            &root.join(DEFINITIONS),
            &corrupt,
            &mut report,
            Alternate::is_alternate_file,
        )?;
        let mut alternates: BTreeMap<AlternateKey, Alternate> =
            load_dir(&root.join(DEFINITIONS), &corrupt, &mut report, |name| {
                !Alternate::is_alternate_file(name)
            })?;
        settle_alternates(&root.join(DEFINITIONS), &mut definitions, &mut alternates)?;
        let mut ledger: BTreeMap<MdevUuid, LedgerEntry> =
            load_dir(&root.join(LEDGER), &corrupt, &mut report, |name| {
                batch_seq(name).is_some()
            })?;
        // An entry's own file overrides its batch copies; a later batch overrides an earlier one.
        let own_files: BTreeSet<MdevUuid> = ledger.keys().copied().collect();
        let mut batches = Batches::default();
        for (n, entries) in load_batches(&root.join(LEDGER), &corrupt, &mut report)? {
            batches.insert(n, entries.iter().map(|e| e.uuid));
            for e in entries {
                if !own_files.contains(&e.uuid) {
                    ledger.insert(e.uuid, e);
                }
            }
        }
        let pools: BTreeMap<String, AppliedPool> =
            load_dir(&root.join(POOLS), &corrupt, &mut report, |_| false)?;
        let applying: BTreeMap<String, AppliedPool> =
            load_dir(&root.join(APPLYING), &corrupt, &mut report, |_| false)?;
        let vf_slots: BTreeMap<MdevUuid, VfSlotRecord> =
            load_dir(&root.join(VF_SLOTS), &corrupt, &mut report, |_| false)?;
        let incoming: BTreeMap<MdevUuid, IncomingRecord> =
            load_dir(&root.join(INCOMING), &corrupt, &mut report, |_| false)?;
        report.definitions = definitions.len() + alternates.len();
        report.ledger_entries = ledger.len();
        report.pools = pools.len();
        report.vf_slots = vf_slots.len();
        Ok((
            StateDir {
                root,
                definitions,
                alternates,
                ledger,
                batches,
                own_files,
                pools,
                applying,
                vf_slots,
                incoming,
                _lock: lock,
            },
            report,
        ))
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Durably stores (creates or replaces) the main definition of `def.uuid`. An alternate of the
    /// UUID on `def.parent` is superseded by it and removed.
    pub fn put_definition(&mut self, def: &Definition) -> Result<(), StoreError> {
        put(&self.root.join(DEFINITIONS), def)?;
        self.definitions.insert(def.uuid, def.clone());
        let key = AlternateKey {
            uuid: def.uuid,
            parent: def.parent.clone(),
        };
        if self.alternates.contains_key(&key) {
            remove_durable(&self.root.join(DEFINITIONS), &Alternate::file_name(&key))?;
            self.alternates.remove(&key);
        }
        Ok(())
    }

    /// Durably stores the main definitions `defs` (each as [`StateDir::put_definition`] does), with
    /// one `fsync` of the directory for all of them: a pool's new slots, defined together before any
    /// of their devices is made. Each is validated and encoded before anything is written. On a
    /// failure the definitions before it are stored: `Err((k, error))` with `k` stored (all of them
    /// when what failed is the removal of a superseded alternate).
    pub fn put_definitions(&mut self, defs: &[Definition]) -> Result<(), (usize, StoreError)> {
        let dir = self.root.join(DEFINITIONS);
        let texts = defs
            .iter()
            .map(|d| encode(&dir, d))
            .collect::<Result<Vec<String>, StoreError>>()
            .map_err(|e| (0, e))?;
        let files: Vec<NewFile<'_>> = defs
            .iter()
            .zip(&texts)
            .map(|(d, t)| NewFile {
                name: Definition::file_name(d.key()),
                bytes: t.as_bytes(),
                modified: d.modified(),
            })
            .collect();
        let written = write_all_atomic(&dir, &files);
        let stored = match &written {
            Ok(()) => defs.len(),
            Err((k, _)) => *k,
        };
        for d in &defs[..stored] {
            self.definitions.insert(d.uuid, d.clone());
        }
        written?;
        // Alternates superseded by the new main definitions go after them, as in `put_definition`.
        for d in defs {
            let key = AlternateKey {
                uuid: d.uuid,
                parent: d.parent.clone(),
            };
            if self.alternates.contains_key(&key) {
                remove_durable(&dir, &Alternate::file_name(&key)).map_err(|e| (defs.len(), e))?;
                self.alternates.remove(&key);
            }
        }
        Ok(())
    }

    /// Durably deletes the main definition of `uuid`; returns it if there was one. When the UUID has
    /// alternates, the first of them (by parent) becomes its main definition (one atomic replace of
    /// the main file, then the alternate's file is removed: a crash between leaves the same
    /// definition twice, which the next open reads as one).
    pub fn remove_definition(&mut self, uuid: &MdevUuid) -> Result<Option<Definition>, StoreError> {
        let dir = self.root.join(DEFINITIONS);
        let next = self.alternates_of(uuid).next().cloned();
        match next {
            Some(next) if self.definitions.contains_key(uuid) => {
                put(&dir, &next)?;
                let key = AlternateKey {
                    uuid: *uuid,
                    parent: next.parent.clone(),
                };
                remove_durable(&dir, &Alternate::file_name(&key))?;
                self.alternates.remove(&key);
                Ok(self.definitions.insert(*uuid, next))
            }
            // No definition, no file: the load synced the directory, and every file since was
            // written through the store, which would have recorded it.
            _ if !self.definitions.contains_key(uuid) => Ok(None),
            _ => {
                remove_durable(&dir, &Definition::file_name(uuid))?;
                Ok(self.definitions.remove(uuid))
            }
        }
    }

    /// The main definition of `uuid`: the one vgpud acts on.
    pub fn get_definition(&self, uuid: &MdevUuid) -> Option<&Definition> {
        self.definitions.get(uuid)
    }

    /// All main definitions, by UUID.
    pub fn definitions(&self) -> impl ExactSizeIterator<Item = &Definition> + '_ {
        self.definitions.values()
    }

    /// The alternates of `uuid` (its definitions on other parents than the main one), by parent.
    pub fn alternates_of<'a>(
        &'a self,
        uuid: &'a MdevUuid,
    ) -> impl Iterator<Item = &'a Definition> + 'a {
        self.alternates
            .range(
                AlternateKey {
                    uuid: *uuid,
                    parent: String::new(),
                }..,
            )
            .take_while(move |(k, _)| k.uuid == *uuid)
            .map(|(_, a)| a.definition())
    }

    /// Every alternate, by UUID then parent.
    pub fn alternates(&self) -> impl ExactSizeIterator<Item = &Definition> + '_ {
        self.alternates.values().map(Alternate::definition)
    }

    /// The definition of `uuid` on `parent`, main or alternate.
    pub fn definition_on(&self, uuid: &MdevUuid, parent: &str) -> Option<&Definition> {
        match self.definitions.get(uuid) {
            Some(d) if d.parent == parent => Some(d),
            _ => self
                .alternates
                .get(&AlternateKey {
                    uuid: *uuid,
                    parent: parent.to_string(),
                })
                .map(Alternate::definition),
        }
    }

    /// Durably stores (creates or replaces) `def` as an alternate: a definition of a UUID that has its
    /// main definition on another parent.
    pub fn put_alternate(&mut self, def: &Definition) -> Result<(), StoreError> {
        let dir = self.root.join(DEFINITIONS);
        let alt = Alternate::new(def.clone());
        match self.definitions.get(&def.uuid) {
            Some(main) if main.parent != def.parent => {}
            _ => {
                return Err(StoreError::Invalid {
                    path: dir.join(Alternate::file_name(alt.key())),
                    reason: format!(
                        "{} has no main definition on another parent than {} (define it instead)",
                        def.uuid, def.parent
                    ),
                });
            }
        }
        put(&dir, &alt)?;
        self.alternates.insert(alt.key().clone(), alt);
        Ok(())
    }

    /// Durably deletes the alternate of `uuid` on `parent`; returns it if there was one.
    pub fn remove_alternate(
        &mut self,
        uuid: &MdevUuid,
        parent: &str,
    ) -> Result<Option<Definition>, StoreError> {
        let key = AlternateKey {
            uuid: *uuid,
            parent: parent.to_string(),
        };
        remove_durable(&self.root.join(DEFINITIONS), &Alternate::file_name(&key))?;
        Ok(self.alternates.remove(&key).map(|a| a.def_owned()))
    }

    /// Makes the alternate of `uuid` on `parent` its main definition, and the main one an alternate.
    /// Returns whether anything changed (`false`: the main definition is on `parent` already, or
    /// there is no such alternate). Three durable steps — the old main is written as an alternate,
    /// the new one over the main file, its alternate file removed — and after a crash between any
    /// two, both definitions are still there (a definition found twice is read once).
    pub fn select_definition(&mut self, uuid: &MdevUuid, parent: &str) -> Result<bool, StoreError> {
        let key = AlternateKey {
            uuid: *uuid,
            parent: parent.to_string(),
        };
        let (Some(main), Some(chosen)) = (
            self.definitions.get(uuid).cloned(),
            self.alternates.get(&key).map(|a| a.definition().clone()),
        ) else {
            return Ok(false);
        };
        let dir = self.root.join(DEFINITIONS);
        let demoted = Alternate::new(main);
        put(&dir, &demoted)?;
        put(&dir, &chosen)?;
        remove_durable(&dir, &Alternate::file_name(&key))?;
        self.alternates.remove(&key);
        self.alternates.insert(demoted.key().clone(), demoted);
        self.definitions.insert(*uuid, chosen);
        Ok(true)
    }

    /// Durably stores (creates or replaces) a ledger entry. Call *before* creating the device.
    pub fn put_ledger(&mut self, entry: &LedgerEntry) -> Result<(), StoreError> {
        put(&self.root.join(LEDGER), entry)?;
        self.own_files.insert(entry.uuid);
        self.ledger.insert(entry.uuid, entry.clone());
        Ok(())
    }

    /// Durably stores several ledger entries with one flush for all of them (see the module's
    /// *Durability*); a reconcile that creates many devices writes all their entries this way before
    /// creating the first device. On error the in-memory view is unchanged and each file on disk is
    /// in its old or its new state (both safe under the ledger protocol).
    pub fn put_ledgers(&mut self, entries: &[LedgerEntry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let dir = self.root.join(LEDGER);
        let n = self.batches.next_seq();
        let name = batch_name(n);
        let mut seen = BTreeSet::new();
        for e in entries {
            encode(&dir, e)?;
            if !seen.insert(e.uuid) {
                return Err(StoreError::Invalid {
                    path: dir.join(&name),
                    reason: format!("{} appears twice in one batch", e.uuid),
                });
            }
        }
        let text = encode_batch(entries).map_err(|reason| StoreError::Encode {
            path: dir.join(&name),
            reason,
        })?;
        write_atomic(&dir, &name, text.as_bytes())?;
        self.batches.insert(n, entries.iter().map(|e| e.uuid));
        // An older own file would override the new batch copy on the next load. Until it is gone a
        // crash shows the entry as before this batch, which is safe: no device was made yet.
        for e in entries {
            if self.own_files.contains(&e.uuid) {
                remove_durable(&dir, &LedgerEntry::file_name(&e.uuid))?;
                self.own_files.remove(&e.uuid);
            }
        }
        for e in entries {
            self.ledger.insert(e.uuid, e.clone());
        }
        Ok(())
    }

    /// Durably deletes a ledger entry; returns it if there was one. Call only *after* the device is
    /// gone. Batch copies go first: until the entry's own file is gone too, a crash keeps the entry.
    pub fn remove_ledger(&mut self, uuid: &MdevUuid) -> Result<Option<LedgerEntry>, StoreError> {
        let entry = self.ledger.get(uuid).cloned();
        self.remove_ledgers(std::slice::from_ref(uuid))?;
        Ok(entry)
    }

    /// Durably deletes the ledger entries of `uuids` (their devices must be gone) with one rewrite of
    /// each batch that holds any of them and one flush of the directory for their own files: batch
    /// copies first, as a crash in between then keeps the entries. An entry only in batches has no
    /// file of its own to remove (see `remove_definition`). On error the in-memory view keeps every
    /// entry.
    pub fn remove_ledgers(&mut self, uuids: &[MdevUuid]) -> Result<(), StoreError> {
        let dir = self.root.join(LEDGER);
        let going: BTreeSet<MdevUuid> = uuids.iter().copied().collect();
        for (n, keep) in self.batches.without_all(&going) {
            if keep.is_empty() {
                remove_durable(&dir, &batch_name(n))?;
            } else {
                let entries: Vec<LedgerEntry> = keep
                    .iter()
                    .filter_map(|u| self.ledger.get(u).cloned())
                    .collect();
                let text = encode_batch(&entries).map_err(|reason| StoreError::Encode {
                    path: dir.join(batch_name(n)),
                    reason,
                })?;
                write_atomic(&dir, &batch_name(n), text.as_bytes())?;
            }
            for u in &going {
                self.batches.forget(n, u);
            }
        }
        let own: Vec<MdevUuid> = going
            .iter()
            .filter(|u| self.own_files.contains(u))
            .copied()
            .collect();
        let names: Vec<String> = own.iter().map(LedgerEntry::file_name).collect();
        remove_all_durable(&dir, &names)?;
        for u in &going {
            self.own_files.remove(u);
            self.ledger.remove(u);
        }
        Ok(())
    }

    /// Durably deletes the main definitions of `uuids` with one flush of the directory; a UUID with
    /// alternates (whose first alternate becomes its main definition) goes through
    /// [`StateDir::remove_definition`] instead. Returns the definitions removed. On error the
    /// in-memory view still holds the definitions whose removal did not finish; on disk each of their
    /// files is there or gone.
    pub fn remove_definitions(
        &mut self,
        uuids: &[MdevUuid],
    ) -> Result<Vec<Definition>, StoreError> {
        let dir = self.root.join(DEFINITIONS);
        let (plain, with_alternates): (Vec<MdevUuid>, Vec<MdevUuid>) = uuids
            .iter()
            .filter(|u| self.definitions.contains_key(u))
            .partition(|u| self.alternates_of(u).next().is_none());
        let names: Vec<String> = plain.iter().map(Definition::file_name).collect();
        remove_all_durable(&dir, &names)?;
        let mut removed: Vec<Definition> = plain
            .iter()
            .filter_map(|u| self.definitions.remove(u))
            .collect();
        for u in with_alternates {
            removed.extend(self.remove_definition(&u)?);
        }
        Ok(removed)
    }

    /// One ledger entry.
    pub fn get_ledger(&self, uuid: &MdevUuid) -> Option<&LedgerEntry> {
        self.ledger.get(uuid)
    }

    /// All ledger entries, by UUID.
    pub fn ledger(&self) -> impl ExactSizeIterator<Item = &LedgerEntry> + '_ {
        self.ledger.values()
    }

    /// Durably stores (creates or replaces) the record of an applied pool; the file's modification
    /// time becomes its `applied_at`.
    pub fn put_pool(&mut self, pool: &AppliedPool) -> Result<(), StoreError> {
        put(&self.root.join(POOLS), pool)?;
        self.pools.insert(pool.name.clone(), pool.clone());
        Ok(())
    }

    /// Durably deletes the record of applied pool `name`; returns it if there was one.
    pub fn remove_pool(&mut self, name: &str) -> Result<Option<AppliedPool>, StoreError> {
        let Some(key) = AppliedPool::key_of_file_name(&format!("{name}.toml")) else {
            return Ok(None);
        };
        remove_durable(&self.root.join(POOLS), &AppliedPool::file_name(&key))?;
        Ok(self.pools.remove(name))
    }

    /// One applied pool.
    pub fn get_pool(&self, name: &str) -> Option<&AppliedPool> {
        self.pools.get(name)
    }

    /// All applied pools, by name.
    pub fn pools(&self) -> impl ExactSizeIterator<Item = &AppliedPool> + '_ {
        self.pools.values()
    }

    /// Durably records that pool `pool.name` is being applied with `pool.text`. Call before the
    /// apply's first change; [`StateDir::remove_applying`] once it is applied or undone.
    pub fn put_applying(&mut self, pool: &AppliedPool) -> Result<(), StoreError> {
        put(&self.root.join(APPLYING), pool)?;
        self.applying.insert(pool.name.clone(), pool.clone());
        Ok(())
    }

    /// Durably deletes the record of pool `name`'s apply in progress; returns it if there was one.
    pub fn remove_applying(&mut self, name: &str) -> Result<Option<AppliedPool>, StoreError> {
        let Some(key) = AppliedPool::key_of_file_name(&format!("{name}.toml")) else {
            return Ok(None);
        };
        remove_durable(&self.root.join(APPLYING), &AppliedPool::file_name(&key))?;
        Ok(self.applying.remove(name))
    }

    /// The pool applies in progress (left by a shutdown or a crash when the directory was opened),
    /// by name.
    pub fn applying(&self) -> impl ExactSizeIterator<Item = &AppliedPool> + '_ {
        self.applying.values()
    }

    /// The file that holds (or would hold) applied pool `name`, for messages.
    pub fn pool_file(&self, name: &str) -> PathBuf {
        self.root.join(POOLS).join(format!("{name}.toml"))
    }

    /// Durably stores (creates or replaces) a VF slot record. Call *before* touching the VF, and
    /// again once the backend has made the slot.
    pub fn put_vf_slot(&mut self, record: &VfSlotRecord) -> Result<(), StoreError> {
        put(&self.root.join(VF_SLOTS), record)?;
        self.vf_slots.insert(record.uuid, record.clone());
        Ok(())
    }

    /// Durably deletes a VF slot record; returns it if there was one. Call only *after* the VF is
    /// given back.
    pub fn remove_vf_slot(&mut self, uuid: &MdevUuid) -> Result<Option<VfSlotRecord>, StoreError> {
        remove_durable(&self.root.join(VF_SLOTS), &VfSlotRecord::file_name(uuid))?;
        Ok(self.vf_slots.remove(uuid))
    }

    /// One VF slot record.
    pub fn get_vf_slot(&self, uuid: &MdevUuid) -> Option<&VfSlotRecord> {
        self.vf_slots.get(uuid)
    }

    /// All VF slot records, by UUID.
    pub fn vf_slots(&self) -> impl ExactSizeIterator<Item = &VfSlotRecord> + '_ {
        self.vf_slots.values()
    }
}

impl StateDir {
    /// Durably stores (creates or replaces) an incoming instance record. Call *before* creating its
    /// device.
    pub fn put_incoming(&mut self, record: &IncomingRecord) -> Result<(), StoreError> {
        put(&self.root.join(INCOMING), record)?;
        self.incoming.insert(record.uuid, record.clone());
        Ok(())
    }

    /// Durably deletes the incoming record of `uuid`; returns it if there was one. Call after its
    /// device is gone, or once a VM holds it.
    pub fn remove_incoming(
        &mut self,
        uuid: &MdevUuid,
    ) -> Result<Option<IncomingRecord>, StoreError> {
        remove_durable(&self.root.join(INCOMING), &IncomingRecord::file_name(uuid))?;
        Ok(self.incoming.remove(uuid))
    }

    /// The incoming record of `uuid`.
    pub fn get_incoming(&self, uuid: &MdevUuid) -> Option<&IncomingRecord> {
        self.incoming.get(uuid)
    }

    /// Every incoming record, by UUID.
    pub fn incoming(&self) -> impl ExactSizeIterator<Item = &IncomingRecord> + '_ {
        self.incoming.values()
    }
}

/// After loading: an alternate that repeats its UUID's main definition (on the same parent) is a
/// leftover of an interrupted [`StateDir::select_definition`] or [`StateDir::remove_definition`] and
/// is removed; an alternate whose UUID has no main definition (its file was deleted by hand) becomes
/// the main one.
fn settle_alternates(
    dir: &Path,
    definitions: &mut BTreeMap<MdevUuid, Definition>,
    alternates: &mut BTreeMap<AlternateKey, Alternate>,
) -> Result<(), StoreError> {
    let keys: Vec<AlternateKey> = alternates.keys().cloned().collect();
    for key in keys {
        let repeated = match definitions.get(&key.uuid) {
            Some(main) => main.parent == key.parent,
            None => {
                let Some(alt) = alternates.get(&key) else {
                    continue;
                };
                put(dir, alt.definition())?;
                tracing::info!(
                    "state directory: {} has no main definition file; its definition on {} is now the main one",
                    key.uuid,
                    key.parent
                );
                definitions.insert(key.uuid, alt.definition().clone());
                true
            }
        };
        if repeated {
            remove_durable(dir, &Alternate::file_name(&key))?;
            alternates.remove(&key);
        }
    }
    Ok(())
}

/// Validates, encodes and atomically writes a record into `dir`.
fn put<R: Record>(dir: &Path, record: &R) -> Result<(), StoreError> {
    let text = encode(dir, record)?;
    write_atomic_at(
        dir,
        &R::file_name(record.key()),
        text.as_bytes(),
        record.modified(),
    )
}

/// Validates and encodes a record that is to be stored in `dir`.
fn encode<R: Record>(dir: &Path, record: &R) -> Result<String, StoreError> {
    let path = dir.join(R::file_name(record.key()));
    record.validate().map_err(|reason| StoreError::Invalid {
        path: path.clone(),
        reason,
    })?;
    record
        .encode()
        .map_err(|reason| StoreError::Encode { path, reason })
}
