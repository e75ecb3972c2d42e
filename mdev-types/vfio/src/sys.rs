//! The raw VFIO ioctls vfio-ioctls does not expose (device flags, per-index region and IRQ info, config
//! space reads) and the raw type1 DMA map/unmap the benchmark compares our path against.
//!
//! ABI source: include/uapi/linux/vfio.h (`VFIO_DEVICE_GET_INFO` = `_IO(VFIO_TYPE, VFIO_BASE + 7)`,
//! `VFIO_DEVICE_FEATURE` + 17,
//! `VFIO_DEVICE_GET_REGION_INFO` + 8, `VFIO_DEVICE_GET_IRQ_INFO` + 9, `VFIO_IOMMU_MAP_DMA` + 13,
//! `VFIO_IOMMU_UNMAP_DMA` + 14; each takes a pointer to its argsz-prefixed struct).
//! This is the hardware layer: every `unsafe` block states why it is sound.

use std::ffi::CString;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use iommufd_bindings::iommufd::{
    IOMMUFD_CMD_IOAS_ALLOC, IOMMUFD_CMD_IOAS_MAP, IOMMUFD_CMD_IOAS_UNMAP, IOMMUFD_TYPE,
    iommu_ioas_alloc, iommu_ioas_map, iommu_ioas_unmap,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE,
    iommufd_ioas_map_flags_IOMMU_IOAS_MAP_WRITEABLE,
};

use nix::errno::Errno;
use vfio_bindings::bindings::vfio::{
    VFIO_BASE, VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT, VFIO_DEVICE_FEATURE_DMA_LOGGING_START,
    VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP, VFIO_DEVICE_FEATURE_GET,
    VFIO_DEVICE_FEATURE_MIG_DATA_SIZE, VFIO_DEVICE_FEATURE_MIGRATION, VFIO_DEVICE_FEATURE_PROBE,
    VFIO_DEVICE_FEATURE_SET, VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_TYPE,
    vfio_device_attach_iommufd_pt, vfio_device_bind_iommufd, vfio_device_info, vfio_group_status,
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

// The device features of the VFIO migration uAPI v2 (include/uapi/linux/vfio.h, "VFIO_DEVICE_FEATURE"
// = `_IO(VFIO_TYPE, VFIO_BASE + 17)`): a `struct vfio_device_feature` header (argsz, flags: the feature
// number and GET/SET/PROBE) followed by the feature's own struct. One header+payload type per feature.

/// `vfio_device_feature` + `vfio_device_feature_migration` (`VFIO_DEVICE_FEATURE_MIGRATION`, GET).
#[repr(C)]
#[derive(Default)]
pub(crate) struct FeatureMigration {
    argsz: u32,
    flags: u32,
    /// `VFIO_MIGRATION_STOP_COPY` | `_P2P` | `_PRE_COPY`.
    mig_flags: u64,
}

/// `vfio_device_feature` + `vfio_device_feature_mig_data_size` (`VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`).
#[repr(C)]
#[derive(Default)]
pub(crate) struct FeatureDataSize {
    argsz: u32,
    flags: u32,
    stop_copy_length: u64,
}

/// `vfio_device_feature` alone, for a PROBE (the kernel reads no payload: vfio_check_feature()).
#[repr(C)]
#[derive(Default)]
pub(crate) struct FeatureProbe {
    argsz: u32,
    flags: u32,
}

nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_FEATURE` with the migration feature.
    feature_migration,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 17),
    FeatureMigration
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_FEATURE` with the stop-copy data size feature.
    feature_data_size,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 17),
    FeatureDataSize
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_FEATURE` probing a feature.
    feature_probe,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 17),
    FeatureProbe
);

/// `VFIO_DEVICE_FEATURE_MIGRATION` GET: the device's migration flags. ENOTTY: the device has no
/// migration support (its driver sets no `mig_ops`).
pub(crate) fn migration_flags(fd: &impl AsRawFd) -> Result<u64, Errno> {
    let mut f = FeatureMigration {
        argsz: argsz::<FeatureMigration>(),
        flags: VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIGRATION,
        mig_flags: 0,
    };
    // SAFETY: the fd is an open VFIO device (borrowed for the call); `f` is an initialized header
    // followed by the 8-byte payload, and argsz is their size, so the kernel writes within `f`.
    unsafe { feature_migration(fd.as_raw_fd(), &mut f) }?;
    Ok(f.mig_flags)
}

/// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE` GET: the device's estimate of its stop-copy data, in bytes.
pub(crate) fn stop_copy_size(fd: &impl AsRawFd) -> Result<u64, Errno> {
    let mut f = FeatureDataSize {
        argsz: argsz::<FeatureDataSize>(),
        flags: VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIG_DATA_SIZE,
        stop_copy_length: 0,
    };
    // SAFETY: as in `migration_flags`, for the 8-byte data-size payload.
    unsafe { feature_data_size(fd.as_raw_fd(), &mut f) }?;
    Ok(f.stop_copy_length)
}

/// Whether the device supports SET of `feature` (a PROBE: nothing changes). ENOTTY: it does not.
pub(crate) fn probe_set(fd: &impl AsRawFd, feature: u32) -> Result<bool, Errno> {
    let mut f = FeatureProbe {
        argsz: argsz::<FeatureProbe>(),
        flags: VFIO_DEVICE_FEATURE_PROBE | VFIO_DEVICE_FEATURE_SET | feature,
    };
    // SAFETY: as in `migration_flags`; a PROBE reads only the header and writes nothing.
    match unsafe { feature_probe(fd.as_raw_fd(), &mut f) } {
        Ok(_) => Ok(true),
        Err(Errno::ENOTTY) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `vfio_device_feature` + `vfio_device_feature_dma_logging_control`
/// (`VFIO_DEVICE_FEATURE_DMA_LOGGING_START`, SET).
#[repr(C)]
#[derive(Default)]
pub(crate) struct FeatureLogControl {
    argsz: u32,
    flags: u32,
    /// The tracking granularity asked for; the driver may write back the one it uses.
    page_size: u64,
    num_ranges: u32,
    reserved: u32,
    /// User pointer to `num_ranges` [`LogRange`]s.
    ranges: u64,
}

/// `vfio_device_feature_dma_logging_range`.
#[repr(C)]
pub(crate) struct LogRange {
    iova: u64,
    length: u64,
}

/// `vfio_device_feature` + `vfio_device_feature_dma_logging_report`
/// (`VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT`, GET).
#[repr(C)]
#[derive(Default)]
pub(crate) struct FeatureLogReport {
    argsz: u32,
    flags: u32,
    iova: u64,
    length: u64,
    page_size: u64,
    /// User pointer to the bitmap, one bit per page of `length`.
    bitmap: u64,
}

nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_FEATURE` starting DMA logging.
    feature_log_start,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 17),
    FeatureLogControl
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_FEATURE` reading the DMA log.
    feature_log_report,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 17),
    FeatureLogReport
);

/// What one round of the device's DMA logging on a single page gave ([`probe_dma_log`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DmaLogProbe {
    /// START refused with this errno: nothing was started.
    StartFailed(Errno),
    /// START succeeded and REPORT gave this (`Ok`: the log was read); STOP's result follows.
    Reported(Result<(), Errno>, Result<(), Errno>),
}

/// Starts the device's DMA logging on the one page at IOVA 0, reads its log once into a buffer of
/// ours and stops it again (include/uapi/linux/vfio.h: `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`,
/// `_REPORT`, `_STOP`; drivers/vfio/vfio_main.c checks the range and hands it to the driver's
/// `log_ops`). The device's memory is not touched and no DMA is mapped; the only state change,
/// the started log, is undone before returning.
pub(crate) fn probe_dma_log(fd: &impl AsRawFd) -> DmaLogProbe {
    const PAGE: u64 = 4096;
    let range = LogRange {
        iova: 0,
        length: PAGE,
    };
    let mut start = FeatureLogControl {
        argsz: argsz::<FeatureLogControl>(),
        flags: VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_START,
        page_size: PAGE,
        num_ranges: 1,
        reserved: 0,
        ranges: std::ptr::addr_of!(range) as u64,
    };
    // SAFETY: the fd is an open VFIO device (borrowed for the call); `start` is an initialized header
    // with its 24-byte payload (argsz is their size; the kernel writes back only the payload) and its
    // `ranges` points to one valid LogRange that lives until the call returns (the kernel copies it).
    if let Err(e) = unsafe { feature_log_start(fd.as_raw_fd(), &mut start) } {
        return DmaLogProbe::StartFailed(e);
    }
    let page_size = if start.page_size >= PAGE && start.page_size.is_power_of_two() {
        start.page_size
    } else {
        PAGE
    };
    // One bit per page of the range: a single u64 holds it (the kernel pins and writes this buffer).
    let mut bitmap = [0u64; 1];
    let mut report = FeatureLogReport {
        argsz: argsz::<FeatureLogReport>(),
        flags: VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT,
        iova: 0,
        length: page_size,
        page_size,
        bitmap: bitmap.as_mut_ptr() as u64,
    };
    // SAFETY: as above for a 32-byte payload; `bitmap` is a live, writable, 8-byte aligned buffer of
    // one u64, the size the kernel writes for a range of one page (include/linux/iova_bitmap.h).
    let reported = unsafe { feature_log_report(fd.as_raw_fd(), &mut report) }.map(drop);
    let mut stop = FeatureProbe {
        argsz: argsz::<FeatureProbe>(),
        flags: VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP,
    };
    // SAFETY: as in `probe_set`: STOP has no payload, the kernel reads only the header.
    let stopped = unsafe { feature_probe(fd.as_raw_fd(), &mut stop) }.map(drop);
    DmaLogProbe::Reported(reported, stopped)
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

// The hand-off (`super::handoff`) opens devices with the raw ioctl sequence instead of vfio-ioctls'
// objects, whose Drop detaches the group from its container or the device from its IOAS: the daemon
// closes its copies right after sending them, and the receiving VMM must keep a working device.
//
// ABI source: include/uapi/linux/vfio.h (`VFIO_GET_API_VERSION` = VFIO_BASE + 0, `VFIO_CHECK_EXTENSION`
// + 1 and `VFIO_SET_IOMMU` + 2 taking an int by value, `VFIO_GROUP_GET_STATUS` + 3,
// `VFIO_GROUP_SET_CONTAINER` + 4 taking a pointer to the container fd, `VFIO_GROUP_GET_DEVICE_FD` + 6
// taking a pointer to the device name and returning the fd, `VFIO_DEVICE_BIND_IOMMUFD` + 18,
// `VFIO_DEVICE_ATTACH_IOMMUFD_PT` + 19) and include/uapi/linux/iommufd.h (`IOMMU_IOAS_ALLOC`,
// `IOMMU_IOAS_MAP`, `IOMMU_IOAS_UNMAP`: `_IO(IOMMUFD_TYPE, IOMMUFD_CMD_*)`).

nix::ioctl_none_bad!(
    /// `VFIO_GET_API_VERSION`.
    get_api_version,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE)
);
nix::ioctl_write_int_bad!(
    /// `VFIO_CHECK_EXTENSION`.
    check_extension,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 1)
);
nix::ioctl_write_int_bad!(
    /// `VFIO_SET_IOMMU`.
    set_iommu,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 2)
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_GROUP_GET_STATUS`.
    group_get_status,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 3),
    vfio_group_status
);
nix::ioctl_write_ptr_bad!(
    /// `VFIO_GROUP_SET_CONTAINER`.
    group_set_container,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 4),
    std::os::raw::c_int
);
nix::ioctl_write_ptr_bad!(
    /// `VFIO_GROUP_GET_DEVICE_FD`.
    group_get_device_fd,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 6),
    std::os::raw::c_char
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_BIND_IOMMUFD`.
    device_bind_iommufd,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 18),
    vfio_device_bind_iommufd
);
nix::ioctl_readwrite_bad!(
    /// `VFIO_DEVICE_ATTACH_IOMMUFD_PT`.
    device_attach_iommufd_pt,
    nix::request_code_none!(VFIO_TYPE, VFIO_BASE + 19),
    vfio_device_attach_iommufd_pt
);
nix::ioctl_readwrite_bad!(
    /// `IOMMU_IOAS_ALLOC`.
    ioas_alloc,
    nix::request_code_none!(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_ALLOC),
    iommu_ioas_alloc
);
nix::ioctl_readwrite_bad!(
    /// `IOMMU_IOAS_MAP`.
    ioas_map,
    nix::request_code_none!(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_MAP),
    iommu_ioas_map
);
nix::ioctl_readwrite_bad!(
    /// `IOMMU_IOAS_UNMAP`.
    ioas_unmap,
    nix::request_code_none!(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_UNMAP),
    iommu_ioas_unmap
);

/// `VFIO_GET_API_VERSION` on a container.
pub(crate) fn api_version(container: &impl AsRawFd) -> Result<i32, Errno> {
    // SAFETY: the ioctl takes no argument; the fd is borrowed for the call.
    unsafe { get_api_version(container.as_raw_fd()) }
}

/// `VFIO_CHECK_EXTENSION(ext)`: true when the container supports the extension.
pub(crate) fn has_extension(container: &impl AsRawFd, ext: u32) -> Result<bool, Errno> {
    let ext = i32::try_from(ext).map_err(|_| Errno::EINVAL)?;
    // SAFETY: the argument is an int passed by value; the kernel reads nothing from our memory.
    let r = unsafe { check_extension(container.as_raw_fd(), ext) }?;
    Ok(r > 0)
}

/// `VFIO_SET_IOMMU(model)` on a container with at least one group.
pub(crate) fn set_iommu_model(container: &impl AsRawFd, model: u32) -> Result<(), Errno> {
    let model = i32::try_from(model).map_err(|_| Errno::EINVAL)?;
    // SAFETY: as in `has_extension`.
    unsafe { set_iommu(container.as_raw_fd(), model) }?;
    Ok(())
}

/// `VFIO_GROUP_GET_STATUS`: the group's flags (`VFIO_GROUP_FLAGS_*`).
pub(crate) fn group_status(group: &impl AsRawFd) -> Result<u32, Errno> {
    let mut status = vfio_group_status {
        argsz: argsz::<vfio_group_status>(),
        flags: 0,
    };
    // SAFETY: `status` is a valid, argsz-prefixed vfio_group_status the kernel fills in.
    unsafe { group_get_status(group.as_raw_fd(), &mut status) }?;
    Ok(status.flags)
}

/// `VFIO_GROUP_SET_CONTAINER`: attaches the group to the container.
pub(crate) fn group_attach(group: &impl AsRawFd, container: &impl AsRawFd) -> Result<(), Errno> {
    let fd: std::os::raw::c_int = container.as_raw_fd();
    // SAFETY: the kernel reads one int (the container fd, open for the duration of the call).
    unsafe { group_set_container(group.as_raw_fd(), &fd) }?;
    Ok(())
}

/// `VFIO_GROUP_GET_DEVICE_FD(name)`: a new fd for the device `name` of the group.
pub(crate) fn group_device_fd(group: &impl AsRawFd, name: &str) -> Result<OwnedFd, Errno> {
    let name = CString::new(name).map_err(|_| Errno::EINVAL)?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the kernel reads it with
    // strndup_user and returns a new fd on success.
    let fd = unsafe { group_get_device_fd(group.as_raw_fd(), name.as_ptr()) }?;
    // SAFETY: on success the ioctl returns a freshly installed fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `VFIO_DEVICE_BIND_IOMMUFD`: binds a device cdev to an iommufd; returns the device id in it.
pub(crate) fn bind_iommufd(device: &impl AsRawFd, iommufd: &impl AsRawFd) -> Result<u32, Errno> {
    let mut bind = vfio_device_bind_iommufd {
        argsz: argsz::<vfio_device_bind_iommufd>(),
        flags: 0,
        iommufd: iommufd.as_raw_fd(),
        ..Default::default()
    };
    // SAFETY: `bind` is a valid, argsz-prefixed struct with flags 0 (so the optional token pointer is
    // not read); the kernel writes out_devid.
    unsafe { device_bind_iommufd(device.as_raw_fd(), &mut bind) }?;
    Ok(bind.out_devid)
}

/// `VFIO_DEVICE_ATTACH_IOMMUFD_PT`: attaches a bound device to the IOAS (or page table) `pt_id`.
pub(crate) fn attach_pt(device: &impl AsRawFd, pt_id: u32) -> Result<(), Errno> {
    let mut attach = vfio_device_attach_iommufd_pt {
        argsz: argsz::<vfio_device_attach_iommufd_pt>(),
        flags: 0,
        pt_id,
        pasid: 0,
    };
    // SAFETY: `attach` is a valid, argsz-prefixed struct with flags 0 (no PASID); the kernel may write
    // back pt_id.
    unsafe { device_attach_iommufd_pt(device.as_raw_fd(), &mut attach) }?;
    Ok(())
}

/// `IOMMU_IOAS_ALLOC`: a new, empty IOAS in the iommufd; returns its id.
pub(crate) fn alloc_ioas(iommufd: &impl AsRawFd) -> Result<u32, Errno> {
    let mut alloc = iommu_ioas_alloc {
        size: argsz::<iommu_ioas_alloc>(),
        flags: 0,
        out_ioas_id: 0,
    };
    // SAFETY: `alloc` is a valid, size-prefixed iommu_ioas_alloc the kernel fills in.
    unsafe { ioas_alloc(iommufd.as_raw_fd(), &mut alloc) }?;
    Ok(alloc.out_ioas_id)
}

/// `IOMMU_IOAS_MAP` at a fixed IOVA, read+write.
///
/// # Safety
///
/// As for [`raw_type1_map`]: `vaddr..vaddr+size` stays mapped in this process until
/// [`raw_ioas_unmap`] of the range succeeds, and no Rust reference to it is live meanwhile.
pub unsafe fn raw_ioas_map(
    iommufd: &impl AsRawFd,
    ioas_id: u32,
    iova: u64,
    size: u64,
    vaddr: u64,
) -> Result<(), Errno> {
    let mut map = iommu_ioas_map {
        size: argsz::<iommu_ioas_map>(),
        flags: iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA
            | iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE
            | iommufd_ioas_map_flags_IOMMU_IOAS_MAP_WRITEABLE,
        ioas_id,
        __reserved: 0,
        user_va: vaddr,
        length: size,
        iova,
    };
    // SAFETY: `map` is a valid, size-prefixed iommu_ioas_map; the caller guarantees the memory contract.
    unsafe { ioas_map(iommufd.as_raw_fd(), &mut map) }?;
    Ok(())
}

/// `IOMMU_IOAS_UNMAP`; returns the number of bytes the kernel unmapped.
pub fn raw_ioas_unmap(
    iommufd: &impl AsRawFd,
    ioas_id: u32,
    iova: u64,
    size: u64,
) -> Result<u64, Errno> {
    let mut unmap = iommu_ioas_unmap {
        size: argsz::<iommu_ioas_unmap>(),
        ioas_id,
        iova,
        length: size,
    };
    // SAFETY: `unmap` is a valid, size-prefixed iommu_ioas_unmap the kernel reads and writes back.
    unsafe { ioas_unmap(iommufd.as_raw_fd(), &mut unmap) }?;
    Ok(unmap.length)
}
