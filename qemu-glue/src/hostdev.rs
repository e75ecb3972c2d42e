//! libvirt `<hostdev>` elements: one per mdev instance or per PCI function (an SR-IOV VF) given to a guest
//! (libvirt formatdomain, "Host device assignment").

use std::fmt::Write as _;

use mdev_types::ids::{MdevUuid, PciAddress};

/// How the guest sees an mdev's display (libvirt `<hostdev display=… ramfb=…>`, formatdomain "Host device
/// assignment": `display` needs a vGPU with a display, `ramfb` gives boot-time output on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MdevDisplay {
    /// Expose the vGPU's display to the VM's graphics (`display='on'`).
    pub display: bool,
    /// Add a ramfb boot display (`ramfb='on'`; only meaningful with `display`).
    pub ramfb: bool,
}

impl MdevDisplay {
    /// Display and ramfb both on: what a VDI desktop wants (firmware and boot loader are visible too).
    pub const DESKTOP: MdevDisplay = MdevDisplay {
        display: true,
        ramfb: true,
    };
}

/// Who binds a PCI function to its VFIO driver, which decides libvirt's `managed` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VfBinding {
    /// An NVIDIA VF on NVIDIA's vendor-specific VFIO driver (Ada/Hopper and later vGPU): the VF must stay
    /// on that driver with its vGPU type selected, so libvirt must not rebind it (`managed='no'`; NVIDIA
    /// Virtual GPU Software User Guide, "Adding a vGPU to a Linux with KVM hypervisor VM", vendor-specific
    /// VFIO framework).
    NvidiaVendorVfio,
    /// vgpu-manager binds the function to vfio-pci itself (`managed='no'`, so libvirt neither rebinds it at
    /// start nor gives it back to the host driver at shutdown).
    BoundByVgpuManager,
    /// libvirt detaches the function from its host driver at start and reattaches it after
    /// (`managed='yes'`, formatdomain "managed").
    Libvirt,
}

/// A PCI function given to a guest whole, normally an SR-IOV VF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciHostdev {
    /// The function's PCI address, written as the hostdev's source address.
    pub address: PciAddress,
    /// `managed='yes'` (libvirt rebinds it) or `'no'`.
    pub managed: bool,
}

impl PciHostdev {
    /// The hostdev for `address`, with `managed` chosen from who binds it.
    pub fn new(address: PciAddress, binding: VfBinding) -> Self {
        PciHostdev {
            address,
            managed: binding == VfBinding::Libvirt,
        }
    }
}

/// A device given to a guest: an mdev instance or a whole PCI function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostdev {
    /// An mdev instance, by UUID.
    Mdev {
        /// The mdev instance's UUID, as in `/sys/bus/mdev/devices/<uuid>`.
        uuid: MdevUuid,
        /// Whether the guest gets its display (`display=`) and a ramfb boot display.
        display: MdevDisplay,
    },
    /// A PCI function.
    Pci(PciHostdev),
}

impl Hostdev {
    /// The libvirt `<hostdev>` element, indented by `indent` spaces, ending with a newline.
    pub fn libvirt_xml(&self, indent: usize) -> String {
        let pad = " ".repeat(indent);
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = match self {
            Hostdev::Mdev { uuid, display } => {
                let mut attrs = String::new();
                if display.display {
                    attrs.push_str(" display='on'");
                    attrs.push_str(if display.ramfb {
                        " ramfb='on'"
                    } else {
                        " ramfb='off'"
                    });
                }
                // The UUID's text form is hex digits and hyphens only, nothing to escape.
                write!(
                    s,
                    "{pad}<hostdev mode='subsystem' type='mdev' model='vfio-pci'{attrs}>\n\
                     {pad}  <source>\n\
                     {pad}    <address uuid='{uuid}'/>\n\
                     {pad}  </source>\n\
                     {pad}</hostdev>\n"
                )
            }
            Hostdev::Pci(p) => {
                let a = p.address;
                let managed = if p.managed { "yes" } else { "no" };
                write!(
                    s,
                    "{pad}<hostdev mode='subsystem' type='pci' managed='{managed}'>\n\
                     {pad}  <source>\n\
                     {pad}    <address domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/>\n\
                     {pad}  </source>\n\
                     {pad}</hostdev>\n",
                    a.domain, a.bus, a.device, a.function
                )
            }
        };
        s
    }

    /// The QEMU arguments that attach it without libvirt (see [`crate::qemu`]).
    pub fn qemu_args(&self) -> Vec<String> {
        match self {
            Hostdev::Mdev { uuid, display } => crate::qemu::mdev_qemu_args(uuid, *display),
            Hostdev::Pci(p) => crate::qemu::pci_qemu_args(&p.address),
        }
    }
}

/// The libvirt `<hostdev>` element that attaches mdev `uuid` to a domain (libvirt formatdomain,
/// `<hostdev mode='subsystem' type='mdev' model='vfio-pci'>` with `<source><address uuid=…/></source>`).
pub fn mdev_hostdev_xml(uuid: &MdevUuid, display: MdevDisplay) -> String {
    Hostdev::Mdev {
        uuid: *uuid,
        display,
    }
    .libvirt_xml(0)
}

/// The libvirt `<hostdev mode='subsystem' type='pci' managed=…>` element for a whole PCI function, with the
/// address in libvirt's `domain/bus/slot/function` form.
pub fn pci_hostdev_xml(hostdev: &PciHostdev) -> String {
    Hostdev::Pci(*hostdev).libvirt_xml(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid() -> MdevUuid {
        "4b20d080-1b54-4048-85b3-a6a62d165c01"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn vf() -> PciAddress {
        "0000:c1:00.4".parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn mdev_without_and_with_display() {
        assert_eq!(
            mdev_hostdev_xml(&uuid(), MdevDisplay::default()),
            "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>\n  <source>\n    <address uuid='4b20d080-1b54-4048-85b3-a6a62d165c01'/>\n  </source>\n</hostdev>\n"
        );
        let x = mdev_hostdev_xml(&uuid(), MdevDisplay::DESKTOP);
        assert!(
            x.starts_with(
                "<hostdev mode='subsystem' type='mdev' model='vfio-pci' display='on' ramfb='on'>"
            ),
            "{x}"
        );
        let x = mdev_hostdev_xml(
            &uuid(),
            MdevDisplay {
                display: true,
                ramfb: false,
            },
        );
        assert!(x.contains("display='on' ramfb='off'"), "{x}");
    }

    #[test]
    fn pci_managed_follows_the_binding() {
        let nv = pci_hostdev_xml(&PciHostdev::new(vf(), VfBinding::NvidiaVendorVfio));
        assert_eq!(
            nv,
            "<hostdev mode='subsystem' type='pci' managed='no'>\n  <source>\n    <address domain='0x0000' bus='0xc1' slot='0x00' function='0x4'/>\n  </source>\n</hostdev>\n"
        );
        let ours = PciHostdev::new(vf(), VfBinding::BoundByVgpuManager);
        assert!(!ours.managed);
        let lv = pci_hostdev_xml(&PciHostdev::new(vf(), VfBinding::Libvirt));
        assert!(lv.contains("managed='yes'"), "{lv}");
    }

    #[test]
    fn indentation_applies_to_every_line() {
        let x = Hostdev::Pci(PciHostdev::new(vf(), VfBinding::Libvirt)).libvirt_xml(4);
        assert!(x.lines().all(|l| l.starts_with("    ")), "{x}");
    }
}
