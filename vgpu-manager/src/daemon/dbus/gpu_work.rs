//! Which GPU objects need re-reading. An instance change can only alter its own GPU's capacity and
//! instance list, which one parent's `available_instances` files tell (`Command::GpuCapacity`); only a
//! kernel event or a reconcile needs a full discovery (`Command::ListGpus`, every device on the host).
//! Marks are coalesced: a burst of changes costs one re-read per GPU.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// Pending GPU refresh work, shared by the marking side and the refreshing task.
#[derive(Debug, Default)]
pub(super) struct GpuWork {
    notify: Notify,
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    all: bool,
    gpus: BTreeSet<String>,
}

/// What the refreshing task is to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Work {
    /// Re-discover every GPU.
    All,
    /// Re-read the capacity of these GPUs.
    Gpus(Vec<String>),
}

impl GpuWork {
    /// Every GPU may have changed (a kernel event, a reconcile).
    pub(super) fn all(&self) {
        self.lock().all = true;
        self.notify.notify_one();
    }

    /// An instance on GPU `id` changed.
    pub(super) fn gpu(&self, id: &str) {
        self.lock().gpus.insert(id.to_string());
        self.notify.notify_one();
    }

    /// Waits for marks and takes them all.
    pub(super) async fn next(&self) -> Work {
        loop {
            self.notify.notified().await;
            let mut p = self.lock();
            let work = if p.all {
                Work::All
            } else if p.gpus.is_empty() {
                // A permit left by marks already taken with an earlier batch.
                continue;
            } else {
                Work::Gpus(p.gpus.iter().cloned().collect())
            };
            *p = Pending::default();
            return work;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_are_coalesced_and_a_full_refresh_covers_single_gpus() {
        let w = GpuWork::default();
        w.gpu("b");
        w.gpu("a");
        w.gpu("b");
        assert_eq!(w.next().await, Work::Gpus(vec!["a".into(), "b".into()]));
        w.gpu("a");
        w.all();
        assert_eq!(w.next().await, Work::All);
        w.gpu("c");
        assert_eq!(w.next().await, Work::Gpus(vec!["c".into()]));
    }
}
