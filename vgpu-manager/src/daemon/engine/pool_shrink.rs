//! Pool slots removed together: the removes of one [`SlotRun::Removes`](super::pool_exec::SlotRun)
//! (running mdev slots of ours on one parent) as one command of the engine.
//!
//! Per slot only its device removal is its own; the ledger entries and definitions of the run go in
//! one durable removal each, after the last device is gone. That is the ledger protocol's order (an
//! entry goes only once its device is gone), and a crash in between leaves entries without devices,
//! which the next start drops, and definitions the interrupted apply's record makes it remove.

use tracing::info;

use mdev_types::ids::MdevUuid;

use super::instances::Instances;
use super::lock;
use super::pool_exec::SlotsFailed;
use crate::daemon::api::{CoreError, StateError};

impl Instances {
    /// The parent of `uuid` when it is an instance of ours (a ledger entry) with one definition
    /// there (no alternates): with its device present, what [`Instances::remove_slots`] takes.
    /// `None` sends the slot the way of a single destroy.
    pub(super) fn owned_on(&self, uuid: &MdevUuid) -> Option<String> {
        let store = lock(&self.store);
        let def = store.get_definition(uuid)?;
        let led = store.get_ledger(uuid)?;
        (led.parent == def.parent && store.alternates_of(uuid).next().is_none())
            .then(|| def.parent.clone())
    }

    /// Removes the devices of `uuids` on `parent` in order, then their ledger entries and
    /// definitions, then announces each slot gone and calls `removed(k)`. Every slot must be
    /// [`Instances::owned_on`] `parent`, and its device was present when the runs were grouped. A
    /// device gone since (removed by someone else) is what its removal would have made of it: the
    /// kernel's `ENOENT` for its `remove` write, and the slot is forgotten like the others. A
    /// failure names how many slots it removed (the first ones, gone entirely) and which one failed
    /// (left as it was, with the rest).
    pub(super) fn remove_slots(
        &self,
        parent: &str,
        uuids: &[MdevUuid],
        removed: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        self.locks.with_parent(parent, || {
            let mut gone = Vec::with_capacity(uuids.len());
            let mut failure = None;
            for (k, uuid) in uuids.iter().enumerate() {
                // Read under the lock: a concurrent command may have changed the slot. Its device
                // is not looked at again: its `remove` write says whether it is still there.
                if self.owned_on(uuid).as_deref() != Some(parent) {
                    failure = Some((
                        k,
                        StateError::Vanished {
                            uuid: *uuid,
                            doing: "removed",
                        }
                        .into(),
                    ));
                    break;
                }
                if let Err(e) = self.remove_mdev_checked(uuid) {
                    failure = Some((k, e));
                    break;
                }
                gone.push(*uuid);
            }
            let forgotten = {
                let mut store = lock(&self.store);
                store
                    .remove_ledgers(&gone)
                    .map_err(CoreError::from)
                    .and_then(|()| store.remove_definitions(&gone))
            };
            for uuid in &gone {
                self.refresh_one(uuid);
            }
            if !gone.is_empty() {
                // One line for the run: a shrink by dozens of slots would otherwise write (and
                // timestamp) a line per slot while it holds the parent's lock.
                let uuids: Vec<String> = gone.iter().map(ToString::to_string).collect();
                info!(%parent, slots = gone.len(), uuids = %uuids.join(","), "pool slots removed");
            }
            if let Err(e) = forgotten {
                // The devices are gone; what the store still holds of them the next start drops.
                return Err(SlotsFailed {
                    done: gone.len(),
                    at: gone.len().saturating_sub(1),
                    error: Box::new(e),
                });
            }
            for k in 0..gone.len() {
                removed(k);
            }
            match failure {
                None => Ok(()),
                Some((at, error)) => Err(SlotsFailed {
                    done: gone.len(),
                    at,
                    error: Box::new(error),
                }),
            }
        })
    }
}
