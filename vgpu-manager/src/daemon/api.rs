//! The daemon's one internal command type. The D-Bus layer, `vgpuctl` tests and reconcile all drive
//! [`Command`]s through [`Core::execute`](super::core::Core::execute); the core never knows who called.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::ops::LifecycleError;

/// What an instance should be made of: a vendor-neutral profile, or a concrete mdev type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "name")]
pub enum Target {
    /// A profile name from the catalog (`vdi-2g`); the best matching type on the chosen GPU is used.
    Profile(String),
    /// An exact mdev type id (`nvidia-231`); `gpu` must then name its parent unless only one offers it.
    Type(MdevTypeId),
}

/// Parameters of [`Command::Create`] and [`Command::Define`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateRequest {
    /// Profile or type.
    pub target: Target,
    /// The GPU (PCI address or parent name); `None` lets the daemon choose.
    pub gpu: Option<String>,
    /// The UUID to use; `None` makes a random one.
    pub uuid: Option<MdevUuid>,
    /// Start it whenever the daemon starts or its parent appears (definitions only).
    pub autostart: bool,
    /// A free-form label of who asked (a VM name, a pool slot); shown as `Owner`.
    pub label: Option<String>,
}

/// Everything a client can ask the daemon. Each variant says when it is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// List GPUs and their capacity. Always allowed (read-only).
    ListGpus,
    /// What an instance change can alter in one GPU's view: its mdev types' available instances and
    /// its running instances (a cheap re-read of one parent, not a discovery). Read-only.
    GpuCapacity {
        /// The GPU id ([`GpuView::id`]).
        id: String,
    },
    /// List instances: ours, defined-but-stopped, and foreign ones. Always allowed (read-only).
    ListInstances,
    /// One instance. Read-only.
    GetInstance {
        /// Which.
        uuid: MdevUuid,
    },
    /// Create and start a transient instance (gone after `Destroy` or a host reboot). Mutating.
    Create(CreateRequest),
    /// Persist a definition without starting it. Mutating.
    Define(CreateRequest),
    /// Start a defined instance (create its device). Mutating; refused for foreign instances.
    Start {
        /// Which.
        uuid: MdevUuid,
    },
    /// Stop an instance (remove its device, keep its definition). Mutating; refused for foreign instances.
    Stop {
        /// Which.
        uuid: MdevUuid,
    },
    /// Remove an instance entirely: its device (if running) and its definition (if defined). `Stop`
    /// removes only the device.
    /// Mutating; refused for foreign instances.
    Destroy {
        /// Which.
        uuid: MdevUuid,
    },
    /// Delete a definition; a running device stays as a transient instance. Mutating.
    Undefine {
        /// Which.
        uuid: MdevUuid,
    },
    /// Set whether a definition starts automatically. Mutating.
    SetAutostart {
        /// Which.
        uuid: MdevUuid,
        /// The new value.
        autostart: bool,
    },
    /// Converge the host to the desired state now (normally driven by start-up and kernel events).
    Reconcile,
    /// Dry run of a pool (TOML text, the pool file format of [`crate::pool::spec`]): what applying it
    /// would create, remove and keep. Read-only. Replies [`Reply::Report`] with a
    /// [`crate::pool::PoolPlan`].
    PlanPool {
        /// The pool file's text.
        toml: String,
    },
    /// Make the host match a pool: every slot an instance with its stable UUID, defined (autostart as
    /// the pool says) and running. Refused before any change when a slot does not fit or needs a kind
    /// of instance vgpud cannot create; a failed step undoes what this apply did. Sends
    /// [`Event::PoolProgress`] after each step. Mutating. Replies [`Reply::Report`] with a
    /// [`crate::client::PoolSummary`].
    ApplyPool {
        /// The pool file's text.
        toml: String,
    },
    /// Every pool applied through vgpud and the state of its slots. Read-only. Replies
    /// [`Reply::Report`] with a list of [`crate::client::PoolStatus`].
    PoolStatus,
    /// The time-slice scheduling programmed on a GPU now, read back through its vendor backend.
    /// Read-only. Replies [`Reply::Report`] with a [`crate::client::SchedulingView`].
    GetScheduling {
        /// The GPU id (PCI address or parent name).
        gpu: String,
    },
    /// A GPU's scheduling plan for the given requests (none: weight 1 for every vGPU that exists).
    /// Read-only. Replies [`Reply::Report`] with a [`crate::sched::SchedPlan`].
    PlanScheduling {
        /// The GPU id.
        gpu: String,
        /// One request per vGPU that will run there.
        requests: Vec<crate::sched::SchedRequest>,
    },
    /// Computes the plan as [`Command::PlanScheduling`] and programs it. Mutating. Replies
    /// [`Reply::Report`] with a [`crate::sched::ApplyReport`].
    ApplyScheduling {
        /// The GPU id.
        gpu: String,
        /// One request per vGPU that will run there.
        requests: Vec<crate::sched::SchedRequest>,
    },
    /// Opens the instance through VFIO as a VMM would (`vgpu_vfio::preflight`, KVM attach check
    /// included). Needs authorization (it holds the device's group or cdev for a moment). Replies
    /// [`Reply::Report`] with a [`vgpu_vfio::PreflightReport`].
    Preflight {
        /// The instance.
        uuid: MdevUuid,
    },
}

impl Command {
    /// True for commands answered from the core's memory alone, with no sysfs or disk I/O (so the
    /// D-Bus layer may run them on its async threads instead of the blocking pool).
    pub fn is_memory_read(&self) -> bool {
        matches!(self, Command::ListInstances | Command::GetInstance { .. })
    }

    /// True for commands that change the host or the desired state (and so need authorization).
    pub fn is_mutating(&self) -> bool {
        !matches!(
            self,
            Command::ListGpus
                | Command::GpuCapacity { .. }
                | Command::ListInstances
                | Command::GetInstance { .. }
                | Command::PlanPool { .. }
                | Command::PoolStatus
                | Command::GetScheduling { .. }
                | Command::PlanScheduling { .. }
        )
    }
}

/// Who created an instance, which decides whether the daemon may ever remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ownership {
    /// The daemon created it.
    Daemon,
    /// It existed before and was taken over by an explicit definition with its UUID.
    Adopted,
    /// Someone else made it (mdevctl, a shell); shown, never touched.
    Foreign,
}

/// The lifecycle state of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Its device exists.
    Running,
    /// Defined, device not created.
    Stopped,
    /// Defined with autostart, but its parent is not registered (driver not loaded yet).
    WaitingForParent,
}

/// An instance as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceView {
    /// UUID.
    pub uuid: MdevUuid,
    /// The GPU id (PCI address or parent name).
    pub gpu: String,
    /// The mdev parent device name.
    pub parent: String,
    /// The mdev type.
    pub type_id: MdevTypeId,
    /// The profile it was made from, if any.
    pub profile: Option<String>,
    /// State.
    pub state: InstanceState,
    /// Persistent definition exists.
    pub defined: bool,
    /// Starts automatically.
    pub autostart: bool,
    /// Who owns it.
    pub ownership: Ownership,
    /// Free-form label of who asked for it.
    pub label: Option<String>,
    /// IOMMU group, while running.
    pub iommu_group: Option<u32>,
    /// When it was created or defined (seconds since the Unix epoch).
    pub created_at: u64,
}

/// A GPU as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    /// GPU id (PCI address or parent name).
    pub id: String,
    /// Vendor (`nvidia`, `intel`, …).
    pub vendor: String,
    /// Model name.
    pub model: String,
    /// Driver.
    pub driver: Option<String>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// mdev types with (type id, available instances).
    pub types: Vec<(MdevTypeId, u32)>,
    /// Instances on it (running).
    pub instances: Vec<MdevUuid>,
}

/// The answer to a [`Command`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// For `ListGpus`.
    Gpus(Vec<GpuView>),
    /// For `GpuCapacity`: (type id, available instances) of each type, in no particular order, and
    /// the running instances.
    GpuCapacity(Vec<(MdevTypeId, u32)>, Vec<MdevUuid>),
    /// For `ListInstances`.
    Instances(Vec<InstanceView>),
    /// For commands about one instance.
    Instance(InstanceView),
    /// For `Undefine`/`Destroy` of a transient instance, `Reconcile`: nothing to show.
    Done,
    /// For the pool and scheduling commands: a structured report in the JSON shape its command names
    /// (documented in docs/json.md); the D-Bus layer sends it as a JSON string.
    Report(serde_json::Value),
}

/// Something that changed, for signals and property updates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A new instance (created, defined, or first seen).
    InstanceAdded(InstanceView),
    /// An instance is gone entirely (no device, no definition).
    InstanceRemoved(MdevUuid),
    /// An instance's state, autostart or definition changed.
    InstanceChanged(InstanceView),
    /// A step of a pool apply finished (the `PoolProgress` signal).
    PoolProgress {
        /// The pool.
        pool: String,
        /// Steps finished so far (this one included).
        done: u32,
        /// Steps in the apply.
        total: u32,
        /// The step, in a line (`create vdi-2g/3 on 0000:83:00.0 as nvidia-231`).
        step: String,
    },
}

/// Why a command was refused. Each names the object and what to do; [`CoreError::kind`] gives a stable
/// short name (the D-Bus error is `org.vgpumanager.Error.<Kind>`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreError {
    /// No such instance.
    #[error("no instance {uuid}: `vgpuctl list` shows the instances")]
    NotFound {
        /// The UUID.
        uuid: MdevUuid,
    },
    /// The instance was not made by vgpu-manager.
    #[error(
        "instance {uuid} was not created by vgpu-manager (made by mdevctl or by hand): it is never modified here; remove it with the tool that made it"
    )]
    Foreign {
        /// The UUID.
        uuid: MdevUuid,
    },
    /// The UUID is taken.
    #[error("instance {uuid} already exists: choose another UUID")]
    Exists {
        /// The UUID.
        uuid: MdevUuid,
    },
    /// The request is malformed or impossible (unknown profile, GPU, type; no GPU can serve it).
    #[error("{0}")]
    Invalid(String),
    /// Not in a state that allows it (e.g. Start of a running instance).
    #[error("{0}")]
    State(String),
    /// The kernel refused.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The state directory could not be written or read.
    #[error("{0}")]
    Store(String),
    /// The caller may not do this.
    #[error("{0}")]
    Denied(String),
    /// A pool does not fit: the message gives the shortfall per profile. Nothing was changed.
    #[error("{0}")]
    Shortfall(String),
    /// The request needs something vgpud does not do (e.g. a whole GPU as a pool slot, or enabling VFs
    /// a driver makes only at load). Nothing was changed.
    #[error("{0}")]
    NotSupported(String),
    /// A pool apply failed at a step and what it had done was undone; `kind` is the failed step's.
    #[error("{message}")]
    PoolStep {
        /// The failed step, its cause, and the rollback's outcome.
        message: String,
        /// [`CoreError::kind`] of the cause.
        kind: &'static str,
    },
}

impl CoreError {
    /// Stable short name, e.g. `NotFound`, `TypeFull`.
    pub fn kind(&self) -> &'static str {
        match self {
            CoreError::NotFound { .. } => "NotFound",
            CoreError::Foreign { .. } => "Foreign",
            CoreError::Exists { .. } => "Exists",
            CoreError::Invalid(_) => "Invalid",
            CoreError::State(_) => "State",
            CoreError::Lifecycle(LifecycleError::TypeFull { .. }) => "TypeFull",
            CoreError::Lifecycle(LifecycleError::DuplicateUuid { .. }) => "Exists",
            CoreError::Lifecycle(_) => "Kernel",
            CoreError::Store(_) => "Store",
            CoreError::Denied(_) => "AccessDenied",
            CoreError::Shortfall(_) => "Shortfall",
            CoreError::NotSupported(_) => "NotSupported",
            CoreError::PoolStep { kind, .. } => kind,
        }
    }
}
