//! The daemon's one executor. Every change to the host and the state directory runs as a sequence of
//! steps through [`Actions`]: each step does its work and records, effect by effect, how to undo it
//! ([`Effects`]). When a step fails, everything recorded so far is undone, newest first, and the
//! outcome is one [`Report`]. Reconcile and the single-instance commands (ledgered mdev devices,
//! `reconcile::execute`) and pool apply (`engine::pool_exec`) all run here; they differ only in
//! their step and undo types.
//!
//! The rollback rule: effects are undone newest first, each one tried. When undoing an effect on an
//! [`Object`] fails, or a step could not tell whether an effect happened ([`Effects::uncertain`]),
//! the *older* effects on that same object are left in place rather than undone, because they are
//! what the newer effect stands on: a ledger entry stays while its device may still exist, a slot's
//! old instance is not brought back while the new one could not be destroyed. Such effects are
//! listed in [`Report::left`].
//!
//! Pure: the executor decides what to undo and in which order; the actions only act. It is tested
//! through both users' fakes with proptest (`reconcile/tests`, `engine/pool_exec_tests.rs`) and by
//! the unit tests below.

use std::collections::BTreeSet;
use std::fmt;

use mdev_types::ids::{MdevUuid, PciAddress};

/// What an effect changed: the unit of the rollback rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Object {
    /// An mdev instance or VF slot with everything recorded for it (ledger entry, definition, slot
    /// record), named by its UUID.
    Instance(MdevUuid),
    /// An SR-IOV physical function, whose VF count a step changed.
    Pf(PciAddress),
}

/// What the executor needs from its user: how to run one step and how to undo one effect.
pub trait Actions<S: Clone + fmt::Display> {
    /// How to undo one effect of a step.
    type Undo: Clone + fmt::Display;
    /// What a step or an undo fails with.
    type Error: fmt::Display + fmt::Debug;

    /// Runs `step`, recording in `effects` how to undo each effect it had, also when it fails
    /// halfway (what it did before failing is undone with the rest).
    fn run(
        &mut self,
        step: &S,
        effects: &mut Effects<Self::Undo, Self::Error>,
    ) -> Result<(), Self::Error>;

    /// Undoes one effect recorded by [`Actions::run`].
    fn undo(&mut self, undo: &Self::Undo) -> Result<(), Self::Error>;
}

impl<U, E> Default for Effects<U, E> {
    fn default() -> Self {
        Effects::new()
    }
}

/// The journal one step writes: the effects it had, with their undo, in the order they happened.
#[derive(Debug)]
pub struct Effects<U, E> {
    done: Vec<(Object, U)>,
    uncertain: Vec<(Object, U, E)>,
}

impl<U, E> Effects<U, E> {
    /// An empty journal (the executor makes one per step; tests may run a step alone).
    pub fn new() -> Self {
        Effects {
            done: Vec::new(),
            uncertain: Vec::new(),
        }
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty() && self.uncertain.is_empty()
    }

    /// An effect happened on `object`; `undo` takes it back.
    pub fn done(&mut self, object: Object, undo: U) {
        self.done.push((object, undo));
    }

    /// An effect on `object` may have happened, and `what` (the undo that would be needed) cannot be
    /// decided because of `error`. Reported as a rollback error; the older effects on `object` are
    /// left in place.
    pub fn uncertain(&mut self, object: Object, what: U, error: E) {
        self.uncertain.push((object, what, error));
    }
}

/// The step that failed.
#[derive(Debug, Clone)]
pub struct StepFailure<S, E> {
    /// Its index in the plan (as the caller numbered the steps).
    pub index: usize,
    /// The step.
    pub step: S,
    /// Why it failed.
    pub error: E,
}

/// An undo that failed, or an effect whose undo could not be decided; its effect stays in place.
#[derive(Debug, Clone)]
pub struct RollbackError<S, U, E> {
    /// The step whose effect it is.
    pub step: S,
    /// The undo that failed (or could not be decided).
    pub what: U,
    /// Why.
    pub error: E,
}

/// An effect left in place, unattempted, because undoing a newer effect on the same object failed.
#[derive(Debug, Clone)]
pub struct LeftInPlace<S, U> {
    /// The step whose effect it is.
    pub step: S,
    /// The undo not attempted.
    pub what: U,
}

/// What an execution did.
#[derive(Debug, Clone)]
pub struct Report<S, U, E> {
    /// Steps that completed, in order. Without a failure these are the plan's effects; with one they
    /// were undone (see `rolled_back`, `rollback_errors`, `left`).
    pub completed: Vec<S>,
    /// The step that failed, if any (execution stops there).
    pub failure: Option<StepFailure<S, E>>,
    /// Completed steps all of whose effects were undone, newest first (the reverse of
    /// `completed` when the rollback succeeded).
    pub rolled_back: Vec<S>,
    /// Effects recorded before the rollback (what `rolled_back` set out to undo); zero when nothing
    /// was rolled back.
    pub effects: usize,
    /// Undos that failed, in the order tried, and effects whose undo could not be decided.
    pub rollback_errors: Vec<RollbackError<S, U, E>>,
    /// Effects left in place because a newer effect on the same object could not be undone.
    pub left: Vec<LeftInPlace<S, U>>,
}

impl<S, U, E> Default for Report<S, U, E> {
    fn default() -> Self {
        Report {
            completed: Vec::new(),
            failure: None,
            rolled_back: Vec::new(),
            effects: 0,
            rollback_errors: Vec::new(),
            left: Vec::new(),
        }
    }
}

impl<S, U, E> Report<S, U, E> {
    /// True when every step succeeded.
    pub fn succeeded(&self) -> bool {
        self.failure.is_none()
    }
}

/// One effect in the journal of a whole run.
struct Entry<U> {
    /// The step (position in `Transaction::steps`).
    step: usize,
    object: Object,
    undo: U,
}

/// A run of steps that is either kept as a whole or undone as a whole. Steps run one at a time
/// ([`Transaction::run`]), so a caller may look at the host between them; a failed step ends the
/// run ([`Failed`], which can only be rolled back), [`Transaction::commit`] keeps it and
/// [`Transaction::roll_back`] undoes it.
pub struct Transaction<'a, S, A: Actions<S> + ?Sized>
where
    S: Clone + fmt::Display,
{
    actions: &'a mut A,
    /// Every step run, with its index in the plan.
    steps: Vec<(usize, S)>,
    journal: Vec<Entry<A::Undo>>,
    /// Effects whose undo could not be decided: (step position, object, what, why).
    uncertain: Vec<(usize, Object, A::Undo, A::Error)>,
}

/// A run whose step failed: it can only be undone ([`Failed::roll_back`]).
pub struct Failed<'a, S, A: Actions<S> + ?Sized>
where
    S: Clone + fmt::Display,
{
    run: Transaction<'a, S, A>,
    failure: StepFailure<S, A::Error>,
}

impl<'a, S: Clone + fmt::Display, A: Actions<S> + ?Sized> Transaction<'a, S, A> {
    /// Starts a run with nothing done yet.
    pub fn new(actions: &'a mut A) -> Self {
        Transaction {
            actions,
            steps: Vec::new(),
            journal: Vec::new(),
            uncertain: Vec::new(),
        }
    }

    /// Runs `step` (numbered `index` in the caller's plan). A failure ends the run.
    pub fn run(mut self, index: usize, step: &S) -> Result<Self, Failed<'a, S, A>> {
        let mut effects = Effects::new();
        let result = self.actions.run(step, &mut effects);
        let at = self.steps.len();
        self.steps.push((index, step.clone()));
        self.journal
            .extend(effects.done.into_iter().map(|(object, undo)| Entry {
                step: at,
                object,
                undo,
            }));
        self.uncertain.extend(
            effects
                .uncertain
                .into_iter()
                .map(|(object, what, error)| (at, object, what, error)),
        );
        match result {
            Ok(()) => Ok(self),
            Err(error) => {
                tracing::warn!(step = %step, %error, "step failed; undoing this run");
                Err(Failed {
                    run: self,
                    failure: StepFailure {
                        index,
                        step: step.clone(),
                        error,
                    },
                })
            }
        }
    }

    /// Keeps every effect of the run.
    pub fn commit(self) -> Report<S, A::Undo, A::Error> {
        let Transaction {
            steps, uncertain, ..
        } = self;
        let rollback_errors = uncertain
            .into_iter()
            .map(|(at, _, what, error)| RollbackError {
                step: steps[at].1.clone(),
                what,
                error,
            })
            .collect();
        Report {
            completed: steps.into_iter().map(|(_, s)| s).collect(),
            rollback_errors,
            ..Report::default()
        }
    }

    /// Undoes every recorded effect, newest first, under the rollback rule of this module.
    pub fn roll_back(self) -> Report<S, A::Undo, A::Error> {
        self.undo_all(None)
    }

    /// Undoes every recorded effect; `failed_at` is the position of the failed step, if any.
    fn undo_all(self, failed_at: Option<usize>) -> Report<S, A::Undo, A::Error> {
        let Transaction {
            actions,
            steps,
            journal,
            uncertain,
        } = self;
        let mut report = Report {
            effects: journal.len(),
            ..Report::default()
        };
        let mut stuck: BTreeSet<Object> = BTreeSet::new();
        // Steps with an effect that was not undone.
        let mut incomplete: BTreeSet<usize> = BTreeSet::new();
        for (at, object, what, error) in uncertain {
            stuck.insert(object);
            incomplete.insert(at);
            report.rollback_errors.push(RollbackError {
                step: steps[at].1.clone(),
                what,
                error,
            });
        }
        for e in journal.into_iter().rev() {
            if stuck.contains(&e.object) {
                incomplete.insert(e.step);
                report.left.push(LeftInPlace {
                    step: steps[e.step].1.clone(),
                    what: e.undo,
                });
                continue;
            }
            if let Err(error) = actions.undo(&e.undo) {
                tracing::warn!(undo = %e.undo, %error, "undo failed; its effect stays");
                stuck.insert(e.object);
                incomplete.insert(e.step);
                report.rollback_errors.push(RollbackError {
                    step: steps[e.step].1.clone(),
                    what: e.undo,
                    error,
                });
            }
        }
        let completed = |at: &usize| Some(*at) != failed_at;
        report.completed = steps
            .iter()
            .enumerate()
            .filter(|(at, _)| completed(at))
            .map(|(_, (_, s))| s.clone())
            .collect();
        report.rolled_back = steps
            .iter()
            .enumerate()
            .rev()
            .filter(|(at, _)| completed(at) && !incomplete.contains(at))
            .map(|(_, (_, s))| s.clone())
            .collect();
        report
    }
}

impl<S: Clone + fmt::Display, A: Actions<S> + ?Sized> Failed<'_, S, A> {
    /// Undoes the run.
    pub fn roll_back(self) -> Undone<S, A::Undo, A::Error> {
        let at = self.run.steps.len().checked_sub(1);
        Undone {
            failure: self.failure,
            report: self.run.undo_all(at),
        }
    }
}

/// A failed run, undone.
#[derive(Debug, Clone)]
pub struct Undone<S, U, E> {
    /// The step that failed.
    pub failure: StepFailure<S, E>,
    /// The rollback (its `failure` is unset: it is the field above).
    pub report: Report<S, U, E>,
}

/// Runs `steps` in order, stopping at the first failure and then undoing the whole run.
pub fn execute<S: Clone + fmt::Display, A: Actions<S> + ?Sized>(
    actions: &mut A,
    steps: impl IntoIterator<Item = (usize, S)>,
) -> Report<S, A::Undo, A::Error> {
    let mut run = Transaction::new(actions);
    for (index, step) in steps {
        match run.run(index, &step) {
            Ok(next) => run = next,
            Err(failed) => {
                let Undone {
                    failure,
                    mut report,
                } = failed.roll_back();
                report.failure = Some(failure);
                return report;
            }
        }
    }
    run.commit()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Steps of the test: each is a list of (object, value) effects; an effect sets a cell.
    #[derive(Debug, Clone, PartialEq)]
    struct Set(Vec<(u8, u32)>, bool);

    impl fmt::Display for Set {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{:?}", self.0)
        }
    }

    #[derive(Debug, Clone, PartialEq)]
    struct Restore(u8, u32);

    impl fmt::Display for Restore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "set {} back to {}", self.0, self.1)
        }
    }

    #[derive(Default)]
    struct Cells {
        cells: std::collections::BTreeMap<u8, u32>,
        /// Undos of these cells fail.
        stuck: BTreeSet<u8>,
    }

    fn object(cell: u8) -> Object {
        Object::Pf(format!("0000:00:{cell:02x}.0").parse().unwrap())
    }

    impl Actions<Set> for Cells {
        type Undo = Restore;
        type Error = String;

        fn run(&mut self, step: &Set, fx: &mut Effects<Restore, String>) -> Result<(), String> {
            for (cell, value) in &step.0 {
                let old = self.cells.insert(*cell, *value).unwrap_or(0);
                fx.done(object(*cell), Restore(*cell, old));
            }
            if step.1 {
                Err(format!("step {step} fails after its effects"))
            } else {
                Ok(())
            }
        }

        fn undo(&mut self, u: &Restore) -> Result<(), String> {
            if self.stuck.contains(&u.0) {
                return Err(format!("cell {} is stuck", u.0));
            }
            self.cells.insert(u.0, u.1);
            Ok(())
        }
    }

    #[test]
    fn a_failed_step_undoes_the_run_newest_first_including_its_own_effects() {
        let mut c = Cells::default();
        let steps = [
            Set(vec![(1, 10)], false),
            Set(vec![(1, 11), (2, 20)], false),
            Set(vec![(3, 30)], true),
            Set(vec![(4, 40)], false),
        ];
        let report = execute(&mut c, steps.iter().cloned().enumerate());
        let f = report.failure.as_ref().unwrap();
        assert_eq!(f.index, 2);
        assert_eq!(report.completed, steps[..2].to_vec());
        assert_eq!(report.rolled_back, vec![steps[1].clone(), steps[0].clone()]);
        assert_eq!(report.effects, 4);
        assert!(report.rollback_errors.is_empty() && report.left.is_empty());
        assert!(c.cells.values().all(|v| *v == 0), "{:?}", c.cells);
        assert!(!c.cells.contains_key(&4), "nothing runs after the failure");
    }

    #[test]
    fn a_failed_undo_leaves_the_older_effects_on_its_object_and_undoes_the_rest() {
        let mut c = Cells::default();
        c.stuck.insert(1);
        let steps = [
            Set(vec![(1, 10), (2, 20)], false),
            Set(vec![(1, 11)], false),
            Set(vec![(5, 50)], true),
        ];
        let report = execute(&mut c, steps.iter().cloned().enumerate());
        assert_eq!(report.rollback_errors.len(), 1);
        assert_eq!(report.rollback_errors[0].what, Restore(1, 10));
        assert_eq!(report.left.len(), 1);
        assert_eq!(report.left[0].what, Restore(1, 0));
        assert_eq!(c.cells[&1], 11, "both effects on cell 1 stay");
        assert_eq!((c.cells[&2], c.cells[&5]), (0, 0), "the others were undone");
        assert!(report.rolled_back.is_empty(), "no step was fully undone");
    }

    #[test]
    fn an_uncertain_effect_keeps_what_lies_under_it() {
        struct Unsure(Cells);
        impl Actions<Set> for Unsure {
            type Undo = Restore;
            type Error = String;
            fn run(&mut self, s: &Set, fx: &mut Effects<Restore, String>) -> Result<(), String> {
                let r = self.0.run(s, fx);
                if s.1 {
                    fx.uncertain(object(7), Restore(7, 0), "cannot read cell 7".into());
                }
                r
            }
            fn undo(&mut self, u: &Restore) -> Result<(), String> {
                self.0.undo(u)
            }
        }
        let mut u = Unsure(Cells::default());
        let steps = [Set(vec![(7, 70), (8, 80)], false), Set(vec![], true)];
        let report = execute(&mut u, steps.iter().cloned().enumerate());
        assert_eq!(report.rollback_errors.len(), 1);
        assert_eq!(u.0.cells[&7], 70, "kept: an effect on it is uncertain");
        assert_eq!(u.0.cells[&8], 0);
    }

    #[test]
    fn a_successful_run_is_kept_and_a_forced_rollback_undoes_it() {
        let mut c = Cells::default();
        let steps = [Set(vec![(1, 10)], false), Set(vec![(2, 20)], false)];
        let report = execute(&mut c, steps.iter().cloned().enumerate());
        assert!(report.succeeded() && report.rolled_back.is_empty());
        assert_eq!(report.completed, steps.to_vec());
        let run = Transaction::new(&mut c);
        let report = run
            .run(0, &Set(vec![(1, 12)], false))
            .ok()
            .unwrap()
            .roll_back();
        assert!(report.succeeded());
        assert_eq!(report.rolled_back.len(), 1);
        assert_eq!(c.cells[&1], 10);
    }
}
