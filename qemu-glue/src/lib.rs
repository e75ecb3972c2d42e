//! libvirt, QEMU and mdevctl output for vgpu-manager devices.
//!
//! Starts with what attaching one mdev instance needs: the libvirt `<hostdev>` element and the QEMU
//! `-device` argument. (Full domains, VF hostdevs, the libvirt hook and mdevctl compatibility come with the
//! VDI glue.)
#![deny(missing_docs)]

use mdev_types::ids::MdevUuid;

/// How the guest sees an mdev's display (libvirt `<hostdev display=… ramfb=…>`, formatdomain "Host device
/// assignment": `display` needs a vGPU with a display, `ramfb` gives boot-time output on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MdevDisplay {
    /// Expose the vGPU's display to the VM's graphics (`display='on'`).
    pub display: bool,
    /// Add a ramfb boot display (`ramfb='on'`; only meaningful with `display`).
    pub ramfb: bool,
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// The libvirt `<hostdev>` element that attaches mdev `uuid` to a domain (libvirt formatdomain,
/// `<hostdev mode='subsystem' type='mdev' model='vfio-pci'>` with `<source><address uuid=…/></source>`).
pub fn mdev_hostdev_xml(uuid: &MdevUuid, display: MdevDisplay) -> String {
    let mut attrs = String::new();
    if display.display {
        attrs.push_str(&format!(" display='{}'", on_off(display.display)));
        attrs.push_str(&format!(" ramfb='{}'", on_off(display.ramfb)));
    }
    format!(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'{attrs}>\n  <source>\n    <address uuid='{uuid}'/>\n  </source>\n</hostdev>\n"
    )
}

/// The QEMU arguments that attach mdev `uuid` without libvirt
/// (`-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/<uuid>[,display=on]`, QEMU docs "VFIO").
pub fn mdev_qemu_args(uuid: &MdevUuid, display: MdevDisplay) -> Vec<String> {
    let mut dev = format!("vfio-pci,sysfsdev=/sys/bus/mdev/devices/{uuid}");
    if display.display {
        dev.push_str(",display=on");
        if display.ramfb {
            dev.push_str(",ramfb=on");
        }
    }
    vec!["-device".to_string(), dev]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid() -> MdevUuid {
        "4b20d080-1b54-4048-85b3-a6a62d165c01"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn hostdev_without_and_with_display() {
        assert_eq!(
            mdev_hostdev_xml(&uuid(), MdevDisplay::default()),
            "<hostdev mode='subsystem' type='mdev' model='vfio-pci'>\n  <source>\n    <address uuid='4b20d080-1b54-4048-85b3-a6a62d165c01'/>\n  </source>\n</hostdev>\n"
        );
        let x = mdev_hostdev_xml(
            &uuid(),
            MdevDisplay {
                display: true,
                ramfb: true,
            },
        );
        assert!(
            x.starts_with(
                "<hostdev mode='subsystem' type='mdev' model='vfio-pci' display='on' ramfb='on'>"
            ),
            "{x}"
        );
    }

    #[test]
    fn qemu_device_argument() {
        assert_eq!(
            mdev_qemu_args(&uuid(), MdevDisplay { display: true, ramfb: false }),
            vec![
                "-device".to_string(),
                "vfio-pci,sysfsdev=/sys/bus/mdev/devices/4b20d080-1b54-4048-85b3-a6a62d165c01,display=on".to_string()
            ]
        );
    }
}
