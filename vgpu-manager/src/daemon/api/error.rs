//! Why a command was refused. Every variant names the object and what to do; errors of the layers
//! below are kept as typed sources, each mapped in exactly one place ([`CoreError::kind`]).

use std::sync::Arc;

use mdev_types::fault::DeviceFault;
use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};
use thiserror::Error;
use vgpu_host::discover::DiscoverError;
use vgpu_host::ops::LifecycleError;
use vgpu_vfio::VfioCheckError;

use super::limits::{ClientList, ClientText, clip};
use crate::backend::BackendError;
use crate::daemon::mdevctl_dir::MdevctlDirError;
use crate::daemon::store::StoreError;
use crate::pool::{PoolError, PoolShortfall};

/// Why a command was refused. [`CoreError::kind`] gives a stable short name (the D-Bus error is
/// `org.vgpumanager.Error.<Kind>`).
#[derive(Debug, Clone, Error)]
pub enum CoreError {
    /// No such instance.
    #[error("no instance {uuid}: `vgpuctl list` shows the instances")]
    NotFound {
        /// The UUID asked for.
        uuid: MdevUuid,
    },
    /// The instance was not made by vgpu-manager, and the request is not one that takes it over (only
    /// a stop, destroy or define that names it does).
    #[error(
        "instance {uuid} was not created by vgpu-manager (made by mdevctl or by hand): only a stop, destroy or define naming it takes it over (`vgpuctl stop {uuid}`); or change it with the tool that made it"
    )]
    Foreign {
        /// The foreign instance's UUID.
        uuid: MdevUuid,
    },
    /// The UUID is taken.
    #[error("instance {uuid} already exists: choose another UUID")]
    Exists {
        /// The UUID that is taken.
        uuid: MdevUuid,
    },
    /// The request is malformed or impossible (unknown profile, GPU, type; no GPU can serve it).
    #[error(transparent)]
    Invalid(#[from] RequestError),
    /// A pool's text does not load, or it cannot be planned.
    #[error(transparent)]
    Pool(Arc<PoolError>),
    /// Not in a state that allows it (e.g. Start of a running instance).
    #[error(transparent)]
    State(Box<StateError>),
    /// The kernel refused a lifecycle operation.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// A vendor backend refused or failed (VF slots, scheduling).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Opening an instance through VFIO failed.
    #[error("{source}")]
    Vfio {
        /// The instance.
        uuid: MdevUuid,
        /// What VFIO said.
        source: VfioCheckError,
    },
    /// Reading the host (sysfs) failed: not the request's fault.
    #[error("cannot read the host: {0}")]
    Host(#[from] DiscoverError),
    /// The state directory could not be written or read.
    #[error(transparent)]
    Store(Arc<StoreError>),
    /// mdevctl's definition directory could not be written or read.
    #[error(transparent)]
    MdevctlDir(Arc<MdevctlDirError>),
    /// A pool does not fit. Nothing was changed.
    #[error(
        "pool {pool} does not fit on {host}: {}; nothing was changed: lower the counts, widen [select], or free capacity (`vgpuctl pool plan FILE` shows the placement){}",
        shortfall_list(.shortfall),
        if *.proven_optimal { "" } else { " (the search budget ran out: more may fit)" }
    )]
    Shortfall {
        /// The pool.
        pool: String,
        /// The host it was planned on.
        host: String,
        /// Each profile not fully placed.
        shortfall: Vec<PoolShortfall>,
        /// Whether the placement is proven the most possible.
        proven_optimal: bool,
    },
    /// vgpud is shutting down: a pool apply stopped at a step boundary, keeping the steps it ran; the
    /// next start of vgpud finishes it.
    #[error(
        "pool {pool}: vgpud is shutting down: the apply stopped after step {done} of {total} (between two steps); the next start of vgpud finishes it (or apply the pool again then)"
    )]
    Interrupted {
        /// The pool.
        pool: String,
        /// Steps that ran.
        done: usize,
        /// Steps the apply had.
        total: usize,
    },
    /// The request needs something vgpud does not do. Nothing was changed.
    #[error(
        "{step}: vgpud does not assign whole GPUs to pool slots; use the passthrough profile outside pools"
    )]
    WholeGpuSlot {
        /// The pool step, in a line.
        step: String,
    },
    /// A pool apply failed at a step and what it had done was undone; the kind is the cause's.
    #[error(
        "pool {pool}: step {number}/{total} ({step}) failed: {cause}; {}",
        if .rollback.is_empty() {
            format!("the {undone} change(s) this apply made were undone")
        } else {
            format!(
                "undoing this apply failed too ({}): `vgpuctl pool status` shows what is left",
                .rollback.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
            )
        }
    )]
    PoolStep {
        /// The pool.
        pool: String,
        /// The failed step's number, from 1.
        number: usize,
        /// Steps in the apply.
        total: usize,
        /// The failed step, in a line.
        step: String,
        /// Why it failed.
        cause: Box<CoreError>,
        /// Changes the apply had made (all undone unless `rollback` says otherwise).
        undone: usize,
        /// The undo steps that failed (none when everything was undone).
        rollback: Vec<UndoFailure>,
    },
}

/// An undo of a failed pool apply that failed too; its change stays in place.
#[derive(Debug, Clone, Error)]
#[error("{undo}: {error}")]
pub struct UndoFailure {
    /// The undo, in a line (`destroy <uuid>`).
    pub undo: String,
    /// Why it failed.
    pub error: CoreError,
}

fn shortfall_list(s: &[PoolShortfall]) -> String {
    s.iter()
        .map(|s| {
            format!(
                "{}: {} of {} placed, {} missing ({})",
                s.profile, s.placed, s.wanted, s.missing, s.reason
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<MdevctlDirError> for CoreError {
    fn from(e: MdevctlDirError) -> Self {
        CoreError::MdevctlDir(Arc::new(e))
    }
}

impl From<StoreError> for CoreError {
    fn from(e: StoreError) -> Self {
        CoreError::Store(Arc::new(e))
    }
}

impl From<StateError> for CoreError {
    fn from(e: StateError) -> Self {
        CoreError::State(Box::new(e))
    }
}

impl From<PoolError> for CoreError {
    fn from(e: PoolError) -> Self {
        CoreError::Pool(Arc::new(e))
    }
}

impl CoreError {
    /// The error of a VFIO open or preflight of instance `uuid`: an instance VFIO does not find is
    /// [`CoreError::NotFound`].
    pub fn vfio(uuid: MdevUuid, e: VfioCheckError) -> CoreError {
        match e {
            VfioCheckError::NoSuchTarget(_) => CoreError::NotFound { uuid },
            source => CoreError::Vfio { uuid, source },
        }
    }

    /// Stable short name, e.g. `NotFound`, `TypeFull`.
    pub fn kind(&self) -> &'static str {
        match self {
            CoreError::NotFound { .. } => "NotFound",
            CoreError::Foreign { .. } => "Foreign",
            CoreError::Exists { .. } => "Exists",
            CoreError::Invalid(RequestError::Faulted { .. }) => "Faulted",
            CoreError::Invalid(_) | CoreError::Pool(_) => "Invalid",
            CoreError::State(_) => "State",
            CoreError::Lifecycle(e) => lifecycle_kind(e),
            CoreError::Backend(BackendError::UnknownGpu { .. }) => "Invalid",
            CoreError::Backend(BackendError::Lifecycle(e)) => lifecycle_kind(e),
            CoreError::Backend(_) => "State",
            CoreError::Vfio {
                source: VfioCheckError::BadTarget(_) | VfioCheckError::BackendUnavailable { .. },
                ..
            } => "Invalid",
            CoreError::Vfio { .. } => "State",
            CoreError::Host(_) => "Host",
            CoreError::Store(_) | CoreError::MdevctlDir(_) => "Store",
            CoreError::Shortfall { .. } => "Shortfall",
            CoreError::Interrupted { .. } => "State",
            CoreError::WholeGpuSlot { .. } => "NotSupported",
            CoreError::PoolStep { cause, .. } => cause.kind(),
        }
    }
}

fn lifecycle_kind(e: &LifecycleError) -> &'static str {
    match e {
        LifecycleError::TypeFull { .. } => "TypeFull",
        LifecycleError::DuplicateUuid { .. } => "Exists",
        _ => "Kernel",
    }
}

/// A request that names something that does not exist or cannot be served (D-Bus `Error.Invalid`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// The named mdev parent is not registered.
    #[error("no mdev parent {} on {host}: `vgpuctl types` lists parents and their types", clip(.parent))]
    NoParent {
        /// The parent asked for.
        parent: String,
        /// The host.
        host: String,
    },
    /// The parent does not offer the type.
    #[error(
        "{parent} offers no mdev type {type_id}: `vgpuctl types --gpu {parent}` lists its types"
    )]
    TypeNotOffered {
        /// The parent.
        parent: String,
        /// The type asked for.
        type_id: MdevTypeId,
    },
    /// The type on the named parent has no instance left.
    #[error(
        "mdev type {type_id} on {parent} is full (available_instances is 0): destroy an instance or choose another GPU"
    )]
    TypeFull {
        /// The parent.
        parent: String,
        /// The full type.
        type_id: MdevTypeId,
    },
    /// No SR-IOV VF of a GPU whose VFs are its mdev parents (one vGPU each) can take the type now.
    #[error(
        "no VF of GPU {gpu} can take mdev type {type_id}: each VF holds one vGPU, and the free ones show available_instances 0 for it (the GPU's framebuffer is used up, or it holds vGPUs of another type: NVIDIA's vGPUs on one GPU are of one type); destroy an instance or choose another GPU"
    )]
    VfsFull {
        /// The GPU (its physical function).
        gpu: String,
        /// The type asked for.
        type_id: MdevTypeId,
    },
    /// The GPU asked for could not be read (it is faulted): nothing is placed on it until it reads again.
    #[error(
        "GPU {} is faulted and not used until it reads again: {fault}{}; nothing was changed (`vgpuctl status` shows when it reads again)",
        clip(.gpu),
        fallback_fix(.fault)
    )]
    Faulted {
        /// The GPU (or parent) asked for.
        gpu: String,
        /// The fault, with its path, cause and fix.
        fault: Box<DeviceFault>,
    },
    /// No GPU offers the type.
    #[error("no GPU on {host} offers mdev type {type_id}: `vgpuctl types` lists the types")]
    NoGpuOffers {
        /// The type asked for.
        type_id: MdevTypeId,
        /// The host.
        host: String,
    },
    /// Every GPU that offers the type is full.
    #[error("every GPU offering mdev type {type_id} is full: destroy an instance first")]
    EveryGpuFull {
        /// The full type.
        type_id: MdevTypeId,
    },
    /// The profile is not in the catalog.
    #[error("unknown profile {:?}: known profiles are {known}", clip(.name))]
    UnknownProfile {
        /// The name asked for.
        name: String,
        /// The catalog's profiles, comma-separated.
        known: String,
    },
    /// The named GPU does not exist (placement).
    #[error("no GPU {} on {host}: `vgpuctl list-gpus` or `vgpuctl discover` lists them", clip(.gpu))]
    NoGpu {
        /// The GPU asked for.
        gpu: String,
        /// The host.
        host: String,
    },
    /// The named GPU does not exist (scheduling).
    #[error("no GPU {} on {host}: `vgpuctl status` lists the GPUs", clip(.gpu))]
    NoSchedulingGpu {
        /// The GPU asked for.
        gpu: String,
        /// The host.
        host: String,
    },
    /// No GPU can take an instance of the profile now.
    #[error(
        "no GPU can take an instance of profile {profile} now{}",
        if .why.is_empty() { String::new() } else { format!(" — {}", .why.join(" | ")) }
    )]
    NoRoom {
        /// The profile.
        profile: String,
        /// One reason per GPU (its closest miss), and where VF slots could serve it.
        why: Vec<String>,
    },
    /// Scheduling defaults need existing vGPUs.
    #[error(
        "{gpu} has no vGPU yet: give one request per vGPU that will run there, e.g. [{{\"weight\":10}},{{\"weight\":30}}]"
    )]
    NoVgpuYet {
        /// The GPU.
        gpu: String,
    },
    /// A text the client sent is longer than its limit.
    #[error(
        "{what} is {bytes} bytes long, more than the limit of {limit} bytes: send a shorter one"
    )]
    TooLong {
        /// Which text.
        what: ClientText,
        /// Its length.
        bytes: usize,
        /// The limit ([`ClientText::limit`]).
        limit: usize,
    },
    /// An mdev attribute of the request is refused.
    #[error(transparent)]
    Attr(#[from] super::attrs::AttrError),
    /// A request holds more items than their limit.
    #[error("{what}: {count} of them, more than the limit of {limit}: send at most {limit}")]
    TooMany {
        /// Which items.
        what: ClientList,
        /// How many were sent.
        count: usize,
        /// The limit ([`ClientList::limit`]).
        limit: usize,
    },
    /// A label holds a control character.
    #[error(
        "{what} {label:?} holds a control character at byte {at}: labels are printable text on one line (no newline, tab or escape)"
    )]
    UnprintableLabel {
        /// Which label.
        what: ClientText,
        /// The label, clipped ([`clip`]).
        label: String,
        /// The byte offset of the first control character.
        at: usize,
    },
    /// A pool name that no pool can have.
    #[error(
        "{:?} is not a pool name: 1-64 lower-case letters, digits and '-', starting with a letter or digit (`vgpuctl pool status` lists the pools)",
        clip(.name)
    )]
    BadPoolName {
        /// The name sent.
        name: String,
    },
    /// A VF slot was asked for with a target that is no VF.
    #[error("{target} is not a VF target")]
    NotVfTarget {
        /// The target, in a line.
        target: String,
    },
}

/// The object is not in a state that allows the command (D-Bus `Error.State`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StateError {
    /// The device stayed after its `remove` was written.
    #[error("instance {uuid} is still present after remove (in use by a VM?): stop the VM first")]
    StillPresent {
        /// The instance.
        uuid: MdevUuid,
    },
    /// The instance disappeared while the command ran.
    #[error("instance {uuid} vanished while being {doing}: `vgpuctl list` shows what exists now")]
    Vanished {
        /// The instance.
        uuid: MdevUuid,
        /// What was being done (`adopted`, `created`).
        doing: &'static str,
    },
    /// Only defined instances can be started.
    #[error(
        "instance {uuid} is transient and already running; only defined instances can be started"
    )]
    TransientRunning {
        /// The instance.
        uuid: MdevUuid,
    },
    /// A transient instance was asked for with the UUID of a definition vgpud does not hold (a file
    /// of mdevctl's definition directory).
    #[error(
        "{uuid} is defined on {parent} in mdevctl's definition directory: start that definition (`mdevctl start -u {uuid}`) or choose another UUID"
    )]
    ForeignDefinition {
        /// The UUID asked for.
        uuid: MdevUuid,
        /// The parent the foreign definition names.
        parent: String,
    },
    /// Start of a running instance.
    #[error("instance {uuid} is already running")]
    AlreadyRunning {
        /// The instance.
        uuid: MdevUuid,
    },
    /// The definition's parent is not registered.
    #[error("cannot start {uuid}: its parent {parent} is not registered (vGPU driver not loaded?)")]
    ParentMissing {
        /// The instance.
        uuid: MdevUuid,
        /// Its parent.
        parent: String,
    },
    /// Stop or destroy of an instance that is not running.
    #[error("cannot {action} {uuid}: it is not running")]
    NotRunning {
        /// The instance.
        uuid: MdevUuid,
        /// The command (`stop`, `destroy`).
        action: &'static str,
    },
    /// A live migration's state cannot load on this host.
    #[error(
        "this host cannot take the migrating {type_id} instance: {}", reasons.join("; ")
    )]
    Incompatible {
        /// The type asked for.
        type_id: MdevTypeId,
        /// Every reason (`vgpuctl migration check --target FILE` prints the same).
        reasons: Vec<String>,
    },
    /// An incoming-instance request naming an instance that is not incoming.
    #[error("{uuid} is not an incoming migration target (`vgpuctl list` shows the instances)")]
    NotIncoming {
        /// The instance.
        uuid: MdevUuid,
    },
    /// Making a definition of a UUID the one vgpud acts on while the UUID's device runs on another
    /// parent (one device per UUID runs at a time; mdevctl.rst "start").
    #[error(
        "mdev {uuid} runs on {running_on}, so its definition on {parent} cannot be made the one vgpud acts on: stop it first (`mdevctl stop -u {uuid}`), or name parent {running_on}"
    )]
    RunsElsewhere {
        /// The UUID.
        uuid: MdevUuid,
        /// The parent its device runs on.
        running_on: String,
        /// The parent of the definition asked for.
        parent: String,
    },
    /// Adopting a definition that has no file.
    #[error(
        "no definition of mdev {uuid} on {parent} in the mdevctl definition directory: `mdevctl list --defined` shows the definitions"
    )]
    NoDefinitionFile {
        /// The UUID.
        uuid: MdevUuid,
        /// The parent asked for.
        parent: String,
    },
    /// Start of a UUID's definition that does not exist (on the parent named, when one is).
    #[error(
        "mdev {uuid} has no definition{}: `mdevctl list --defined` shows the definitions",
        parent.as_deref().map(|p| format!(" on {p}")).unwrap_or_default()
    )]
    NoDefinition {
        /// The UUID.
        uuid: MdevUuid,
        /// The parent named, if any.
        parent: Option<String>,
    },
    /// Start of a UUID defined on several parents without naming one (mdevctl keys definitions by
    /// parent and UUID; src/main.rs `start_command_helper` refuses the same).
    #[error(
        "mdev {uuid} is defined on several parents ({}): name the one to start (`mdevctl start -u {uuid} -p PARENT`)",
        parents.join(", ")
    )]
    SeveralDefinitions {
        /// The UUID.
        uuid: MdevUuid,
        /// The parents it is defined on.
        parents: Vec<String>,
    },
    /// Undefine of a transient instance.
    #[error("instance {uuid} is not defined (it is transient)")]
    NotDefined {
        /// The instance.
        uuid: MdevUuid,
    },
    /// Autostart of a transient instance.
    #[error("instance {uuid} is transient: define it first (`vgpuctl define --uuid {uuid} …`)")]
    TransientAutostart {
        /// The instance.
        uuid: MdevUuid,
    },
    /// OpenDevice of a stopped instance.
    #[error("instance {uuid} is not running, so there is no device to open: Start it first")]
    NoDeviceToOpen {
        /// The instance.
        uuid: MdevUuid,
    },
    /// A slot's UUID is defined as something else than the plan puts there.
    #[error(
        "slot {slot} ({uuid}) is already defined as {defined_type} on {defined_parent}, not as {type_id} on {parent} where the plan puts it: destroy it (`vgpuctl destroy {uuid}`) or start it, then apply again"
    )]
    SlotDefinedElsewhere {
        /// The slot (`profile/index`).
        slot: String,
        /// Its UUID.
        uuid: MdevUuid,
        /// The type it is defined as.
        defined_type: MdevTypeId,
        /// The parent it is defined on.
        defined_parent: String,
        /// The type the plan wants.
        type_id: MdevTypeId,
        /// The parent the plan wants.
        parent: String,
    },
    /// The plan's VF is held by another slot.
    #[error("VF {vf} of {pf} is already held by another slot: plan again (`vgpuctl pool plan`)")]
    VfHeld {
        /// The VF.
        vf: PciAddress,
        /// Its PF.
        pf: PciAddress,
    },
    /// The plan's VF is in use.
    #[error(
        "VF {vf} of {pf} cannot be taken: {why}; plan again (`vgpuctl pool plan`) to pick another"
    )]
    VfBusy {
        /// The VF.
        vf: PciAddress,
        /// Its PF.
        pf: PciAddress,
        /// What uses it.
        why: VfInUse,
    },
    /// No VF of the PF is free.
    #[error(
        "no free VF on {pf}: every enabled VF is held by a slot or bound to a driver (`vgpuctl discover` lists them)"
    )]
    NoFreeVf {
        /// The PF.
        pf: PciAddress,
    },
}

/// Why a VF cannot be taken for a slot.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VfInUse {
    /// The VF is not there.
    #[error("it does not exist")]
    Missing,
    /// An NVIDIA VF with a vGPU type set.
    #[error("it already has vGPU type {0}")]
    HasVgpuType(u32),
    /// Bound to a driver.
    #[error("it is bound to {0}, so the host or another guest uses it")]
    BoundTo(String),
}

/// The fix of a fault discovery knows none for (its message already carries a known one).
fn fallback_fix(fault: &DeviceFault) -> &'static str {
    if fault.fix.is_some() {
        ""
    } else {
        " (check `dmesg` for the device, then reload its driver or reset it)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_error_has_one_kind() {
        let full = LifecycleError::TypeFull {
            parent: "p".into(),
            type_id: "nvidia-1".parse().unwrap(),
            errno: nix::errno::Errno::ENOSPC,
        };
        assert_eq!(CoreError::Lifecycle(full.clone()).kind(), "TypeFull");
        // A full type reached through a vendor backend is the same TypeFull, not a generic state.
        assert_eq!(
            CoreError::Backend(BackendError::Lifecycle(full)).kind(),
            "TypeFull"
        );
        let unknown = BackendError::UnknownGpu {
            gpu: "x".into(),
            host: "h".into(),
        };
        assert_eq!(CoreError::Backend(unknown).kind(), "Invalid");
        let host = DiscoverError::Host(vgpu_host::HostError::new(
            vgpu_host::HostOp::Read,
            "/sys/bus/pci/devices",
            nix::errno::Errno::EIO,
        ));
        // A failed host read is not the request's fault.
        assert_eq!(CoreError::from(host).kind(), "Host");
        let uuid: MdevUuid = "4b20d080-1b54-4048-85b3-a6a62d165c01".parse().unwrap();
        let e = CoreError::vfio(
            uuid,
            VfioCheckError::NoSuchTarget(mdev_types::vfio_api::VfioTarget::Mdev(uuid)),
        );
        assert!(matches!(e, CoreError::NotFound { .. }), "{e:?}");
    }
}
