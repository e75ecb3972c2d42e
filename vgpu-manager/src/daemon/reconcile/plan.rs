//! The planner: a pure function from desired state and host snapshot to a list of steps.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::input::{HostInstance, ReconcileInput};
use crate::daemon::api::MdevAttr;
use crate::daemon::store::{Definition, LedgerEntry, LedgerOwnership};

/// One step of a [`Plan`]. Only [`ReconcileStep::Create`] and [`ReconcileStep::DropLedger`] change anything; the others
/// report what was found. There is deliberately no step that removes a device: reconcile only adds
/// what is missing and forgets what is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileStep {
    /// An autostart definition's device is missing and its parent offers the type: write the ledger
    /// entry, then create the device.
    Create {
        /// The UUID.
        uuid: MdevUuid,
        /// The parent to create it on.
        parent: String,
        /// Its type.
        type_id: MdevTypeId,
        /// A stale ledger entry for this UUID that the new one overwrites (restored on rollback).
        replaces: Option<LedgerEntry>,
        /// The definition's mdev attributes, written in order once the device exists.
        attrs: Vec<MdevAttr>,
    },
    /// An autostart definition whose parent is not registered (driver not loaded yet); retried on the
    /// next kernel event.
    Wait {
        /// The UUID.
        uuid: MdevUuid,
        /// The missing parent.
        parent: String,
    },
    /// A ledger entry whose device is gone (and that no `Create` of this plan renews): forget it, so a
    /// later device with this UUID made by someone else is never taken for ours.
    DropLedger {
        /// The entry to remove (restored on rollback).
        entry: LedgerEntry,
    },
    /// Our device exists and matches its definition (or has none: a running transient instance).
    /// Kept as is; reconcile never removes a running device, a VM may use it.
    Keep {
        /// The UUID.
        uuid: MdevUuid,
        /// Created by the daemon or adopted.
        ownership: LedgerOwnership,
    },
    /// A device with no matching ledger entry: made by someone else. Shown, never touched.
    ReportForeign {
        /// The UUID.
        uuid: MdevUuid,
        /// Its parent.
        parent: String,
        /// Its type.
        type_id: MdevTypeId,
    },
    /// A definition that cannot be applied because its UUID is taken; nothing is touched.
    Conflict {
        /// The UUID.
        uuid: MdevUuid,
        /// Why.
        reason: ConflictReason,
    },
    /// A UUID whose device or parent could not be read (a faulted GPU): its ledger entry and definition
    /// are kept and nothing is created, until it reads again.
    Unreadable {
        /// The UUID.
        uuid: MdevUuid,
        /// The faulted parent, or `None` when the device itself could not be read.
        parent: Option<String>,
    },
    /// An autostart definition whose parent is registered but cannot take the device now.
    Blocked {
        /// The UUID.
        uuid: MdevUuid,
        /// Why.
        reason: BlockReason,
    },
}

impl ReconcileStep {
    /// The UUID the step is about.
    pub fn uuid(&self) -> &MdevUuid {
        match self {
            ReconcileStep::Create { uuid, .. }
            | ReconcileStep::Wait { uuid, .. }
            | ReconcileStep::Keep { uuid, .. }
            | ReconcileStep::ReportForeign { uuid, .. }
            | ReconcileStep::Conflict { uuid, .. }
            | ReconcileStep::Blocked { uuid, .. }
            | ReconcileStep::Unreadable { uuid, .. } => uuid,
            ReconcileStep::DropLedger { entry } => &entry.uuid,
        }
    }

    /// True for steps that change the host or the ledger.
    pub fn is_action(&self) -> bool {
        matches!(
            self,
            ReconcileStep::Create { .. } | ReconcileStep::DropLedger { .. }
        )
    }
}

impl fmt::Display for ReconcileStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileStep::Create {
                uuid,
                parent,
                type_id,
                ..
            } => write!(f, "create {uuid} ({type_id} on {parent})"),
            ReconcileStep::Wait { uuid, parent } => {
                write!(f, "{uuid} waits for parent {parent} to register")
            }
            ReconcileStep::DropLedger { entry } => write!(
                f,
                "forget {} ({} on {}): the device is gone",
                entry.uuid, entry.type_id, entry.parent
            ),
            ReconcileStep::Keep { uuid, .. } => write!(f, "keep {uuid}"),
            ReconcileStep::ReportForeign {
                uuid,
                parent,
                type_id,
            } => write!(
                f,
                "{uuid} ({type_id} on {parent}) was not made by vgpu-manager: left alone"
            ),
            ReconcileStep::Conflict { uuid, reason } => write!(f, "{uuid} not applied: {reason}"),
            ReconcileStep::Blocked { uuid, reason } => write!(f, "{uuid} not created: {reason}"),
            ReconcileStep::Unreadable {
                uuid,
                parent: Some(p),
            } => write!(
                f,
                "{uuid} left as it is: its parent {p} is faulted (`vgpuctl discover` names the fault)"
            ),
            ReconcileStep::Unreadable { uuid, parent: None } => write!(
                f,
                "{uuid} left as it is: its device could not be read (`vgpuctl discover` names the fault)"
            ),
        }
    }
}

/// Why a definition conflicts with the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictReason {
    /// Our device with this UUID has another parent or type than the definition says.
    DefinitionMismatch {
        /// The definition's parent.
        defined_parent: String,
        /// The definition's type.
        defined_type: MdevTypeId,
        /// The device's parent.
        actual_parent: String,
        /// The device's type.
        actual_type: MdevTypeId,
    },
    /// A device made by someone else has this UUID.
    ForeignDevice {
        /// Its parent.
        parent: String,
        /// Its type.
        type_id: MdevTypeId,
    },
}

impl fmt::Display for ConflictReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConflictReason::DefinitionMismatch {
                defined_parent,
                defined_type,
                actual_parent,
                actual_type,
            } => write!(
                f,
                "defined as {defined_type} on {defined_parent} but the running device is {actual_type} on {actual_parent}; stop it and start it again to apply the definition"
            ),
            ConflictReason::ForeignDevice { parent, type_id } => write!(
                f,
                "a device with this UUID ({type_id} on {parent}) was made by another tool; remove it with that tool or undefine this UUID"
            ),
        }
    }
}

/// Why an autostart definition's device cannot be created on its (registered) parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockReason {
    /// The parent does not offer the type.
    TypeNotOffered {
        /// The parent.
        parent: String,
        /// The type.
        type_id: MdevTypeId,
    },
    /// The type has no available instances left (counting the creates earlier in this plan).
    NoCapacity {
        /// The parent.
        parent: String,
        /// The type.
        type_id: MdevTypeId,
    },
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockReason::TypeNotOffered { parent, type_id } => write!(
                f,
                "parent {parent} does not offer type {type_id} (check its driver and configuration)"
            ),
            BlockReason::NoCapacity { parent, type_id } => write!(
                f,
                "type {type_id} on {parent} has no available instances; free one or redefine on another GPU"
            ),
        }
    }
}

/// The steps to converge the host, in UUID order (at most three steps per UUID).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The steps.
    pub steps: Vec<ReconcileStep>,
}

impl Plan {
    /// The steps that change something.
    pub fn actions(&self) -> impl Iterator<Item = &ReconcileStep> {
        self.steps.iter().filter(|s| s.is_action())
    }

    /// True when executing the plan would change nothing.
    pub fn is_noop(&self) -> bool {
        self.actions().next().is_none()
    }
}

/// Same parent and type.
fn same_device(parent: &str, type_id: &MdevTypeId, host: &HostInstance) -> bool {
    parent == host.parent && *type_id == host.type_id
}

/// Plans reconcile. Rules, per UUID (D = definition, L = ledger entry, H = host device):
///
/// * H exists and L records exactly H (parent and type): ours → `Keep`, or `Conflict` if D disagrees.
/// * H exists otherwise: foreign → `ReportForeign` (plus `Conflict` if D exists); an L describing a
///   different device is stale → `DropLedger`.
/// * No H, D autostart: parent missing → `Wait`; type not offered or full → `Blocked`; else `Create`.
/// * No H and no `Create`: L is stale → `DropLedger`.
/// * H could not be read, or no H and the parent of D or L is faulted: → `Unreadable`, nothing
///   dropped or created (a GPU that fell off the bus does not lose its instances).
pub fn plan(input: &ReconcileInput) -> Plan {
    let definitions: BTreeMap<&MdevUuid, &Definition> =
        input.definitions.iter().map(|d| (&d.uuid, d)).collect();
    let ledger: BTreeMap<&MdevUuid, &LedgerEntry> =
        input.ledger.iter().map(|e| (&e.uuid, e)).collect();
    let mut host: BTreeMap<&MdevUuid, &HostInstance> = BTreeMap::new();
    for i in &input.instances {
        // UUIDs are unique on the mdev bus; should a snapshot repeat one, the first wins.
        host.entry(&i.uuid).or_insert(i);
    }
    // Remaining capacity per parent and type, decremented by each planned create.
    let mut available: BTreeMap<&str, BTreeMap<&MdevTypeId, u32>> = input
        .parents
        .iter()
        .map(|p| {
            let types = p.types.iter().map(|t| (&t.id, t.available)).collect();
            (p.name.as_str(), types)
        })
        .collect();
    let uuids: BTreeSet<&MdevUuid> = definitions
        .keys()
        .chain(ledger.keys())
        .chain(host.keys())
        .copied()
        .collect();

    let mut steps = Vec::new();
    for uuid in uuids {
        let def = definitions.get(uuid).copied();
        let entry = ledger.get(uuid).copied();
        let present = host.get(uuid).copied();
        if input.unreadable_instances.contains(uuid) {
            let parent = entry
                .map(|e| e.parent.clone())
                .or(def.map(|d| d.parent.clone()));
            steps.push(ReconcileStep::Unreadable {
                uuid: *uuid,
                parent,
            });
            continue;
        }
        let wanted_parent = entry.map(|e| &e.parent).or(def.map(|d| &d.parent));
        if present.is_none()
            && let Some(p) = wanted_parent.filter(|p| input.faulted_parents.contains(p))
        {
            steps.push(ReconcileStep::Unreadable {
                uuid: *uuid,
                parent: Some(p.clone()),
            });
            continue;
        }
        match present {
            Some(dev) => plan_present(uuid, dev, def, entry, &mut steps),
            None => plan_absent(uuid, def, entry, &mut available, &mut steps),
        }
    }
    Plan { steps }
}

/// Rules for a UUID whose device exists.
fn plan_present(
    uuid: &MdevUuid,
    dev: &HostInstance,
    def: Option<&Definition>,
    entry: Option<&LedgerEntry>,
    steps: &mut Vec<ReconcileStep>,
) {
    match entry {
        Some(e) if same_device(&e.parent, &e.type_id, dev) => match def {
            Some(d) if !same_device(&d.parent, &d.type_id, dev) => {
                steps.push(ReconcileStep::Conflict {
                    uuid: *uuid,
                    reason: ConflictReason::DefinitionMismatch {
                        defined_parent: d.parent.clone(),
                        defined_type: d.type_id.clone(),
                        actual_parent: dev.parent.clone(),
                        actual_type: dev.type_id.clone(),
                    },
                })
            }
            _ => steps.push(ReconcileStep::Keep {
                uuid: *uuid,
                ownership: e.ownership,
            }),
        },
        _ => {
            if let Some(e) = entry {
                // The entry describes another device than the one now carrying this UUID (written
                // as intent before a create that never happened, then someone else used the UUID).
                steps.push(ReconcileStep::DropLedger { entry: e.clone() });
            }
            steps.push(ReconcileStep::ReportForeign {
                uuid: *uuid,
                parent: dev.parent.clone(),
                type_id: dev.type_id.clone(),
            });
            if def.is_some() {
                steps.push(ReconcileStep::Conflict {
                    uuid: *uuid,
                    reason: ConflictReason::ForeignDevice {
                        parent: dev.parent.clone(),
                        type_id: dev.type_id.clone(),
                    },
                });
            }
        }
    }
}

/// Rules for a UUID with no device.
fn plan_absent(
    uuid: &MdevUuid,
    def: Option<&Definition>,
    entry: Option<&LedgerEntry>,
    available: &mut BTreeMap<&str, BTreeMap<&MdevTypeId, u32>>,
    steps: &mut Vec<ReconcileStep>,
) {
    let mut creating = false;
    if let Some(d) = def.filter(|d| d.autostart) {
        let blocked = |reason| ReconcileStep::Blocked {
            uuid: *uuid,
            reason,
        };
        let step = match available.get_mut(d.parent.as_str()) {
            None => ReconcileStep::Wait {
                uuid: *uuid,
                parent: d.parent.clone(),
            },
            Some(types) => match types.get_mut(&d.type_id) {
                None => blocked(BlockReason::TypeNotOffered {
                    parent: d.parent.clone(),
                    type_id: d.type_id.clone(),
                }),
                Some(0) => blocked(BlockReason::NoCapacity {
                    parent: d.parent.clone(),
                    type_id: d.type_id.clone(),
                }),
                Some(n) => {
                    *n -= 1;
                    creating = true;
                    ReconcileStep::Create {
                        uuid: *uuid,
                        parent: d.parent.clone(),
                        type_id: d.type_id.clone(),
                        replaces: entry.cloned(),
                        attrs: d.attrs.clone(),
                    }
                }
            },
        };
        if !creating && let Some(e) = entry {
            steps.push(ReconcileStep::DropLedger { entry: e.clone() });
        }
        steps.push(step);
    } else if let Some(e) = entry {
        steps.push(ReconcileStep::DropLedger { entry: e.clone() });
    }
}
