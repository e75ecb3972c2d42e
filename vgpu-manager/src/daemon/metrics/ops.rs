//! What the engine records as it works: every operation's outcome and duration, reconcile runs and
//! kernel events ([`OpMetrics`]). Recording is a few atomic adds and, per operation, one short lock.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::text::{Exposition, HistogramValue, Kind};

/// Upper bounds (seconds) of `vgpu_operation_duration_seconds`: from a 1 ms metadata change to a
/// pool apply of many slots (an SR-IOV VF enable can take seconds).
pub const DURATION_BOUNDS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// One operation's durations.
#[derive(Debug, Clone, Default)]
struct Durations {
    /// Observations at or below each bound of [`DURATION_BOUNDS`] (not yet cumulative).
    per_bucket: [u64; DURATION_BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Durations {
    fn observe(&mut self, secs: f64) {
        if let Some(i) = DURATION_BOUNDS.iter().position(|b| secs <= *b) {
            self.per_bucket[i] += 1;
        }
        self.count += 1;
        self.sum += secs;
    }

    fn cumulative(&self) -> [u64; DURATION_BOUNDS.len()] {
        let mut out = self.per_bucket;
        for i in 1..out.len() {
            out[i] += out[i - 1];
        }
        out
    }
}

#[derive(Debug, Default)]
struct Operations {
    /// (op, result) → count.
    outcomes: BTreeMap<(&'static str, &'static str), u64>,
    /// op → durations.
    durations: BTreeMap<&'static str, Durations>,
}

/// The engine's counters and histograms. Thread-safe.
#[derive(Debug, Default)]
pub struct OpMetrics {
    ops: Mutex<Operations>,
    /// Operations that change state recorded so far (a snapshot built before the latest is stale).
    changes: AtomicU64,
    reconcile_runs: AtomicU64,
    reconcile_failures: AtomicU64,
    /// Seconds since the Unix epoch of the last successful reconcile, as `f64` bits (0: never).
    reconcile_last_success: AtomicU64,
    uevents: AtomicU64,
}

/// The operations `vgpu_operations_total` is born with (at 0, for every result in
/// [`SEEDED_RESULTS`]), so `rate()` over them works from the first scrape; others appear when first
/// run.
pub const SEEDED_OPS: [&str; 6] = ["create", "define", "start", "stop", "destroy", "pool_apply"];

/// The result each seeded operation starts with.
pub const SEEDED_RESULTS: [&str; 1] = ["ok"];

impl OpMetrics {
    /// Records one operation: its name (`create`, `pool_apply`, …), its result (`ok`, or the kind of
    /// error, as the D-Bus error name ends: `TypeFull`, `NotFound`, …) and how long it took.
    pub fn operation(&self, op: &'static str, result: &'static str, took: Duration, change: bool) {
        let secs = took.as_secs_f64();
        {
            let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
            *ops.outcomes.entry((op, result)).or_insert(0) += 1;
            ops.durations.entry(op).or_default().observe(secs);
        }
        if change {
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Records a reconcile run and whether it succeeded (now is then its last success).
    pub fn reconcile(&self, ok: bool) {
        self.reconcile_runs.fetch_add(1, Ordering::Relaxed);
        if ok {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            self.reconcile_last_success
                .store(now.to_bits(), Ordering::Relaxed);
        } else {
            self.reconcile_failures.fetch_add(1, Ordering::Relaxed);
        }
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Records a kernel uevent handled.
    pub fn uevent(&self) {
        self.uevents.fetch_add(1, Ordering::SeqCst);
    }

    /// A number that grows with every recorded change, reconcile and uevent: a snapshot of the host
    /// taken while it read `n` is current until it reads more.
    pub fn epoch(&self) -> u64 {
        self.changes.load(Ordering::SeqCst) + self.uevents.load(Ordering::SeqCst)
    }

    /// How many operations `op` ended with `result`.
    pub fn count(&self, op: &str, result: &str) -> u64 {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        ops.outcomes
            .iter()
            .filter(|((o, r), _)| *o == op && *r == result)
            .map(|(_, n)| *n)
            .sum()
    }

    /// Writes the families of this recorder.
    pub fn write(&self, e: &mut Exposition) {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut f = e.family(
                "vgpu_operations",
                Kind::Counter,
                "Operations vgpud ran (commands that change the host or the desired state, and device opens), by operation and result (ok, or the kind of error as the D-Bus error name ends).",
            );
            for op in SEEDED_OPS {
                for result in SEEDED_RESULTS {
                    if !ops.outcomes.contains_key(&(op, result)) {
                        f.sample(&[("op", op), ("result", result)], 0.0);
                    }
                }
            }
            for ((op, result), n) in &ops.outcomes {
                f.sample(&[("op", op), ("result", result)], *n as f64);
            }
        }
        {
            let mut f = e.family(
                "vgpu_operation_duration_seconds",
                Kind::Histogram,
                "How long operations took, from the engine receiving the command to its reply, by operation.",
            );
            for (op, d) in &ops.durations {
                let cumulative = d.cumulative();
                f.histogram(
                    &[("op", op)],
                    &HistogramValue {
                        bounds: &DURATION_BOUNDS,
                        cumulative: &cumulative,
                        count: d.count,
                        sum: d.sum,
                    },
                );
            }
        }
        drop(ops);
        e.family(
            "vgpu_reconcile_runs",
            Kind::Counter,
            "Reconcile runs (at start, when a parent appears, after kernel events, on request).",
        )
        .sample(&[], self.reconcile_runs.load(Ordering::Relaxed) as f64);
        e.family(
            "vgpu_reconcile_failures",
            Kind::Counter,
            "Reconcile runs that failed (the log says why).",
        )
        .sample(&[], self.reconcile_failures.load(Ordering::Relaxed) as f64);
        e.family(
            "vgpu_reconcile_last_success_timestamp_seconds",
            Kind::Gauge,
            "When the last reconcile succeeded, in seconds since the Unix epoch (0: none yet).",
        )
        .sample(
            &[],
            f64::from_bits(self.reconcile_last_success.load(Ordering::Relaxed)),
        );
        e.family(
            "vgpu_uevents",
            Kind::Counter,
            "Kernel uevents vgpud handled.",
        )
        .sample(&[], self.uevents.load(Ordering::SeqCst) as f64);
    }
}

/// The label an operation's command type gets in `vgpu_operations_total{op}`: the D-Bus method's
/// word in snake case (`create`, `pool_apply`), from the command's type name.
pub fn op_label(type_name: &'static str) -> &'static str {
    let short = type_name.rsplit("::").next().unwrap_or(type_name);
    match short {
        "CreateInstance" => "create",
        "DefineInstance" => "define",
        "StartInstance" => "start",
        "StopInstance" => "stop",
        "DestroyInstance" => "destroy",
        "UndefineInstance" => "undefine",
        "SetAutostart" => "set_autostart",
        "AdoptDefinition" => "adopt_definition",
        "StartDefinition" => "start_definition",
        "RedefineInstance" => "redefine",
        "Reconcile" => "reconcile",
        "ApplyPool" => "pool_apply",
        "ApplyScheduling" => "scheduling_apply",
        "Preflight" => "preflight",
        "MigrationInfo" => "migration_info",
        "PrepareIncoming" => "prepare_incoming",
        "AbortIncoming" => "abort_incoming",
        "CompleteIncoming" => "complete_incoming",
        "OpenDevice" => "open_device",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::metrics::text::Format;

    #[test]
    fn operations_count_and_time_with_cumulative_buckets() {
        let m = OpMetrics::default();
        m.operation("create", "ok", Duration::from_millis(3), true);
        m.operation("create", "ok", Duration::from_millis(40), true);
        m.operation("create", "TypeFull", Duration::from_secs(60), true);
        assert_eq!(m.count("create", "ok"), 2);
        assert_eq!(m.epoch(), 3);
        let mut e = Exposition::with_capacity(Format::Prometheus, 0);
        m.write(&mut e);
        let t = e.finish();
        assert!(
            t.contains("vgpu_operations_total{op=\"create\",result=\"TypeFull\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("vgpu_operations_total{op=\"stop\",result=\"ok\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("vgpu_operation_duration_seconds_bucket{op=\"create\",le=\"0.005\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("vgpu_operation_duration_seconds_bucket{op=\"create\",le=\"0.05\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("vgpu_operation_duration_seconds_bucket{op=\"create\",le=\"30\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("vgpu_operation_duration_seconds_bucket{op=\"create\",le=\"+Inf\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("vgpu_operation_duration_seconds_count{op=\"create\"} 3\n"),
            "{t}"
        );
    }

    #[test]
    fn reconcile_and_uevents_are_counted() {
        let m = OpMetrics::default();
        m.reconcile(false);
        m.reconcile(true);
        m.uevent();
        let mut e = Exposition::with_capacity(Format::Prometheus, 0);
        m.write(&mut e);
        let t = e.finish();
        assert!(t.contains("vgpu_reconcile_runs_total 2\n"), "{t}");
        assert!(t.contains("vgpu_reconcile_failures_total 1\n"), "{t}");
        assert!(t.contains("vgpu_uevents_total 1\n"), "{t}");
        assert!(
            !t.contains("vgpu_reconcile_last_success_timestamp_seconds 0\n"),
            "{t}"
        );
    }

    #[test]
    fn command_types_get_their_method_words() {
        assert_eq!(
            op_label("vgpu_manager::daemon::api::CreateInstance"),
            "create"
        );
        assert_eq!(op_label("x::ApplyPool"), "pool_apply");
    }
}
