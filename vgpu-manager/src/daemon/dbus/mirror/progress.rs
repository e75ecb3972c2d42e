//! Coalescing of a pool apply's `PoolProgress` signals: at most one per pool per
//! [`PROGRESS_SPACING`], none of its steps dropped.
//!
//! A pool of dozens of slots finishes a step every few milliseconds, and each signal is a message
//! every subscriber's bus connection is offered. A step that finishes within the spacing of the
//! pool's last signal is held; the next signal sent carries it too, one step per line of its `step`
//! argument, and `done` counts them all. The first step goes out at once (a client sees the apply
//! start), so does the last (`done == total`: the apply's reply follows it), and a held step goes
//! out once the spacing has passed even when no other step follows (an apply that failed).
//!
//! The logic here is pure: the mirror task offers each progress event with the time, sends what
//! comes back, and calls [`Coalescer::flush`] when [`Coalescer::due`] passes.

use std::time::Duration;

use tokio::time::Instant;

/// The least time between two `PoolProgress` signals of one pool, unless the later one is the
/// apply's last step.
pub(super) const PROGRESS_SPACING: Duration = Duration::from_millis(50);

/// One `PoolProgress` signal to send: steps up to `done` of `total` finished, `step` naming each
/// step since the pool's previous signal, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProgressSignal {
    pub(super) pool: String,
    pub(super) done: u32,
    pub(super) total: u32,
    pub(super) step: String,
}

/// Steps of one pool held back.
#[derive(Debug)]
struct Held {
    signal: ProgressSignal,
    /// The mirror's count of events applied when the first held step was offered: until the steps
    /// go out, the count of events whose signals are sent stays below it.
    first_event: u64,
}

/// Holds back the steps of a pool apply that come quicker than [`PROGRESS_SPACING`].
#[derive(Debug)]
pub(super) struct Coalescer {
    spacing: Duration,
    held: Option<Held>,
    /// The last signal sent: its pool and when.
    last: Option<(String, Instant)>,
}

impl Coalescer {
    /// A coalescer with at least `spacing` between two signals of a pool.
    pub(super) fn new(spacing: Duration) -> Coalescer {
        Coalescer {
            spacing,
            held: None,
            last: None,
        }
    }

    /// Takes the step `signal` (one step: its `step` is one line), offered at `now` as the mirror's
    /// `event`-th event. Returns the signals to send now, in order: none when the step is held.
    pub(super) fn offer(
        &mut self,
        signal: ProgressSignal,
        now: Instant,
        event: u64,
    ) -> Vec<ProgressSignal> {
        let mut out = Vec::new();
        // Another pool's steps: the held ones of the first go out before them.
        if self
            .held
            .as_ref()
            .is_some_and(|h| h.signal.pool != signal.pool)
        {
            out.extend(self.flush(now));
        }
        let recent = self.last.as_ref().is_some_and(|(pool, at)| {
            *pool == signal.pool && now.duration_since(*at) < self.spacing
        });
        // An apply's first and last steps are never held: a client sees it start, and its reply
        // follows its last step.
        let first_or_last = signal.done <= 1 || signal.done >= signal.total;
        match self.held.as_mut() {
            Some(h) => {
                h.signal.done = signal.done;
                h.signal.total = signal.total;
                h.signal.step.push('\n');
                h.signal.step.push_str(&signal.step);
            }
            None => {
                self.held = Some(Held {
                    signal,
                    first_event: event,
                })
            }
        }
        if first_or_last || !recent {
            out.extend(self.flush(now));
        }
        out
    }

    /// When the held steps are due to go out, if any are held.
    pub(super) fn due(&self) -> Option<Instant> {
        self.held.as_ref().map(|_| match &self.last {
            Some((_, at)) => *at + self.spacing,
            None => Instant::now(),
        })
    }

    /// The held steps, as one signal to be sent at `now` (their time has come, another pool's or
    /// the apply's last step follows them, or the core has gone).
    pub(super) fn flush(&mut self, now: Instant) -> Option<ProgressSignal> {
        let held = self.held.take()?;
        self.last = Some((held.signal.pool.clone(), now));
        Some(held.signal)
    }

    /// The count of events whose signals are all sent, given `applied` events applied: below the
    /// first held step while steps are held.
    pub(super) fn announced(&self, applied: u64) -> u64 {
        match &self.held {
            Some(h) => h.first_event.saturating_sub(1).min(applied),
            None => applied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(pool: &str, done: u32, total: u32) -> ProgressSignal {
        ProgressSignal {
            pool: pool.into(),
            done,
            total,
            step: format!("step {done}"),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn quick_steps_are_held_and_go_out_together_with_the_last() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(50));
        // The first step goes out at once.
        assert_eq!(c.offer(step("p", 1, 4), t0, 1), vec![step("p", 1, 4)]);
        assert_eq!(c.announced(1), 1);
        // The next two come within the spacing: held, and the events' signals count stays below.
        assert!(c.offer(step("p", 2, 4), t0 + ms(5), 3).is_empty());
        assert!(c.offer(step("p", 3, 4), t0 + ms(10), 5).is_empty());
        assert_eq!(c.announced(5), 2);
        assert_eq!(c.due(), Some(t0 + ms(50)));
        // The last step goes out at once, with the held ones before it, one per line.
        let sent = c.offer(step("p", 4, 4), t0 + ms(15), 7);
        assert_eq!(
            sent,
            vec![ProgressSignal {
                pool: "p".into(),
                done: 4,
                total: 4,
                step: "step 2\nstep 3\nstep 4".into(),
            }]
        );
        assert_eq!(c.announced(7), 7);
        assert_eq!(c.due(), None);
    }

    #[test]
    fn the_first_step_of_the_next_apply_goes_out_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(50));
        assert_eq!(c.offer(step("p", 2, 2), t0, 1).len(), 1);
        // The same pool applied again at once.
        assert_eq!(
            c.offer(step("p", 1, 3), t0 + ms(1), 2),
            vec![step("p", 1, 3)]
        );
        assert!(c.offer(step("p", 2, 3), t0 + ms(2), 3).is_empty());
    }

    #[test]
    fn a_step_after_the_spacing_goes_out_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(50));
        assert_eq!(c.offer(step("p", 1, 9), t0, 1).len(), 1);
        assert_eq!(
            c.offer(step("p", 2, 9), t0 + ms(60), 2),
            vec![step("p", 2, 9)]
        );
    }

    #[test]
    fn held_steps_go_out_when_due_even_if_no_step_follows() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(50));
        c.offer(step("p", 1, 9), t0, 1);
        assert!(c.offer(step("p", 2, 9), t0 + ms(1), 2).is_empty());
        assert_eq!(c.due(), Some(t0 + ms(50)));
        assert_eq!(c.flush(t0 + ms(50)), Some(step("p", 2, 9)));
        assert_eq!(c.announced(2), 2);
        assert_eq!(c.flush(t0 + ms(51)), None);
    }

    #[test]
    fn another_pools_step_sends_the_held_ones_first() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(50));
        c.offer(step("a", 1, 3), t0, 1);
        assert!(c.offer(step("a", 2, 3), t0 + ms(1), 2).is_empty());
        assert_eq!(
            c.offer(step("b", 1, 2), t0 + ms(2), 3),
            vec![step("a", 2, 3), step("b", 1, 2)]
        );
    }
}
