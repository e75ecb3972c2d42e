//! Opening a device for another process: the daemon, which may open `/dev/vfio`, opens the device and
//! its IOMMU context and hands the fds to an unprivileged VMM (over D-Bus, `Instance1.OpenDevice`); the
//! VMM then reads the device and maps its memory for DMA through them without any rights of its own.
//!
//! The sequences are the raw ioctls of [`super::sys`], not vfio-ioctls' objects: those detach the group
//! from its container (or the device from its IOAS) when dropped, and the daemon drops its copies right
//! after sending them.
//!
//! - type1: `/dev/vfio/vfio` (API version, TYPE1v2), `/dev/vfio/<group>` (viable), SET_CONTAINER,
//!   SET_IOMMU, GET_DEVICE_FD. The group fd is closed afterwards: the device fd holds a reference to the
//!   group file, so the group stays in the container while the device is open (drivers/vfio/group.c,
//!   `vfio_group_fops_release`: "Device FDs hold a group file reference").
//! - iommufd: `/dev/iommu`, `/dev/vfio/devices/vfioN`, BIND_IOMMUFD, IOAS_ALLOC, ATTACH_IOMMUFD_PT
//!   (Documentation/driver-api/vfio.rst, "VFIO device cdev"); the receiver maps into that IOAS.

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

use nix::errno::Errno;
use vfio_bindings::bindings::vfio::{
    VFIO_API_VERSION, VFIO_GROUP_FLAGS_VIABLE, VFIO_TYPE1v2_IOMMU,
};

use super::info::DeviceInfo;
use super::{
    DmaBuffer, OpenedDevice, PreflightReport, PreflightStep, StepOutcome, Steps, TargetState,
    VfioBackend, VfioCheckError, VfioTarget, ensure_live, inspect, read_config_ids,
    resolve_backend, sys,
};

/// An fd-level failure as a [`VfioCheckError`] naming the operation and the fix where one is known.
fn failed(target: &VfioTarget, op: String, e: Errno, hint: &str) -> VfioCheckError {
    VfioCheckError::Vfio {
        op,
        target: *target,
        detail: format!("{}{hint}", e.desc()),
    }
}

fn open_rw(target: &VfioTarget, path: &Path, busy_hint: &str) -> Result<OwnedFd, VfioCheckError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| {
            let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
            let hint = match errno {
                Errno::EBUSY => busy_hint,
                Errno::EACCES | Errno::EPERM => {
                    " (only root may open it: ask vgpud for the fds with Instance1.OpenDevice)"
                }
                Errno::ENOENT => " (the VFIO driver is not loaded or devtmpfs lacks the node)",
                _ => "",
            };
            failed(target, format!("opening {}", path.display()), errno, hint)
        })
}

/// The VFIO operations on an [`OpenedDevice`] (a plain-data type of `mdev-types`, so clients can
/// receive one without linking VFIO): opening one, binding it, reading it, mapping DMA through it.
pub trait OpenedDeviceExt: Sized {
    /// Opens `target` for hand-off through the backend `forced`, or the automatic choice. With `bind`
    /// the device is ready for DMA mappings (type1: group in a container with TYPE1v2 set; iommufd:
    /// cdev bound and attached to a fresh IOAS); without, the cdev and the iommufd are handed over
    /// as they are (iommufd only: a type1 device fd exists only once its group is in a container).
    /// Nothing stays open in this process once the returned value is dropped (or its fds are sent and
    /// closed).
    fn open(
        host: &dyn vgpu_host::Host,
        target: &VfioTarget,
        forced: Option<VfioBackend>,
        bind: bool,
    ) -> Result<Self, VfioCheckError>;

    /// Binds an unbound iommufd hand-off to its iommufd and attaches it to a new IOAS (what a VMM
    /// does with the fds); returns the IOAS id. Already attached: returns it.
    fn bind_and_attach(&mut self) -> Result<u32, VfioCheckError>;

    /// Reads flags, regions and IRQs through the device fd.
    fn device_info(&self) -> Result<DeviceInfo, VfioCheckError>;

    /// Maps `buf` for DMA at its IOVA, read and write, through the container or IOAS.
    fn map(&self, buf: &DmaBuffer) -> Result<(), VfioCheckError>;

    /// Unmaps `buf`.
    fn unmap(&self, buf: &DmaBuffer) -> Result<(), VfioCheckError>;

    /// Proves the fds work the way a VMM uses them: device info, config ids, a DMA map and unmap of
    /// `dma_size` bytes. A failed step is in the report (as in [`super::preflight`]).
    /// An unbound iommufd hand-off is bound and attached first (step `bind-attach`).
    fn check(&mut self, dma_size: usize) -> PreflightReport;
}

impl OpenedDeviceExt for OpenedDevice {
    fn open(
        host: &dyn vgpu_host::Host,
        target: &VfioTarget,
        forced: Option<VfioBackend>,
        bind: bool,
    ) -> Result<OpenedDevice, VfioCheckError> {
        let state = inspect(host, target)?;
        ensure_live(host, &state)?;
        let (backend, why) = resolve_backend(host, &state, forced)?;
        match backend {
            VfioBackend::Type1 if !bind => Err(VfioCheckError::BackendUnavailable {
                backend: VfioBackend::Iommufd,
                target: *target,
                reason: format!(
                    "an unbound hand-off needs the device's cdev and /dev/iommu, and the type1 container was {}",
                    if forced.is_some() {
                        "forced".to_string()
                    } else {
                        why
                    }
                ),
            }),
            VfioBackend::Type1 => open_type1(&state),
            VfioBackend::Iommufd => open_iommufd(&state, bind),
        }
    }

    fn bind_and_attach(&mut self) -> Result<u32, VfioCheckError> {
        if let Some(ioas) = self.ioas_id {
            return Ok(ioas);
        }
        if self.backend != VfioBackend::Iommufd {
            return Err(VfioCheckError::Vfio {
                op: "binding the device".into(),
                target: self.target,
                detail: "a type1 device is bound when its fd is made".into(),
            });
        }
        let ioas = attach_iommufd(&self.device, &self.iommu, &self.target)?;
        self.ioas_id = Some(ioas);
        Ok(ioas)
    }

    fn device_info(&self) -> Result<DeviceInfo, VfioCheckError> {
        DeviceInfo::read(&self.device).map_err(|(op, e)| VfioCheckError::Vfio {
            op: op.to_string(),
            target: self.target,
            detail: e.desc().to_string(),
        })
    }

    fn map(&self, buf: &DmaBuffer) -> Result<(), VfioCheckError> {
        let host = buf.host_addr()? as u64;
        let (iova, size) = (buf.iova(), buf.size() as u64);
        // SAFETY: `host..host+size` is the anonymous mmap owned by `buf`; nothing in this crate holds a
        // Rust reference into it, and callers unmap (or close the fds, which drops the mapping with the
        // container or IOAS) before dropping `buf`.
        let r = unsafe {
            match (self.backend, self.ioas_id) {
                (VfioBackend::Iommufd, Some(ioas)) => {
                    sys::raw_ioas_map(&self.iommu, ioas, iova, size, host)
                }
                _ => sys::raw_type1_map(&self.iommu, iova, size, host),
            }
        };
        r.map_err(|e| {
            failed(
                &self.target,
                format!("mapping {size} bytes for DMA at IOVA 0x{iova:x}"),
                e,
                " (a failed pin is usually RLIMIT_MEMLOCK of the mapping process: raise it, e.g. LimitMEMLOCK= or `ulimit -l`)",
            )
        })
    }

    fn unmap(&self, buf: &DmaBuffer) -> Result<(), VfioCheckError> {
        let (iova, size) = (buf.iova(), buf.size() as u64);
        let unmapped = match (self.backend, self.ioas_id) {
            (VfioBackend::Iommufd, Some(ioas)) => {
                sys::raw_ioas_unmap(&self.iommu, ioas, iova, size)
            }
            _ => sys::raw_type1_unmap(&self.iommu, iova, size),
        }
        .map_err(|e| {
            failed(
                &self.target,
                format!("unmapping {size} bytes at IOVA 0x{iova:x}"),
                e,
                "",
            )
        })?;
        if unmapped != size {
            return Err(VfioCheckError::Vfio {
                op: format!("unmapping {size} bytes at IOVA 0x{iova:x}"),
                target: self.target,
                detail: format!("the kernel unmapped {unmapped} bytes"),
            });
        }
        Ok(())
    }

    fn check(&mut self, dma_size: usize) -> PreflightReport {
        let start = Instant::now();
        let mut steps = Steps(Vec::new());
        if self.backend == VfioBackend::Iommufd && self.ioas_id.is_none() {
            steps.run("bind-attach", || {
                self.bind_and_attach()
                    .map(|ioas| ((), format!("bound to the iommufd, attached to IOAS {ioas}")))
            });
        }
        let mut device = steps.run("device-info", || {
            let i = self.device_info()?;
            let text = i.summary();
            Ok((i, text))
        });
        let ids = steps.run("config-read", || {
            let (v, d) = read_config_ids(&self.device, &self.target)?;
            Ok(((v, d), format!("vendor {v}, device {d}")))
        });
        if let (Some(info), Some((v, d))) = (device.as_mut(), ids) {
            info.vendor = Some(v);
            info.device = Some(d);
        }
        match DmaBuffer::new(dma_size) {
            Err(e) => {
                steps.0.push(PreflightStep {
                    name: "dma-map".into(),
                    outcome: StepOutcome::Failed(e.to_string()),
                    micros: 0,
                });
                steps.skip("dma-unmap", "the DMA buffer could not be allocated");
            }
            Ok(buf) => {
                let mapped = steps.run("dma-map", || {
                    self.map(&buf).map(|()| {
                        (
                            (),
                            format!("{} bytes at IOVA 0x{:x}", buf.size(), buf.iova()),
                        )
                    })
                });
                if mapped.is_some() {
                    steps.run("dma-unmap", || {
                        self.unmap(&buf)
                            .map(|()| ((), format!("{} bytes unmapped", buf.size())))
                    });
                } else {
                    steps.skip("dma-unmap", "dma-map failed");
                }
            }
        }
        let steps = steps.0;
        PreflightReport {
            target: self.target,
            iommu_group: self.iommu_group,
            backend: self.backend,
            backend_reason: "fds received from vgpud (Instance1.OpenDevice)".into(),
            passed: !steps.iter().any(|s| s.outcome.is_failed()),
            steps,
            device,
            total_micros: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }
}

/// The name VFIO knows the device by (GET_DEVICE_FD matches it against `dev_name`).
fn device_name(target: &VfioTarget) -> String {
    match target {
        VfioTarget::Pci(a) => a.to_string(),
        VfioTarget::Mdev(u) => u.to_string(),
    }
}

fn open_type1(state: &TargetState) -> Result<OpenedDevice, VfioCheckError> {
    let t = &state.target;
    let group_no = state.iommu_group;
    let container = open_rw(t, Path::new("/dev/vfio/vfio"), "")?;
    let version = sys::api_version(&container)
        .map_err(|e| failed(t, "VFIO_GET_API_VERSION".into(), e, ""))?;
    if u32::try_from(version).ok() != Some(VFIO_API_VERSION) {
        return Err(VfioCheckError::Vfio {
            op: "VFIO_GET_API_VERSION".into(),
            target: *t,
            detail: format!("the kernel speaks VFIO API {version}, we speak {VFIO_API_VERSION}"),
        });
    }
    if !sys::has_extension(&container, VFIO_TYPE1v2_IOMMU)
        .map_err(|e| failed(t, "VFIO_CHECK_EXTENSION(TYPE1v2)".into(), e, ""))?
    {
        return Err(VfioCheckError::Vfio {
            op: "VFIO_CHECK_EXTENSION(TYPE1v2)".into(),
            target: *t,
            detail: "the container lacks the TYPE1v2 IOMMU (is vfio_iommu_type1 loaded?)".into(),
        });
    }
    let group = open_rw(
        t,
        &Path::new("/dev/vfio").join(group_no.to_string()),
        " (the group is already open: by a running VMM, a preflight, or an earlier OpenDevice whose fds are still open)",
    )?;
    let flags = sys::group_status(&group).map_err(|e| {
        failed(
            t,
            format!("VFIO_GROUP_GET_STATUS of group {group_no}"),
            e,
            "",
        )
    })?;
    if flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
        return Err(VfioCheckError::Vfio {
            op: format!("checking IOMMU group {group_no}"),
            target: *t,
            detail: "the group is not viable: another device in it is on a host driver (`vgpuctl viability` names it)".into(),
        });
    }
    sys::group_attach(&group, &container).map_err(|e| {
        failed(
            t,
            format!("VFIO_GROUP_SET_CONTAINER of group {group_no}"),
            e,
            "",
        )
    })?;
    sys::set_iommu_model(&container, VFIO_TYPE1v2_IOMMU)
        .map_err(|e| failed(t, "VFIO_SET_IOMMU(TYPE1v2)".into(), e, ""))?;
    let name = device_name(t);
    let device = sys::group_device_fd(&group, &name).map_err(|e| {
        failed(
            t,
            format!("VFIO_GROUP_GET_DEVICE_FD({name})"),
            e,
            " (is the device open through its cdev, or gone?)",
        )
    })?;
    // The device fd keeps the group file (and so its container attachment) alive; see the module docs.
    drop(group);
    Ok(OpenedDevice {
        target: *t,
        iommu_group: group_no,
        backend: VfioBackend::Type1,
        device,
        iommu: container,
        ioas_id: None,
    })
}

fn open_iommufd(state: &TargetState, bind: bool) -> Result<OpenedDevice, VfioCheckError> {
    let t = &state.target;
    let cdev = state
        .cdev
        .as_deref()
        .ok_or(VfioCheckError::BackendUnavailable {
            backend: VfioBackend::Iommufd,
            target: *t,
            reason: "the device has no vfio cdev".into(),
        })?;
    let iommufd = open_rw(t, Path::new("/dev/iommu"), "")?;
    let device = open_rw(
        t,
        &Path::new("/dev/vfio/devices").join(cdev),
        " (the device is already open: by a running VMM, a preflight, or an earlier OpenDevice whose fds are still open)",
    )?;
    let ioas_id = if bind {
        Some(attach_iommufd(&device, &iommufd, t)?)
    } else {
        None
    };
    Ok(OpenedDevice {
        target: *t,
        iommu_group: state.iommu_group,
        backend: VfioBackend::Iommufd,
        device,
        iommu: iommufd,
        ioas_id,
    })
}

/// BIND_IOMMUFD, IOAS_ALLOC, ATTACH_IOMMUFD_PT: returns the IOAS id.
fn attach_iommufd(
    device: &OwnedFd,
    iommufd: &OwnedFd,
    t: &VfioTarget,
) -> Result<u32, VfioCheckError> {
    sys::bind_iommufd(device, iommufd).map_err(|e| {
        failed(
            t,
            "VFIO_DEVICE_BIND_IOMMUFD".into(),
            e,
            " (the device is already open — by a running VMM, a preflight, or an earlier OpenDevice whose fds are still open — or its group is open through the type1 API)",
        )
    })?;
    let ioas = sys::alloc_ioas(iommufd).map_err(|e| failed(t, "IOMMU_IOAS_ALLOC".into(), e, ""))?;
    sys::attach_pt(device, ioas)
        .map_err(|e| failed(t, format!("VFIO_DEVICE_ATTACH_IOMMUFD_PT({ioas})"), e, ""))?;
    Ok(ioas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_sim::SimHost;

    #[test]
    fn a_simulated_host_cannot_hand_devices_out() {
        let h = SimHost::builtin("samples").unwrap();
        let inv = vgpu_host::discover::discover(&h).unwrap();
        let Some(parent) = inv.mdev_parents.first() else {
            panic!("the samples host has mdev parents");
        };
        let ty = parent.types[0].id.clone();
        let uuid: mdev_types::ids::MdevUuid =
            "6a1f0c2e-9b3d-4c1a-8e2f-0d5b7a9c1e01".parse().unwrap();
        vgpu_host::ops::create_mdev(&h, &parent.name, &ty, &uuid).unwrap();
        let e = OpenedDevice::open(&h, &VfioTarget::Mdev(uuid), None, true).unwrap_err();
        assert!(matches!(e, VfioCheckError::NotLive { .. }), "{e}");
    }

    #[test]
    fn names_are_what_get_device_fd_matches() {
        assert_eq!(
            device_name(&VfioTarget::Pci("0000:01:00.1".parse().unwrap())),
            "0000:01:00.1"
        );
        let u = "6a1f0c2e-9b3d-4c1a-8e2f-0d5b7a9c1e01";
        assert_eq!(device_name(&VfioTarget::Mdev(u.parse().unwrap())), u);
    }

    #[test]
    fn a_missing_node_is_explained() {
        let t = VfioTarget::Mdev("6a1f0c2e-9b3d-4c1a-8e2f-0d5b7a9c1e01".parse().unwrap());
        let e = open_rw(&t, Path::new("/nonexistent/vfio/7"), "").unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("/nonexistent/vfio/7") && s.contains("not loaded"),
            "{s}"
        );
    }
}
