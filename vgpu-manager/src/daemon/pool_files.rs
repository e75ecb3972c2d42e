//! The pool files of the host (`/etc/vgpu-manager/pools.d/*.toml`, [`crate::pool::DEFAULT_DIR`]): vgpud
//! applies each at start and again on `SIGHUP`, so that "this host serves 40 × vdi-2g" written in a file
//! holds after every reboot without a client. Each file goes through the same [`ApplyPool`]
//! as a D-Bus `Apply` (plan, refusal of a shortfall before any change, rollback of a failed step).
//!
//! A file that does not load, or that names a pool an earlier file (in name order) already named, is
//! reported and skipped; the others are still applied. Removing a file does not remove its pool's
//! slots: that takes an explicit `vgpuctl pool apply` of a smaller pool (or `destroy`), never a missing
//! file.

use std::path::{Path, PathBuf};

use super::api::ApplyPool;
use super::engine::Core;
use crate::pool::Pool;
use crate::profile::Catalog;

/// What happened to one pool file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolFileOutcome {
    /// Applied; `changed` is false when it was already in place.
    Applied {
        /// The file.
        file: PathBuf,
        /// The pool.
        pool: String,
        /// Whether anything changed.
        changed: bool,
    },
    /// Not applied, with the reason (a load error naming file, line and field; a duplicate name; the
    /// daemon's refusal).
    Failed {
        /// The file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The `*.toml` files of `dir` in name order; an empty list when `dir` does not exist.
fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    out.sort();
    Ok(out)
}

/// Applies every pool file of `dir` through `core`, in name order. Blocking.
pub fn apply_pool_files(
    core: &Core,
    catalog: &Catalog,
    dir: &Path,
) -> Result<Vec<PoolFileOutcome>, std::io::Error> {
    let mut seen: Vec<(String, PathBuf)> = Vec::new();
    let mut out = Vec::new();
    for file in files(dir)? {
        let failed = |reason: String| PoolFileOutcome::Failed {
            file: file.clone(),
            reason,
        };
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) => {
                out.push(failed(format!("cannot read it: {e}")));
                continue;
            }
        };
        let pool = match Pool::from_toml(&file.display().to_string(), &text, catalog) {
            Ok(p) => p,
            Err(e) => {
                out.push(failed(e.to_string()));
                continue;
            }
        };
        if let Some((_, first)) = seen.iter().find(|(n, _)| *n == pool.name) {
            out.push(failed(format!(
                "pool '{}' is already defined by {}: give each pool file its own name",
                pool.name,
                first.display()
            )));
            continue;
        }
        seen.push((pool.name.clone(), file.clone()));
        out.push(match core.execute(ApplyPool { toml: text }) {
            Ok(summary) => PoolFileOutcome::Applied {
                file: file.clone(),
                pool: pool.name.clone(),
                changed: summary.changed,
            },
            Err(e) => failed(e.to_string()),
        });
    }
    Ok(out)
}
