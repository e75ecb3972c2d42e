//! Human model names for the GPUs we know, by PCI vendor and device id.
//!
//! Source: the PCI ID Repository (pci-ids.ucw.cz, `pci.ids`), entries for vendors 10de, 8086, 1002, 1234.

use mdev_types::ids::PciId;

/// (vendor, device, model name).
const KNOWN: &[(u16, u16, &str)] = &[
    (0x10de, 0x1eb8, "NVIDIA T4"),
    (0x10de, 0x1db4, "NVIDIA V100 PCIe 16GB"),
    (0x10de, 0x20b0, "NVIDIA A100 SXM4 40GB"),
    (0x10de, 0x20b5, "NVIDIA A100 PCIe 80GB"),
    (0x10de, 0x20b7, "NVIDIA A30"),
    (0x10de, 0x2235, "NVIDIA A40"),
    (0x10de, 0x2236, "NVIDIA A10"),
    (0x10de, 0x26b9, "NVIDIA L40S"),
    (0x10de, 0x26b5, "NVIDIA L40"),
    (0x10de, 0x27b8, "NVIDIA L4"),
    (0x10de, 0x2331, "NVIDIA H100 PCIe"),
    (0x10de, 0x2335, "NVIDIA H200"),
    (0x8086, 0x56c0, "Intel Data Center GPU Flex 170"),
    (0x8086, 0x56c1, "Intel Data Center GPU Flex 140"),
    (0x8086, 0x3e92, "Intel UHD Graphics 630"),
    (0x8086, 0x3e9b, "Intel UHD Graphics 630 (mobile)"),
    (0x8086, 0x5912, "Intel HD Graphics 630"),
    (0x1002, 0x74a1, "AMD Instinct MI300X"),
    (0x1002, 0x74b5, "AMD Instinct MI300X VF"),
    (0x1002, 0x7408, "AMD Instinct MI250X"),
    (0x1234, 0x1111, "QEMU standard VGA"),
];

/// The model name of a device, or `<Vendor> device 0xVVVV:0xDDDD` when we do not know it.
pub fn model_name(vendor: PciId, device: PciId) -> String {
    KNOWN
        .iter()
        .find(|(v, d, _)| *v == vendor.0 && *d == device.0)
        .map(|(_, _, n)| n.to_string())
        .unwrap_or_else(|| {
            let who = match vendor {
                PciId::NVIDIA => "NVIDIA",
                PciId::INTEL => "Intel",
                PciId::AMD => "AMD",
                _ => "PCI",
            };
            format!("{who} device {vendor}:{device}")
        })
}
