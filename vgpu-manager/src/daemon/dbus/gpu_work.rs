//! Which GPU objects need re-reading. An instance change can only alter its own GPU's capacity and
//! instance list, which one parent's `available_instances` files tell (`Command::GpuCapacity`); only a
//! kernel event or a reconcile needs a full discovery (`Command::ListGpus`, every device on the host).
//! Marks are coalesced: a burst of changes costs one re-read per GPU.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

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

    /// Waits for marks and takes them all, no sooner than `spacing` after `last` (when the
    /// previous batch was taken): the first change after a quiet spell is re-read at once, and a
    /// burst (a pool apply's slots, one after another) costs one re-read per GPU per `spacing`
    /// instead of one per change. Marks are never dropped: what arrives while waiting is taken with
    /// the batch.
    pub(super) async fn next_spaced(&self, last: Option<Instant>, spacing: Duration) -> Work {
        loop {
            self.notify.notified().await;
            if let Some(wait) = last.and_then(|t| spacing.checked_sub(t.elapsed())) {
                tokio::time::sleep(wait).await;
            }
            if let Some(work) = self.take() {
                return work;
            }
        }
    }

    /// The marks pending now, taken; `None` when there are none.
    fn take(&self) -> Option<Work> {
        let mut p = self.lock();
        let work = if p.all {
            Work::All
        } else if p.gpus.is_empty() {
            return None;
        } else {
            Work::Gpus(p.gpus.iter().cloned().collect())
        };
        *p = Pending::default();
        Some(work)
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
        assert_eq!(
            w.next_spaced(None, Duration::ZERO).await,
            Work::Gpus(vec!["a".into(), "b".into()])
        );
        w.gpu("a");
        w.all();
        assert_eq!(w.next_spaced(None, Duration::ZERO).await, Work::All);
        w.gpu("c");
        assert_eq!(
            w.next_spaced(None, Duration::ZERO).await,
            Work::Gpus(vec!["c".into()])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_taken_once_per_spacing_and_nothing_is_dropped() {
        let w = std::sync::Arc::new(GpuWork::default());
        let spacing = Duration::from_millis(100);
        // After a quiet spell: at once.
        w.gpu("a");
        let t0 = Instant::now();
        assert_eq!(
            w.next_spaced(None, spacing).await,
            Work::Gpus(vec!["a".into()])
        );
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // Marks during the spacing wait for its end and come together.
        let marker = std::sync::Arc::clone(&w);
        let burst = tokio::spawn(async move {
            for g in ["b", "c", "b"] {
                marker.gpu(g);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let work = w.next_spaced(Some(t0), spacing).await;
        assert_eq!(t0.elapsed(), spacing);
        burst.await.unwrap();
        let mut gpus = match work {
            Work::Gpus(g) => g,
            Work::All => panic!("no full refresh was asked for"),
        };
        // Whatever the burst marked after the batch was taken is the next batch.
        if let Some(rest) = w.take() {
            match rest {
                Work::Gpus(g) => gpus.extend(g),
                Work::All => panic!("no full refresh was asked for"),
            }
        }
        gpus.sort();
        gpus.dedup();
        assert_eq!(gpus, vec!["b".to_string(), "c".to_string()]);
    }
}
