//! Device model and hardware boundary of vgpu-manager.
//!
//! * [`ids`] — identifiers (PCI addresses, mdev UUIDs, type ids, vendor/device ids).
//! * [`parse`] — pure parsers for every sysfs attribute text we read.
//! * [`model`] — what discovery reports: PCI devices, mdev parents and types, SR-IOV PFs and VFs.
//! * [`host`] — the one boundary to the kernel ([`host::Host`]) with a real ([`host::SysfsHost`]) and a
//!   simulated ([`host::sim::SimHost`]) implementation.
//! * [`discover`] — builds the model from any [`host::Host`].
//! * [`ops`] — lifecycle operations (mdev create/remove, SR-IOV, driver binding) with typed errors.
//! * [`vfio`] — VFIO preflight (type1 or iommufd, device info, DMA map) and the KVM attach check.
//! * [`viability`] — may a device be handed to a guest (IOMMU group members, boot VGA, PF with VFs).
#![deny(missing_docs)]

pub mod discover;
pub mod host;
pub mod ids;
pub mod model;
pub mod ops;
pub mod parse;
pub mod vfio;
pub mod viability;
