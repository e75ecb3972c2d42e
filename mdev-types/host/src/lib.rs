//! The one boundary between vgpu-manager and the kernel, and what is built directly on it.
//!
//! Every kernel interaction — reading, writing and listing sysfs, following its links — goes through
//! [`Host`]. Paths are always the kernel's absolute paths (`/sys/bus/mdev/devices/…`); an implementation
//! decides where they really live:
//!
//! * [`SysfsHost`] maps them below a root directory (`/` on a real host, a fixture tree or capture in tests);
//! * the `vgpu-sim` crate's `SimHost` answers from an in-memory kernel model with the kernel's semantics
//!   and errnos.
//!
//! Errors keep the kernel's errno ([`HostError::errno`]) so the layers above can turn `EEXIST` on an mdev
//! `create` into "duplicate UUID" the same way for both implementations.
//!
//! Built on the boundary:
//! * [`discover`] — builds the device model (`mdev_types::model`) from any [`Host`].
//! * [`ops`] — lifecycle operations (mdev create/remove, SR-IOV, driver binding) with typed errors.
//! * [`viability`] — may a device be handed to a guest (IOMMU group members, boot VGA, PF with VFs).
//! * [`uevent`] — the kernel's uevent socket.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fmt;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

pub use nix::errno::Errno;
use thiserror::Error;

pub mod discover;
pub mod ops;
pub mod paths;
mod sysfs;
pub mod uevent;
pub mod viability;

pub use sysfs::SysfsHost;

/// Which kernel interaction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOp {
    /// Reading an attribute.
    Read,
    /// Writing an attribute.
    Write,
    /// Listing a directory.
    List,
    /// Reading a symbolic link.
    ReadLink,
    /// Resolving a path to its canonical form.
    Canonicalize,
}

impl fmt::Display for HostOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostOp::Read => "reading",
            HostOp::Write => "writing",
            HostOp::List => "listing",
            HostOp::ReadLink => "reading link",
            HostOp::Canonicalize => "resolving",
        })
    }
}

/// A failed kernel interaction: the operation, the kernel path and the errno the kernel returned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct HostError {
    /// What was attempted.
    pub op: HostOp,
    /// The kernel path (as the kernel names it, not below any root).
    pub path: PathBuf,
    /// The value written, for [`HostOp::Write`].
    pub value: Option<String>,
    /// The errno the kernel (or the simulated kernel) returned; `EIO` for a [short write](Self::unwritten),
    /// where `write(2)` itself reported none.
    pub errno: Errno,
    /// Set when `write(2)` returned fewer bytes than the value has: how many it left unwritten (the kernel
    /// stored only part of the value). [`HostError::short_write`] gives both counts.
    pub unwritten: Option<NonZeroUsize>,
}

/// A `write(2)` that returned a count short of the value's length. A sysfs attribute's `store()` sees one
/// buffer per `write(2)`, so the remainder is not written again: the write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortWrite {
    /// The count `write(2)` returned.
    pub written: usize,
    /// The value's length in bytes, which a complete write returns.
    pub expected: usize,
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} failed: ", self.op, self.path.display())?;
        match self.short_write() {
            Some(s) => write!(
                f,
                "the kernel took {} of {} bytes (a sysfs attribute takes its value in one write)",
                s.written, s.expected
            )?,
            None => write!(f, "{}", self.errno)?,
        }
        if let Some(v) = &self.value {
            write!(f, " (value {v:?})")?;
        }
        Ok(())
    }
}

impl HostError {
    /// Builds an error for `op` on `path`.
    pub fn new(op: HostOp, path: impl Into<PathBuf>, errno: Errno) -> Self {
        Self {
            op,
            path: path.into(),
            value: None,
            errno,
            unwritten: None,
        }
    }

    /// Builds an error for writing `value` to `path`.
    pub fn write(path: impl Into<PathBuf>, value: &str, errno: Errno) -> Self {
        Self {
            op: HostOp::Write,
            path: path.into(),
            value: Some(value.to_string()),
            errno,
            unwritten: None,
        }
    }

    /// Builds the error for a `write(2)` of `value` to `path` that returned `written`, fewer bytes than
    /// the value has (errno `EIO`).
    pub fn write_cut_short(path: impl Into<PathBuf>, value: &str, written: usize) -> Self {
        Self {
            unwritten: NonZeroUsize::new(value.len().saturating_sub(written)),
            ..Self::write(path, value, Errno::EIO)
        }
    }

    /// For a write the kernel took only in part: the count `write(2)` returned and the value's length.
    pub fn short_write(&self) -> Option<ShortWrite> {
        let unwritten = self.unwritten?.get();
        let expected = self.value.as_ref().map_or(unwritten, String::len);
        Some(ShortWrite {
            written: expected.saturating_sub(unwritten),
            expected,
        })
    }

    /// True when the path does not exist (`ENOENT`).
    pub fn is_not_found(&self) -> bool {
        self.errno == Errno::ENOENT
    }
}

/// The kernel interface vgpu-manager uses: sysfs reads, writes, listings and links.
///
/// Implementations must behave like the kernel: a missing path is `ENOENT`, listing a file is `ENOTDIR`,
/// writing a read-only attribute is `EACCES`, and writes to control attributes have their side effects
/// before returning.
pub trait Host: Send + Sync + fmt::Debug {
    /// Reads a file's whole contents as text (sysfs attributes end in a newline; callers trim).
    fn read(&self, path: &Path) -> Result<String, HostError>;

    /// Writes `value` to an attribute in one `write(2)`, as `echo -n value > path` would.
    fn write(&self, path: &Path, value: &str) -> Result<(), HostError>;

    /// Lists a directory's entry names, sorted.
    fn list(&self, path: &Path) -> Result<Vec<String>, HostError>;

    /// Reads a symbolic link's target as stored (often relative, like `../../../bus/pci/drivers/nvidia`).
    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError>;

    /// Resolves every symbolic link in `path`, returning the kernel's canonical path.
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError>;

    /// True if `path` exists (following links).
    fn exists(&self, path: &Path) -> bool {
        self.canonicalize(path).is_ok()
    }

    /// One line naming this host for logs and reports, e.g. `sysfs at /` or `simulated host 'demo'`.
    fn describe(&self) -> String;

    /// A stream of kernel uevents (devices and parents coming and going), or `None` when this host cannot
    /// report them (e.g. a static fixture tree). The stream ends when the host is dropped.
    fn subscribe(&self) -> Option<std::sync::mpsc::Receiver<uevent::Uevent>> {
        None
    }
}

/// Convenience reads layered on [`Host`]; every method returns the kernel's errno unchanged.
pub trait HostExt: Host {
    /// Reads an attribute and trims surrounding whitespace.
    fn read_trimmed(&self, path: &Path) -> Result<String, HostError> {
        self.read(path).map(|s| s.trim().to_string())
    }

    /// Reads an attribute, or `None` when it does not exist.
    fn read_optional(&self, path: &Path) -> Result<Option<String>, HostError> {
        match self.read(path) {
            Ok(s) => Ok(Some(s.trim().to_string())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Lists a directory, or an empty list when it does not exist.
    fn list_optional(&self, path: &Path) -> Result<Vec<String>, HostError> {
        match self.list(path) {
            Ok(v) => Ok(v),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The last component of a link's target (e.g. the driver name behind `driver`), or `None` when the
    /// link does not exist.
    fn link_name(&self, path: &Path) -> Result<Option<String>, HostError> {
        match self.read_link(path) {
            Ok(t) => Ok(t.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl<H: Host + ?Sized> HostExt for H {}
