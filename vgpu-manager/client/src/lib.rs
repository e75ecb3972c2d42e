//! The client of vgpud's D-Bus API: bus selection, typed proxies, the wire types both sides serialize,
//! object paths, the client error, and a small high-level API — [`Client`] (async) and
//! [`blocking::Client`] (for programs without an async runtime, such as the libvirt hook) — so that
//! front ends (`vgpuctl`, the libvirt hook, the mdevctl front end, orchestration plugins) need not know
//! the daemon's internals. It links neither KVM, VFIO nor the simulator: its model types come from the
//! pure `mdev-types` crate.
//!
//! The API: `/org/vgpumanager/Manager1` serves `org.vgpumanager.Manager1` and the standard ObjectManager;
//! one object per GPU (`org.vgpumanager.Gpu1`) and per instance (`org.vgpumanager.Instance1`) lives below
//! it (see [`gpu_path`], [`instance_path`] and their inverses [`gpu_id`], [`instance_uuid`]).
//! `data/org.vgpumanager.Manager1.xml` is the introspection, `docs/json.md` the JSON reports.
//!
//! # Example
//!
//! Create a transient instance of a profile and show where it landed, from a program that has no async
//! runtime of its own:
//!
//! ```no_run
//! use vgpu_client::{BusAddress, NewInstance, blocking};
//!
//! # fn main() -> Result<(), vgpu_client::ClientError> {
//! let bus: BusAddress = "system".parse()?;
//! let client = blocking::Client::connect(&bus)?;
//! let mut request = NewInstance::of_profile("vdi-2g");
//! request.label = Some("desk-07".into());
//! let instance = client.create(&request)?;
//! println!("{} on {} ({})", instance.uuid, instance.gpu, instance.state);
//! # Ok(())
//! # }
//! ```
//!
//! The same with the async [`Client`], inside a Tokio runtime:
//!
//! ```no_run
//! # async fn demo() -> Result<(), vgpu_client::ClientError> {
//! use vgpu_client::{BusAddress, Client, NewInstance};
//!
//! let client = Client::connect(&BusAddress::System).await?;
//! let instance = client.create(&NewInstance::of_type("nvidia-231")).await?;
//! for gpu in client.list_gpus().await? {
//!     println!("{}: {} instances", gpu.id, gpu.instances.len());
//! }
//! client.destroy(&instance.uuid).await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod api;
pub mod blocking;
mod bus;
mod error;
mod handoff;
pub mod offers;
mod paths;
pub mod pools;
pub mod private;
pub mod proxy;
pub mod sched;
pub mod wire;

pub use api::{Client, NewInstance, PoolProgress, PrepareOptions, TargetKind};
pub use bus::{BusAddress, connect, connect_daemon, runtime};
pub use error::ClientError;
pub use offers::{GpuOffers, ProfileOffer, VfOffers};
pub use paths::{
    escape_path_element, gpu_id, gpu_path, instance_path, instance_uuid, manager_path,
};
pub use pools::{PoolGpu, PoolRemoval, PoolStatus, PoolSummary, SchedulingView, SlotRow};
pub use proxy::{Gpu1Proxy, Instance1Proxy, Manager1Proxy};
pub use sched::{SchedState, SlotState};
pub use wire::{DefinitionInfo, FaultInfo, GpuInfo, InstanceInfo, TypeSlot};

/// The daemon's well-known bus name.
pub const SERVICE: &str = "org.vgpumanager.Manager1";
/// The path of the manager object (and of the ObjectManager for all objects below it).
pub const MANAGER_PATH: &str = "/org/vgpumanager/Manager1";
/// The D-Bus interface of the manager object at [`MANAGER_PATH`].
pub const MANAGER_INTERFACE: &str = "org.vgpumanager.Manager1";
/// The D-Bus interface of each GPU object.
pub const GPU_INTERFACE: &str = "org.vgpumanager.Gpu1";
/// The D-Bus interface of each mdev or VF instance object.
pub const INSTANCE_INTERFACE: &str = "org.vgpumanager.Instance1";
/// Prefix of the daemon's D-Bus error names: `org.vgpumanager.Error.<Kind>`.
pub const ERROR_PREFIX: &str = "org.vgpumanager.Error";
/// The Unix group whose members may call mutating methods (besides root).
pub const ADMIN_GROUP: &str = "vgpu-admin";
/// The polkit action checked for mutating calls where polkit runs.
pub const POLKIT_ACTION: &str = "org.vgpumanager.manage";

/// The `target_kind` argument of `Create`/`Define` that names a profile ([`TargetKind::Profile`]).
pub const TARGET_PROFILE: &str = "profile";
/// The `target_kind` argument of `Create`/`Define` that names an exact mdev type
/// ([`TargetKind::Type`]).
pub const TARGET_TYPE: &str = "type";
