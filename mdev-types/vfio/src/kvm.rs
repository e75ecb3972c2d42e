//! The KVM attach check: could a KVM guest take this device?
//!
//! Creates a throwaway VM whose only memory slot is the vm-memory DMA buffer, creates the kvm-vfio
//! pseudo device (`KVM_CREATE_DEVICE` with `KVM_DEV_TYPE_VFIO`, Documentation/virt/kvm/devices/vfio.rst)
//! and opens the device through vfio-ioctls with that pseudo device, which adds the group file (type1)
//! or the device cdev (iommufd) to it (`KVM_DEV_VFIO_FILE_ADD`); then maps the same memory for DMA and
//! unmaps it. Closing removes the file again (`KVM_DEV_VFIO_FILE_DEL`) before the VM goes away.
//!
//! Without a usable `/dev/kvm` (missing, not permitted, or `KVM_CREATE_VM` refused) the check is
//! skipped with the reason; it never reports success it did not see.

use std::path::Path;
use std::sync::Arc;

use kvm_bindings::{
    kvm_create_device, kvm_device_type_KVM_DEV_TYPE_VFIO, kvm_userspace_memory_region,
};
use kvm_ioctls::{Kvm, VmFd};
use vfio_ioctls::VfioDeviceFd;

use super::{DmaBuffer, Session, StepOutcome, TargetState, VfioBackend};

/// Errnos that mean "KVM is not usable here" rather than "KVM refused this device".
fn unusable(errno: i32) -> bool {
    matches!(
        nix::errno::Errno::from_raw(errno),
        nix::errno::Errno::ENOENT
            | nix::errno::Errno::ENODEV
            | nix::errno::Errno::ENXIO
            | nix::errno::Errno::EACCES
            | nix::errno::Errno::EPERM
            | nix::errno::Errno::EOPNOTSUPP
    )
}

fn errno_text(e: &kvm_ioctls::Error) -> String {
    nix::errno::Errno::from_raw(e.errno()).desc().to_string()
}

/// Runs the check for an inspected target over `backend`, with a `dma_size`-byte VM memory.
pub fn attach_check(state: &TargetState, backend: VfioBackend, dma_size: usize) -> StepOutcome {
    if !Path::new("/dev/kvm").exists() {
        return StepOutcome::Skipped(
            "/dev/kvm does not exist (kvm module not loaded, or no hardware virtualization)".into(),
        );
    }
    // Declared first so it drops last: after the session (closed inside `attach`) and the VM.
    let buffer = match DmaBuffer::new(dma_size) {
        Ok(b) => b,
        Err(e) => return StepOutcome::Failed(e.to_string()),
    };
    let kvm = match Kvm::new() {
        Ok(k) => k,
        Err(e) if unusable(e.errno()) => {
            return StepOutcome::Skipped(format!("/dev/kvm cannot be opened: {}", errno_text(&e)));
        }
        Err(e) => {
            return StepOutcome::Failed(format!("opening /dev/kvm failed: {}", errno_text(&e)));
        }
    };
    let vm = match kvm.create_vm() {
        Ok(vm) => vm,
        Err(e) if unusable(e.errno()) => {
            return StepOutcome::Skipped(format!(
                "KVM is unusable: KVM_CREATE_VM failed: {}",
                errno_text(&e)
            ));
        }
        Err(e) => return StepOutcome::Failed(format!("KVM_CREATE_VM failed: {}", errno_text(&e))),
    };
    match attach(state, backend, &vm, &buffer) {
        Ok(text) => StepOutcome::Passed(text),
        Err(text) => StepOutcome::Failed(text),
    }
}

fn attach(
    state: &TargetState,
    backend: VfioBackend,
    vm: &VmFd,
    buffer: &DmaBuffer,
) -> Result<String, String> {
    let host = buffer.host_addr().map_err(|e| e.to_string())?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: buffer.iova(),
        memory_size: buffer.size() as u64,
        userspace_addr: host as u64,
    };
    // SAFETY: the region is `buffer`'s anonymous mapping, valid for `memory_size` bytes; the VM never
    // runs a vCPU, and attach_check drops the VM before `buffer`.
    unsafe { vm.set_user_memory_region(region) }.map_err(|e| {
        format!(
            "KVM_SET_USER_MEMORY_REGION of {} bytes failed: {}",
            buffer.size(),
            errno_text(&e)
        )
    })?;
    let mut create = kvm_create_device {
        type_: kvm_device_type_KVM_DEV_TYPE_VFIO,
        fd: 0,
        flags: 0,
    };
    let dev = vm
        .create_device(&mut create)
        .map_err(|e| format!("creating the kvm-vfio device (KVM_DEV_TYPE_VFIO) failed: {} (is the kernel built with CONFIG_KVM_VFIO?)", errno_text(&e)))?;
    let handle = Arc::new(VfioDeviceFd::new_from_kvm(dev));
    let mut session =
        Session::open_backend(backend, Some(handle), &state.target).map_err(|e| e.to_string())?;
    session
        .open_device(state)
        .map_err(|e| format!("{e} (while adding it to the kvm-vfio device)"))?;
    session.map(buffer).map_err(|e| e.to_string())?;
    session.unmap(buffer).map_err(|e| e.to_string())?;
    session.close();
    let what = match backend {
        VfioBackend::Type1 => format!("group {} file", state.iommu_group),
        VfioBackend::Iommufd => format!("device cdev {}", state.cdev.as_deref().unwrap_or("vfio?")),
    };
    Ok(format!(
        "throwaway VM with {} bytes of guest memory; {what} added to kvm-vfio (KVM_DEV_VFIO_FILE_ADD); the same memory mapped and unmapped for DMA",
        buffer.size()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::errno::Errno as libc_errno;

    #[test]
    fn missing_or_forbidden_kvm_is_unusable_not_failed() {
        for e in [libc_errno::ENOENT, libc_errno::EACCES, libc_errno::ENXIO] {
            assert!(unusable(e as i32), "{e}");
        }
        for e in [libc_errno::EINVAL, libc_errno::ENOMEM, libc_errno::EBUSY] {
            assert!(!unusable(e as i32), "{e}");
        }
    }
}
