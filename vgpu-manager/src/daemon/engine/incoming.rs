//! Incoming live-migration targets ([`crate::daemon::api::PrepareIncoming`]): made from the source's
//! fingerprint on a parent that can load its state, held as *incoming* (a record in the state
//! directory, written before the device is made) until completed, aborted or past their deadline.
//!
//! A reaper thread looks at the records once a second. One whose deadline passed is released when no
//! process holds its device (its IOMMU group's `/dev/vfio/N` opens: a VM that took the device holds
//! it open, and VFIO groups open once); one whose device is held is kept as an ordinary instance, as
//! a VM is using it. A record whose device is gone (removed by someone, or never made before a crash)
//! is dropped.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{info, warn};

use mdev_types::ids::MdevUuid;
use qemu_glue::hostdev::{MdevDisplay, mdev_hostdev_xml};
use vgpu_host::discover::discover;
use vgpu_host::{HostExt, paths};

use super::instances::Instances;
use super::lock;
use crate::daemon::api::{
    CoreError, IncomingView, InstanceSpec, InstanceTarget, PrepareIncoming, StateError,
};
use crate::daemon::store::{IncomingRecord, unix_now};
use crate::migration::{Candidate, check};

/// How often the reaper looks at the deadlines.
const REAP_EVERY: Duration = Duration::from_secs(1);

impl Instances {
    /// See [`PrepareIncoming`].
    pub(super) fn prepare_incoming(&self, req: PrepareIncoming) -> Result<IncomingView, CoreError> {
        let fp = req.fingerprint;
        let inv = discover(self.host.as_ref())?;
        let verdict = check(self.host.as_ref(), &inv, &fp);
        let wanted = |parent: &str| req.gpu.as_deref().is_none_or(|g| g == parent);
        let fits: Vec<&Candidate> = verdict
            .candidates
            .iter()
            .filter(|c| c.problems.is_empty() && wanted(&c.parent))
            .collect();
        let mut notes = verdict.notes.clone();
        let chosen = match fits.first() {
            Some(first) if verdict.reasons.is_empty() => {
                prefer_numa(&fits, first, req.numa_node, &mut notes)
            }
            _ => {
                let mut reasons = verdict.reasons.clone();
                for c in verdict.candidates.iter().filter(|c| wanted(&c.parent)) {
                    reasons.extend(c.problems.iter().map(|p| format!("{}: {p}", c.parent)));
                }
                if let Some(g) = &req.gpu
                    && !verdict.candidates.iter().any(|c| c.parent == *g)
                {
                    reasons.push(format!("GPU {g} does not offer {}", fp.type_id));
                }
                return Err(StateError::Incompatible {
                    type_id: fp.type_id.clone(),
                    reasons,
                }
                .into());
            }
        };
        let numa_node = chosen.numa_node;
        let chosen = chosen.parent.clone();
        let uuid = req.uuid.unwrap_or_else(MdevUuid::new_random);
        let until = deadline_after(req.timeout);
        // The record first: a crash after the create leaves a record the reaper finishes. Until
        // the create has returned the reaper must not take the missing device for one that went.
        lock(&self.incoming_making).insert(uuid);
        let _making = Making {
            instances: self,
            uuid,
        };
        lock(&self.store).put_incoming(&IncomingRecord {
            uuid,
            source: Some(fp.uuid),
            until,
        })?;
        let made = self.create(InstanceSpec {
            target: InstanceTarget::Type(fp.type_id.clone()),
            gpu: Some(chosen),
            uuid: Some(uuid),
            autostart: false,
            label: Some(format!("incoming migration of {}", fp.uuid)),
            attrs: Vec::new(),
        });
        let view = match made {
            Ok(v) => v,
            Err(e) => {
                if !self.device_exists(&uuid)
                    && let Err(r) = lock(&self.store).remove_incoming(&uuid)
                {
                    warn!(%uuid, error = %r, "the incoming record of a target that was not made could not be removed (the reaper drops it)");
                }
                return Err(e);
            }
        };
        info!(%uuid, source = %fp.uuid, parent = %view.parent, type_id = %fp.type_id, until, "incoming migration target made");
        Ok(IncomingView {
            uuid,
            source: fp.uuid,
            parent: view.parent.clone(),
            gpu: view.gpu.clone(),
            numa_node,
            type_id: fp.type_id.clone(),
            until,
            hostdev_xml: mdev_hostdev_xml(&uuid, MdevDisplay::default()),
            target_mdevs: BTreeMap::from([(fp.uuid.to_string(), uuid.to_string())]),
            notes,
        })
    }

    /// See [`crate::daemon::api::AbortIncoming`].
    pub(super) fn abort_incoming(&self, uuid: MdevUuid) -> Result<(), CoreError> {
        if lock(&self.store).get_incoming(&uuid).is_none() {
            return Err(StateError::NotIncoming { uuid }.into());
        }
        self.release_incoming(uuid)?;
        info!(%uuid, "incoming migration target released on request");
        Ok(())
    }

    /// See [`crate::daemon::api::CompleteIncoming`].
    pub(super) fn complete_incoming(&self, uuid: MdevUuid) -> Result<(), CoreError> {
        if lock(&self.store).remove_incoming(&uuid)?.is_none() {
            return Err(StateError::NotIncoming { uuid }.into());
        }
        info!(%uuid, "incoming migration target completed: an ordinary instance now");
        Ok(())
    }

    /// Removes the device of incoming instance `uuid` (if it still exists), then its record.
    fn release_incoming(&self, uuid: MdevUuid) -> Result<(), CoreError> {
        if self.device_exists(&uuid) {
            match self.destroy_named(uuid) {
                Ok(_) | Err(CoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        lock(&self.store).remove_incoming(&uuid)?;
        Ok(())
    }

    /// Whether a process holds incoming instance `uuid`'s device: its VFIO group cannot be opened
    /// because someone has it open (EBUSY). A device without a group or group node (a simulated host)
    /// is held by nobody.
    fn device_held(&self, uuid: &MdevUuid) -> bool {
        let Ok(Some(group)) = self
            .host
            .link_name(&paths::mdev_device(uuid).join("iommu_group"))
        else {
            return false;
        };
        let node = Path::new("/dev/vfio").join(group);
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&node)
        {
            Ok(_) => false,
            Err(e) => e.raw_os_error() == Some(nix::libc::EBUSY),
        }
    }

    /// One look at the incoming records at time `now` (see the module docs).
    pub(super) fn reap_incoming(&self, now: u64) {
        let records: Vec<IncomingRecord> = lock(&self.store).incoming().cloned().collect();
        for r in records {
            // Checked before the device: a target leaves this set only once its create returned.
            if lock(&self.incoming_making).contains(&r.uuid) {
                continue;
            }
            let result = if !self.device_exists(&r.uuid) {
                info!(uuid = %r.uuid, "incoming migration target gone: its record is dropped");
                lock(&self.store)
                    .remove_incoming(&r.uuid)
                    .map(drop)
                    .map_err(CoreError::from)
            } else if r.until > now {
                continue;
            } else if self.device_held(&r.uuid) {
                info!(uuid = %r.uuid, "incoming migration target is in use past its deadline: kept as an ordinary instance");
                lock(&self.store)
                    .remove_incoming(&r.uuid)
                    .map(drop)
                    .map_err(CoreError::from)
            } else {
                info!(uuid = %r.uuid, "no VM took the incoming migration target before its deadline: released");
                self.release_incoming(r.uuid)
            };
            if let Err(e) = result {
                warn!(uuid = %r.uuid, error = %e, "incoming migration target: retried next time");
            }
        }
    }
}

/// The candidate to use among `fits` (those without problems, best first; `first` is the best): the
/// first on NUMA node `numa` when one is asked for and one is there, else `first` (with a note when
/// the preference could not be met).
fn prefer_numa<'a>(
    fits: &[&'a Candidate],
    first: &'a Candidate,
    numa: Option<u32>,
    notes: &mut Vec<String>,
) -> &'a Candidate {
    let Some(node) = numa else {
        return first;
    };
    if let Some(c) = fits.iter().find(|c| c.numa_node == Some(node)) {
        return c;
    }
    notes.push(format!(
        "no GPU on NUMA node {node} can take it: {} (NUMA node {}) was chosen",
        first.parent,
        first
            .numa_node
            .map_or_else(|| "unknown".to_string(), |n| n.to_string())
    ));
    first
}

/// The deadline `timeout` from now in whole seconds since the Unix epoch, rounded up. The reaper keeps
/// a target while its deadline is after the clock's whole seconds ([`unix_now`]), so rounding up means
/// a target is never released before its full timeout (rounding down released a 1 s target as soon as
/// the clock's second turned).
fn deadline_after(timeout: Duration) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let at = now.saturating_add(timeout);
    at.as_secs()
        .saturating_add(u64::from(at.subsec_nanos() > 0))
}

/// Marks an incoming target as being made while it lives (`Instances::incoming_making`).
struct Making<'a> {
    instances: &'a Instances,
    uuid: MdevUuid,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        lock(&self.instances.incoming_making).remove(&self.uuid);
    }
}

/// Starts the reaper of `instances`' incoming records; it ends when they are dropped.
pub(super) fn spawn_reaper(instances: Weak<Instances>) {
    let started = std::thread::Builder::new()
        .name("incoming-reaper".into())
        .spawn(move || {
            loop {
                std::thread::sleep(REAP_EVERY);
                let Some(i): Option<Arc<Instances>> = instances.upgrade() else {
                    return;
                };
                i.reap_incoming(unix_now());
            }
        });
    if let Err(e) = started {
        warn!(error = %e, "cannot start the reaper of incoming migration targets: their deadlines are not kept");
    }
}

#[cfg(test)]
mod deadline_tests {
    use super::*;

    #[test]
    fn a_deadline_is_never_before_its_full_timeout() {
        for ms in [0, 1, 500, 999, 1000, 1001, 2500] {
            let timeout = Duration::from_millis(ms);
            let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            let until = deadline_after(timeout);
            assert!(
                Duration::from_secs(until) >= before + timeout,
                "{ms} ms: deadline {until} is before {:?}",
                before + timeout
            );
        }
    }
}
