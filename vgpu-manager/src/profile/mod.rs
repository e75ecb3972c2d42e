//! vGPU profiles: what a tenant needs, vendor-neutral, and matching that against a discovered host.
//!
//! * [`spec`] — the TOML format and its validation ([`Profile`]).
//! * [`catalog`] — the shipped set ([`Catalog::builtin`]), directories and single files.
//! * [`matching`] — [`match_profile`]: per GPU the best option or the reasons it cannot serve.
//! * [`offers`] — [`host_offers`](offers::host_offers): what each GPU gives each profile when it has room.
//! * [`options`] — the concrete options a GPU offers ([`MatchOption`], [`ProfileTarget`]).
//! * [`facts`] — per-device facts sysfs does not print (memory, graphics engine), with sources.
//! * [`reason`] — why an option cannot serve ([`Reason`], [`Refusal`]).
//!
//! ```no_run
//! use vgpu_manager::profile::{Catalog, match_profile};
//! # fn demo(inv: &mdev_types::model::Inventory) -> Result<(), Box<dyn std::error::Error>> {
//! let catalog = Catalog::builtin()?;
//! let profile = catalog.resolve("vdi-2g")?;
//! let report = match_profile(&profile, inv);
//! for gpu in &report.gpus {
//!     match &gpu.best {
//!         Some(option) => println!("{}: {}", gpu.gpu, option.target),
//!         None => println!("{}: cannot serve: {}", gpu.gpu, gpu.why_not().unwrap_or_default()),
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod catalog;
pub mod error;
pub mod facts;
pub mod matching;
pub mod offers;
pub mod options;
pub mod reason;
pub mod spec;

#[cfg(test)]
mod tests;

pub use catalog::{Catalog, check_files};
pub use error::{ProfileError, ProfileErrors};
pub use matching::{GpuMatch, MatchReport, match_profile};
pub use options::{MatchOption, ProfileTarget};
pub use reason::{Reason, Refusal};
pub use spec::{Delivery, Priority, Profile, WorkloadClass};
