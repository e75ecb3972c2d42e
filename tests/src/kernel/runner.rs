//! A tiny test runner for the real-kernel suite.
//!
//! The suite runs as PID 1's child in a busybox guest, so it cannot use libtest: each [`Test`] is a
//! named function returning [`TestResult`]; [`run`] filters them by name, catches panics, prints one
//! line per test (`ok name`, `FAILED name: reason`, `skipped name: reason`, `elsewhere name: boot`) and
//! closes with `N passed, M failed` (plus `, K skipped` and `, L on another boot` when there are any),
//! the line scripts/vm-test checks.
//!
//! A test is either [`Scope::EveryBoot`] (it checks the kernel or the PCI topology, so every kernel and
//! topology runs it) or [`Scope::OneBoot`] (it checks our integration with user-space peers — libvirt,
//! Nova — which behave the same on every kernel the suite boots): a multi-boot run of scripts/vm-test
//! names one boot for those ([`Boots`]), and the others list them as run elsewhere.

use std::any::Any;
use std::fmt::Display;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use thiserror::Error;
use vgpu_host::ops::LifecycleError;
use vgpu_host::{Errno, HostError};

/// How a test that did not fail ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// The running kernel truly lacks what the test needs (e.g. IOMMUFD on a stock kernel); the reason
    /// names what is missing.
    Skipped(String),
}

/// Why a test failed.
#[derive(Debug, Error)]
pub enum TestError {
    /// A kernel interaction failed unexpectedly.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A lifecycle operation failed unexpectedly.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// A check did not hold; the message says what was expected and what was found.
    #[error("{0}")]
    Check(String),
}

/// What every test returns.
pub type TestResult = Result<Outcome, TestError>;

/// On which boots of a scripts/vm-test run a test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// On every boot: what it checks depends on the kernel or the topology.
    EveryBoot,
    /// On the one boot the run names for user-space integration tests: what it checks (libvirt's and
    /// Nova's view of our devices, domains booting through them) does not change with the kernel, and
    /// each such test takes tens of seconds under TCG.
    OneBoot,
}

/// One named test over a context `C` (the guest, or a stand-in in the runner's own unit tests).
pub struct Test<C> {
    /// Unique name, printed and matched by filters.
    pub name: &'static str,
    /// The test body.
    pub run: fn(&C) -> TestResult,
    /// Which boots run it.
    pub scope: Scope,
}

impl<C> Test<C> {
    /// A test named `name` running `run` on every boot.
    pub const fn new(name: &'static str, run: fn(&C) -> TestResult) -> Self {
        Self {
            name,
            run,
            scope: Scope::EveryBoot,
        }
    }

    /// A user-space integration test named `name` running `run` on one boot of a run ([`Scope::OneBoot`]).
    pub const fn one_boot(name: &'static str, run: fn(&C) -> TestResult) -> Self {
        Self {
            name,
            run,
            scope: Scope::OneBoot,
        }
    }
}

/// Where this run's [`Scope::OneBoot`] tests run (scripts/vm-test's `vmtest.one-boot=` marker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boots {
    /// This boot runs every selected test (a single boot, a filtered run, or the boot named for them).
    All,
    /// Another boot of this run, named `kernel/topology`, runs them; this one lists them as run there.
    OneBootTestsOn(String),
}

/// Counts of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Tests that passed.
    pub passed: usize,
    /// Tests that failed or panicked.
    pub failed: usize,
    /// Tests skipped because the kernel lacks a feature.
    pub skipped: usize,
    /// [`Scope::OneBoot`] tests that another boot of the run runs.
    pub elsewhere: usize,
}

/// The closing line scripts/vm-test parses.
impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.skipped > 0 {
            write!(f, ", {} skipped", self.skipped)?;
        }
        if self.elsewhere > 0 {
            write!(f, ", {} on another boot", self.elsewhere)?;
        }
        Ok(())
    }
}

/// True when `name` is selected: no filters, or a filter is a substring of it.
pub fn selected(name: &str, filters: &[String]) -> bool {
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// Runs the selected tests in order, writing one line per test and the closing summary to `out`;
/// [`Scope::OneBoot`] tests run only when `boots` is [`Boots::All`].
///
/// Output errors are ignored: the guest's console is the only place to report them.
pub fn run<C>(
    tests: &[Test<C>],
    ctx: &C,
    filters: &[String],
    boots: &Boots,
    out: &mut dyn Write,
) -> Report {
    let mut report = Report::default();
    for t in tests.iter().filter(|t| selected(t.name, filters)) {
        if let (Scope::OneBoot, Boots::OneBootTestsOn(there)) = (t.scope, boots) {
            report.elsewhere += 1;
            let _ = writeln!(
                out,
                "elsewhere {}: a user-space integration test, run on the {there} boot of this run",
                t.name
            );
            continue;
        }
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| (t.run)(ctx)));
        let ms = start.elapsed().as_millis();
        let line = match result {
            Ok(Ok(Outcome::Passed)) => {
                report.passed += 1;
                format!("ok {} ({ms} ms)", t.name)
            }
            Ok(Ok(Outcome::Skipped(why))) => {
                report.skipped += 1;
                format!("skipped {}: {why}", t.name)
            }
            Ok(Err(e)) => {
                report.failed += 1;
                format!("FAILED {}: {e}", t.name)
            }
            Err(payload) => {
                report.failed += 1;
                format!("FAILED {}: panicked: {}", t.name, panic_message(&*payload))
            }
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    let _ = writeln!(out, "{report}");
    let _ = out.flush();
    report
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// Fails with `msg` unless `cond` holds.
pub fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<(), TestError> {
    if cond {
        Ok(())
    } else {
        Err(TestError::Check(msg()))
    }
}

/// Fails unless `actual == expected`, naming `what`.
pub fn ensure_eq<T: PartialEq + std::fmt::Debug>(
    what: impl Display,
    actual: T,
    expected: T,
) -> Result<(), TestError> {
    ensure(actual == expected, || {
        format!("{what}: expected {expected:?}, found {actual:?}")
    })
}

/// Fails unless `result` is a [`HostError`] with `errno`; `what` names the operation.
pub fn expect_errno<T: std::fmt::Debug>(
    what: impl Display,
    result: Result<T, HostError>,
    errno: Errno,
) -> Result<(), TestError> {
    match result {
        Err(e) if e.errno == errno => Ok(()),
        Err(e) => Err(TestError::Check(format!(
            "{what}: expected {errno}, the kernel answered {}: {e}",
            e.errno
        ))),
        Ok(v) => Err(TestError::Check(format!(
            "{what}: expected {errno}, but it succeeded ({v:?})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(_: &u32) -> TestResult {
        Ok(Outcome::Passed)
    }
    fn fail(n: &u32) -> TestResult {
        ensure_eq("the number", *n, 2)?;
        Ok(Outcome::Passed)
    }
    fn skip(_: &u32) -> TestResult {
        Ok(Outcome::Skipped("no such feature".into()))
    }
    fn boom(_: &u32) -> TestResult {
        panic!("kaboom")
    }

    fn tests() -> Vec<Test<u32>> {
        vec![
            Test::new("alpha_pass", pass),
            Test::new("beta_fail", fail),
            Test::new("gamma_skip", skip),
            Test::new("delta_panic", boom),
        ]
    }

    #[test]
    fn counts_and_lines() {
        let mut out = Vec::new();
        let r = run(&tests(), &1, &[], &Boots::All, &mut out);
        assert_eq!(
            r,
            Report {
                passed: 1,
                failed: 2,
                skipped: 1,
                elsewhere: 0
            }
        );
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ok alpha_pass ("), "{text}");
        assert_eq!(
            lines[1],
            "FAILED beta_fail: the number: expected 2, found 1"
        );
        assert_eq!(lines[2], "skipped gamma_skip: no such feature");
        assert_eq!(lines[3], "FAILED delta_panic: panicked: kaboom");
        assert_eq!(lines[4], "1 passed, 2 failed, 1 skipped");
    }

    #[test]
    fn filters_select_by_substring() {
        let mut out = Vec::new();
        let r = run(&tests(), &2, &["beta".to_string()], &Boots::All, &mut out);
        assert_eq!(
            r,
            Report {
                passed: 1,
                failed: 0,
                skipped: 0,
                elsewhere: 0
            }
        );
        assert_eq!(
            String::from_utf8(out).unwrap().lines().last(),
            Some("1 passed, 0 failed")
        );
        assert!(!selected("alpha_pass", &["beta".to_string()]));
    }

    #[test]
    fn one_boot_tests_run_only_on_the_boot_named_for_them() {
        let tests = vec![
            Test::new("alpha_pass", pass),
            Test::one_boot("libvirt_fail", fail),
            Test::one_boot("libvirt_pass", pass),
        ];
        let mut out = Vec::new();
        let there = Boots::OneBootTestsOn("stock-6.12/default".into());
        let r = run(&tests, &1, &[], &there, &mut out);
        assert_eq!(
            r,
            Report {
                passed: 1,
                failed: 0,
                skipped: 0,
                elsewhere: 2
            }
        );
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "elsewhere libvirt_fail: a user-space integration test, run on the stock-6.12/default boot of this run"
        );
        assert_eq!(lines[3], "1 passed, 0 failed, 2 on another boot");

        // The boot named for them runs them (and a failure among them counts).
        let mut out = Vec::new();
        let r = run(&tests, &1, &[], &Boots::All, &mut out);
        assert_eq!((r.passed, r.failed, r.elsewhere), (2, 1, 0));
    }

    #[test]
    fn errno_expectations() {
        let e = HostError::new(vgpu_host::HostOp::Write, "/sys/x", Errno::EEXIST);
        assert!(expect_errno("create", Err::<(), _>(e.clone()), Errno::EEXIST).is_ok());
        let msg = expect_errno("create", Err::<(), _>(e), Errno::ENOSPC)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("expected ENOSPC") && msg.contains("EEXIST"),
            "{msg}"
        );
        let msg = expect_errno("create", Ok(()), Errno::ENOSPC)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("succeeded"), "{msg}");
    }
}
