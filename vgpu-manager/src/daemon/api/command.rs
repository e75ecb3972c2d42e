//! The commands: one type per request, each paired with its reply type through [`Command`] (the
//! request/response pairing of cloud-hypervisor's `ApiAction`). A transport builds a command, asks
//! [`Command::ACCESS`] whether the caller must be authorized, and runs it through [`Handle`]; the reply
//! comes back typed, so no caller ever matches on a reply it did not ask for.
//!
//! Every request a client can make is a command here, including the two whose replies are not data:
//! [`Preflight`] (a report the D-Bus layer also keeps as the instance's `Health`) and [`OpenDevice`]
//! (open file descriptors, handed over by the transport). They go through the same authorization and
//! dispatch as every other command.

use std::fmt;

use mdev_types::ids::{MdevTypeId, MdevUuid};
use mdev_types::vfio_api::{OpenedDevice, VfioBackend};
use vgpu_vfio::{MigrationSupport, PreflightReport};

use super::{CoreError, GpuView, InstanceView, MdevAttr};
use crate::pool::PoolPlan;
use crate::sched::{ApplyReport, SchedPlan, SchedRequest};
use vgpu_client::{PoolStatus, PoolSummary, SchedulingView};

/// What a command may do, which decides who may send it and how a transport runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, answered from the engine's memory with no sysfs or disk I/O (a transport may run
    /// it on its async threads).
    MemoryRead,
    /// Read-only; reads sysfs or the state directory (blocking).
    Read,
    /// Changes the host or the desired state: needs authorization, and a transport that mirrors
    /// state waits for the change's events before it answers.
    Change,
    /// Holds a device for a moment or hands it out: needs authorization like a change, changes no
    /// state.
    Device,
}

impl Access {
    /// True when the caller must be authorized ([`Access::Change`] and [`Access::Device`]).
    pub fn needs_authorization(self) -> bool {
        matches!(self, Access::Change | Access::Device)
    }

    /// True for commands that change the host or the desired state.
    pub fn is_change(self) -> bool {
        self == Access::Change
    }

    /// True for commands answered from memory alone.
    pub fn is_memory_read(self) -> bool {
        self == Access::MemoryRead
    }
}

/// A request to the daemon with its reply type.
pub trait Command: fmt::Debug + Send + 'static {
    /// What the command answers on success.
    type Reply: Send + 'static;
    /// Who may send it and how it runs.
    const ACCESS: Access;
}

/// Something that executes command `C` (the engine, for every command). Blocking: it may do sysfs
/// and disk I/O. Every [`Event`](super::Event) a command causes is sent before `handle` returns.
pub trait Handle<C: Command> {
    /// Executes `cmd`.
    fn handle(&self, cmd: C) -> Result<C::Reply, CoreError>;
}

/// What an instance should be made of: a vendor-neutral profile, or a concrete mdev type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceTarget {
    /// A profile name from the catalog (`vdi-2g`); the best matching type on the chosen GPU is used.
    Profile(String),
    /// An exact mdev type id (`nvidia-231`); `gpu` must then name its parent unless only one offers it.
    Type(MdevTypeId),
}

/// What [`CreateInstance`] and [`DefineInstance`] make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSpec {
    /// The profile or mdev type it is made of.
    pub target: InstanceTarget,
    /// The GPU (PCI address or parent name); `None` lets the daemon choose.
    pub gpu: Option<String>,
    /// The UUID to use; `None` makes a random one.
    pub uuid: Option<MdevUuid>,
    /// Start it whenever the daemon starts or its parent appears (definitions only).
    pub autostart: bool,
    /// A free-form label of who asked (a VM name, a pool slot); shown as `Owner`.
    pub label: Option<String>,
    /// mdev attributes written, in order, to the device after it is created (mdevctl's `attrs`); a
    /// refused write removes the device again.
    pub attrs: Vec<MdevAttr>,
}

/// Declares a command type's [`Command`] impl.
macro_rules! command {
    ($ty:ty => $reply:ty, $access:ident) => {
        impl Command for $ty {
            type Reply = $reply;
            const ACCESS: Access = Access::$access;
        }
    };
}

/// Lists GPUs and their capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListGpus;
command!(ListGpus => Vec<GpuView>, Read);

/// What each GPU can give each profile of the catalog when it has room, with its occupancy now
/// ([`crate::profile::offers::host_offers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOffers;
command!(ListOffers => Vec<vgpu_client::GpuOffers>, Read);

/// What an instance change can alter in one GPU's view: its mdev types' available instances and its
/// running instances (a cheap re-read of one parent, not a discovery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetGpuCapacity {
    /// The GPU id ([`GpuView::id`]).
    pub id: String,
}
command!(GetGpuCapacity => GpuCapacity, Read);

/// The reply of [`GetGpuCapacity`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuCapacity {
    /// (type id, available instances) of each type, in no particular order; none when the GPU is
    /// not a registered mdev parent.
    pub types: Vec<(MdevTypeId, u32)>,
    /// The GPU's running instances.
    pub instances: Vec<MdevUuid>,
}

/// Lists instances: ours, defined-but-stopped, and foreign ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListInstances;
command!(ListInstances => Vec<InstanceView>, MemoryRead);

/// One instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetInstance {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(GetInstance => InstanceView, MemoryRead);

/// Creates and starts a transient instance (gone after [`DestroyInstance`] or a host reboot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateInstance(pub InstanceSpec);
command!(CreateInstance => InstanceView, Change);

/// Persists a definition without starting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefineInstance(pub InstanceSpec);
command!(DefineInstance => InstanceView, Change);

/// Starts a defined instance (creates its device); refused for foreign instances. Replies the
/// instance's view after the change (`None` if it vanished meanwhile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartInstance {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(StartInstance => Option<InstanceView>, Change);

/// Stops an instance (removes its device, keeps its definition); refused for foreign instances.
/// Replies the view after the change (`None` when a transient instance is gone with its device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopInstance {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(StopInstance => Option<InstanceView>, Change);

/// Removes an instance entirely: its device (if running) and its definition (if defined);
/// [`StopInstance`] removes only the device. Refused for foreign instances. Replies `None` once the
/// instance is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestroyInstance {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(DestroyInstance => Option<InstanceView>, Change);

/// Deletes a definition; a running device stays as a transient instance. Replies the view after
/// the change (`None` when nothing of the instance is left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndefineInstance {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(UndefineInstance => Option<InstanceView>, Change);

/// Sets whether a definition starts automatically. Replies the view after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAutostart {
    /// The instance's UUID.
    pub uuid: MdevUuid,
    /// The new value.
    pub autostart: bool,
}
command!(SetAutostart => Option<InstanceView>, Change);

/// Converges the host to the desired state now (normally driven by start-up and kernel events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile;
command!(Reconcile => (), Change);

/// Dry run of a pool (TOML text, the pool file format of [`crate::pool::spec`]): what applying it
/// would create, remove and keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanPool {
    /// The pool file's text.
    pub toml: String,
}
command!(PlanPool => PoolPlan, Read);

/// Makes the host match a pool: every slot an instance with its stable UUID, defined (autostart as
/// the pool says) and running. Refused before any change when a slot does not fit or needs a kind of
/// instance vgpud cannot create; a failed step undoes what this apply did. Sends
/// [`Event::PoolProgress`](super::Event::PoolProgress) after each step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyPool {
    /// The pool file's text.
    pub toml: String,
}
command!(ApplyPool => PoolSummary, Change);

/// Removes a pool: every slot it holds is given back (mdev instances destroyed, VFs released, their
/// records dropped) and the pool is forgotten. A pool vgpud does not know changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovePool {
    /// The pool's name.
    pub name: String,
}
command!(RemovePool => vgpu_client::PoolRemoval, Change);

/// Every pool applied through vgpud and the state of its slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetPoolStatus;
command!(GetPoolStatus => Vec<PoolStatus>, Read);

/// The time-slice scheduling programmed on a GPU now, read back through its vendor backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetScheduling {
    /// The GPU id (PCI address or parent name).
    pub gpu: String,
}
command!(GetScheduling => SchedulingView, Read);

/// A GPU's scheduling plan for the given requests (none: weight 1 for every vGPU that exists).
#[derive(Debug, Clone)]
pub struct PlanScheduling {
    /// The GPU id.
    pub gpu: String,
    /// One request per vGPU that will run there.
    pub requests: Vec<SchedRequest>,
}
command!(PlanScheduling => SchedPlan, Read);

/// Computes the plan as [`PlanScheduling`] and programs it; refused (nothing written) when the plan
/// has refusals.
#[derive(Debug, Clone)]
pub struct ApplyScheduling {
    /// The GPU id.
    pub gpu: String,
    /// One request per vGPU that will run there.
    pub requests: Vec<SchedRequest>,
}
command!(ApplyScheduling => ApplyReport, Change);

/// Opens the instance through VFIO as a VMM would (`vgpu_vfio::preflight`, KVM attach check
/// included). Authorized like a change: it holds the device's group or cdev for a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preflight {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(Preflight => PreflightReport, Device);

/// Opens the instance through VFIO as a VMM would and reads what it supports of the VFIO migration
/// uAPI v2 (`vgpu_vfio::migration_support`: GET and PROBE, and a dirty-page log started, read and
/// stopped on one page; nothing else changes). Authorized like a
/// change, as [`Preflight`]: it holds the device for a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationInfo {
    /// The instance's UUID.
    pub uuid: MdevUuid,
}
command!(MigrationInfo => MigrationSupport, Device);

/// Opens a running instance vgpu-manager manages through VFIO so its fds can be handed to a VMM
/// (bound and attached for DMA, or not: `OpenedDevice::open`). Refused for foreign and stopped
/// instances. Authorized like a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenDevice {
    /// The instance's UUID.
    pub uuid: MdevUuid,
    /// The IOMMU backend to use; `None` for the automatic choice.
    pub backend: Option<VfioBackend>,
    /// Bind the device and attach it for DMA (`false`: hand over the unbound cdev).
    pub bind: bool,
}
command!(OpenDevice => OpenedDevice, Device);
