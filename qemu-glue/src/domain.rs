//! A complete libvirt domain for a VDI desktop with vGPUs (libvirt formatdomain). It is an example to
//! start from: a q35 UEFI guest with a virtio disk and network, SPICE graphics, and the given host devices,
//! plus vgpu-manager's `<metadata>` so the libvirt hook can create the vGPUs on demand.

use std::path::PathBuf;

use thiserror::Error;

use crate::escape::{escape, escape_attr};
use crate::hostdev::Hostdev;
use crate::metadata::{VgpuRequest, metadata_xml};

/// Why a domain could not be written.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DomainError {
    /// The name is empty or not usable by libvirt.
    #[error(
        "domain name '{0}' is not usable: give a non-empty name without '/' (libvirt uses it as a file name)"
    )]
    BadName(String),
    /// Memory or vCPU count is zero.
    #[error("domain {name}: {what} must be at least 1")]
    Zero {
        /// The libvirt domain name from the spec.
        name: String,
        /// `memory` or `vcpus`.
        what: &'static str,
    },
    /// A metadata request names a UUID that is not one of the domain's mdev hostdevs.
    #[error(
        "domain {name}: vGPU request for {uuid} has no matching mdev <hostdev>: add Hostdev::Mdev for it or drop the request"
    )]
    OrphanRequest {
        /// The libvirt domain name from the spec.
        name: String,
        /// The UUID the metadata request names, as given.
        uuid: String,
    },
}

/// What to put in the domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSpec {
    /// The libvirt domain name (`<name>`).
    pub name: String,
    /// Guest memory in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// A qcow2 disk image; `None` for no disk.
    pub disk: Option<PathBuf>,
    /// The libvirt network for a virtio NIC; `None` for no NIC.
    pub network: Option<String>,
    /// The mdev instances and whole PCI functions to pass through, one `<hostdev>` each.
    pub hostdevs: Vec<Hostdev>,
    /// vgpu-manager metadata: what each mdev hostdev should be, for on-demand creation by the hook.
    pub vgpus: Vec<VgpuRequest>,
}

impl DomainSpec {
    /// A desktop named `name` with `hostdevs`: 4 GiB, 2 vCPUs, network `default`, no disk, no metadata.
    pub fn desktop(name: &str, hostdevs: Vec<Hostdev>) -> Self {
        DomainSpec {
            name: name.to_string(),
            memory_mib: 4096,
            vcpus: 2,
            disk: None,
            network: Some("default".into()),
            hostdevs,
            vgpus: Vec::new(),
        }
    }

    /// Renders the libvirt domain XML, after checking the spec.
    pub fn to_xml(&self) -> Result<String, DomainError> {
        self.check()?;
        let name = escape(&self.name);
        let display = self
            .hostdevs
            .iter()
            .any(|h| matches!(h, Hostdev::Mdev { display, .. } if display.display));
        let mut s = String::new();
        s.push_str("<domain type='kvm'>\n");
        s.push_str(&format!("  <name>{name}</name>\n"));
        if !self.vgpus.is_empty() {
            s.push_str("  <metadata>\n");
            s.push_str(&metadata_xml(&self.vgpus, 4));
            s.push_str("  </metadata>\n");
        }
        s.push_str(&format!(
            "  <memory unit='MiB'>{}</memory>\n",
            self.memory_mib
        ));
        s.push_str(&format!("  <vcpu>{}</vcpu>\n", self.vcpus));
        // UEFI: vGPU guest drivers and ramfb boot output are documented with OVMF, and current desktop
        // OSes need it (libvirt formatdomain, "BIOS bootloader": firmware='efi' auto-selects OVMF).
        s.push_str("  <os firmware='efi'>\n    <type arch='x86_64' machine='q35'>hvm</type>\n    <boot dev='hd'/>\n  </os>\n");
        s.push_str("  <features>\n    <acpi/>\n    <apic/>\n  </features>\n");
        s.push_str("  <cpu mode='host-passthrough'/>\n");
        s.push_str("  <clock offset='utc'/>\n");
        s.push_str("  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n");
        s.push_str("  <devices>\n");
        if let Some(disk) = &self.disk {
            s.push_str(&format!(
                "    <disk type='file' device='disk'>\n      <driver name='qemu' type='qcow2'/>\n      <source file='{}'/>\n      <target dev='vda' bus='virtio'/>\n    </disk>\n",
                escape_attr(&disk.to_string_lossy())
            ));
        }
        if let Some(net) = &self.network {
            s.push_str(&format!(
                "    <interface type='network'>\n      <source network='{}'/>\n      <model type='virtio'/>\n    </interface>\n",
                escape_attr(net)
            ));
        }
        s.push_str("    <input type='tablet' bus='usb'/>\n");
        s.push_str("    <graphics type='spice' autoport='yes'>\n      <listen type='address' address='127.0.0.1'/>\n    </graphics>\n");
        // With display='on' the vGPU is the guest's screen; an emulated adapter would be a second,
        // confusing head, so the video model is 'none' (formatdomain, "Video devices").
        let video = if display { "none" } else { "virtio" };
        s.push_str(&format!(
            "    <video>\n      <model type='{video}'/>\n    </video>\n"
        ));
        for h in &self.hostdevs {
            s.push_str(&h.libvirt_xml(4));
        }
        // VFIO pins all guest memory for device DMA, so a balloon could never return any to the host.
        s.push_str("    <memballoon model='none'/>\n");
        s.push_str("  </devices>\n</domain>\n");
        Ok(s)
    }

    fn check(&self) -> Result<(), DomainError> {
        if self.name.trim().is_empty() || self.name.contains('/') {
            return Err(DomainError::BadName(self.name.clone()));
        }
        for (what, v) in [
            ("memory", self.memory_mib),
            ("vcpus", u64::from(self.vcpus)),
        ] {
            if v == 0 {
                return Err(DomainError::Zero {
                    name: self.name.clone(),
                    what,
                });
            }
        }
        for r in &self.vgpus {
            let matched = self
                .hostdevs
                .iter()
                .any(|h| matches!(h, Hostdev::Mdev { uuid, .. } if *uuid == r.uuid));
            if !matched {
                return Err(DomainError::OrphanRequest {
                    name: self.name.clone(),
                    uuid: r.uuid.to_string(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostdev::{MdevDisplay, PciHostdev, VfBinding};
    use crate::metadata::VgpuTarget;
    use mdev_types::ids::MdevUuid;

    fn uuid() -> MdevUuid {
        "4b20d080-1b54-4048-85b3-a6a62d165c01"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn desktop_has_hostdev_metadata_and_no_video_with_display() {
        let mut d = DomainSpec::desktop(
            "vdi-01",
            vec![Hostdev::Mdev {
                uuid: uuid(),
                display: MdevDisplay::DESKTOP,
            }],
        );
        d.vgpus.push(VgpuRequest {
            uuid: uuid(),
            target: VgpuTarget::Profile("vdi-2g".into()),
            gpu: None,
        });
        let x = d.to_xml().unwrap_or_else(|e| panic!("{e}"));
        assert!(x.contains("<name>vdi-01</name>"), "{x}");
        assert!(x.contains("    <hostdev mode='subsystem' type='mdev' model='vfio-pci' display='on' ramfb='on'>"), "{x}");
        assert!(x.contains("<model type='none'/>"), "{x}");
        assert!(x.contains("profile='vdi-2g'"), "{x}");
        let doc = roxmltree::Document::parse(&x).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(doc.root_element().tag_name().name(), "domain");
    }

    #[test]
    fn names_and_paths_are_escaped() {
        let mut d = DomainSpec::desktop("a<b>&'c", vec![]);
        d.disk = Some("/var/lib/x'y.qcow2".into());
        let x = d.to_xml().unwrap_or_else(|e| panic!("{e}"));
        assert!(x.contains("<name>a&lt;b&gt;&amp;&apos;c</name>"), "{x}");
        assert!(x.contains("file='/var/lib/x&apos;y.qcow2'"), "{x}");
        assert!(x.contains("<model type='virtio'/>"), "{x}");
    }

    // Found by the fuzz target domain_xml: the writer put a carriage return and a tab in raw, which a
    // reader turns into a newline (element text) and a space (attribute value).
    #[test]
    fn whitespace_in_names_reads_back_unchanged() {
        let mut d = DomainSpec::desktop(
            "desk\r07",
            vec![Hostdev::Mdev {
                uuid: uuid(),
                display: MdevDisplay::default(),
            }],
        );
        d.vgpus.push(VgpuRequest {
            uuid: uuid(),
            target: VgpuTarget::Profile("vdi\t2g".into()),
            gpu: Some("gpu\n0".into()),
        });
        let x = d.to_xml().unwrap_or_else(|e| panic!("{e}"));
        let read = crate::parse_domain(&x).unwrap_or_else(|e| panic!("{e}: {x}"));
        assert_eq!(read.name, "desk\r07", "{x}");
        assert_eq!(read.vgpus, d.vgpus, "{x}");
    }

    #[test]
    fn refuses_bad_specs_naming_the_fix() {
        assert_eq!(
            DomainSpec::desktop("", vec![]).to_xml(),
            Err(DomainError::BadName(String::new()))
        );
        let mut d = DomainSpec::desktop("x", vec![]);
        d.vcpus = 0;
        assert!(matches!(
            d.to_xml(),
            Err(DomainError::Zero { what: "vcpus", .. })
        ));
        let mut d = DomainSpec::desktop(
            "x",
            vec![Hostdev::Pci(PciHostdev::new(
                "0000:c1:00.4".parse().unwrap_or_else(|e| panic!("{e}")),
                VfBinding::NvidiaVendorVfio,
            ))],
        );
        d.vgpus.push(VgpuRequest {
            uuid: uuid(),
            target: VgpuTarget::Profile("vdi-2g".into()),
            gpu: None,
        });
        let e = d.to_xml().unwrap_err().to_string();
        assert!(e.contains("4b20d080") && e.contains("<hostdev>"), "{e}");
    }
}
