//! Running call-out scripts: the [`Runner`] boundary (list a directory, run one script) and the real
//! implementation, [`ProcessRunner`], which runs a script as a child process with a time limit.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::protocol::Call;

/// How a script ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

/// What one run of a script produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub exit: Exit,
    /// Its standard output (at most [`MAX_OUTPUT`] bytes).
    pub stdout: Vec<u8>,
    /// Its standard error (at most [`MAX_OUTPUT`] bytes).
    pub stderr: Vec<u8>,
}

impl Outcome {
    /// An outcome with exit status `code` and the given output.
    #[cfg(test)]
    pub fn code(code: i32, stdout: &str) -> Outcome {
        Outcome {
            exit: Exit::Code(code),
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
        }
    }
}

/// Why a script could not be run to its end.
#[derive(Debug, Error)]
pub enum RunError {
    /// The script could not be started (not executable, not a file, no interpreter).
    #[error("cannot run call-out script {}: {source}", script.display())]
    Spawn {
        /// The script.
        script: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The script ran longer than the time limit, and it and its process group were killed.
    #[error(
        "call-out script {} did not finish within {} s and was killed: fix the script or remove it from its directory",
        script.display(),
        limit.as_secs()
    )]
    TimedOut {
        /// The script.
        script: PathBuf,
        /// The time limit.
        limit: Duration,
    },
    /// Waiting for the script failed.
    #[error("cannot wait for call-out script {}: {source}", script.display())]
    Wait {
        /// The script.
        script: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// The boundary to the scripts: the call-out logic above it is pure, and tests give it a fake.
pub trait Runner {
    /// The entries of directory `dir` in the order they are tried (sorted by name); `None` when `dir`
    /// is not a directory that can be read.
    fn entries(&self, dir: &Path) -> Option<Vec<PathBuf>>;
    /// Runs `call`, writing `stdin` (if any) to its standard input and then closing it.
    fn run(&mut self, call: &Call, stdin: Option<&[u8]>) -> Result<Outcome, RunError>;
}

/// The most of each output stream kept from one script; more is read and dropped (the script is
/// not left blocked on a full pipe).
pub const MAX_OUTPUT: u64 = 1 << 20;

/// How long one script may run: mdevctl has no limit, but a hung script would hold up libvirt's
/// node-device driver for ever, so the front end kills it after this long.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs scripts as child processes, each in a process group of its own, which is killed when the
/// script outlives `limit`.
#[derive(Debug, Clone)]
pub struct ProcessRunner {
    limit: Duration,
}

impl ProcessRunner {
    /// A runner that kills a script after `limit`.
    pub fn new(limit: Duration) -> ProcessRunner {
        ProcessRunner { limit }
    }
}

impl Default for ProcessRunner {
    /// A runner with the limit [`SCRIPT_TIMEOUT`].
    fn default() -> Self {
        ProcessRunner::new(SCRIPT_TIMEOUT)
    }
}

/// Output collected from one pipe while the script runs.
type Collected = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;

/// Reads `from` to its end into a shared buffer, keeping at most [`MAX_OUTPUT`] bytes, and says when
/// the pipe is closed.
fn collect(mut from: impl Read + Send + 'static, done: mpsc::Sender<()>) -> Collected {
    let kept: Collected = Collected::default();
    let into = kept.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match from.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    if let Ok(mut buf) = into.lock() {
                        let room = usize::try_from(MAX_OUTPUT)
                            .unwrap_or(usize::MAX)
                            .saturating_sub(buf.len());
                        buf.extend_from_slice(&chunk[..n.min(room)]);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = done.send(());
    });
    kept
}

fn taken(c: &Collected) -> Vec<u8> {
    c.lock()
        .map(|mut b| std::mem::take(&mut *b))
        .unwrap_or_default()
}

impl Runner for ProcessRunner {
    fn entries(&self, dir: &Path) -> Option<Vec<PathBuf>> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        paths.sort();
        Some(paths)
    }

    fn run(&mut self, call: &Call, stdin: Option<&[u8]>) -> Result<Outcome, RunError> {
        let script = &call.script;
        let deadline = Instant::now() + self.limit;
        let mut child = Command::new(script)
            .args(call.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| RunError::Spawn {
                script: script.clone(),
                source,
            })?;
        let group = i32::try_from(child.id()).ok();
        let timed_out = || {
            if let Some(g) = group {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(g),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            RunError::TimedOut {
                script: script.clone(),
                limit: self.limit,
            }
        };
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().map(|p| collect(p, tx.clone()));
        let stderr = child.stderr.take().map(|p| collect(p, tx.clone()));
        drop(tx);
        let input = stdin.map(<[u8]>::to_vec);
        if let Some(mut pipe) = child.stdin.take() {
            // A script that does not read its input may close it early: that is not an error
            // (mdevctl src/callouts.rs invoke_script ignores a broken pipe too).
            std::thread::spawn(move || {
                if let Some(bytes) = input
                    && let Err(e) = pipe.write_all(&bytes)
                    && e.kind() != ErrorKind::BrokenPipe
                {
                    tracing::debug!(error = %e, "cannot write a call-out script's standard input");
                }
            });
        }
        let (status_tx, status_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = status_tx.send(child.wait());
        });
        let remaining = || deadline.saturating_duration_since(Instant::now());
        let status = match status_rx.recv_timeout(remaining()) {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => {
                return Err(RunError::Wait {
                    script: script.clone(),
                    source,
                });
            }
            Err(_) => return Err(timed_out()),
        };
        // A child the script left running may hold the pipes open: its output is awaited only until
        // the same deadline, then the script's result stands with what it wrote so far.
        for _ in 0..2 {
            match rx.recv_timeout(remaining()) {
                Ok(()) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(script = %script.display(), "call-out script exited but something it started still holds its output open");
                    break;
                }
            }
        }
        let (stdout, stderr) = (
            stdout.as_ref().map(taken).unwrap_or_default(),
            stderr.as_ref().map(taken).unwrap_or_default(),
        );
        let exit = match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Signal(0),
        };
        Ok(Outcome {
            exit,
            stdout,
            stderr,
        })
    }
}
