//! libvirt, QEMU and mdevctl glue for vgpu-manager devices.
//!
//! - [`hostdev`]: libvirt `<hostdev>` elements for mdev instances and whole PCI functions (VFs);
//! - [`domain`]: a complete example VDI domain;
//! - [`metadata`]: vgpu-manager's element in a domain's `<metadata>` (what each mdev should be);
//! - [`parse`]: reading a domain XML (as libvirt gives it to hooks) for its host devices and metadata;
//! - [`qemu`]: `-device` arguments for QEMU without libvirt;
//! - [`mdevctl`]: mdevctl's JSON shapes and `/etc/mdevctl.d` files;
//! - [`escape`]: XML escaping used by all of the above.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod domain;
pub mod escape;
pub mod hostdev;
pub mod mdevctl;
pub mod metadata;
pub mod parse;
pub mod qemu;

pub use domain::{DomainError, DomainSpec};
pub use hostdev::{Hostdev, MdevDisplay, PciHostdev, VfBinding, mdev_hostdev_xml, pci_hostdev_xml};
pub use metadata::{METADATA_NS, VgpuRequest, VgpuTarget};
pub use parse::{DomainDevices, MdevHostdevRef, ParseError, parse_domain};
pub use qemu::{mdev_qemu_args, pci_qemu_args};
