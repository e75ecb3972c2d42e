//! What the planner looks at: desired state from the store and a snapshot of the host.

use mdev_types::fault::FaultScope;
use mdev_types::ids::{MdevTypeId, MdevUuid};
use mdev_types::model::Inventory;

use crate::daemon::store::{Definition, LedgerEntry};

/// An mdev device that exists on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInstance {
    /// Its UUID.
    pub uuid: MdevUuid,
    /// Its parent's device name.
    pub parent: String,
    /// Its type.
    pub type_id: MdevTypeId,
}

/// One type a registered parent offers, with how many more instances of it the kernel accepts now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostType {
    /// The type id.
    pub id: MdevTypeId,
    /// `available_instances` (already net of the existing instances).
    pub available: u32,
}

/// A registered mdev parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostParent {
    /// Its device name (`/sys/class/mdev_bus/<name>`).
    pub name: String,
    /// The types it offers.
    pub types: Vec<HostType>,
}

/// Everything [`plan`](super::plan) needs. It must be one consistent snapshot, taken while no other
/// lifecycle operation of the daemon runs (the daemon serializes them), or the planner could mistake
/// an entry written just before a `create` for a stale one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileInput {
    /// The persistent definitions.
    pub definitions: Vec<Definition>,
    /// The ownership ledger.
    pub ledger: Vec<LedgerEntry>,
    /// The mdev devices that exist on the host.
    pub instances: Vec<HostInstance>,
    /// The registered mdev parents and their types.
    pub parents: Vec<HostParent>,
    /// Parents (and PCI devices) discovery could not read: their devices may exist unseen.
    pub faulted_parents: Vec<String>,
    /// mdev devices that exist but could not be read.
    pub unreadable_instances: Vec<MdevUuid>,
}

impl ReconcileInput {
    /// Combines the desired state with a discovery snapshot (`Inventory::mdev_instances`,
    /// `Inventory::mdev_parents` and `Inventory::faults`).
    pub fn from_inventory(
        definitions: impl IntoIterator<Item = Definition>,
        ledger: impl IntoIterator<Item = LedgerEntry>,
        inventory: &Inventory,
    ) -> Self {
        ReconcileInput {
            definitions: definitions.into_iter().collect(),
            ledger: ledger.into_iter().collect(),
            instances: inventory
                .mdev_instances
                .iter()
                .map(|i| HostInstance {
                    uuid: i.uuid,
                    parent: i.parent.clone(),
                    type_id: i.type_id.clone(),
                })
                .collect(),
            parents: inventory
                .mdev_parents
                .iter()
                .map(|p| HostParent {
                    name: p.name.clone(),
                    types: p
                        .types
                        .iter()
                        .map(|t| HostType {
                            id: t.id.clone(),
                            available: t.available_instances,
                        })
                        .collect(),
                })
                .collect(),
            faulted_parents: inventory
                .faults
                .iter()
                .filter(|f| matches!(f.scope, FaultScope::MdevParent | FaultScope::PciDevice))
                .map(|f| f.device.clone())
                .collect(),
            unreadable_instances: inventory
                .faults
                .iter()
                .filter(|f| f.scope == FaultScope::MdevInstance)
                .filter_map(|f| f.device.parse().ok())
                .collect(),
        }
    }
}
