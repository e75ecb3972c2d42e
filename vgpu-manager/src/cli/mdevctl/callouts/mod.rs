//! mdevctl's call-out scripts, run around the front end's commands as mdevctl runs them (mdevctl.rst,
//! "CALLOUT SCRIPTS"; mdevctl src/callouts.rs and src/environment.rs at bd7f10a for the rules):
//!
//! - The scripts are the entries of `usr/lib/mdevctl/scripts.d/callouts` and then
//!   `etc/mdevctl.d/scripts.d/callouts` below the root, each directory in name order; notifiers those
//!   of the two `notifiers` directories.
//! - For a device (parent and type), the first script answering `-e get -a capabilities` with a
//!   `{"supports": …}` answer (and not exit status 2) is its versioned script: every call for that
//!   device goes to it alone, and only for the events and actions it lists.
//! - Without one, each call tries the scripts in order: exit status 2 is "not my device type" (the next
//!   is tried), a script killed by a signal or that cannot start is skipped, and the first other answer
//!   is the answer; a script that answered `pre` with 0 also gets that command's `post`.
//! - `pre` with another status refuses the command (unless `--force`); `post` and notifiers are only
//!   logged; `get attributes` returns the running device's attributes as JSON; `live` (of `modify
//!   --live`) needs a versioned script that lists it.
//!
//! Unlike mdevctl: each script runs under a time limit ([`runner::SCRIPT_TIMEOUT`]); a versioned script
//! killed by a signal is a failure (mdevctl counts it a success); notifiers run in name order (mdevctl's
//! is the directory's); attributes of a `get attributes` answer are taken all or none.

use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

use protocol::AttributesAnswerError;

pub mod protocol;
pub mod runner;

use protocol::{Action, Call, Capabilities, Device, Event, PROVIDES, State};
use runner::{Exit, Outcome, ProcessRunner, RunError, Runner};

/// Why a call-out stopped a command.
#[derive(Debug, Error)]
pub enum CalloutError {
    /// The script answered with a status other than 0 (and, when searching, 2).
    #[error(
        "call-out script {} failed the {event} {action} call-out of mdev {uuid} with exit status {status}{}",
        script.display(),
        force_hint(*event)
    )]
    Failed {
        /// The script.
        script: PathBuf,
        /// The event.
        event: Event,
        /// The action.
        action: Action,
        /// The device.
        uuid: String,
        /// Its exit status.
        status: i32,
    },
    /// The device's versioned script was killed by a signal.
    #[error(
        "call-out script {} was killed by signal {signal} in the {event} {action} call-out of mdev {uuid}{}",
        script.display(),
        force_hint(*event)
    )]
    Killed {
        /// The script.
        script: PathBuf,
        /// The event.
        event: Event,
        /// The action.
        action: Action,
        /// The device.
        uuid: String,
        /// The signal.
        signal: i32,
    },
    /// The device's versioned script does not list the event or the action in its `get capabilities`
    /// answer.
    #[error(
        "call-out script {} does not support the {event} event of action {action} (its get-capabilities answer does not list both), which mdev {uuid} needs: add them to its answer, or remove the script",
        script.display()
    )]
    Unsupported {
        /// The script.
        script: PathBuf,
        /// The event.
        event: Event,
        /// The action.
        action: Action,
        /// The device.
        uuid: String,
    },
    /// `modify --live` without a versioned script for the device (mdevctl's error, with the fix).
    #[error(
        "No callout script with version support found that supports live modify: mdev {uuid} (type {mdev_type} on {parent}) can be changed while running only by a call-out script that answers get-capabilities with the live event; change its definition instead (--defined without --live) and restart it"
    )]
    NoLiveScript {
        /// The device.
        uuid: String,
        /// Its type.
        mdev_type: String,
        /// Its parent.
        parent: String,
    },
    /// The `get attributes` answer is not JSON.
    #[error(
        "Invalid JSON received from callout script {} for the attributes of mdev {uuid}: {source}",
        script.display()
    )]
    AttributesJson {
        /// The script.
        script: PathBuf,
        /// The device.
        uuid: String,
        /// What the JSON reader said.
        #[source]
        source: serde_json::Error,
    },
    /// The `get attributes` answer is JSON of another shape than a list of `{"name": "value"}`.
    #[error(
        "call-out script {} answered get-attributes of mdev {uuid} with {problem}: it must print a list of {{\"name\": \"value\"}} objects",
        script.display()
    )]
    AttributesShape {
        /// The script.
        script: PathBuf,
        /// The device.
        uuid: String,
        /// What is wrong.
        problem: String,
    },
    /// The script could not be run to its end.
    #[error(transparent)]
    Run(#[from] RunError),
}

fn force_hint(event: Event) -> &'static str {
    match event {
        Event::Pre => ": see its messages above, or pass --force to go on anyway",
        _ => ": see its messages above",
    }
}

/// The script that answers for a device, and what it handles.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chosen {
    script: PathBuf,
    supports: Capabilities,
}

/// One command's calls for one device: the script found so far and the command's state.
struct Track<'d> {
    dev: &'d Device,
    script: Option<Chosen>,
    state: State,
}

/// The call-out scripts below one root and the runner that runs them; one per front-end command, so a
/// device's versioned script is looked up once per command (as mdevctl's cache does).
pub struct Callouts {
    callout_dirs: Vec<PathBuf>,
    notifier_dirs: Vec<PathBuf>,
    runner: Box<dyn Runner>,
    /// (parent, type) → the versioned script, or none.
    versioned: Vec<((String, String), Option<Chosen>)>,
    echo: Box<dyn Write>,
}

impl std::fmt::Debug for Callouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callouts")
            .field("callout_dirs", &self.callout_dirs)
            .field("notifier_dirs", &self.notifier_dirs)
            .finish_non_exhaustive()
    }
}

/// The call-out directories below `root`, in priority order (mdevctl src/environment.rs
/// `callout_dirs`).
pub fn callout_dirs(root: &Path) -> Vec<PathBuf> {
    vec![
        root.join("usr/lib/mdevctl/scripts.d/callouts"),
        root.join("etc/mdevctl.d/scripts.d/callouts"),
    ]
}

/// The notifier directories below `root` (mdevctl src/environment.rs `notification_dirs`).
pub fn notifier_dirs(root: &Path) -> Vec<PathBuf> {
    vec![
        root.join("usr/lib/mdevctl/scripts.d/notifiers"),
        root.join("etc/mdevctl.d/scripts.d/notifiers"),
    ]
}

impl Callouts {
    /// No scripts at all: every call-out is a no-op (a simulated host, unit tests of the commands).
    pub fn none() -> Callouts {
        Callouts::with_runner(Vec::new(), Vec::new(), Box::new(ProcessRunner::default()))
    }

    /// The scripts below `root` (`/` on the live host), run as processes; their standard error goes to
    /// ours, each line after the script's file name, as mdevctl prints it.
    pub fn below(root: &Path) -> Callouts {
        Callouts::with_runner(
            callout_dirs(root),
            notifier_dirs(root),
            Box::new(ProcessRunner::default()),
        )
    }

    /// The scripts of `callout_dirs` and `notifier_dirs`, run by `runner`.
    pub fn with_runner(
        callout_dirs: Vec<PathBuf>,
        notifier_dirs: Vec<PathBuf>,
        runner: Box<dyn Runner>,
    ) -> Callouts {
        Callouts {
            callout_dirs,
            notifier_dirs,
            runner,
            versioned: Vec::new(),
            echo: Box::new(std::io::stderr()),
        }
    }

    /// Whether no call-out or notifier script exists (every directory is missing or empty), so that
    /// [`Callouts::invoke`] would only run its operation.
    pub fn is_empty(&self) -> bool {
        self.callout_dirs
            .iter()
            .chain(&self.notifier_dirs)
            .all(|d| self.runner.entries(d).is_none_or(|e| e.is_empty()))
    }

    /// Sends the scripts' standard error to `echo` instead of ours.
    #[cfg(test)]
    pub fn echo_to(mut self, echo: Box<dyn Write>) -> Callouts {
        self.echo = echo;
        self
    }

    /// Runs `op` between the `pre` and `post` call-outs of `action` for `dev`, then the notifiers
    /// (mdevctl src/callouts.rs `invoke`). A refusing `pre` stops the command before `op` unless
    /// `force`; `post` and the notifiers never change the result, which is `op`'s.
    pub fn invoke<T, E>(
        &mut self,
        action: Action,
        dev: &Device,
        force: bool,
        op: impl FnOnce(&mut Callouts) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<CalloutError>,
    {
        let mut t = Track {
            dev,
            script: self.versioned_script(dev),
            state: State::None,
        };
        let conf = dev.config_json();
        let res = match self.call(&mut t, Event::Pre, action, Some(conf.as_bytes())) {
            Err(e) if !force => Err(E::from(e)),
            pre => {
                if let Err(e) = pre {
                    tracing::warn!(uuid = %dev.uuid, %action, error = %e, "going on despite the call-out's refusal (--force)");
                }
                let done = op(self);
                t.state = if done.is_ok() {
                    State::Success
                } else {
                    State::Failure
                };
                if let Err(e) = self.call(&mut t, Event::Post, action, Some(conf.as_bytes())) {
                    tracing::info!(uuid = %dev.uuid, %action, error = %e, "post call-out failed");
                }
                done
            }
        };
        self.notify(&t, action);
        res
    }

    /// The running device's attributes as its call-out script reports them (`get attributes`,
    /// mdevctl src/callouts.rs `get_attributes`): `None` when no script answers or the answer is empty.
    pub fn attributes(
        &mut self,
        dev: &Device,
    ) -> Result<Option<Vec<(String, String)>>, CalloutError> {
        let mut t = Track {
            dev,
            script: self.versioned_script(dev),
            state: State::None,
        };
        let Some(out) = self.call(&mut t, Event::Get, Action::Attributes, None)? else {
            return Ok(None);
        };
        let script = t.script.map(|c| c.script).unwrap_or_default();
        protocol::attributes_from_answer(&out.stdout).map_err(|e| match e {
            AttributesAnswerError::Json(source) => CalloutError::AttributesJson {
                script,
                uuid: dev.uuid.clone(),
                source,
            },
            AttributesAnswerError::Shape(problem) => CalloutError::AttributesShape {
                script,
                uuid: dev.uuid.clone(),
                problem,
            },
        })
    }

    /// `modify --live`: the device's versioned script applies `dev`'s configuration to the running
    /// device (`-e live -a modify`), then the notifiers run (mdevctl src/callouts.rs
    /// `invoke_modify_live`). The caller has checked that `dev` is running with that parent and type.
    pub fn modify_live(&mut self, dev: &Device) -> Result<(), CalloutError> {
        let Some(chosen) = self.versioned_script(dev) else {
            return Err(CalloutError::NoLiveScript {
                uuid: dev.uuid.clone(),
                mdev_type: dev.mdev_type.clone(),
                parent: dev.parent.clone(),
            });
        };
        if !chosen.supports.handles(Event::Live, Action::Modify) {
            return Err(CalloutError::Unsupported {
                script: chosen.script,
                event: Event::Live,
                action: Action::Modify,
                uuid: dev.uuid.clone(),
            });
        }
        let mut t = Track {
            dev,
            script: Some(chosen),
            state: State::None,
        };
        let conf = dev.config_json();
        let res = self
            .call(&mut t, Event::Live, Action::Modify, Some(conf.as_bytes()))
            .map(|_| ());
        self.notify(&t, Action::Modify);
        res
    }

    fn call_of(&self, t: &Track<'_>, script: &Path, event: Event, action: Action) -> Call {
        Call {
            script: script.to_path_buf(),
            event,
            action,
            state: t.state,
            mdev_type: t.dev.mdev_type.clone(),
            uuid: t.dev.uuid.clone(),
            parent: t.dev.parent.clone(),
        }
    }

    /// Copies a script's standard error to ours, after its file name (mdevctl src/callouts.rs
    /// `print_err`).
    fn echo_stderr(&mut self, script: &Path, out: &Outcome) {
        if out.stderr.is_empty() {
            return;
        }
        let name = script
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "unknown script name".into());
        let _ = write!(
            self.echo,
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The scripts of the call-out directories, in the order they are tried.
    fn candidates(&self) -> Vec<PathBuf> {
        self.callout_dirs
            .iter()
            .filter_map(|d| self.runner.entries(d))
            .flatten()
            .collect()
    }

    /// The device's versioned script, looked up once per (parent, type) (mdevctl src/callouts.rs
    /// `find_versioned_script`).
    fn versioned_script(&mut self, dev: &Device) -> Option<Chosen> {
        let key = (dev.parent.clone(), dev.mdev_type.clone());
        if let Some((_, found)) = self.versioned.iter().find(|(k, _)| *k == key) {
            return found.clone();
        }
        let t = Track {
            dev,
            script: None,
            state: State::None,
        };
        let mut found = None;
        for script in self.candidates() {
            let call = self.call_of(&t, &script, Event::Get, Action::Capabilities);
            let out = match self.runner.run(&call, Some(PROVIDES.as_bytes())) {
                Ok(out) => out,
                Err(e) => {
                    tracing::debug!(error = %e, "skipping a call-out script in the capabilities search");
                    continue;
                }
            };
            if matches!(out.exit, Exit::Signal(_) | Exit::Code(2)) {
                continue;
            }
            if let Some(supports) = Capabilities::from_answer(&out.stdout) {
                self.echo_stderr(&script, &out);
                found = Some(Chosen { script, supports });
                break;
            }
        }
        self.versioned.push((key, found.clone()));
        found
    }

    /// One call-out: to the device's script when it has one, else the first script of the search that
    /// answers (mdevctl src/callouts.rs `callout`). `Ok(None)` when no script answered.
    fn call(
        &mut self,
        t: &mut Track<'_>,
        event: Event,
        action: Action,
        stdin: Option<&[u8]>,
    ) -> Result<Option<Outcome>, CalloutError> {
        let uuid = t.dev.uuid.clone();
        let judge = |script: &Path, out: Outcome| match out.exit {
            Exit::Code(0) => Ok(out),
            Exit::Code(status) => Err(CalloutError::Failed {
                script: script.to_path_buf(),
                event,
                action,
                uuid: uuid.clone(),
                status,
            }),
            Exit::Signal(signal) => Err(CalloutError::Killed {
                script: script.to_path_buf(),
                event,
                action,
                uuid: uuid.clone(),
                signal,
            }),
        };
        if let Some(chosen) = t.script.clone() {
            if !chosen.supports.handles(event, action) {
                return Err(CalloutError::Unsupported {
                    script: chosen.script,
                    event,
                    action,
                    uuid,
                });
            }
            let call = self.call_of(t, &chosen.script, event, action);
            let out = self.runner.run(&call, stdin)?;
            self.echo_stderr(&chosen.script, &out);
            return judge(&chosen.script, out).map(Some);
        }
        for script in self.candidates() {
            let call = self.call_of(t, &script, event, action);
            let out = match self.runner.run(&call, stdin) {
                Ok(out) => out,
                Err(e @ RunError::Spawn { .. }) => {
                    tracing::debug!(error = %e, "skipping a call-out script that cannot run");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            match out.exit {
                Exit::Code(2) => continue,
                Exit::Signal(signal) => {
                    tracing::warn!(script = %script.display(), signal, "call-out script was killed by a signal; trying the next");
                    continue;
                }
                Exit::Code(_) => {}
            }
            self.echo_stderr(&script, &out);
            let out = judge(&script, out)?;
            t.script = Some(Chosen {
                script,
                supports: Capabilities::version_1(),
            });
            return Ok(Some(out));
        }
        Ok(None)
    }

    /// Runs every notifier for `action` with the command's state; their results are only logged.
    fn notify(&mut self, t: &Track<'_>, action: Action) {
        let scripts: Vec<PathBuf> = self
            .notifier_dirs
            .iter()
            .filter_map(|d| self.runner.entries(d))
            .flatten()
            .collect();
        for script in scripts {
            let call = self.call_of(t, &script, Event::Notify, action);
            match self.runner.run(&call, None) {
                Ok(out) if out.exit == Exit::Code(0) => {}
                Ok(out) => {
                    tracing::debug!(script = %script.display(), exit = ?out.exit, "notifier failed")
                }
                Err(e) => tracing::debug!(error = %e, "notifier could not run"),
            }
        }
    }
}

/// A `get attributes` answer as (name, value) pairs: `null` is none; otherwise a list of objects of
/// one string member each (mdevctl src/mdev.rs `add_attributes`).
#[cfg(test)]
mod tests;
