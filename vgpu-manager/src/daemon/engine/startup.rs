//! The startup reconcile when the host could not be read at start: it is owed, not skipped. vgpud
//! serves from its state directory at once, and the reconcile (autostart definitions created, the
//! instance views computed, VF slots of autostart pools made again) runs on the first kernel event
//! or back-off retry after which the host reads.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{info, warn};

use super::{Core, GpuImpact, ReconcileScope};
use crate::daemon::api::CoreError;

/// The first wait between two retries of an owed startup reconcile; each failed retry doubles it.
pub const STARTUP_RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between two retries of an owed startup reconcile (the back-off's bound): a host
/// that reads again is noticed within this time even when the kernel sends no event for it.
pub const STARTUP_RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait after `previous`: doubled, at most [`STARTUP_RETRY_MAX`].
pub fn next_retry_delay(previous: Duration) -> Duration {
    previous.saturating_mul(2).min(STARTUP_RETRY_MAX)
}

/// What a retry of the startup reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupRetry {
    /// Nothing was owed (the startup reconcile had already run).
    NotOwed,
    /// It ran now: every GPU object must be read again (none was served while the host was unread).
    Done,
    /// The host still cannot be read; it stays owed.
    StillOwed,
}

impl Core {
    /// Whether the startup reconcile is still owed (the host could not be read when it was due).
    pub fn startup_owed(&self) -> bool {
        !self.instances.startup_done.load(Ordering::SeqCst)
    }

    /// Runs the owed startup reconcile, if one is owed, and then makes the VF slots of autostart pools
    /// again. A host that still cannot be read leaves it owed (logged as a warning); any other
    /// failure of the reconcile also leaves it owed (the next retry plans from what is there then).
    pub fn retry_startup(&self) -> StartupRetry {
        if !self.startup_owed() {
            return StartupRetry::NotOwed;
        }
        match self.instances.reconcile(ReconcileScope::Startup) {
            Ok(report) => {
                info!(
                    steps = report.completed.len(),
                    "the host reads again: the owed startup reconcile ran"
                );
                self.vf_slots.reconcile(|pool| self.pools.autostart(pool));
                StartupRetry::Done
            }
            Err(CoreError::Host(e)) => {
                warn!(error = %e, "the host still cannot be read: the startup reconcile stays owed");
                StartupRetry::StillOwed
            }
            Err(e) => {
                warn!(error = %e, "the owed startup reconcile failed; it is retried");
                StartupRetry::StillOwed
            }
        }
    }

    /// [`Core::handle_uevent`]'s first part: any kernel event is a reason to retry an owed startup
    /// reconcile (a driver bound, a device back on the bus).
    pub(super) fn uevent_retries_startup(&self) -> Option<GpuImpact> {
        if !self.startup_owed() {
            return None;
        }
        (self.retry_startup() == StartupRetry::Done).then_some(GpuImpact::All)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_back_off_doubles_up_to_its_bound() {
        let mut d = STARTUP_RETRY_FIRST;
        let mut seen = vec![d];
        for _ in 0..10 {
            d = next_retry_delay(d);
            seen.push(d);
        }
        assert_eq!(seen[1], Duration::from_secs(2));
        assert_eq!(seen[6], STARTUP_RETRY_MAX);
        assert!(seen.iter().all(|d| *d <= STARTUP_RETRY_MAX));
        assert_eq!(next_retry_delay(Duration::MAX), STARTUP_RETRY_MAX);
    }
}
