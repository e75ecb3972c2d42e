//! mdevctl compatibility: its JSON shapes and its definition files.
//!
//! Shapes, as mdevctl 1.x writes and libvirt's node-device driver reads them (mdevctl(8) "CONFIGURATION
//! FILE FORMAT"; mdevctl src/main.rs `format_json`, src/mdev.rs `to_json`; libvirt
//! src/node_device/node_device_driver.c `nodeDeviceParseMdevctlJSON`):
//!
//! - one device's configuration: `{"mdev_type": T, "start": "auto"|"manual", "attrs": [{K: V}, …]}` —
//!   `attrs` is an *ordered* list of single-key objects with string values (order matters: attributes
//!   are written to sysfs in that order); on input it may be missing;
//! - `list --dumpjson`: `[{PARENT: [{UUID: CONFIG}, …], …}]`, or `[]` when there is nothing; with
//!   `--uuid` matching exactly one device, that device's bare CONFIG;
//! - `types --dumpjson`: `[{PARENT: [{TYPE: {"available_instances": N, "device_api": A, "name": …,
//!   "description": …}}, …]}]`, `name`/`description` left out when empty; `[]` when there is nothing.

mod files;
mod json;

pub use files::{
    CONFIG_DIR, ConfigScan, config_path, read_config_dir, remove_config, scan_config_dir,
    write_config,
};
pub use json::{
    MdevctlConfig, MdevctlDevice, MdevctlType, StartMode, list_json, parse_list_json,
    parse_types_json, types_json,
};

use std::path::PathBuf;

use thiserror::Error;

/// Why mdevctl JSON or a definition file could not be read or written. Each names where and what to fix.
#[derive(Debug, Error)]
pub enum MdevctlError {
    /// Not JSON at all.
    #[error("{origin}: not JSON ({detail})")]
    Json {
        /// File name or `stdin`, etc.
        origin: String,
        /// serde_json's message (with line and column).
        detail: String,
    },
    /// JSON of the wrong shape.
    #[error("{origin}: {field}: {problem}")]
    Shape {
        /// File name or `stdin`, etc.
        origin: String,
        /// The JSON path of the offending field, e.g. `attrs[2]`.
        field: String,
        /// What is wrong and what is expected.
        problem: String,
    },
    /// A parent device name that cannot be a directory name under /etc/mdevctl.d.
    #[error(
        "'{0}' is not an mdev parent name: parents are sysfs device names such as 0000:3b:00.0 (no '/', not '.' or '..')"
    )]
    BadParent(String),
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory that could not be read or written.
        path: PathBuf,
        /// The I/O error from the attempt.
        source: std::io::Error,
    },
}

/// Checks that `parent` is usable as one path element (mdevctl keeps definitions in
/// `/etc/mdevctl.d/<parent>/<uuid>`).
pub fn check_parent(parent: &str) -> Result<(), MdevctlError> {
    if parent.is_empty()
        || parent == "."
        || parent == ".."
        || parent.contains('/')
        || parent.contains('\0')
    {
        Err(MdevctlError::BadParent(parent.to_string()))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
