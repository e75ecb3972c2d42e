//! An open VFIO device through vfio-ioctls, with the DMA buffer it maps.

use std::sync::Arc;

use iommufd_ioctls::IommuFd;
use vfio_ioctls::{VfioContainer, VfioDevice, VfioDeviceFd, VfioIommufd, VfioOps};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::info::DeviceInfo;
use super::{TargetState, VfioBackend, VfioCheckError, VfioTarget, chain, ids_from_config, sys};
use mdev_types::ids::PciId;

/// Why [`DmaBuffer::raw_type1_map`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawMapError {
    /// The buffer's host address could not be read.
    #[error(transparent)]
    Buffer(VfioCheckError),
    /// `VFIO_IOMMU_MAP_DMA` failed with this errno.
    #[error("VFIO_IOMMU_MAP_DMA failed: {0}")]
    Ioctl(nix::errno::Errno),
}

/// Anonymous memory for DMA, allocated through vm-memory (`GuestMemoryMmap`, one region at IOVA/guest
/// address 0), as a VMM allocates guest RAM.
pub struct DmaBuffer {
    mem: GuestMemoryMmap,
    size: usize,
}

impl DmaBuffer {
    /// Allocates `size` bytes (a multiple of the page size).
    pub fn new(size: usize) -> Result<Self, VfioCheckError> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size)]).map_err(|e| {
            VfioCheckError::Memory {
                size,
                detail: chain(&e),
            }
        })?;
        Ok(Self { mem, size })
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The IOVA (and guest physical address) it is mapped at.
    pub fn iova(&self) -> u64 {
        0
    }

    /// The host virtual address of its first byte.
    pub fn host_addr(&self) -> Result<*mut u8, VfioCheckError> {
        self.mem
            .get_host_address(GuestAddress(0))
            .map_err(|e| VfioCheckError::Memory {
                size: self.size,
                detail: chain(&e),
            })
    }

    /// `VFIO_IOMMU_MAP_DMA` of the whole buffer at its IOVA on a type1 container through the raw
    /// ioctl, without vfio-ioctls: the baseline a benchmark compares [`Session::map`] with. Undo it
    /// with [`sys::raw_type1_unmap`] of the same range; the kernel drops the mapping with the
    /// container too.
    pub fn raw_type1_map(&self, container: &impl std::os::fd::AsRawFd) -> Result<(), RawMapError> {
        let host = self.host_addr().map_err(RawMapError::Buffer)? as u64;
        // SAFETY: `host..host+size` is the anonymous mapping `self` owns and keeps mapped while it
        // lives; nothing in this crate holds a Rust reference into it, and the mapping is removed
        // (unmapped, or the container closed) before the buffer is dropped, as for `Session::map`.
        unsafe { sys::raw_type1_map(container, self.iova(), self.size as u64, host) }
            .map_err(RawMapError::Ioctl)
    }

    /// The vm-memory object (for KVM memory slots).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }
}

/// An open VFIO backend (type1 container or iommufd) and, once opened, one device in it.
///
/// Field order is drop order: the device closes before the backend (vfio-ioctls releases the group
/// from the container when the device drops).
pub struct Session {
    device: Option<VfioDevice>,
    ops: Arc<dyn VfioOps>,
    container: Option<Arc<VfioContainer>>,
    iommufd: Option<Arc<VfioIommufd>>,
    target: VfioTarget,
    backend: VfioBackend,
}

impl Session {
    /// Opens the backend: `/dev/vfio/vfio` (checking the API version and TYPE1v2 support) or
    /// `/dev/iommu` with a fresh IOAS. `kvm` is a kvm-vfio device the group or device file is added to.
    pub fn open_backend(
        backend: VfioBackend,
        kvm: Option<Arc<VfioDeviceFd>>,
        target: &VfioTarget,
    ) -> Result<Self, VfioCheckError> {
        let err = |op: &str, e: &dyn std::error::Error| VfioCheckError::Vfio {
            op: op.to_string(),
            target: *target,
            detail: chain(e),
        };
        let (ops, container, iommufd): (Arc<dyn VfioOps>, _, _) = match backend {
            VfioBackend::Type1 => {
                let c = Arc::new(
                    VfioContainer::new(kvm)
                        .map_err(|e| err("opening the VFIO container /dev/vfio/vfio", &e))?,
                );
                (c.clone(), Some(c), None)
            }
            VfioBackend::Iommufd => {
                let fd = IommuFd::new().map_err(|e| err("opening /dev/iommu", &e))?;
                let i = Arc::new(
                    VfioIommufd::new(Arc::new(fd), None, kvm)
                        .map_err(|e| err("allocating an iommufd IOAS", &e))?,
                );
                (i.clone(), None, Some(i))
            }
        };
        Ok(Self {
            device: None,
            ops,
            container,
            iommufd,
            target: *target,
            backend,
        })
    }

    /// Opens the device: through its group (type1: `/dev/vfio/<group>`, VFIO_GROUP_GET_DEVICE_FD) or its
    /// cdev (iommufd: bind to the iommufd, attach to the IOAS).
    pub fn open_device(&mut self, state: &TargetState) -> Result<(), VfioCheckError> {
        let path = vgpu_host::paths::vfio_target(&self.target);
        let dev = VfioDevice::new(&path, self.ops.clone(), true).map_err(|e| {
            let hint = match self.backend {
                VfioBackend::Type1 => format!(
                    " (is /dev/vfio/{} open elsewhere, or is another device in group {} on a host driver? `vgpuctl viability` tells)",
                    state.iommu_group, state.iommu_group
                ),
                VfioBackend::Iommufd => " (is the device's cdev open elsewhere?)".to_string(),
            };
            VfioCheckError::Vfio {
                op: format!("opening the device through the {}", self.backend),
                target: self.target,
                detail: format!("{}{hint}", chain(&e)),
            }
        })?;
        self.device = Some(dev);
        Ok(())
    }

    /// The open device, for the feature ioctls of [`super::sys`].
    pub(crate) fn open_device_fd(&self) -> Result<&VfioDevice, VfioCheckError> {
        self.device()
    }

    /// The device this session is for.
    pub(crate) fn target(&self) -> &VfioTarget {
        &self.target
    }

    fn device(&self) -> Result<&VfioDevice, VfioCheckError> {
        self.device.as_ref().ok_or_else(|| VfioCheckError::Vfio {
            op: "using the device".into(),
            target: self.target,
            detail: "it is not open".into(),
        })
    }

    /// Reads flags, regions and IRQs.
    pub fn device_info(&self) -> Result<DeviceInfo, VfioCheckError> {
        DeviceInfo::read(self.device()?).map_err(|(op, e)| VfioCheckError::Vfio {
            op: op.to_string(),
            target: self.target,
            detail: e.desc().to_string(),
        })
    }

    /// Reads vendor and device id from the PCI config region (offset 0 of region 7).
    pub fn config_ids(&self) -> Result<(PciId, PciId), VfioCheckError> {
        read_config_ids(self.device()?, &self.target)
    }

    /// Maps `buf` for DMA at its IOVA, read and write.
    pub fn map(&self, buf: &DmaBuffer) -> Result<(), VfioCheckError> {
        let host = buf.host_addr()?;
        // SAFETY: `host..host+size` is the anonymous mmap owned by `buf` (vm-memory's GuestMemoryMmap).
        // No Rust reference into it exists while it is mapped: nothing in this crate reads or writes the
        // buffer, and callers unmap (or close the session, which drops the mapping with the container or
        // IOAS) before dropping `buf`. The kernel pins the pages for the lifetime of the mapping.
        unsafe { self.ops.vfio_dma_map(buf.iova(), buf.size(), host) }.map_err(|e| {
            VfioCheckError::Vfio {
                op: format!("mapping {} bytes for DMA at IOVA 0x{:x}", buf.size(), buf.iova()),
                target: self.target,
                detail: format!("{} (a failed pin is usually RLIMIT_MEMLOCK: raise it, e.g. LimitMEMLOCK=infinity)", chain(&e)),
            }
        })
    }

    /// Unmaps `buf`.
    pub fn unmap(&self, buf: &DmaBuffer) -> Result<(), VfioCheckError> {
        self.ops
            .vfio_dma_unmap(buf.iova(), buf.size())
            .map_err(|e| VfioCheckError::Vfio {
                op: format!("unmapping {} bytes at IOVA 0x{:x}", buf.size(), buf.iova()),
                target: self.target,
                detail: chain(&e),
            })
    }

    /// The type1 container, for the benchmark's raw ioctl baseline.
    pub fn container(&self) -> Option<&VfioContainer> {
        self.container.as_deref()
    }

    /// The VFIO backend this session opened the device with (type1 or iommufd).
    pub fn backend(&self) -> VfioBackend {
        self.backend
    }

    /// Closes the device, then the group/container or IOAS/iommufd.
    pub fn close(self) {
        drop(self);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The device first: vfio-ioctls detaches it from the IOAS or releases its group from the
        // container, which needs the backend still open.
        self.device.take();
        self.iommufd.take();
        self.container.take();
    }
}

/// Reads vendor and device id through a VFIO device fd: offset 0 of its PCI config region (index 7).
pub(super) fn read_config_ids(
    dev: &impl std::os::fd::AsRawFd,
    target: &VfioTarget,
) -> Result<(PciId, PciId), VfioCheckError> {
    let not_pci = || VfioCheckError::Vfio {
        op: "finding the PCI config region".into(),
        target: *target,
        detail: "the device reports no config region of at least 4 bytes (not a vfio-pci device?)"
            .into(),
    };
    let (_, size, offset) =
        sys::region_info(dev, super::info::CONFIG_REGION).map_err(|_| not_pci())?;
    if size < 4 {
        return Err(not_pci());
    }
    let mut buf = [0u8; 4];
    let n = sys::read_at(dev, &mut buf, offset).map_err(|e| VfioCheckError::Vfio {
        op: "reading the PCI config region".into(),
        target: *target,
        detail: e.desc().to_string(),
    })?;
    if n != 4 {
        return Err(VfioCheckError::Vfio {
            op: "reading the PCI config region".into(),
            target: *target,
            detail: format!("short read: {n} of 4 bytes"),
        });
    }
    let (v, d) = ids_from_config(buf);
    if v.0 == 0xffff {
        return Err(VfioCheckError::Vfio {
            op: "reading the PCI config region".into(),
            target: *target,
            detail: "vendor reads 0xffff: the device does not respond (powered off or gone)".into(),
        });
    }
    Ok((v, d))
}
