//! libvirt, QEMU and mdevctl output for vgpu-manager devices.
#![deny(missing_docs)]
