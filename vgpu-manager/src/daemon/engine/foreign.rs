//! Devices vgpud did not create (foreign: no ledger entry), on explicit request, and `define` of a
//! running device.
//!
//! Automatic actions (reconcile, pools, autostart, recovery after a crash) never touch a foreign
//! device. `UndefineInstance` removes a definition vgpud holds for one and leaves the device. An explicit, authorized request that names one (`StopInstance`, `DestroyInstance`: `vgpuctl
//! stop U`, `mdevctl stop -u U`, `virsh nodedev-destroy`) may act on it: the device is adopted into the
//! ledger first (`ownership = "adopted"`, durably, under the parent's lock), then removed by the one
//! executor, which follows the ledger protocol of [`crate::daemon::store`]. A crash after the adoption
//! leaves an adopted entry with its device: the next start keeps both (an adopted device is never
//! removed automatically either), and the request can simply be repeated. A removal the kernel refuses
//! (a device in use) leaves the device adopted too.
//!
//! `define` of a running device keeps the device as it is and persists it, as mdevctl's `define --uuid`
//! does (mdevctl src/main.rs `define_command_helper`: the running device's parent and type, each
//! replaced by the one given): a foreign device whose parent and type match is adopted with it; one
//! that differs, or a transient device of vgpud's own, just gets the definition, which applies at its
//! next start.

use tracing::{info, warn};

use mdev_types::ids::MdevUuid;

use super::instances::Instances;
use super::lock;
use super::views::device_identity;
use crate::daemon::api::{CoreError, InstanceSpec, InstanceView, Ownership, StateError};
use crate::daemon::store::{LedgerEntry, LedgerOwnership, unix_now};

/// What removing a running device does when the ledger does not list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnForeign {
    /// Refuse with [`CoreError::Foreign`]: every caller but an explicit request naming the device
    /// (pools, which act on their own slots only).
    Refuse,
    /// Adopt it into the ledger first, then act: a request that names the device.
    AdoptFirst,
}

impl Instances {
    /// `StopInstance`: stops instance `uuid`, adopting it first if vgpud did not create it.
    pub(super) fn stop_named(&self, uuid: MdevUuid) -> Result<Option<InstanceView>, CoreError> {
        self.stop_with(uuid, OnForeign::AdoptFirst)
    }

    /// `DestroyInstance`: removes the device and the definition of instance `uuid`, adopting the
    /// device first if vgpud did not create it.
    pub(super) fn destroy_named(&self, uuid: MdevUuid) -> Result<Option<InstanceView>, CoreError> {
        self.destroy_with(uuid, OnForeign::AdoptFirst)
    }

    /// Whether `UndefineInstance` may remove the definition of `v`: always, but a foreign device
    /// without a definition has nothing vgpud holds (Foreign). The definition of a running foreign
    /// device goes; the device is not touched and stays foreign.
    pub(super) fn may_undefine(&self, v: &InstanceView) -> Result<(), CoreError> {
        if v.ownership != Ownership::Foreign {
            return Ok(());
        }
        if !v.defined {
            return Err(CoreError::Foreign { uuid: v.uuid });
        }
        warn!(uuid = %v.uuid, parent = %v.parent, "undefining a device not created by vgpud: its definition goes, the device is left running");
        Ok(())
    }

    /// Writes the ledger entry (ownership adopted) of the running foreign device `uuid`, so that the
    /// executor may remove it; `action` names the request for the log. The parent's lock must be held.
    pub(super) fn adopt_named_locked(
        &self,
        uuid: &MdevUuid,
        action: &'static str,
    ) -> Result<(), CoreError> {
        let Some((parent, type_id)) = device_identity(self.host.as_ref(), uuid) else {
            return Err(StateError::NotRunning {
                uuid: *uuid,
                action,
            }
            .into());
        };
        let mut store = lock(&self.store);
        // What clients saw of it stays: a definition on the same parent names its GPU and profile.
        let def = store
            .get_definition(uuid)
            .filter(|d| d.parent == parent)
            .cloned();
        store.put_ledger(&LedgerEntry {
            uuid: *uuid,
            parent: parent.clone(),
            type_id: type_id.clone(),
            ownership: LedgerOwnership::Adopted,
            created_at: unix_now(),
            gpu: def.as_ref().map(|d| d.gpu.clone()),
            profile: def.as_ref().and_then(|d| d.profile.clone()),
            label: def.and_then(|d| d.label),
        })?;
        warn!(%uuid, %parent, %type_id, action, "device not created by vgpud adopted into the ledger for an explicit request naming it");
        Ok(())
    }

    /// `define` of running device `uuid` that has no definition: persists it, the device untouched.
    pub(super) fn define_running(
        &self,
        uuid: MdevUuid,
        req: &InstanceSpec,
    ) -> Result<InstanceView, CoreError> {
        let Some((parent, type_id)) = device_identity(self.host.as_ref(), &uuid) else {
            return Err(StateError::Vanished {
                uuid,
                doing: "defined",
            }
            .into());
        };
        let place = self.place(req, false)?;
        let same = place.parent == parent && place.type_id == type_id;
        let ours = lock(&self.store).get_ledger(&uuid).is_some();
        if same && !ours {
            return self.adopt(uuid, req);
        }
        let _reserved = self.reserve_new_for_adoption(uuid)?;
        self.locks
            .with_parent(&parent, || -> Result<(), CoreError> {
                let mut store = lock(&self.store);
                if store.get_definition(&uuid).is_some() {
                    // Defined meanwhile by a concurrent request.
                    return Err(CoreError::Exists { uuid });
                }
                store.put_definition(&place.definition(uuid, req))?;
                Ok(())
            })?;
        if same {
            info!(%uuid, %parent, %type_id, "running transient instance defined");
        } else {
            warn!(%uuid, running_parent = %parent, running_type = %type_id, parent = %place.parent, type_id = %place.type_id, foreign = !ours,
                "running device defined with another parent or type: the definition applies at its next start, the device is left as it is");
        }
        self.refresh_one(&uuid).ok_or_else(|| {
            StateError::Vanished {
                uuid,
                doing: "defined",
            }
            .into()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use mdev_types::ids::MdevUuid;
    use vgpu_host::{Host, paths};
    use vgpu_sim::SimHost;

    use super::super::Core;
    use crate::daemon::api::{GetInstance, Ownership, Reconcile, StopInstance};
    use crate::profile::Catalog;

    /// The foreign mdev of the demo host (mdev-types/sims/demo.toml), on the second T4.
    const FOREIGN: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";
    const PARENT: &str = "0000:83:00.0";

    fn open(host: &Arc<SimHost>, dir: &std::path::Path) -> Core {
        Core::open(
            host.clone() as Arc<dyn Host>,
            dir,
            Catalog::builtin().unwrap(),
        )
        .unwrap()
    }

    /// A stop that ends after the adoption (vgpud killed before the removal) leaves an adopted
    /// entry and its device: the next start keeps both (no automatic action removes it), shows it
    /// as adopted, and the repeated stop removes device and entry.
    #[test]
    fn a_crash_between_adopt_and_remove_leaves_a_state_start_up_reconciles() {
        let host = Arc::new(SimHost::builtin("demo").unwrap());
        let dir = tempfile::tempdir().unwrap();
        let uuid: MdevUuid = FOREIGN.parse().unwrap();
        let core = open(&host, dir.path());
        core.instances
            .locks
            .with_parent(PARENT, || core.instances.adopt_named_locked(&uuid, "stop"))
            .unwrap();
        drop(core);
        let ledger = dir.path().join("ledger").join(format!("{FOREIGN}.toml"));
        assert!(
            ledger.exists(),
            "the adoption is durable before the removal"
        );

        let core = open(&host, dir.path());
        let v = core.execute(GetInstance { uuid }).unwrap();
        assert_eq!(v.ownership, Ownership::Adopted);
        core.execute(Reconcile).unwrap();
        assert!(
            host.exists(&paths::mdev_device(&uuid)),
            "start-up and reconcile keep an adopted device"
        );
        assert!(ledger.exists(), "and its entry");

        core.execute(StopInstance { uuid }).unwrap();
        assert!(!host.exists(&paths::mdev_device(&uuid)));
        assert!(!ledger.exists(), "the entry goes after the device");
        drop(core);
        let core = open(&host, dir.path());
        assert!(
            core.execute(GetInstance { uuid }).is_err(),
            "nothing is left"
        );
    }
}
