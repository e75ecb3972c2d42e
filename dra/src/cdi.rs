//! The CDI spec the plugin writes for a prepared claim, so the container runtime gives the container
//! the vGPU's VFIO device nodes and its device-metadata file. Format: the Container Device Interface
//! specification (github.com/cncf-tags/container-device-interface, `SPEC.md`): a JSON file in the CDI
//! directory (`/var/run/cdi`) with `cdiVersion`, `kind` (`vendor/class`) and `devices[]`, each with a
//! `name` and `containerEdits` (`deviceNodes[].path`, `mounts[]`). The runtime resolves the fully
//! qualified names `vendor/class=name` the kubelet passes on.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FsError};

/// The CDI version the spec declares: mounts and device nodes need 0.3.0; 0.6.0 is understood by the
/// CDI library of every containerd and CRI-O release with DRA support.
pub const CDI_VERSION: &str = "0.6.0";
/// The CDI vendor of the devices.
pub const VENDOR: &str = "vgpu-manager.io";
/// The CDI class of the devices.
pub const CLASS: &str = "vgpu";
/// The container path of the VFIO container device (drivers/vfio/vfio_main.c, `vfio` misc device).
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    /// [`CDI_VERSION`].
    pub cdi_version: String,
    /// `vgpu-manager.io/vgpu`.
    pub kind: String,
    /// One device per allocated vGPU.
    pub devices: Vec<Device>,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    /// Unique within the kind: `<claim UID>-<device name>`.
    pub name: String,
    /// What the runtime adds to the container.
    pub container_edits: ContainerEdits,
}

/// The edits of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    /// Device nodes to create in the container (the runtime reads type and numbers from the host).
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts; none when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A device node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceNode {
    /// Its path in the container, the same as on the host.
    pub path: String,
}

/// A mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    /// The host path.
    pub host_path: String,
    /// The path in the container.
    pub container_path: String,
    /// Mount options.
    pub options: Vec<String>,
}

/// The CDI kind, `vendor/class`.
pub fn kind() -> String {
    format!("{VENDOR}/{CLASS}")
}

/// The CDI device name of `device` in claim `claim_uid`.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The fully qualified CDI name the kubelet passes to the runtime: `vendor/class=name`.
pub fn qualified_name(claim_uid: &str, device: &str) -> String {
    format!("{}={}", kind(), device_name(claim_uid, device))
}

/// The spec file of claim `claim_uid` in `cdi_dir`: `<vendor>-<claim UID>.json`.
pub fn spec_path(cdi_dir: &Path, claim_uid: &str) -> PathBuf {
    cdi_dir.join(format!("{VENDOR}-{claim_uid}.json"))
}

/// The device nodes of a VFIO device in IOMMU group `group`: the group and the container device.
pub fn vfio_nodes(group: u32) -> Vec<DeviceNode> {
    vec![
        DeviceNode {
            path: format!("/dev/vfio/{group}"),
        },
        DeviceNode {
            path: VFIO_CONTAINER.to_string(),
        },
    ]
}

/// A read-only bind mount of `host` at `container`.
pub fn ro_bind(host: &Path, container: &str) -> Mount {
    Mount {
        host_path: host.display().to_string(),
        container_path: container.to_string(),
        options: vec!["ro".into(), "bind".into()],
    }
}

/// Writes `spec` durably to `path`.
pub fn write(path: &Path, spec: &Spec) -> Result<(), FsError> {
    // Serializing plain strings and vectors cannot fail.
    let json = serde_json::to_vec_pretty(spec).unwrap_or_default();
    fsutil::write_durably(path, &json)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn spec_has_the_cdi_field_names() {
        let spec = Spec {
            cdi_version: CDI_VERSION.into(),
            kind: kind(),
            devices: vec![Device {
                name: device_name("u1", "gpu-0000-3b-00-0-vdi-2g-0"),
                container_edits: ContainerEdits {
                    device_nodes: vfio_nodes(12),
                    mounts: vec![ro_bind(Path::new("/h/m.json"), "/c/m.json")],
                },
            }],
        };
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["cdiVersion"], "0.6.0");
        assert_eq!(v["kind"], "vgpu-manager.io/vgpu");
        let edits = &v["devices"][0]["containerEdits"];
        assert_eq!(edits["deviceNodes"][0]["path"], "/dev/vfio/12");
        assert_eq!(edits["deviceNodes"][1]["path"], "/dev/vfio/vfio");
        assert_eq!(edits["mounts"][0]["hostPath"], "/h/m.json");
        assert_eq!(edits["mounts"][0]["containerPath"], "/c/m.json");
        assert_eq!(qualified_name("u1", "d"), "vgpu-manager.io/vgpu=u1-d");
    }
}
