//! A fake host for executor and planner tests: devices, parents with per-type capacity, a ledger,
//! failure injection, and assertions that the ledger protocol is followed.

use std::collections::{BTreeMap, BTreeSet};

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::exec::StepActions;
use super::input::{HostInstance, HostParent, HostType, ReconcileInput};
use crate::daemon::api::MdevAttr;
use crate::daemon::store::{Definition, LedgerEntry};

/// The observable state: devices (uuid → parent, type) and the ledger.
pub(crate) type FakeState = (
    BTreeMap<MdevUuid, (String, MdevTypeId)>,
    BTreeMap<MdevUuid, LedgerEntry>,
);

/// A host that behaves like the kernel for what the executor does.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeHost {
    /// Existing devices.
    pub devices: BTreeMap<MdevUuid, (String, MdevTypeId)>,
    /// Registered parents: type → total capacity of that type.
    pub parents: BTreeMap<String, BTreeMap<MdevTypeId, u32>>,
    /// The ledger.
    pub ledger: BTreeMap<MdevUuid, LedgerEntry>,
    /// Indices of mutating calls that fail (0-based, counting every mutating call).
    pub fail_calls: BTreeSet<usize>,
    /// When an injected `create_device` failure happens, the device is made anyway.
    pub ghost_create: bool,
    /// `device_exists` fails.
    pub fail_exists: bool,
    /// Mutating calls so far.
    pub calls: usize,
    /// Attribute names the devices' driver refuses (a write to one fails, as an unknown name would).
    pub refused_attrs: BTreeSet<String>,
    /// Every attribute written, in order: (device, name, value).
    pub attrs_written: Vec<(MdevUuid, String, String)>,
}

impl FakeHost {
    /// Devices and ledger.
    pub fn state(&self) -> FakeState {
        (self.devices.clone(), self.ledger.clone())
    }

    /// Instances of `type_id` on `parent`.
    pub fn used(&self, parent: &str, type_id: &MdevTypeId) -> u32 {
        let n = self
            .devices
            .values()
            .filter(|(p, t)| p == parent && t == type_id)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The planner's input for this host and these definitions.
    pub fn input(&self, definitions: &[Definition]) -> ReconcileInput {
        ReconcileInput {
            definitions: definitions.to_vec(),
            ledger: self.ledger.values().cloned().collect(),
            instances: self
                .devices
                .iter()
                .map(|(uuid, (parent, type_id))| HostInstance {
                    uuid: *uuid,
                    parent: parent.clone(),
                    type_id: type_id.clone(),
                })
                .collect(),
            parents: self
                .parents
                .iter()
                .map(|(name, types)| HostParent {
                    name: name.clone(),
                    types: types
                        .iter()
                        .map(|(id, cap)| HostType {
                            id: id.clone(),
                            available: cap.saturating_sub(self.used(name, id)),
                        })
                        .collect(),
                })
                .collect(),
            faulted_parents: Vec::new(),
            unreadable_instances: Vec::new(),
        }
    }

    /// Counts a mutating call; `Err` if it is one of the injected failures.
    fn call(&mut self, what: &str) -> Result<(), FakeError> {
        let n = self.calls;
        self.calls += 1;
        if self.fail_calls.contains(&n) {
            Err(FakeError(format!("injected failure of call {n} ({what})")))
        } else {
            Ok(())
        }
    }
}

/// A failure of the fake: what the kernel would have refused, or an injected failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FakeError(pub(crate) String);

impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StepActions for FakeHost {
    type Error = FakeError;

    fn put_ledger(&mut self, entry: &LedgerEntry) -> Result<(), FakeError> {
        self.call("put_ledger")?;
        self.ledger.insert(entry.uuid, entry.clone());
        Ok(())
    }

    fn remove_ledger(&mut self, uuid: &MdevUuid) -> Result<(), FakeError> {
        // Protocol: an entry goes only once the device it describes is gone.
        if let (Some(e), Some((p, t))) = (self.ledger.get(uuid), self.devices.get(uuid)) {
            assert!(
                !(e.parent == *p && e.type_id == *t),
                "ledger entry of existing device {uuid} removed"
            );
        }
        self.call("remove_ledger")?;
        self.ledger.remove(uuid);
        Ok(())
    }

    fn create_device(
        &mut self,
        uuid: &MdevUuid,
        parent: &str,
        type_id: &MdevTypeId,
    ) -> Result<(), FakeError> {
        // Protocol: the ledger entry is written before the device.
        let e = self.ledger.get(uuid);
        assert!(
            e.is_some_and(|e| e.parent == parent && e.type_id == *type_id),
            "device {uuid} created without its ledger entry"
        );
        if let Err(e) = self.call("create_device") {
            if self.ghost_create {
                self.devices
                    .insert(*uuid, (parent.to_string(), type_id.clone()));
            }
            return Err(e);
        }
        // What the kernel checks (drivers/vfio/mdev/mdev_sysfs.c create_store, mdev_core.c
        // mdev_device_create): unique UUID, registered parent, supported type, available instances.
        if self.devices.contains_key(uuid) {
            return Err(FakeError(format!("instance {uuid} already exists")));
        }
        let cap = self
            .parents
            .get(parent)
            .and_then(|t| t.get(type_id))
            .copied()
            .ok_or_else(|| FakeError(format!("no type {type_id} on {parent}")))?;
        if self.used(parent, type_id) >= cap {
            return Err(FakeError(format!("{type_id} on {parent} is full")));
        }
        self.devices
            .insert(*uuid, (parent.to_string(), type_id.clone()));
        Ok(())
    }

    fn write_attr(&mut self, uuid: &MdevUuid, attr: &MdevAttr) -> Result<(), FakeError> {
        // Protocol: attributes are written to a device that exists and is in the ledger.
        assert!(
            self.devices.contains_key(uuid) && self.ledger.contains_key(uuid),
            "attribute {attr} written to {uuid}, which does not exist or is not ours"
        );
        self.call("write_attr")?;
        if self.refused_attrs.contains(attr.name()) {
            return Err(FakeError(format!(
                "{uuid}: attribute {} refused value {:?}",
                attr.name(),
                attr.value()
            )));
        }
        self.attrs_written
            .push((*uuid, attr.name().to_string(), attr.value().to_string()));
        Ok(())
    }

    fn remove_device(&mut self, uuid: &MdevUuid, parent: &str) -> Result<(), FakeError> {
        // Protocol: only devices in the ledger are ever removed.
        assert!(
            self.ledger.contains_key(uuid),
            "device {uuid} removed without a ledger entry"
        );
        self.call("remove_device")?;
        match self.devices.get(uuid) {
            Some((p, _)) if p == parent => {
                self.devices.remove(uuid);
                Ok(())
            }
            _ => Err(FakeError(format!("no instance {uuid}"))),
        }
    }

    fn device_exists(&mut self, uuid: &MdevUuid) -> Result<bool, FakeError> {
        if self.fail_exists {
            return Err(FakeError("injected: cannot read the mdev bus".into()));
        }
        Ok(self.devices.contains_key(uuid))
    }

    fn now(&self) -> u64 {
        1_800_000_000
    }
}
