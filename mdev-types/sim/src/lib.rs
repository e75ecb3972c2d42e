//! [`SimHost`]: an in-memory Linux kernel with the kernel's sysfs semantics, not a recorder.
//!
//! A simulated host is described in TOML ([`SimSpec`]; the shipped ones are in `mdev-types/sims/` and
//! embedded: [`SimHost::builtin_names`]). From the description the simulator keeps typed kernel state
//! (PCI functions, drivers, SR-IOV, mdev parents and instances, IOMMU groups, NVIDIA vendor-VFIO and
//! Intel xe `sriov_admin` state) and renders the sysfs tree from it. Writes reach the same store
//! handlers the kernel has — `create`, `remove`, `sriov_numvfs`, `bind`, `unbind`, `driver_override`,
//! `drivers_probe`, `current_vgpu_type`, … — which check their input in the kernel's order and fail with
//! the kernel's errno; each handler names its kernel source function.
//!
//! ```
//! use std::path::Path;
//! use vgpu_host::Host;
//! use vgpu_sim::SimHost;
//!
//! let host = SimHost::builtin("samples").unwrap();
//! let ty = Path::new("/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-medium");
//! assert_eq!(host.read(&ty.join("available_instances")).unwrap(), "16\n");
//! host.write(&ty.join("create"), "4b20d080-1b54-4048-85b3-a6a62d165c01").unwrap();
//! assert_eq!(host.read(&ty.join("available_instances")).unwrap(), "15\n");
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fmt;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::errno::Errno;

use vgpu_host::uevent::Uevent;
use vgpu_host::{Host, HostError, HostOp};

mod attr;
mod build;
mod error;
mod events;
mod i915_iov;
mod journal;
mod kstr;
mod locate;
mod materialize;
mod mdev;
mod model;
mod modules;
mod nvidia;
mod pci;
mod render;
mod spec;
mod sriov;
mod vfs;
mod xe;

#[cfg(test)]
mod tests;

pub use error::SimError;
pub use i915_iov::I915IovSpec;
pub use modules::ModuleSpec;
pub use spec::{
    CountingSpec, DriverKindSpec, DriverSpec, ErrnoName, HostSpec, MdevParentSpec, MdevSpec,
    MdevTypeSpec, NvidiaVfioSpec, PciSpec, SimSpec, SriovSpec, VfIommuSpec, VgpuSpec, VgpuTypeSpec,
    XeSriovSpec,
};

use attr::Attr;
use model::Model;
use vfs::{Node, Vfs};

/// The shipped host descriptions, embedded.
const BUILTINS: &[(&str, &str)] = &[
    ("ampere", include_str!("../../sims/ampere.toml")),
    ("demo", include_str!("../../sims/demo.toml")),
    ("samples", include_str!("../../sims/samples.toml")),
    ("vendors", include_str!("../../sims/vendors.toml")),
];

/// Builtin names, in [`BUILTINS`] order.
const BUILTIN_NAMES: &[&str] = &["ampere", "demo", "samples", "vendors"];

/// Kernel state plus the tree rendered from it (re-rendered lazily after each write).
struct Inner {
    model: Model,
    tree: Option<Vfs>,
    /// Receivers of uevents ([`Host::subscribe`]); dropped receivers are pruned on the next event.
    subscribers: Vec<Sender<Uevent>>,
    /// Where changes are recorded ([`SimHost::with_journal`]).
    journal: Option<File>,
    /// The last rendered tree after a change made it stale; replaying a journal resolves paths in it
    /// when it can, to avoid a full re-render per entry.
    stale: Option<Vfs>,
    /// Every change since `stale` was rendered only added nodes to the tree (or changed contents), so
    /// a writable attribute found in `stale` is still at that path in the current tree.
    stale_additive: bool,
}

impl Inner {
    /// Applies one change: runs it, then journals it and broadcasts the uevents it caused.
    fn change(
        &mut self,
        entry: journal::Entry,
        additive: bool,
        f: impl FnOnce(&mut Model) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        let before = (!self.subscribers.is_empty()).then(|| events::snapshot(&self.model));
        let result = f(&mut self.model);
        if let Some(t) = self.tree.take() {
            self.stale = Some(t);
            self.stale_additive = additive;
        } else {
            self.stale_additive &= additive;
        }
        result?;
        if let Some(file) = &mut self.journal {
            // The change happened; a journal that cannot record it would silently lose it on restart.
            journal::append(file, &entry).map_err(|_| Errno::EIO)?;
        }
        if let Some(before) = before {
            let evs = events::diff(&before, &events::snapshot(&self.model));
            self.subscribers
                .retain(|tx| evs.iter().all(|ev| tx.send(ev.clone()).is_ok()));
        }
        Ok(())
    }

    fn set_module(&mut self, module: &str, load: bool) -> Result<(), Errno> {
        let entry = if load {
            journal::Entry::Load {
                module: module.to_string(),
            }
        } else {
            journal::Entry::Unload {
                module: module.to_string(),
            }
        };
        self.change(entry, false, |m| set_module(m, module, load))
    }

    /// Re-applies a journalled write. The entry succeeded once on this same sequence of states, so a
    /// writable attribute found at its path in the last rendered (possibly stale) tree names the same
    /// kernel object: attributes are keyed by stable identities (addresses, UUIDs, parent/type indices).
    fn reapply(&mut self, path: &Path, value: &str) -> Result<(), Errno> {
        let known = self
            .tree
            .as_ref()
            .or(self.stale.as_ref())
            .and_then(|t| match t.node(path) {
                Ok((_, Node::File(f))) if f.mode.writable() => f.attr.clone(),
                _ => None,
            });
        match known {
            Some(attr) => {
                let entry = journal::Entry::Write {
                    path: path.to_string_lossy().into_owned(),
                    value: value.to_string(),
                };
                let additive = only_adds_nodes(&attr);
                self.change(entry, additive, |m| store(m, &attr, value))
            }
            None => self.apply(path, value),
        }
    }

    fn apply(&mut self, path: &Path, value: &str) -> Result<(), Errno> {
        let attr = match self.live_in_stale(path) {
            Some(attr) => attr,
            None => self.resolve_writable(path)?,
        };
        let entry = journal::Entry::Write {
            path: path.to_string_lossy().into_owned(),
            value: value.to_string(),
        };
        let additive = only_adds_nodes(&attr);
        self.change(entry, additive, |m| store(m, &attr, value))
    }

    /// The attribute at `path` when the stale tree still shows the current one there: every
    /// change since it was rendered only added nodes (typically a run of mdev creates), so a
    /// writable attribute in it is still at that path, with the same stable identity. Spares a
    /// full re-render per write in long runs of creates (a host reboot's reconcile).
    fn live_in_stale(&self, path: &Path) -> Option<Attr> {
        if self.tree.is_some() || !self.stale_additive {
            return None;
        }
        match self.stale.as_ref()?.node(path) {
            Ok((_, Node::File(f))) if f.mode.writable() => f.attr.clone(),
            _ => None,
        }
    }

    /// The writable attribute at `path` in the current tree, or the errno a write there gets.
    fn resolve_writable(&mut self, path: &Path) -> Result<Attr, Errno> {
        let attr = match self.tree().node(path)?.1 {
            Node::Dir(_) => return Err(Errno::EISDIR),
            Node::File(f) if !f.mode.writable() => return Err(Errno::EACCES),
            Node::File(f) => f.attr.clone(),
            Node::Link(_) => return Err(Errno::ENOENT),
        };
        attr.ok_or(Errno::EACCES)
    }
}

/// Whether a successful write to `attr` can only add nodes to the tree (and change contents), never
/// remove or re-mode one. True for an mdev create: the new device, its links and its group appear,
/// other types' `available_instances` change (even to 0 under NVIDIA's homogeneous rule), and every
/// `create` attribute stays (mdev_core.c: types live as long as their parent's registration).
fn only_adds_nodes(attr: &Attr) -> bool {
    matches!(attr, Attr::MdevCreate { .. })
}

/// `modprobe`/`rmmod` of the module behind virtual parents of class `module`: unknown → ENOENT; unloading
/// while instances exist → EBUSY (the module is in use: kernel/module/main.c delete_module).
fn set_module(model: &mut Model, module: &str, load: bool) -> Result<(), Errno> {
    let parents: Vec<usize> = model
        .parents
        .iter()
        .enumerate()
        .filter(
            |(_, p)| matches!(&p.loc, model::ParentLoc::Virtual { class, .. } if class == module),
        )
        .map(|(i, _)| i)
        .collect();
    if parents.is_empty() {
        return Err(Errno::ENOENT);
    }
    if !load && model.mdevs.values().any(|m| parents.contains(&m.parent)) {
        return Err(Errno::EBUSY);
    }
    for i in parents {
        if let Some(model::ParentLoc::Virtual { loaded, .. }) =
            model.parents.get_mut(i).map(|p| &mut p.loc)
        {
            *loaded = load;
        }
    }
    Ok(())
}

impl Inner {
    fn tree(&mut self) -> &Vfs {
        if self.tree.is_none() {
            // The fresh tree supersedes the stale one: keep one copy of the tree, not two.
            self.stale = None;
        }
        self.tree.get_or_insert_with(|| render::render(&self.model))
    }
}

/// An in-memory kernel implementing [`Host`] with the kernel's semantics and errnos.
///
/// Cheap to clone: clones share one kernel (like two processes on one machine). `Send + Sync`; every
/// operation is atomic with respect to the others.
#[derive(Clone)]
pub struct SimHost {
    name: Arc<str>,
    inner: Arc<Mutex<Inner>>,
}

impl fmt::Debug for SimHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimHost").field("name", &self.name).finish()
    }
}

impl SimHost {
    fn from_model(model: Model) -> Self {
        Self {
            name: Arc::from(model.name.as_str()),
            inner: Arc::new(Mutex::new(Inner {
                model,
                tree: None,
                stale: None,
                stale_additive: false,
                subscribers: Vec::new(),
                journal: None,
            })),
        }
    }

    /// A host from a parsed description (named `spec`; errors carry schema paths but no lines).
    pub fn from_spec(spec: SimSpec) -> Result<SimHost, SimError> {
        build::build("spec", "<spec>", None, &spec).map(Self::from_model)
    }

    /// A host from TOML text; `name` names the host and the file in errors (`demo`, `lab.toml`).
    pub fn from_toml(name: &str, text: &str) -> Result<SimHost, SimError> {
        let host_name = Path::new(name)
            .file_stem()
            .map_or(name.to_string(), |s| s.to_string_lossy().into_owned());
        let spec = SimSpec::from_toml(name, text)?;
        build::build(&host_name, name, Some(text), &spec).map(Self::from_model)
    }

    /// A shipped host by name ([`SimHost::builtin_names`]).
    pub fn builtin(name: &str) -> Result<SimHost, SimError> {
        let (_, text) =
            BUILTINS
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| SimError::UnknownBuiltin {
                    name: name.to_string(),
                    known: BUILTIN_NAMES.join(", "),
                })?;
        let spec = SimSpec::from_toml(&format!("sims/{name}.toml"), text)?;
        build::build(name, &format!("sims/{name}.toml"), Some(text), &spec).map(Self::from_model)
    }

    /// The names of the shipped hosts.
    pub fn builtin_names() -> &'static [&'static str] {
        BUILTIN_NAMES
    }

    /// A builtin host name, or a path to a TOML description.
    pub fn load(path_or_name: &str) -> Result<SimHost, SimError> {
        if BUILTIN_NAMES.contains(&path_or_name) {
            return Self::builtin(path_or_name);
        }
        let path = Path::new(path_or_name);
        let looks_like_path = path_or_name.contains('/') || path_or_name.ends_with(".toml");
        match std::fs::read_to_string(path) {
            Ok(text) => Self::from_toml(path_or_name, &text),
            Err(e) if looks_like_path || e.kind() != io::ErrorKind::NotFound => Err(SimError::Io {
                path: path.to_path_buf(),
                source: e,
            }),
            Err(_) => Err(SimError::UnknownBuiltin {
                name: path_or_name.to_string(),
                known: BUILTIN_NAMES.join(", "),
            }),
        }
    }

    /// Keeps the simulated kernel's state in a journal file, so it outlives the process (as a real
    /// kernel outlives the daemon): replays the journal's changes on top of the description, then records
    /// every further change. Errors name the journal and the change that no longer applies.
    pub fn with_journal(self, path: &Path) -> Result<SimHost, SimError> {
        let io_err = |source: io::Error| SimError::Io {
            path: path.to_path_buf(),
            source,
        };
        let entries = self.replay(path)?;
        {
            let mut inner = self.lock();
            let alive = |u: &str| u.parse().is_ok_and(|u| inner.model.mdevs.contains_key(&u));
            let compacted = journal::compact(entries.clone(), &alive);
            if compacted.len() < entries.len() {
                journal::rewrite(path, &compacted).map_err(io_err)?;
            }
            inner.journal = Some(journal::open(path).map_err(io_err)?);
        }
        Ok(self)
    }

    /// The state a journal describes, without recording anything further (for looking at the simulated
    /// kernel of a running process: only that process may write the journal).
    pub fn replayed(self, path: &Path) -> Result<SimHost, SimError> {
        self.replay(path)?;
        Ok(self)
    }

    /// Applies a journal's changes; returns them.
    fn replay(&self, path: &Path) -> Result<Vec<journal::Entry>, SimError> {
        let io_err = |source: io::Error| SimError::Io {
            path: path.to_path_buf(),
            source,
        };
        let entries = journal::read(path).map_err(io_err)?;
        {
            let mut inner = self.lock();
            for (n, entry) in entries.iter().enumerate() {
                let result = match &entry {
                    journal::Entry::Write { path: p, value } => inner.reapply(Path::new(p), value),
                    journal::Entry::Load { module } => inner.set_module(module, true),
                    journal::Entry::Unload { module } => inner.set_module(module, false),
                };
                if let Err(errno) = result {
                    return Err(io_err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "change {} ({entry:?}) does not apply to this host ({errno}): the journal belongs to another description; remove it to start fresh",
                            n + 1
                        ),
                    )));
                }
            }
        }
        Ok(entries)
    }

    /// Loads the module that registers the virtual parents of class `module` (like `modprobe`): they
    /// appear under `/sys/class/mdev_bus` and subscribers get the kernel's uevents.
    pub fn load_module(&self, module: &str) -> Result<(), Errno> {
        self.lock().set_module(module, true)
    }

    /// Unloads it again (like `rmmod`); `EBUSY` while instances exist.
    pub fn unload_module(&self, module: &str) -> Result<(), Errno> {
        self.lock().set_module(module, false)
    }

    /// The host's name (`demo`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Writes the current simulated tree as a real directory tree below `dir` (files with sysfs modes,
    /// directories, relative symbolic links), so `SysfsHost::new(dir)` reads the same values and links.
    pub fn materialize(&self, dir: &Path) -> io::Result<()> {
        let mut inner = self.lock();
        materialize::materialize(inner.tree(), dir)
    }

    /// The kernel state, even if another thread panicked while holding it (every handler leaves the
    /// state consistent before it can panic, so the data is still valid).
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Dispatches a write to the store handler behind `attr`.
fn store(model: &mut Model, attr: &Attr, value: &str) -> Result<(), Errno> {
    match attr {
        Attr::DriverOverride(a) => pci::set_driver_override(model, a, value),
        Attr::NumaNode(a) => pci::set_numa_node(model, a, value),
        Attr::SriovNumvfs(a) => sriov::store_numvfs(model, a, value),
        Attr::SriovAutoprobe(a) => sriov::store_autoprobe(model, a, value),
        Attr::Bind(d) => pci::bind(model, d, value),
        Attr::Unbind(d) => pci::unbind(model, d, value),
        Attr::NewId(d) => pci::new_id(model, d, value),
        Attr::RemoveId(d) => pci::remove_id(model, d, value),
        Attr::DriversProbe => pci::drivers_probe(model, value),
        Attr::MdevCreate { parent, ty } => mdev::create(model, *parent, *ty, value),
        Attr::MdevRemove(u) => mdev::store_remove(model, u, value),
        Attr::NvidiaCurrentType(vf) => nvidia::store_current(model, vf, value),
        Attr::NvidiaVgpuParams(vf) => nvidia::store_params(model, vf, value),
        Attr::XeProfile { pf, func, knob } => xe::store_profile(model, pf, *func, *knob, value),
        Attr::XeBulk { pf, knob } => xe::store_bulk(model, pf, *knob, value),
        Attr::XeStop { pf, vf } => xe::store_stop(model, pf, *vf, value),
        Attr::I915Iov { pf, func, knob } => i915_iov::store(model, pf, *func, *knob, value),
    }
}

impl Host for SimHost {
    fn read(&self, path: &Path) -> Result<String, HostError> {
        let mut inner = self.lock();
        let err = |e| HostError::new(HostOp::Read, path, e);
        match inner.tree().node(path).map_err(err)?.1 {
            Node::Dir(_) => Err(err(Errno::EISDIR)),
            Node::File(f) if !f.mode.readable() => Err(err(Errno::EACCES)),
            Node::File(f) => Ok(f.content.clone()),
            // node() follows links; a dangling one is ENOENT there.
            Node::Link(_) => Err(err(Errno::ENOENT)),
        }
    }

    fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
        self.lock()
            .apply(path, value)
            .map_err(|e| HostError::write(path, value, e))
    }

    fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
        let mut inner = self.lock();
        inner
            .tree()
            .list(path)
            .map_err(|e| HostError::new(HostOp::List, path, e))
    }

    fn read_link(&self, path: &Path) -> Result<std::path::PathBuf, HostError> {
        let mut inner = self.lock();
        inner
            .tree()
            .read_link(path)
            .map(std::path::PathBuf::from)
            .map_err(|e| HostError::new(HostOp::ReadLink, path, e))
    }

    fn canonicalize(&self, path: &Path) -> Result<std::path::PathBuf, HostError> {
        let mut inner = self.lock();
        inner
            .tree()
            .canonicalize(path)
            .map_err(|e| HostError::new(HostOp::Canonicalize, path, e))
    }

    fn describe(&self) -> String {
        format!("simulated host '{}'", self.name)
    }

    /// Every later change broadcasts the uevents the kernel would send.
    fn subscribe(&self) -> Option<Receiver<Uevent>> {
        let (tx, rx) = channel();
        self.lock().subscribers.push(tx);
        Some(rx)
    }
}
