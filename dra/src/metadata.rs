//! The device-metadata file KubeVirt reads to find the vGPU a VM was given.
//!
//! The format is the KEP-5304 ("DRA device attributes downward API") `v1alpha1` object as KubeVirt
//! consumes it (kubevirt/kubevirt `pkg/dra/metadata/types.go` and `pkg/dra/utils.go`): a JSON object
//! `{"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata", "metadata": {…},
//! "podClaimName": …, "requests": [{"name", "devices": [{"driver", "pool", "name", "attributes"}]}]}`,
//! where `attributes` are `resource.k8s.io/v1` `DeviceAttribute`s (`{"string": …}`). KubeVirt looks for
//! `mdevUUID` before `resource.kubernetes.io/pciBusID` (virt-launcher `gpu_hostdev.go`), so an mdev
//! carries both and is passed as an mdev, not as its parent GPU.
//!
//! In the container the file is at
//! `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`,
//! or `…/resourceclaimtemplates/<pod claim name>/…` for a claim generated from a template. KEP-5304
//! has no kubelet support yet, so the plugin writes the file on the host
//! (`<metadata dir>/<claim UID>/<request>/<driver>-metadata.json`) and has the runtime bind-mount it
//! there through the CDI spec, one read-only file mount per request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FsError};

/// The `apiVersion` KubeVirt accepts.
pub const API_VERSION: &str = "metadata.resource.k8s.io/v1alpha1";
/// The `kind`.
pub const KIND: &str = "DeviceMetadata";
/// Where the files appear in the container.
pub const CONTAINER_BASE: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The attribute KubeVirt reads for a mediated device's UUID.
pub const MDEV_UUID: &str = "mdevUUID";
/// The standard attribute of a PCI address.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// One metadata file: the devices of one request of one claim, for one driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMetadata {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The claim's identity.
    pub metadata: ObjectMeta,
    /// The pod's claim name, for a claim generated from a template only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// The request and its devices.
    pub requests: Vec<Request>,
}

/// The claim's identity in a metadata file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's UID.
    pub uid: String,
}

/// One request and its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The request name (for a subrequest, the name of the request it belongs to).
    pub name: String,
    /// The devices allocated for it by this driver.
    pub devices: Vec<Device>,
}

/// One device in a metadata file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// The driver name.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The device name.
    pub name: String,
    /// Attributes, such as [`MDEV_UUID`] and [`PCI_BUS_ID`].
    pub attributes: BTreeMap<String, Attribute>,
}

/// A `resource.k8s.io/v1` `DeviceAttribute` holding a string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribute {
    /// The value.
    pub string: String,
}

/// The request name a metadata file is filed under: `a` for `a` and for subrequest `a/b`.
pub fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// The host path of the file of `request` in claim `claim_uid` of `driver`.
pub fn host_path(dir: &Path, claim_uid: &str, request: &str, driver: &str) -> PathBuf {
    dir.join(claim_uid)
        .join(base_request(request))
        .join(format!("{driver}-metadata.json"))
}

/// The container path of the same file: under `resourceclaims/<claim name>` for a claim made
/// directly, `resourceclaimtemplates/<pod claim name>` for one generated from a template.
pub fn container_path(
    claim_name: &str,
    pod_claim_name: Option<&str>,
    request: &str,
    driver: &str,
) -> String {
    let (sub, name) = match pod_claim_name {
        Some(p) => ("resourceclaimtemplates", p),
        None => ("resourceclaims", claim_name),
    };
    format!(
        "{CONTAINER_BASE}/{sub}/{name}/{}/{driver}-metadata.json",
        base_request(request)
    )
}

/// Writes `md` durably to `path`.
pub fn write(path: &Path, md: &DeviceMetadata) -> Result<(), FsError> {
    // Serializing strings and maps of strings cannot fail.
    let json = serde_json::to_vec_pretty(md).unwrap_or_default();
    fsutil::write_durably(path, &json)
}

/// Removes every metadata file of claim `claim_uid` and its directories.
pub fn remove_claim(dir: &Path, claim_uid: &str) -> Result<(), FsError> {
    let claim_dir = dir.join(claim_uid);
    let Ok(requests) = std::fs::read_dir(&claim_dir) else {
        return Ok(());
    };
    for req in requests.flatten() {
        if let Ok(files) = std::fs::read_dir(req.path()) {
            for f in files.flatten() {
                fsutil::remove_durably(&f.path())?;
            }
        }
        fsutil::remove_empty_dirs(&req.path(), dir);
    }
    fsutil::remove_empty_dirs(&claim_dir, dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_follow_kubevirts_layout() {
        assert_eq!(
            container_path("vm-gpu", None, "vgpu", "vgpu.vgpu-manager.io"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/vgpu/vgpu.vgpu-manager.io-metadata.json"
        );
        assert_eq!(
            container_path("vm-gpu-x7", Some("gpu"), "vgpu/small", "d"),
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/vgpu/d-metadata.json"
        );
        assert_eq!(
            host_path(Path::new("/m"), "u", "r/s", "d"),
            Path::new("/m/u/r/d-metadata.json")
        );
    }

    #[test]
    fn serializes_as_kubevirt_reads_it() {
        let md = DeviceMetadata {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            metadata: ObjectMeta {
                name: "c".into(),
                namespace: "ns".into(),
                uid: "u".into(),
            },
            pod_claim_name: None,
            requests: vec![Request {
                name: "vgpu".into(),
                devices: vec![Device {
                    driver: "d".into(),
                    pool: "p".into(),
                    name: "n".into(),
                    attributes: BTreeMap::from([(
                        MDEV_UUID.to_string(),
                        Attribute { string: "x".into() },
                    )]),
                }],
            }],
        };
        let v = serde_json::to_value(&md).unwrap();
        assert_eq!(v["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
        assert_eq!(v["kind"], "DeviceMetadata");
        assert!(v.get("podClaimName").is_none());
        assert_eq!(
            v["requests"][0]["devices"][0]["attributes"]["mdevUUID"]["string"],
            "x"
        );
    }
}
