//! Pools: declarative sets of vGPU slots ("this host serves 40 × vdi-2g and 4 × workstation-4g").
//!
//! * [`spec`] — the TOML format ([`Pool`]), validated with file:line:field errors.
//! * [`identity`] — stable slot UUIDs ([`SlotId`]): UUIDv5 of pool, profile and index.
//! * [`plan`] — [`plan_pool`]: the steps (remove, enable VFs, create) that make the host match a
//!   pool, placed by [`crate::placement`]; a fully applied pool plans nothing.
//!
//! Loading: [`load_dir`] (default [`DEFAULT_DIR`]), [`load_file`], [`Pool::from_toml`] for text
//! (e.g. received over D-Bus).
//!
//! ```no_run
//! # fn demo(inv: &mdev_types::model::Inventory) -> Result<(), Box<dyn std::error::Error>> {
//! use vgpu_manager::pool::{Pool, plan_pool};
//! use vgpu_manager::profile::Catalog;
//! let catalog = Catalog::builtin()?;
//! let pool = Pool::from_toml("dbus", "name = \"vdi\"\n[profiles]\nvdi-2g = 4\n", &catalog)?;
//! let plan = plan_pool(&pool, &catalog, inv, &[])?;
//! for step in &plan.steps { /* execute in order, roll back on failure */ }
//! # Ok(()) }
//! ```

use std::path::Path;

pub mod error;
pub mod identity;
pub mod plan;
pub mod spec;

#[cfg(test)]
mod tests;

pub use error::{PoolError, PoolErrors};
pub use identity::SlotId;
pub use plan::{GpuLoad, HeldSlot, Kept, PoolPlan, PoolShortfall, PoolStep, plan_pool};
pub use spec::{MAX_SLOTS, Pool, Selector};

use crate::profile::Catalog;
use crate::toml_file;

/// Where the daemon reads pool files.
pub const DEFAULT_DIR: &str = "/etc/vgpu-manager/pools.d";

/// One pool file.
pub fn load_file(path: &Path, catalog: &Catalog) -> Result<Pool, PoolError> {
    let text = toml_file::read::<PoolError>(path)?;
    Pool::from_toml(&path.display().to_string(), &text, catalog)
}

/// Every `*.toml` file in `dir` (not recursing), in name order; all files are checked before failing.
/// Pool names must be unique.
pub fn load_dir(dir: &Path, catalog: &Catalog) -> Result<Vec<Pool>, PoolErrors> {
    let files = toml_file::list(dir).map_err(|e| PoolErrors(vec![e]))?;
    let mut pools: Vec<Pool> = Vec::new();
    let mut errors = Vec::new();
    for f in &files {
        match load_file(f, catalog) {
            Ok(p) => match pools.iter().find(|q| q.name == p.name) {
                Some(first) => errors.push(PoolError::Duplicate {
                    origin: p.origin.clone(),
                    name: p.name.clone(),
                    first: first.origin.clone(),
                }),
                None => pools.push(p),
            },
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(pools)
    } else {
        Err(PoolErrors(errors))
    }
}
