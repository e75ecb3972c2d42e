//! Which pools vgpud has applied, and the slot rows of status and apply reports.
//!
//! A pool that applied is kept as `<state dir>/pools/<name>.toml`, the exact text it was applied with
//! (so it reads back as the same pool), written atomically (temporary file, `fsync`, `rename`, `fsync`
//! of the directory). Its slots' instances are ordinary definitions in the state directory; this file
//! only says which pools exist, for [`GetPoolStatus`](crate::daemon::api::GetPoolStatus).
//! A file that no longer parses (e.g. a profile removed since) is reported in the log and skipped.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use mdev_types::model::Inventory;
use tracing::warn;

use super::{Core, lock};
use crate::client::{PoolGpu, PoolStatus, SlotRow};
use crate::daemon::api::CoreError;
use crate::daemon::store::{StoreError, StoreOp};
use crate::pool::{Pool, SlotId};

/// Subdirectory of the state directory with applied pools.
const POOLS: &str = "pools";

fn store_error(what: &str, path: &Path, e: std::io::Error) -> CoreError {
    let op = match what {
        "create" => StoreOp::CreateDir,
        "list" => StoreOp::ListDir,
        "sync" => StoreOp::Sync,
        "rename into" => StoreOp::Rename,
        "remove" => StoreOp::Remove,
        _ => StoreOp::Write,
    };
    StoreError::io(op, path, e).into()
}

/// Writes `bytes` to `dir/name` atomically and durably.
pub(super) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CoreError> {
    fs::create_dir_all(dir).map_err(|e| store_error("create", dir, e))?;
    let tmp = dir.join(format!(".tmp.{name}"));
    let target = dir.join(name);
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(|e| store_error("write", &tmp, e))?;
    fs::rename(&tmp, &target).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        store_error("rename into", &target, e)
    })?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| store_error("sync", dir, e))
}

/// The `*.toml` files of `dir` in name order, without the temporary files of [`write_atomic`]
/// (`.tmp.*`); none when `dir` does not exist.
pub(super) fn toml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "toml")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    files.sort();
    Ok(files)
}

impl Core {
    fn pools_dir(&self) -> PathBuf {
        lock(&self.store).path().join(POOLS)
    }

    /// Records that `pool` was applied with `text`.
    pub(super) fn record_pool(&self, pool: &Pool, text: &str) -> Result<(), CoreError> {
        write_atomic(
            &self.pools_dir(),
            &format!("{}.toml", pool.name),
            text.as_bytes(),
        )
    }

    /// Whether pool `name` is applied with `autostart` (false when it is not applied or its file no
    /// longer loads).
    pub(super) fn pool_autostart(&self, name: &str) -> bool {
        let path = self.pools_dir().join(format!("{name}.toml"));
        path.exists() && crate::pool::load_file(&path, &self.catalog).is_ok_and(|p| p.autostart)
    }

    /// Every slot of `pool` with its instance (if any), and the slots per GPU.
    pub(super) fn slot_rows(&self, pool: &Pool, inv: &Inventory) -> (Vec<SlotRow>, Vec<PoolGpu>) {
        let vf_records = self.vf_records();
        let views = lock(&self.views);
        let mut rows = Vec::new();
        let mut gpus: Vec<PoolGpu> = Vec::new();
        for (profile, n) in &pool.profiles {
            for index in 0..*n {
                let slot = SlotId::new(&pool.name, profile, index);
                let view = views.get(&slot.uuid);
                let vf = vf_records.iter().find(|r| r.uuid == slot.uuid);
                let gpu = view
                    .map(|v| v.gpu.clone())
                    .or_else(|| vf.map(|r| r.gpu.clone()));
                let found = gpu
                    .as_deref()
                    .and_then(|g| inv.gpus.iter().find(|x| x.id == g));
                if let (true, Some(g)) = (view.is_some() || vf.is_some(), found) {
                    let entry = match gpus.iter_mut().find(|x| x.gpu == g.id) {
                        Some(e) => e,
                        None => {
                            gpus.push(PoolGpu {
                                gpu: g.id.clone(),
                                model: g.model.clone(),
                                numa_node: g.numa_node,
                                profiles: BTreeMap::new(),
                            });
                            let last = gpus.len() - 1;
                            &mut gpus[last]
                        }
                    };
                    *entry.profiles.entry(profile.clone()).or_default() += 1;
                }
                rows.push(SlotRow {
                    profile: profile.clone(),
                    index,
                    uuid: slot.uuid.to_string(),
                    gpu,
                    numa_node: found.and_then(|g| g.numa_node),
                    type_id: view
                        .map(|v| v.type_id.to_string())
                        .or_else(|| vf.map(|r| r.holds_text())),
                    state: match (view, vf) {
                        (Some(v), _) => v.state.as_str(),
                        (None, Some(r)) if self.vf_slot_running(r) => "running",
                        (None, Some(_)) => "stopped",
                        (None, None) => "missing",
                    }
                    .into(),
                    vf: vf.map(|r| r.vf.to_string()),
                });
            }
        }
        gpus.sort_by(|a, b| a.gpu.cmp(&b.gpu));
        (rows, gpus)
    }

    /// [`GetPoolStatus`](crate::daemon::api::GetPoolStatus).
    pub(super) fn pool_status(&self) -> Result<Vec<PoolStatus>, CoreError> {
        let dir = self.pools_dir();
        let files = toml_files(&dir).map_err(|e| store_error("list", &dir, e))?;
        let inv = mdev_types::discover::discover(self.host.as_ref())?;
        let mut out = Vec::new();
        for f in files {
            let pool = match crate::pool::load_file(&f, &self.catalog) {
                Ok(p) => p,
                Err(e) => {
                    warn!(file = %f.display(), error = %e, "applied pool no longer loads; skipped in status");
                    continue;
                }
            };
            let applied_at = fs::metadata(&f)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            let (slots, gpus) = self.slot_rows(&pool, &inv);
            out.push(PoolStatus {
                in_sync: slots.iter().all(|s| s.state == "running"),
                pool: pool.name,
                description: pool.description,
                policy: pool.policy.as_str().to_string(),
                autostart: pool.autostart,
                applied_at,
                wanted: pool.profiles,
                slots,
                gpus,
            });
        }
        Ok(out)
    }
}
