//! mdevctl's definition files: `/etc/mdevctl.d/<parent>/<uuid>`, one JSON configuration each
//! (mdevctl(8) "CONFIGURATION FILE FORMAT"; mdevctl src/environment.rs: `config_base` is `etc/mdevctl.d`,
//! `scripts.d` below it holds call-out scripts, files whose name is not a UUID are skipped).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use mdev_types::ids::MdevUuid;

use super::{MdevctlConfig, MdevctlDevice, MdevctlError, check_parent};

/// Where mdevctl keeps definitions.
pub const CONFIG_DIR: &str = "/etc/mdevctl.d";

/// mdevctl's call-out script directory inside [`CONFIG_DIR`]; not a parent.
const SCRIPTS_DIR: &str = "scripts.d";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MdevctlError + '_ {
    move |source| MdevctlError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The file of device `uuid` under `parent` in definition directory `dir`.
pub fn config_path(dir: &Path, parent: &str, uuid: &MdevUuid) -> Result<PathBuf, MdevctlError> {
    check_parent(parent)?;
    Ok(dir.join(parent).join(uuid.to_string()))
}

/// Reads every definition under `dir` (normally [`CONFIG_DIR`]), sorted by parent then UUID. A missing
/// `dir` means no definitions. Entries mdevctl itself ignores (non-directories at the top, `scripts.d`,
/// files whose name is not a UUID) are skipped; a definition file that does not parse is an error naming
/// it (the first that [`scan_config_dir`] reports), because silently dropping a vGPU definition is worse
/// than stopping.
pub fn read_config_dir(dir: &Path) -> Result<Vec<MdevctlDevice>, MdevctlError> {
    let scan = scan_config_dir(dir);
    match scan.unreadable.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(scan.devices),
    }
}

/// What [`scan_config_dir`] found: every definition that parses, and each file that does not.
#[derive(Debug, Default)]
pub struct ConfigScan {
    /// The definitions that parse, sorted by parent then UUID.
    pub devices: Vec<MdevctlDevice>,
    /// Each file or directory that could not be read or parsed, with the reason (naming the path).
    pub unreadable: Vec<MdevctlError>,
}

/// Reads every definition under `dir` as [`read_config_dir`] does, but a file (or parent directory)
/// that cannot be read or parsed is reported in [`ConfigScan::unreadable`] and the rest still load:
/// what a daemon that must start whatever an administrator left there needs. A missing `dir` means no
/// definitions. Names mdevctl ignores (non-UUID file names such as leftover temporary files,
/// `scripts.d`, non-directories at the top) are skipped silently, as mdevctl skips them.
pub fn scan_config_dir(dir: &Path) -> ConfigScan {
    let mut scan = ConfigScan::default();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return scan,
        Err(e) => {
            scan.unreadable.push(io(dir)(e));
            return scan;
        }
    };
    for entry in entries.flatten() {
        let ppath = entry.path();
        let Some(parent) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if parent == SCRIPTS_DIR || !ppath.is_dir() || check_parent(&parent).is_err() {
            continue;
        }
        let children = match fs::read_dir(&ppath) {
            Ok(c) => c,
            Err(e) => {
                scan.unreadable.push(io(&ppath)(e));
                continue;
            }
        };
        for child in children.flatten() {
            let path = child.path();
            let Some(uuid) = child
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<MdevUuid>().ok())
            else {
                continue;
            };
            if !path.is_file() {
                continue;
            }
            let config = fs::read_to_string(&path)
                .map_err(io(&path))
                .and_then(|text| MdevctlConfig::from_json(&text, &path.display().to_string()));
            match config {
                Ok(config) => scan.devices.push(MdevctlDevice {
                    parent: parent.clone(),
                    uuid,
                    config,
                }),
                Err(e) => scan.unreadable.push(e),
            }
        }
    }
    scan.devices
        .sort_by(|a, b| (&a.parent, a.uuid).cmp(&(&b.parent, b.uuid)));
    scan
}

/// Writes `device`'s definition under `dir`, creating the parent directory; returns the file. The file is
/// written to a temporary name and renamed, so a reader (mdevctl, its udev rule) never sees half a file.
pub fn write_config(dir: &Path, device: &MdevctlDevice) -> Result<PathBuf, MdevctlError> {
    let path = config_path(dir, &device.parent, &device.uuid)?;
    let pdir = dir.join(&device.parent);
    fs::create_dir_all(&pdir).map_err(io(&pdir))?;
    let tmp = pdir.join(format!(".{}.tmp", device.uuid));
    let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
    let mut text = device.config.to_json_pretty();
    text.push('\n');
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(path)
}

/// Removes the definition of `uuid` under `parent`; true if there was one.
pub fn remove_config(dir: &Path, parent: &str, uuid: &MdevUuid) -> Result<bool, MdevctlError> {
    let path = config_path(dir, parent, uuid)?;
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io(&path)(e)),
    }
}
