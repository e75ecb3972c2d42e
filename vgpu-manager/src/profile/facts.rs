//! Per-device and per-driver facts matching needs but sysfs does not print: how much memory a GPU
//! has (to split it over SR-IOV VFs or to size a whole-GPU passthrough), whether it has a graphics
//! engine, and what display a vGPU presents when its sysfs entry does not say. Each entry names its
//! source.

use mdev_types::ids::PciId;
use mdev_types::parse::{NvidiaSeries, Resolution};

/// What we know about one GPU model (by PCI vendor:device id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFacts {
    /// PCI vendor id.
    pub vendor: u16,
    /// PCI device id (of the physical function).
    pub device: u16,
    /// Device memory of this PCI function in MiB; `None` for integrated GPUs, which use system memory.
    pub memory_mib: Option<u64>,
    /// Whether it has a graphics (3D) engine, so it can render desktops; compute accelerators do not.
    pub graphics: bool,
    /// Display heads one SR-IOV VF presents to its guest (0: the VF has no display engine; a
    /// desktop's display then comes from the remoting protocol).
    pub vf_heads: u32,
    /// Where these numbers come from.
    pub source: &'static str,
}

const GIB: u64 = 1024;

/// The table. Memory figures are the vendors' data-sheet capacities (binary GiB) unless the source
/// says otherwise.
const DEVICES: &[DeviceFacts] = &[
    DeviceFacts {
        vendor: 0x10de,
        device: 0x1eb8,
        memory_mib: Some(16 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "NVIDIA T4 data sheet: 16 GB GDDR6; vGPU B/Q series supported (NVIDIA vGPU User Guide, \
                 Virtual GPU Types for T4)",
    },
    DeviceFacts {
        vendor: 0x10de,
        device: 0x26b9,
        memory_mib: Some(48 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "NVIDIA L40S data sheet: 48 GB GDDR6 with ECC; vGPU B/Q series supported",
    },
    DeviceFacts {
        vendor: 0x10de,
        device: 0x26b5,
        memory_mib: Some(48 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "NVIDIA L40 data sheet: 48 GB GDDR6",
    },
    DeviceFacts {
        vendor: 0x10de,
        device: 0x2236,
        memory_mib: Some(24 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "NVIDIA A10 data sheet: 24 GB GDDR6",
    },
    DeviceFacts {
        vendor: 0x10de,
        device: 0x2235,
        memory_mib: Some(48 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "NVIDIA A40 data sheet: 48 GB GDDR6",
    },
    DeviceFacts {
        vendor: 0x10de,
        device: 0x20b5,
        memory_mib: Some(80 * GIB),
        graphics: false,
        vf_heads: 0,
        source: "NVIDIA A100 PCIe 80GB data sheet; A100 supports only C-series (compute) vGPUs \
                 (NVIDIA vGPU User Guide, Virtual GPU Types for A100)",
    },
    DeviceFacts {
        vendor: 0x10de,
        device: 0x2335,
        memory_mib: Some(143_771),
        graphics: false,
        vf_heads: 0,
        source: "tests/fixtures/h200-passthrough/nvidia-smi-q.xml: fb_memory_usage total 143771 MiB; \
                 H200 is a compute GPU (C-series vGPUs only)",
    },
    DeviceFacts {
        vendor: 0x8086,
        device: 0x56c0,
        memory_mib: Some(16 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "Intel Data Center GPU Flex 170 product specification: 16 GB GDDR6, no display outputs \
                 (remote display through the VDI protocol), SR-IOV",
    },
    DeviceFacts {
        vendor: 0x8086,
        device: 0x56c1,
        memory_mib: Some(6 * GIB),
        graphics: true,
        vf_heads: 0,
        source: "Intel Data Center GPU Flex 140 product specification: 12 GB GDDR6 over two GPUs, so \
                 6 GB per PCI function, no display outputs, SR-IOV",
    },
    DeviceFacts {
        vendor: 0x1002,
        device: 0x74a1,
        memory_mib: Some(192 * GIB),
        graphics: false,
        vf_heads: 0,
        source: "AMD Instinct MI300X data sheet: 192 GB HBM3; CDNA 3 accelerator without graphics or \
                 display engines",
    },
];

/// The facts for a PCI vendor:device id, when the table has them.
pub fn device_facts(vendor: PciId, device: PciId) -> Option<&'static DeviceFacts> {
    DEVICES
        .iter()
        .find(|d| d.vendor == vendor.0 && d.device == device.0)
}

/// Display of an NVIDIA vGPU type when only its name is known (vendor-specific VFIO types have no
/// description): heads and per-head maximum resolution by series, the most conservative figure the
/// NVIDIA Virtual GPU Software User Guide ("Virtual GPU Types") gives for the series, and what NVIDIA
/// prints in classic mdev descriptions (`GRID T4-2Q`: `num_heads=4, …, max_resolution=5120x2880`).
pub fn nvidia_series_display(series: NvidiaSeries) -> (u32, Resolution) {
    let (heads, width, height) = match series {
        // A: virtual applications, one 1280x1024 head.
        NvidiaSeries::A => (1, 1280, 1024),
        // B: virtual PC, up to four heads at up to 5120x2880.
        NvidiaSeries::B => (4, 5120, 2880),
        // C: compute, one head at up to 4096x2160.
        NvidiaSeries::C => (1, 4096, 2160),
        // Q: virtual workstation, four heads at up to 5120x2880 (7680x4320 on fewer heads).
        NvidiaSeries::Q => (4, 5120, 2880),
    };
    (heads, Resolution { width, height })
}

/// Display heads a GVT-g vGPU presents: one virtual DisplayPort monitor
/// (drivers/gpu/drm/i915/gvt/display.c, `intel_vgpu_init_display` sets up a single virtual DP port).
pub const GVT_HEADS: u32 = 1;

/// Display heads of a kernel sample display (mbochs, mdpy): one plane
/// (samples/vfio-mdev/mbochs.c and mdpy.c answer `VFIO_DEVICE_QUERY_GFX_PLANE` for one primary plane).
pub const SAMPLE_HEADS: u32 = 1;

/// Framebuffer memory an mdpy type allocates: `roundup_pow_of_two(width * height * bytepp)` with 4
/// bytes per pixel (XRGB8888) (samples/vfio-mdev/mdpy.c, `mdpy_init_dev` and `mdpy_types[]`), in MiB
/// rounded up.
pub fn mdpy_memory_mib(resolution: Resolution) -> u64 {
    let bytes = u64::from(resolution.width)
        .saturating_mul(u64::from(resolution.height))
        .saturating_mul(4);
    let pow2 = bytes.checked_next_power_of_two().unwrap_or(u64::MAX);
    pow2.div_ceil(1 << 20)
}

/// Framebuffer of an NVIDIA vGPU type named with `gib` GB: the `-0B`/`-0Q` types have 512 MB
/// (NVIDIA vGPU User Guide, "Virtual GPU Types"), all others exactly their number of GiB.
pub fn nvidia_name_framebuffer_mib(gib: u32) -> u64 {
    if gib == 0 { 512 } else { u64::from(gib) * GIB }
}

/// How to enable SR-IOV VFs on an NVIDIA GPU (NVIDIA vGPU User Guide, "Preparing the Virtual
/// Function for an NVIDIA vGPU that Supports SR-IOV on a Linux with KVM Hypervisor").
pub const NVIDIA_SRIOV_MANAGE: &str = "/usr/lib/nvidia/sriov-manage -e";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdpy_sizes_follow_the_kernel_rounding() {
        let r = |width, height| Resolution { width, height };
        // 640*480*4 = 1228800 B -> 2 MiB; 1024*768*4 = 3 MiB -> 4 MiB; 1920*1080*4 = 7.9 MiB -> 8 MiB.
        assert_eq!(mdpy_memory_mib(r(640, 480)), 2);
        assert_eq!(mdpy_memory_mib(r(1024, 768)), 4);
        assert_eq!(mdpy_memory_mib(r(1920, 1080)), 8);
        assert_eq!(
            mdpy_memory_mib(r(u32::MAX, u32::MAX)),
            u64::MAX.div_ceil(1 << 20)
        );
    }

    #[test]
    fn table_has_unique_ids_and_sources() {
        for (i, a) in DEVICES.iter().enumerate() {
            assert!(!a.source.is_empty());
            for b in &DEVICES[i + 1..] {
                assert!(
                    (a.vendor, a.device) != (b.vendor, b.device),
                    "{:04x}:{:04x} twice",
                    a.vendor,
                    a.device
                );
            }
        }
        assert!(device_facts(PciId(0x8086), PciId(0x56c0)).is_some());
        assert!(device_facts(PciId(0x8086), PciId(0x0001)).is_none());
    }

    #[test]
    fn zero_gib_names_are_half_a_gib() {
        assert_eq!(nvidia_name_framebuffer_mib(0), 512);
        assert_eq!(nvidia_name_framebuffer_mib(4), 4096);
    }
}
