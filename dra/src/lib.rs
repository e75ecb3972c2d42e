//! `vgpu-dra-plugin`: a Kubernetes Dynamic Resource Allocation (DRA) kubelet plugin that gives pods
//! (KubeVirt VMs above all) vGPUs made by vgpud.
//!
//! The kubelet finds the plugin through its registration socket ([`grpc::RegistrationService`]) and
//! calls the DRA service ([`grpc::DraService`]) to prepare a claim before the pod's containers start
//! and to unprepare it after they stop. Preparing ([`driver::Driver`]) reads the claim's allocation
//! from the API server ([`claim`]), maps each allocated device name ([`device_name`]) to a GPU and a
//! profile, has vgpud make the vGPU ([`vgpud`]; a VF-backed one as a pool of one slot, [`vf_slot`]), and writes the CDI spec ([`cdi`]) and the
//! device-metadata file KubeVirt reads ([`metadata`]; [`files`] writes both), all recorded in a
//! crash-safe two-phase [`checkpoint`]; [`health`] streams the prepared devices' health to the
//! kubelet. `docs/dra.md` is the operator's guide.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod device_name;
pub mod driver;
pub mod files;
pub mod fsutil;
pub mod grpc;
pub mod health;
pub mod metadata;
pub mod pb;
pub mod plugin;
pub mod publish;
pub mod slices;
pub mod vf_slot;
pub mod vgpud;
