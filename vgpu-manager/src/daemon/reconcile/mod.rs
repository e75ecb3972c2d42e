//! Reconcile: converge the host to the desired state, safely.
//!
//! [`plan`] is pure: from the definitions, the ownership ledger and a snapshot of the host
//! ([`ReconcileInput`]) it computes a [`Plan`] of [`ReconcileStep`]s that tests and logs can read. [`execute`]
//! then carries out the action steps on the daemon's one executor ([`crate::daemon::exec`]) through
//! [`StepActions`] (implemented by the daemon core) and, if one fails, undoes in reverse order what
//! this run already did and reports it ([`ExecReport`]). A command's single create or removal runs
//! the same way ([`execute_steps`], [`Removal`]).
//!
//! Safety rules, enforced by construction:
//!
//! * There is no removal step. Reconcile creates missing devices of autostart definitions and forgets
//!   ledger entries whose device is gone; it never removes a running device (a VM may use it), and a
//!   device with no matching ledger entry (foreign: mdevctl, a shell) is only reported.
//! * Creates follow the store's ledger protocol: ledger entry first, device second; rollback removes
//!   the device first and the entry second, and keeps the entry whenever the device may still exist.
//! * Capacity: creates are only planned while the type's `available_instances` (minus this plan's
//!   earlier creates) is positive; the rest is reported as [`ReconcileStep::Blocked`].

mod exec;
#[cfg(test)]
pub(crate) mod fake;
mod input;
mod plan;
#[cfg(test)]
mod tests;

pub use exec::{
    Change, DeviceStep, ExecReport, LedgerUndo, Removal, RollbackError, StepActions, StepFailure,
    execute, execute_steps,
};
pub use input::{HostInstance, HostParent, HostType, ReconcileInput};
pub use plan::{BlockReason, ConflictReason, Plan, ReconcileStep, plan};
