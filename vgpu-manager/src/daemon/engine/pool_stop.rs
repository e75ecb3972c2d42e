//! A pool apply and vgpud's shutdown: the apply stops at a step boundary, and the next start finishes
//! it.
//!
//! Each apply is recorded as in progress (`applying/<pool>.toml` in the state directory, the pool's
//! text) before its first change, and the record is removed once the apply succeeded or was undone.
//! When vgpud is asked to stop (SIGTERM), a running apply completes the step it is in, then stops with
//! [`CoreError::Interrupted`], keeping what it did and the record. The next start applies each recorded
//! pool again ([`Core::finish_interrupted_applies`]): the plan is made from what exists then, so the
//! slots already made are kept and the rest made, and the pool is recorded as applied. Finishing rather
//! than undoing keeps what clients were told was under way, and needs no undo log that outlives the
//! process (the undo journal of an apply is in memory); a crash (SIGKILL, power loss) in the middle of
//! an apply leaves the same record and is finished the same way.

use std::sync::atomic::Ordering;

use tracing::{info, warn};

use super::pool::Pools;
use super::{Core, lock};
use crate::daemon::api::{ApplyPool, CoreError};
use crate::daemon::store::{AppliedPool, unix_now};
use crate::pool::Pool;

/// What the next start did with one apply a shutdown or a crash stopped.
#[derive(Debug)]
pub enum FinishedApply {
    /// The pool is applied now.
    Applied {
        /// The pool.
        pool: String,
        /// Steps the finishing apply ran.
        steps: u32,
    },
    /// The finishing apply failed (and undid its own changes; what the stopped apply did stays). The
    /// record was removed: `vgpuctl pool apply` of the pool file tries again.
    Failed {
        /// The pool.
        pool: String,
        /// Why.
        error: CoreError,
    },
}

impl Pools {
    /// Records that `pool` is being applied with `text`.
    pub(super) fn mark_applying(&self, pool: &Pool, text: &str) -> Result<(), CoreError> {
        lock(&self.store).put_applying(&AppliedPool {
            name: pool.name.clone(),
            text: text.to_string(),
            applied_at: unix_now(),
        })?;
        Ok(())
    }

    /// Removes the record of `pool`'s apply in progress (logged when that fails: the next start then
    /// applies the pool once more, which changes nothing when it is applied).
    pub(super) fn unmark_applying(&self, pool: &Pool) {
        if let Err(e) = lock(&self.store).remove_applying(&pool.name) {
            warn!(pool = %pool.name, error = %e, "the record of a finished pool apply could not be removed; the next start applies the pool again");
        }
    }

    /// The error that stops an apply before step `index` (0-based) of `total` when vgpud is
    /// shutting down.
    pub(super) fn check_stopping(
        &self,
        pool: &Pool,
        index: usize,
        total: usize,
    ) -> Result<(), CoreError> {
        if !self.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        warn!(pool = %pool.name, done = index, total, "vgpud is shutting down: the pool apply stops here; the next start finishes it");
        Err(CoreError::Interrupted {
            pool: pool.name.clone(),
            done: index,
            total,
        })
    }
}

impl Core {
    /// Asks a running pool apply to stop at its next step boundary (vgpud is shutting down): it
    /// returns [`CoreError::Interrupted`], and applies asked for from now on stop before their
    /// first step.
    pub fn begin_shutdown(&self) {
        self.pools.stopping.store(true, Ordering::SeqCst);
    }

    /// Applies again every pool whose apply a shutdown or a crash stopped (recorded as in progress
    /// when the state directory was opened), each finishing as an ordinary apply does. Blocking.
    pub fn finish_interrupted_applies(&self) -> Vec<FinishedApply> {
        let pending: Vec<AppliedPool> = lock(&self.pools.store).applying().cloned().collect();
        let mut out = Vec::new();
        for p in pending {
            info!(pool = %p.name, "finishing a pool apply that the last shutdown stopped");
            match self.execute(ApplyPool {
                toml: p.text.clone(),
            }) {
                Ok(summary) => out.push(FinishedApply::Applied {
                    pool: summary.pool,
                    steps: summary.steps,
                }),
                Err(error) => {
                    // The record names a pool file that no longer applies (a profile gone, a
                    // shortfall): keep it from being retried at every start, unless this start was
                    // itself stopped.
                    if !matches!(error, CoreError::Interrupted { .. })
                        && let Err(e) = lock(&self.pools.store).remove_applying(&p.name)
                    {
                        warn!(pool = %p.name, error = %e, "the record of a stopped pool apply could not be removed");
                    }
                    out.push(FinishedApply::Failed {
                        pool: p.name,
                        error,
                    });
                }
            }
        }
        out
    }
}
