//! vgpu-manager's element in a libvirt domain's `<metadata>`: which vGPU each mdev hostdev of the domain
//! should be, so the libvirt hook can create it on demand.
//!
//! libvirt keeps one element per XML namespace under `<metadata>` and leaves it alone (formatdomain,
//! "General metadata"; `virsh metadata DOMAIN --uri URI --key vgpu --set XML` edits it). Ours:
//!
//! ```xml
//! <metadata>
//!   <vgpu:vgpus xmlns:vgpu='https://vgpumanager.org/xmlns/libvirt/1'>
//!     <vgpu:mdev uuid='4b20d080-1b54-4048-85b3-a6a62d165c01' profile='vdi-2g'/>
//!     <vgpu:mdev uuid='9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e' type='nvidia-231' gpu='0000:3b:00.0'/>
//!   </vgpu:vgpus>
//! </metadata>
//! ```
//!
//! Each `mdev` names the UUID of one of the domain's `<hostdev type='mdev'>` and exactly one of `profile`
//! (a vgpu-manager profile, the daemon picks the GPU and type) or `type` (an exact mdev type id);
//! `gpu` (a PCI address or parent name) optionally pins the GPU. Attributes are unprefixed, so they are in
//! no namespace (Namespaces in XML 1.0, §6.2).

use mdev_types::ids::{MdevTypeId, MdevUuid};

use crate::escape::escape_attr;

/// The XML namespace of vgpu-manager's domain metadata.
pub const METADATA_NS: &str = "https://vgpumanager.org/xmlns/libvirt/1";
/// The prefix we write (any prefix bound to [`METADATA_NS`] is accepted when reading).
pub const METADATA_PREFIX: &str = "vgpu";
/// The local name of the container element.
pub const METADATA_ROOT: &str = "vgpus";
/// The local name of one request.
pub const METADATA_MDEV: &str = "mdev";

/// What to make an instance of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VgpuTarget {
    /// A vgpu-manager profile name (`vdi-2g`).
    Profile(String),
    /// An exact mdev type id (`nvidia-231`).
    Type(MdevTypeId),
}

/// One vGPU a domain asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuRequest {
    /// The UUID of the mdev hostdev it backs.
    pub uuid: MdevUuid,
    /// Profile or type.
    pub target: VgpuTarget,
    /// The GPU to use (PCI address or parent name); `None` lets the daemon choose.
    pub gpu: Option<String>,
}

/// The `<vgpu:vgpus>` element for `requests`, indented by `indent` spaces (empty string for none).
pub fn metadata_xml(requests: &[VgpuRequest], indent: usize) -> String {
    if requests.is_empty() {
        return String::new();
    }
    let pad = " ".repeat(indent);
    let p = METADATA_PREFIX;
    let mut s = format!("{pad}<{p}:{METADATA_ROOT} xmlns:{p}='{METADATA_NS}'>\n");
    for r in requests {
        let target = match &r.target {
            VgpuTarget::Profile(name) => format!("profile='{}'", escape_attr(name)),
            VgpuTarget::Type(t) => format!("type='{}'", escape_attr(t.as_str())),
        };
        let gpu = r
            .gpu
            .as_deref()
            .map(|g| format!(" gpu='{}'", escape_attr(g)))
            .unwrap_or_default();
        s.push_str(&format!(
            "{pad}  <{p}:{METADATA_MDEV} uuid='{}' {target}{gpu}/>\n",
            r.uuid
        ));
    }
    s.push_str(&format!("{pad}</{p}:{METADATA_ROOT}>\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_profile_type_and_gpu() {
        let reqs = [
            VgpuRequest {
                uuid: "4b20d080-1b54-4048-85b3-a6a62d165c01"
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}")),
                target: VgpuTarget::Profile("vdi-2g".into()),
                gpu: None,
            },
            VgpuRequest {
                uuid: "9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e"
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}")),
                target: VgpuTarget::Type("nvidia-231".parse().unwrap_or_else(|e| panic!("{e}"))),
                gpu: Some("0000:3b:00.0".into()),
            },
        ];
        let x = metadata_xml(&reqs, 0);
        assert_eq!(
            x,
            "<vgpu:vgpus xmlns:vgpu='https://vgpumanager.org/xmlns/libvirt/1'>\n  <vgpu:mdev uuid='4b20d080-1b54-4048-85b3-a6a62d165c01' profile='vdi-2g'/>\n  <vgpu:mdev uuid='9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e' type='nvidia-231' gpu='0000:3b:00.0'/>\n</vgpu:vgpus>\n"
        );
        assert_eq!(metadata_xml(&[], 2), "");
    }
}
