//! A deterministic model of a round-robin time-slice scheduler with per-slot quanta and preemption
//! timeouts, as GPU schedulers for VFs and vGPUs work (Intel GuC VF scheduling: each VF runs up to its
//! execution quantum, then is asked to yield and reset if it has not within its preemption timeout —
//! kernel ABI sysfs-driver-intel-xe-sriov, `exec_quantum_ms` / `preempt_timeout_us`; NVIDIA's
//! time-sliced round robin, NVIDIA vGPU user guide "vGPU Schedulers").
//!
//! Time advances in microseconds. Slots are visited in order; a busy slot runs its quantum plus the
//! time its work takes to yield after the quantum expired (`overrun_us`), cut at its preemption
//! timeout (the scheduler resets it then). An idle slot is skipped (work-conserving) unless it is
//! `reserved` (fixed share): then its quantum passes with the engine idle.

/// When a slot has work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Always has work.
    Busy,
    /// Never has work.
    Idle,
    /// Has work for `busy_us`, then none for `idle_us`, repeating, shifted by `phase_us`.
    Periodic {
        /// Length of a busy stretch.
        busy_us: u64,
        /// Length of an idle stretch.
        idle_us: u64,
        /// Offset into the cycle at time 0.
        phase_us: u64,
    },
}

impl Load {
    /// Whether the slot has work at time `t`.
    pub fn busy_at(&self, t: u64) -> bool {
        match *self {
            Load::Busy => true,
            Load::Idle => false,
            Load::Periodic {
                busy_us,
                idle_us,
                phase_us,
            } => {
                let cycle = busy_us.saturating_add(idle_us).max(1);
                (t.saturating_add(phase_us)) % cycle < busy_us
            }
        }
    }

    /// When the current busy stretch began, for a slot busy at `t` (0 for [`Load::Busy`]).
    fn busy_since(&self, t: u64) -> u64 {
        match *self {
            Load::Periodic {
                busy_us,
                idle_us,
                phase_us,
            } => {
                let cycle = busy_us.saturating_add(idle_us).max(1);
                let into = (t.saturating_add(phase_us)) % cycle;
                t.saturating_sub(into)
            }
            _ => 0,
        }
    }
}

/// One slot of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RrSlot {
    /// Its execution quantum, µs.
    pub quantum_us: u64,
    /// Its preemption timeout, µs: the longest it may keep the engine after its quantum.
    pub preempt_timeout_us: u64,
    /// How long its work takes to yield once asked (cut at `preempt_timeout_us`).
    pub overrun_us: u64,
    /// When it has work.
    pub load: Load,
    /// Its quantum is kept for it even while idle (fixed-share scheduling).
    pub reserved: bool,
}

/// What the model measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RrOutcome {
    /// Engine time each slot got, µs.
    pub run_us: Vec<u64>,
    /// Each slot's fraction of the elapsed time.
    pub share: Vec<f64>,
    /// Longest time each slot had work but waited for the engine, µs.
    pub max_wait_us: Vec<u64>,
    /// Total simulated time, µs.
    pub elapsed_us: u64,
}

/// The longest a continuously busy slot `i` can wait: every other slot runs its quantum and its full
/// preemption timeout once (a reserved slot's quantum passes even when it is idle).
pub fn wait_bound_us(slots: &[RrSlot], i: usize) -> u64 {
    slots
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, s)| s.quantum_us.saturating_add(s.preempt_timeout_us))
        .sum()
}

/// Runs `rounds` rounds of the scheduler over `slots`.
pub fn simulate(slots: &[RrSlot], rounds: usize) -> RrOutcome {
    let n = slots.len();
    let mut run = vec![0u64; n];
    let mut max_wait = vec![0u64; n];
    // End of each slot's last run (when it became ready again, if still busy).
    let mut last_end: Vec<u64> = vec![0; n];
    let mut t: u64 = 0;
    // Smallest step to advance when nothing at all can run (keeps idle periods finite).
    let idle_step = slots.iter().map(|s| s.quantum_us.max(1)).min().unwrap_or(1);
    for _ in 0..rounds {
        let mut ran_any = false;
        for (i, s) in slots.iter().enumerate() {
            if s.load.busy_at(t) {
                let ready = last_end[i].max(s.load.busy_since(t));
                max_wait[i] = max_wait[i].max(t.saturating_sub(ready));
                let slice = s
                    .quantum_us
                    .saturating_add(s.overrun_us.min(s.preempt_timeout_us));
                run[i] = run[i].saturating_add(slice);
                t = t.saturating_add(slice);
                last_end[i] = t;
                ran_any = true;
            } else if s.reserved {
                t = t.saturating_add(s.quantum_us);
                ran_any = true;
            }
        }
        if !ran_any {
            t = t.saturating_add(idle_step);
        }
    }
    let share = run
        .iter()
        .map(|r| if t == 0 { 0.0 } else { *r as f64 / t as f64 })
        .collect();
    RrOutcome {
        run_us: run,
        share,
        max_wait_us: max_wait,
        elapsed_us: t,
    }
}
