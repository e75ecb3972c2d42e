//! The raw VFIO ioctls vfio-ioctls does not expose (device flags, per-index region and IRQ info, config
//! space reads) and the raw type1 DMA map/unmap the benchmark compares our path against.
//!
//! ABI source: include/uapi/linux/vfio.h (`VFIO_DEVICE_GET_INFO` = `_IO(VFIO_TYPE, VFIO_BASE + 7)`,
//! `VFIO_DEVICE_GET_REGION_INFO` + 8, `VFIO_DEVICE_GET_IRQ_INFO` + 9, `VFIO_IOMMU_MAP_DMA` + 13,
//! `VFIO_IOMMU_UNMAP_DMA` + 14; each takes a pointer to its argsz-prefixed struct).
//! This is the hardware layer: every `unsafe` block states why it is sound.

use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use vfio_bindings::bindings::vfio::{
    VFIO_BASE, VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_TYPE, vfio_device_info,
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, vfio_irq_info, vfio_region_info,
};

nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_GET_INFO`.
    get_device_info,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 7),
    vfio_device_info
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_GET_REGION_INFO`.
    get_region_info,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 8),
    vfio_region_info
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_GET_IRQ_INFO`.
    get_irq_info,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 9),
    vfio_irq_info
);
nix::ioctl_write_ptr_bad!(
    /// `VFIO_IOMMU_MAP_DMA`.
    iommu_map_dma,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 13),
    vfio_iommu_type1_dma_map
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_IOMMU_UNMAP_DMA`.
    iommu_unmap_dma,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 14),
    vfio_iommu_type1_dma_unmap
);

fn argsz<T>() -> u32 {
    // The structs are a few dozen bytes; the cast cannot truncate.
    size_of::<T>() as u32
}

/// `VFIO_DEVICE_GET_INFO`: (flags, num_regions, num_irqs).
pub(crate) fn device_info(fd: &impl AsRawFd) -> Result<(u32, u32, u32), Errno> {
    let mut info = vfio_device_info {
        argsz: argsz::<vfio_device_info>(),
        ..Default::default()
    };
    // SAFETY: the fd is an open VFIO device (borrowed, so it stays open for the call) and `info` is a
    // properly sized, initialized vfio_device_info whose argsz tells the kernel how much it may write.
    unsafe { get_device_info(fd.as_raw_fd(), &mut info) }?;
    Ok((info.flags, info.num_regions, info.num_irqs))
}

/// `VFIO_DEVICE_GET_REGION_INFO` for `index`: (flags, size, offset in the device fd).
pub(crate) fn region_info(fd: &impl AsRawFd, index: u32) -> Result<(u32, u64, u64), Errno> {
    let mut info = vfio_region_info {
        argsz: argsz::<vfio_region_info>(),
        index,
        ..Default::default()
    };
    // SAFETY: as in `device_info`; the kernel writes at most argsz bytes (it reports a larger argsz
    // when capabilities do not fit instead of writing them).
    unsafe { get_region_info(fd.as_raw_fd(), &mut info) }?;
    Ok((info.flags, info.size, info.offset))
}

/// `VFIO_DEVICE_GET_IRQ_INFO` for `index`: (flags, count).
pub(crate) fn irq_info(fd: &impl AsRawFd, index: u32) -> Result<(u32, u32), Errno> {
    let mut info = vfio_irq_info {
        argsz: argsz::<vfio_irq_info>(),
        index,
        ..Default::default()
    };
    // SAFETY: as in `device_info`, for a vfio_irq_info.
    unsafe { get_irq_info(fd.as_raw_fd(), &mut info) }?;
    Ok((info.flags, info.count))
}

/// Reads `buf.len()` bytes of a device region at `offset` (region offset + position) with `pread`.
pub(crate) fn read_at(fd: &impl AsRawFd, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    let offset = i64::try_from(offset).map_err(|_| Errno::EOVERFLOW)?;
    // SAFETY: `fd` is borrowed from an object that owns the descriptor for at least this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd.as_raw_fd()) };
    nix::sys::uio::pread(fd, buf, offset)
}

/// `VFIO_IOMMU_MAP_DMA` on a type1 container, read+write, without any wrapper (the benchmark's baseline).
///
/// # Safety
///
/// `vaddr..vaddr+size` must be a mapping of this process that stays mapped until
/// [`raw_type1_unmap`] of the same range succeeds, and no Rust reference to it may be live meanwhile
/// (the device may read and write it at any time).
pub unsafe fn raw_type1_map(
    container: &impl AsRawFd,
    iova: u64,
    size: u64,
    vaddr: u64,
) -> Result<(), Errno> {
    let map = vfio_iommu_type1_dma_map {
        argsz: argsz::<vfio_iommu_type1_dma_map>(),
        flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
        vaddr,
        iova,
        size,
    };
    // SAFETY: `map` is a valid vfio_iommu_type1_dma_map; the caller guarantees the memory contract.
    unsafe { iommu_map_dma(container.as_raw_fd(), &map) }?;
    Ok(())
}

/// `VFIO_IOMMU_UNMAP_DMA` on a type1 container; returns the number of bytes the kernel unmapped.
pub fn raw_type1_unmap(container: &impl AsRawFd, iova: u64, size: u64) -> Result<u64, Errno> {
    let mut unmap = vfio_iommu_type1_dma_unmap {
        argsz: argsz::<vfio_iommu_type1_dma_unmap>(),
        flags: 0,
        iova,
        size,
        ..Default::default()
    };
    // SAFETY: `unmap` is a valid vfio_iommu_type1_dma_unmap without the optional bitmap (flags 0), so
    // the kernel reads and writes only the fixed-size struct.
    unsafe { iommu_unmap_dma(container.as_raw_fd(), &mut unmap) }?;
    Ok(unmap.size)
}
