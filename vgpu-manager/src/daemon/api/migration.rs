//! The target side of a live migration: an instance made here for a VM that is to arrive, from the
//! source instance's compatibility fingerprint ([`crate::migration::Fingerprint`]).

use std::collections::BTreeMap;
use std::time::Duration;

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::command::{Access, Command};
use crate::migration::Fingerprint;

/// The default time an incoming instance waits for a VM.
pub const DEFAULT_INCOMING_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest wait a caller may ask for.
pub const MAX_INCOMING_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Makes the target instance of a live migration on this host: checks `fingerprint`
/// ([`crate::migration::check`]; refused with every reason when the state cannot load here), picks a
/// parent that fits (placement rules apply; `gpu` narrows the choice; among those that fit, one on
/// NUMA node `numa_node` is preferred), creates an instance of the
/// type with a new UUID (or `uuid`), and holds it as *incoming* until a VM takes it or `timeout`
/// passes (then it is released, unless its device is open: then it is kept as an ordinary
/// instance).
#[derive(Debug, Clone)]
pub struct PrepareIncoming {
    /// The source instance's fingerprint.
    pub fingerprint: Fingerprint,
    /// Only this GPU (PCI address or parent name).
    pub gpu: Option<String>,
    /// The target instance's UUID; default: a new random one.
    pub uuid: Option<MdevUuid>,
    /// How long it waits for a VM.
    pub timeout: Duration,
    /// Prefer a parent on this NUMA node; `None`: the parent with the most room, as without NUMA.
    pub numa_node: Option<u32>,
}

/// The reply of [`PrepareIncoming`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingView {
    /// The target instance.
    pub uuid: MdevUuid,
    /// The source instance (from the fingerprint).
    pub source: MdevUuid,
    /// The target's parent.
    pub parent: String,
    /// The target's GPU id.
    pub gpu: String,
    /// The NUMA node of the target's parent, when known.
    pub numa_node: Option<u32>,
    /// Its type.
    pub type_id: MdevTypeId,
    /// When it is released if no VM took it, seconds since the Unix epoch.
    pub until: u64,
    /// The `<hostdev>` of the target instance, for the target domain XML (`virsh migrate --xml`).
    pub hostdev_xml: String,
    /// Source UUID → target UUID, the map OpenStack Nova's libvirt driver passes as `target_mdevs`.
    pub target_mdevs: BTreeMap<String, String>,
    /// What the target must still do (vendor parameters to set), and a NUMA preference that could
    /// not be met.
    pub notes: Vec<String>,
}

impl Command for PrepareIncoming {
    type Reply = IncomingView;
    const ACCESS: Access = Access::Change;
}

/// Releases incoming instance `uuid` (the migration was given up): its device is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortIncoming {
    /// The incoming instance.
    pub uuid: MdevUuid,
}

impl Command for AbortIncoming {
    type Reply = ();
    const ACCESS: Access = Access::Change;
}

/// Turns incoming instance `uuid` into an ordinary instance (the migration succeeded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompleteIncoming {
    /// The incoming instance.
    pub uuid: MdevUuid,
}

impl Command for CompleteIncoming {
    type Reply = ();
    const ACCESS: Access = Access::Change;
}
