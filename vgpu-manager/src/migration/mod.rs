//! Live migration of VMs with vGPUs, the host side: what must match between the source and the target
//! host for a device's migration state to load ([`Fingerprint`], read from sysfs), and whether this
//! host can take an instance described by one ([`check`], every reason when it cannot).
//!
//! The kernel's VFIO migration uAPI v2 is vendor-neutral (include/uapi/linux/vfio.h,
//! `VFIO_DEVICE_FEATURE_MIGRATION`); what a device supports of it is read by
//! [`vgpu_vfio::migration_support`]. The state a source device saves is loaded by a target device of
//! the same mdev type, made by the same parent driver build: drivers refuse (or misread) state of
//! another version (drivers/vfio/pci/mlx5, samples/vfio-mdev/mtty.c check a magic and version in the
//! stream; NVIDIA's vGPU guide, "Requirements for VM migration": same vGPU type and compatible driver
//! versions), and an in-tree driver's build is pinned by the kernel release.

mod check;
mod domain_xml;
mod fingerprint;

pub use check::{Candidate, Verdict, check};
pub use domain_xml::{DomainXmlError, retarget_domain_xml};
pub use fingerprint::{FINGERPRINT_SCHEMA, Fingerprint, MigrationError, fingerprint};

#[cfg(test)]
mod tests;
