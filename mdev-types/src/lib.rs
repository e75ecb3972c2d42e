//! The vGPU device model of vgpu-manager: pure data and parsers, no I/O and no unsafe code.
//!
//! * [`ids`] — identifiers (PCI addresses, mdev UUIDs, type ids, vendor/device ids).
//! * [`parse`] — pure parsers for every sysfs attribute text we read.
//! * [`model`] — what discovery reports: PCI devices, mdev parents and types, SR-IOV PFs and VFs.
//! * [`fault`] — devices discovery could not read, each with its path, cause and fix.
//! * [`vfio_api`] — what VFIO opens and how, and an opened device's file descriptors (data only).
//!
//! The layers above: `vgpu-host` (the one boundary to the kernel, discovery, lifecycle operations),
//! `vgpu-sim` (a simulated host behind that boundary), `vgpu-vfio` (VFIO/KVM ioctls, the only crate
//! with unsafe code).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod fault;
pub mod ids;
pub mod model;
pub mod parse;
pub mod vfio_api;
