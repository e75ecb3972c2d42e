//! Prometheus metrics of vgpud: every GPU, mdev type, instance, pool slot and operation
//! (`docs/metrics.md` lists each family with its labels).
//!
//! * [`text`] — the Prometheus text format 0.0.4 and OpenMetrics 1.0, written into one buffer.
//! * [`ops`] — what the engine records as it runs operations ([`OpMetrics`]).
//! * [`snapshot`] — the host families, gathered from the engine's views when they changed and
//!   written at every scrape without reading the host ([`Snapshot`]).
//! * [`process`] — the usual process metrics (CPU, memory, descriptors).
//! * [`http`] — the listener of `vgpud --metrics-listen` (`GET /metrics` only, bounded).
//!
//! The engine keeps one [`Registry`] ([`Core::metrics`](crate::daemon::engine::Core::metrics)); the
//! [`GetMetrics`](crate::daemon::api::GetMetrics) command renders it, for the listener and for
//! `vgpuctl metrics` over D-Bus alike.

pub mod http;
pub mod ops;
pub mod process;
pub mod snapshot;
pub mod text;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use ops::OpMetrics;
pub use snapshot::Snapshot;
pub use text::{Exposition, Format, Kind};

/// How stale a snapshot a render may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Rebuilt whenever something changed since it was built (`vgpuctl metrics`, tests).
    Current,
    /// Rebuilt after a change only once the last build is a few build times old (at most
    /// [`MAX_REBUILD_INTERVAL`]), so that scrapes during a burst of changes do not read the host
    /// each time; else the last snapshot (scrapes of the listener).
    Throttled,
}

/// The longest a throttled scrape keeps answering from a snapshot older than a change.
pub const MAX_REBUILD_INTERVAL: Duration = Duration::from_secs(1);

/// A snapshot is rebuilt at least this often even when nothing vgpud saw changed (what the host
/// changes without an event: scheduling shares, the capacity a foreign device took).
pub const MAX_SNAPSHOT_AGE: Duration = Duration::from_secs(30);

/// What a snapshot was built from: the instance views' generation and the recorder's epoch.
pub type SnapshotKey = (u64, u64);

#[derive(Debug)]
struct Cached {
    key: SnapshotKey,
    built: Instant,
    took: Duration,
    snapshot: Arc<Snapshot>,
}

/// The metrics of one engine: the operation recorder and the last host snapshot.
#[derive(Debug, Default)]
pub struct Registry {
    ops: OpMetrics,
    cached: Mutex<Option<Cached>>,
    /// Held while a snapshot is built: one build at a time.
    building: Mutex<()>,
    /// The size of the last exposition, to size the next one's buffer.
    last_len: std::sync::atomic::AtomicUsize,
}

impl Registry {
    /// The operation recorder.
    pub fn ops(&self) -> &OpMetrics {
        &self.ops
    }

    /// The snapshot for `key`: the cached one when still good for `freshness`, else one `build`s
    /// (one build at a time; a throttled caller that finds a build running uses the last snapshot).
    pub fn snapshot(
        &self,
        key: SnapshotKey,
        freshness: Freshness,
        build: impl FnOnce() -> Snapshot,
    ) -> Arc<Snapshot> {
        let good = |c: &Cached| {
            let age = c.built.elapsed();
            if age >= MAX_SNAPSHOT_AGE {
                return false;
            }
            c.key == key
                || (freshness == Freshness::Throttled
                    && age < (c.took * 4).min(MAX_REBUILD_INTERVAL))
        };
        let last = {
            let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
            match cached.as_ref() {
                Some(c) if good(c) => return c.snapshot.clone(),
                c => c.map(|c| c.snapshot.clone()),
            }
        };
        let _building = match (freshness, last, self.building.try_lock()) {
            (_, _, Ok(g)) => g,
            (Freshness::Throttled, Some(last), Err(_)) => return last,
            _ => self.building.lock().unwrap_or_else(|p| p.into_inner()),
        };
        // Another build may have finished while this one waited.
        if let Some(c) = self
            .cached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            && c.key == key
            && c.built.elapsed() < MAX_SNAPSHOT_AGE
        {
            return c.snapshot.clone();
        }
        let started = Instant::now();
        let snapshot = Arc::new(build());
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some(Cached {
            key,
            built: Instant::now(),
            took: started.elapsed(),
            snapshot: snapshot.clone(),
        });
        snapshot
    }

    /// The exposition of `snapshot` and of everything this registry records, in `format`.
    pub fn render(&self, format: Format, snapshot: &Snapshot) -> String {
        use std::sync::atomic::Ordering;
        let capacity = self
            .last_len
            .load(Ordering::Relaxed)
            .max(snapshot.estimated_bytes());
        let mut e = Exposition::with_capacity(format, capacity + capacity / 8);
        e.family(
            "vgpud_build",
            Kind::Info,
            "The vgpud that serves these metrics.",
        )
        .sample(&[("version", env!("CARGO_PKG_VERSION"))], 1.0);
        snapshot.write(&mut e);
        self.ops.write(&mut e);
        process::write(&mut e);
        let text = e.finish();
        self.last_len.store(text.len(), Ordering::Relaxed);
        text
    }
}

#[cfg(test)]
mod tests;
