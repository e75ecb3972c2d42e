//! QEMU command-line arguments for users without libvirt (QEMU docs, "VFIO" device options of `vfio-pci`).

use mdev_types::ids::{MdevUuid, PciAddress};

use crate::hostdev::MdevDisplay;

/// The QEMU arguments that attach mdev `uuid`:
/// `-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/<uuid>[,display=on]`.
///
/// With `ramfb` the device is `vfio-pci-nohotplug`: QEMU defines the `ramfb` property only on that
/// variant (hw/vfio/pci.c, `TYPE_VFIO_PCI_NOHOTPLUG`; a ramfb cannot be hot-unplugged), which is also what
/// libvirt emits for `ramfb='on'`.
pub fn mdev_qemu_args(uuid: &MdevUuid, display: MdevDisplay) -> Vec<String> {
    let ramfb = display.display && display.ramfb;
    let driver = if ramfb {
        "vfio-pci-nohotplug"
    } else {
        "vfio-pci"
    };
    let mut dev = format!("{driver},sysfsdev=/sys/bus/mdev/devices/{uuid}");
    if display.display {
        dev.push_str(",display=on");
    }
    if ramfb {
        dev.push_str(",ramfb=on");
    }
    vec!["-device".to_string(), dev]
}

/// The QEMU arguments that attach a whole PCI function (a VF bound to a VFIO driver):
/// `-device vfio-pci,host=DDDD:BB:DD.F`.
pub fn pci_qemu_args(address: &PciAddress) -> Vec<String> {
    vec!["-device".to_string(), format!("vfio-pci,host={address}")]
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
    fn mdev_plain_display_and_ramfb() {
        assert_eq!(
            mdev_qemu_args(&uuid(), MdevDisplay::default()),
            [
                "-device",
                "vfio-pci,sysfsdev=/sys/bus/mdev/devices/4b20d080-1b54-4048-85b3-a6a62d165c01"
            ]
        );
        assert_eq!(
            mdev_qemu_args(
                &uuid(),
                MdevDisplay {
                    display: true,
                    ramfb: false
                }
            ),
            [
                "-device",
                "vfio-pci,sysfsdev=/sys/bus/mdev/devices/4b20d080-1b54-4048-85b3-a6a62d165c01,display=on"
            ]
        );
        assert_eq!(
            mdev_qemu_args(&uuid(), MdevDisplay::DESKTOP),
            [
                "-device",
                "vfio-pci-nohotplug,sysfsdev=/sys/bus/mdev/devices/4b20d080-1b54-4048-85b3-a6a62d165c01,display=on,ramfb=on"
            ]
        );
    }

    #[test]
    fn ramfb_without_display_is_ignored() {
        let args = mdev_qemu_args(
            &uuid(),
            MdevDisplay {
                display: false,
                ramfb: true,
            },
        );
        assert!(
            args[1].starts_with("vfio-pci,") && !args[1].contains("ramfb"),
            "{args:?}"
        );
    }

    #[test]
    fn pci_host_address_form() {
        let a: PciAddress = "c1:00.4".parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pci_qemu_args(&a), ["-device", "vfio-pci,host=0000:c1:00.4"]);
    }
}
