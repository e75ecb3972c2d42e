//! The plugin's record of what it prepared, so that a restart (or a `kill -9`) neither forgets a vGPU
//! it made nor touches one it did not.
//!
//! One JSON file (`checkpoint.json` in the plugin's directory), replaced durably on every change
//! ([`crate::fsutil::write_durably`]). A claim is recorded in two phases: [`Phase::Started`], with the
//! UUIDs it will create, before any vGPU is made; [`Phase::Completed`], with the IOMMU groups, once
//! every vGPU, the CDI spec and the metadata files exist. A claim still `Started` at start-up was cut
//! short: its vGPUs (by those UUIDs only) and files are removed, and the kubelet, which got no answer,
//! asks again. Unknown fields are refused, and a file that does not parse stops the plugin rather than
//! be overwritten, since it is the only list of the vGPUs the plugin owns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FsError};

/// The checkpoint format version this plugin writes and reads.
pub const VERSION: u32 = 1;

/// How far a claim's preparation got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Recorded before any vGPU was made; some may exist.
    Started,
    /// Every vGPU and file exists and the kubelet was (or is being) answered.
    Completed,
}

/// One claim the plugin prepared or is preparing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRecord {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The pod's claim name, for a claim generated from a template.
    #[serde(default)]
    pub pod_claim_name: Option<String>,
    /// How far its preparation got.
    pub phase: Phase,
    /// Its devices of this driver, in allocation order.
    pub devices: Vec<PreparedDevice>,
}

/// One allocated device and the vGPU made for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreparedDevice {
    /// The claim request it satisfies (`req` or `req/sub`).
    pub request: String,
    /// Its pool.
    pub pool: String,
    /// Its device name.
    pub device: String,
    /// The GPU's PCI address.
    pub gpu: String,
    /// The profile.
    pub profile: String,
    /// The UUID of the vGPU made for it.
    pub uuid: String,
    /// The vGPU's IOMMU group, once it runs.
    #[serde(default)]
    pub iommu_group: Option<u32>,
    /// For a VF-backed device: the vgpud pool of one slot made for it ([`crate::vf_slot`]);
    /// `None` for an mdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpud_pool: Option<String>,
    /// For a VF-backed device, once made: the VF's PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    driver: String,
    claims: BTreeMap<String, ClaimRecord>,
}

/// Why the checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading the file failed.
    #[error("cannot read the checkpoint {}: check its permissions", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("the checkpoint {} does not parse; it lists the vGPUs this plugin made, so it is kept: repair it, or move it away after destroying those vGPUs (vgpuctl list)", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The file has another format version.
    #[error("the checkpoint {} has format version {found}; this plugin reads version {VERSION}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// The file belongs to another driver name.
    #[error("the checkpoint {} belongs to driver {found:?}, not {expected:?}: give each driver name its own plugin directory", path.display())]
    Driver {
        /// The file.
        path: PathBuf,
        /// The driver it names.
        found: String,
        /// This plugin's driver.
        expected: String,
    },
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] FsError),
}

/// The checkpoint file and its content in memory.
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    file: File,
}

impl Checkpoint {
    /// Reads the checkpoint at `path`, or starts an empty one if there is none.
    pub fn load(path: &Path, driver: &str) -> Result<Self, CheckpointError> {
        match std::fs::read(path) {
            Ok(bytes) => Checkpoint::parse(&bytes, path, driver),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint {
                path: path.to_path_buf(),
                file: File {
                    version: VERSION,
                    driver: driver.to_string(),
                    claims: BTreeMap::new(),
                },
            }),
            Err(source) => Err(CheckpointError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// The checkpoint of `driver` in `bytes`, the content of the file at `path`.
    pub fn parse(bytes: &[u8], path: &Path, driver: &str) -> Result<Self, CheckpointError> {
        let file: File =
            serde_json::from_slice(bytes).map_err(|source| CheckpointError::Corrupt {
                path: path.to_path_buf(),
                source,
            })?;
        if file.version != VERSION {
            return Err(CheckpointError::Version {
                path: path.to_path_buf(),
                found: file.version,
            });
        }
        if file.driver != driver {
            return Err(CheckpointError::Driver {
                path: path.to_path_buf(),
                found: file.driver,
                expected: driver.to_string(),
            });
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The file's content as [`Checkpoint::load`] reads it.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing strings, numbers and maps cannot fail.
        serde_json::to_vec_pretty(&self.file).unwrap_or_default()
    }

    /// The record of claim `uid`, if any.
    pub fn get(&self, uid: &str) -> Option<&ClaimRecord> {
        self.file.claims.get(uid)
    }

    /// Every recorded claim by UID.
    pub fn claims(&self) -> impl Iterator<Item = (&String, &ClaimRecord)> {
        self.file.claims.iter()
    }

    /// Records `record` for claim `uid` and writes the file before returning.
    pub fn put(&mut self, uid: &str, record: ClaimRecord) -> Result<(), CheckpointError> {
        let old = self.file.claims.insert(uid.to_string(), record);
        self.save().inspect_err(|_| {
            // Keep memory equal to the disk.
            match old {
                Some(o) => self.file.claims.insert(uid.to_string(), o),
                None => self.file.claims.remove(uid),
            };
        })
    }

    /// Forgets claim `uid` and writes the file before returning.
    pub fn remove(&mut self, uid: &str) -> Result<(), CheckpointError> {
        let Some(old) = self.file.claims.remove(uid) else {
            return Ok(());
        };
        self.save().inspect_err(|_| {
            self.file.claims.insert(uid.to_string(), old);
        })
    }

    fn save(&self) -> Result<(), CheckpointError> {
        Ok(fsutil::write_durably(&self.path, &self.to_json())?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn record(phase: Phase) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: "c".into(),
            pod_claim_name: None,
            phase,
            devices: vec![PreparedDevice {
                request: "r".into(),
                pool: "p".into(),
                device: "gpu-0000-3b-00-0-vdi-2g-0".into(),
                gpu: "0000:3b:00.0".into(),
                profile: "vdi-2g".into(),
                uuid: "u".into(),
                iommu_group: None,
                vgpud_pool: None,
                vf: None,
            }],
        }
    }

    #[test]
    fn survives_a_reload() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        let mut c = Checkpoint::load(&p, "drv").unwrap();
        c.put("a", record(Phase::Started)).unwrap();
        c.put("b", record(Phase::Completed)).unwrap();
        c.remove("a").unwrap();
        c.remove("zz").unwrap();
        let c = Checkpoint::load(&p, "drv").unwrap();
        assert!(c.get("a").is_none());
        assert_eq!(c.get("b"), Some(&record(Phase::Completed)));
    }

    #[test]
    fn refuses_what_it_cannot_trust() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("checkpoint.json");
        std::fs::write(&p, b"{\"version\":1,").unwrap();
        assert!(matches!(
            Checkpoint::load(&p, "drv"),
            Err(CheckpointError::Corrupt { .. })
        ));
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"{\"version\":1,",
            "kept as it was"
        );
        std::fs::write(&p, br#"{"version":1,"driver":"drv","claims":{},"extra":1}"#).unwrap();
        assert!(matches!(
            Checkpoint::load(&p, "drv"),
            Err(CheckpointError::Corrupt { .. })
        ));
        std::fs::write(&p, br#"{"version":2,"driver":"drv","claims":{}}"#).unwrap();
        assert!(matches!(
            Checkpoint::load(&p, "drv"),
            Err(CheckpointError::Version { found: 2, .. })
        ));
        std::fs::write(&p, br#"{"version":1,"driver":"other","claims":{}}"#).unwrap();
        assert!(matches!(
            Checkpoint::load(&p, "drv"),
            Err(CheckpointError::Driver { .. })
        ));
    }
}
