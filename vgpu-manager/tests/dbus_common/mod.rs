//! Shared by the D-Bus integration tests: run the real `vgpud` (on its embedded bus or on a given bus),
//! run the real `vgpuctl` against it, and watch the daemon's signals.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod crash;
pub mod flood;
pub mod fuse_attr;
pub mod mdevctl;
pub mod metrics;
pub mod name;
pub mod objects;
pub mod sysbus;
pub mod system_bus;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use vgpu_client::{BusAddress, Manager1Proxy, SERVICE};
use zbus::Connection;

/// vgpud's open-file limit in the hostile suites ([`Daemon::limit_fds`]): systemd's default soft
/// `LimitNOFILE`.
pub const HOSTILE_NOFILE: u64 = 1024;

/// How long to wait for something that normally takes milliseconds; only a hang reaches it.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A running `vgpud`; killed (by pid) if the test ends without stopping it.
pub struct Daemon {
    child: Option<Child>,
    /// The bus address clients use.
    pub bus: String,
    log: PathBuf,
}

impl Daemon {
    /// Starts `vgpud --listen unix:path=<dir>/bus.sock --sim demo --state-dir <state>` and waits until
    /// it owns its name.
    pub async fn embedded(dir: &Path, state: &Path) -> Daemon {
        Daemon::embedded_with(dir, state, &[]).await
    }

    /// [`Daemon::embedded`] with its state in `dir/state`, held to [`HOSTILE_NOFILE`] descriptors
    /// ([`Daemon::limit_fds`]), as the hostile suites run it.
    pub async fn embedded_hostile(dir: &Path) -> Daemon {
        Daemon::embedded_hostile_with(dir, &[]).await
    }

    /// [`Daemon::embedded_hostile`] with more arguments.
    pub async fn embedded_hostile_with(dir: &Path, extra: &[&str]) -> Daemon {
        let d = Daemon::embedded_with(dir, &dir.join("state"), extra).await;
        d.limit_fds();
        d
    }

    /// [`Daemon::embedded`] with more arguments.
    pub async fn embedded_with(dir: &Path, state: &Path, extra: &[&str]) -> Daemon {
        let bus = format!("unix:path={}", dir.join("bus.sock").display());
        let args = ["--listen", &bus, "--sim", "demo", "--state-dir"];
        Daemon::start(&args, state, &bus, dir, extra).await
    }

    /// Starts `vgpud --listen unix:path=<dir>/bus.sock --sim <sim> --sim-journal <journal> --state-dir
    /// <state>` and waits until it owns its name. The simulated kernel keeps its state in `journal`, so it
    /// outlives the daemon as a real kernel would: a daemon started again finds what the last one made.
    pub async fn embedded_journaled(dir: &Path, sim: &str, journal: &Path, state: &Path) -> Daemon {
        let bus = format!("unix:path={}", dir.join("bus.sock").display());
        let journal = journal.to_str().expect("journal path is UTF-8");
        let args = [
            "--listen",
            &bus,
            "--sim",
            sim,
            "--sim-journal",
            journal,
            "--state-dir",
        ];
        Daemon::start(&args, state, &bus, dir, &[]).await
    }

    /// Sends SIGHUP (vgpud applies its pool files again).
    pub fn hangup(&self) {
        kill(self.pid(), Signal::SIGHUP).expect("SIGHUP vgpud");
    }

    /// Starts `vgpud --bus <bus> --sim demo --state-dir <state> <extra>` and waits until it owns its name.
    pub async fn on_bus(bus: &str, dir: &Path, state: &Path, extra: &[&str]) -> Daemon {
        let args = ["--bus", bus, "--sim", "demo", "--state-dir"];
        Daemon::start(&args, state, bus, dir, extra).await
    }

    async fn start(args: &[&str], state: &Path, bus: &str, dir: &Path, extra: &[&str]) -> Daemon {
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        all.push(state.as_os_str());
        all.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        Daemon::try_start(&all, bus, dir)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `vgpud ARGS` serving on `bus`, its log in `dir`, and waits until it owns its name;
    /// `Err` with its log if it exits first.
    pub async fn try_start(
        args: &[&std::ffi::OsStr],
        bus: &str,
        dir: &Path,
    ) -> Result<Daemon, String> {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let log = dir.join(format!(
            "vgpud-{}.log",
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
            .args(args)
            .env("VGPU_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create daemon log"))
            .spawn()
            .expect("start vgpud");
        let mut d = Daemon {
            child: Some(child),
            bus: bus.to_string(),
            log,
        };
        d.wait_ready().await?;
        Ok(d)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's process id (for a signal sent from another task).
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id() as i32)
    }

    /// Waits until vgpud owns its name; `Err` with its log if it exits first.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        let bus: BusAddress = self.bus.parse().expect("bus address");
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .expect("running")
                .try_wait()
                .expect("poll vgpud")
            {
                return Err(format!("vgpud exited early ({status}):\n{}", self.log()));
            }
            // Each step bounded: a daemon killed or still starting must not hang the wait.
            let short = Duration::from_secs(2);
            if let Ok(Ok(conn)) = tokio::time::timeout(short, vgpu_client::connect(&bus)).await
                && let Ok(Ok(dbus)) =
                    tokio::time::timeout(short, zbus::fdo::DBusProxy::new(&conn)).await
                && let Ok(Ok(true)) = tokio::time::timeout(
                    short,
                    dbus.name_has_owner(SERVICE.try_into().expect("name")),
                )
                .await
            {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "vgpud not ready:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lowers the running vgpud's open-file limit to [`HOSTILE_NOFILE`] (soft and hard), systemd's
    /// default soft limit, as the hostile suites run it (`prlimit`, util-linux), and checks that it
    /// took.
    pub fn limit_fds(&self) {
        let pid = self.pid();
        let status = Command::new("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--nofile={HOSTILE_NOFILE}:{HOSTILE_NOFILE}"))
            .status()
            .expect("prlimit (Debian package util-linux) must be installed");
        assert!(status.success(), "prlimit --pid={pid} failed: {status}");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let n = HOSTILE_NOFILE.to_string();
        assert_eq!(
            line.split_whitespace().filter(|w| *w == n).count(),
            2,
            "vgpud should run with RLIMIT_NOFILE {n}: {line}"
        );
    }

    /// The running vgpud's resident memory in KiB (`VmRSS` in /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// The descriptors vgpud holds now.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Panics, with its log, if vgpud has exited.
    pub fn assert_running(&mut self, when: &str) {
        if let Some(status) = self
            .child
            .as_mut()
            .expect("running")
            .try_wait()
            .expect("poll vgpud")
        {
            panic!("vgpud exited {when} ({status}):\n{}", self.log());
        }
    }

    /// Waits for the daemon to exit (after a signal sent through [`Daemon::pid`]).
    pub fn wait(mut self) -> ExitStatus {
        self.child
            .take()
            .expect("running")
            .wait()
            .expect("wait for vgpud")
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        kill(self.pid(), Signal::SIGTERM).expect("SIGTERM vgpud");
        self.child
            .take()
            .expect("running")
            .wait()
            .expect("wait for vgpud")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}

/// Runs the real `vgpuctl` with `--bus <bus>` appended, optionally as another user via `setpriv`.
pub async fn vgpuctl_as(user: Option<u32>, bus: &str, args: &[&str]) -> Output {
    vgpuctl_with(user, bus, args, &[]).await
}

/// [`vgpuctl_as`] with environment variables `env` set.
pub async fn vgpuctl_with(
    user: Option<u32>,
    bus: &str,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Output {
    let exe = env!("CARGO_BIN_EXE_vgpuctl");
    let mut cmd = match user {
        Some(uid) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(exe);
            c
        }
        None => tokio::process::Command::new(exe),
    };
    cmd.args(args)
        .arg("--bus")
        .arg(bus)
        .env_remove("VGPU_BUS")
        .env_remove("VGPU_SYSFS_ROOT")
        .envs(env.iter().copied());
    tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("vgpuctl hung")
        .expect("run vgpuctl")
}

/// Runs `vgpuctl` as the test's own user.
pub async fn vgpuctl(bus: &str, args: &[&str]) -> Output {
    vgpuctl_as(None, bus, args).await
}

/// Stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "vgpuctl failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// Asserts success and parses stdout as JSON.
pub fn ok_json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(o)).expect("vgpuctl --json output is JSON")
}

/// A daemon refusal: exit code 2, exactly one line `vgpuctl: ...` on stderr containing every needle.
pub fn assert_refused(o: &Output, needles: &[&str]) -> String {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {err}",
        stdout(o)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(err.starts_with("vgpuctl: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in {err:?}");
    }
    err
}

/// A Manager1 signal, as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sig {
    /// InstanceAdded(path, uuid).
    Added(String, String),
    /// InstanceRemoved(path, uuid).
    Removed(String, String),
    /// InstanceStateChanged(path, uuid, state).
    State(String, String, String),
}

/// Collects Manager1 signals from the moment it is created.
pub struct Signals {
    rx: mpsc::UnboundedReceiver<Sig>,
    seen: Vec<Sig>,
}

impl Signals {
    /// Subscribes (the match rules are in place when this returns).
    pub async fn watch(conn: &Connection) -> Signals {
        let m = Manager1Proxy::new(conn).await.expect("manager proxy");
        let (tx, rx) = mpsc::unbounded_channel();
        let mut added = m.receive_instance_added().await.expect("subscribe");
        let mut removed = m.receive_instance_removed().await.expect("subscribe");
        let mut state = m.receive_instance_state_changed().await.expect("subscribe");
        let t = tx.clone();
        tokio::spawn(async move {
            while let Some(s) = added.next().await {
                let a = s.args().expect("args");
                let _ = t.send(Sig::Added(a.instance.to_string(), a.uuid.to_string()));
            }
        });
        let t = tx.clone();
        tokio::spawn(async move {
            while let Some(s) = removed.next().await {
                let a = s.args().expect("args");
                let _ = t.send(Sig::Removed(a.instance.to_string(), a.uuid.to_string()));
            }
        });
        tokio::spawn(async move {
            while let Some(s) = state.next().await {
                let a = s.args().expect("args");
                let _ = tx.send(Sig::State(
                    a.instance.to_string(),
                    a.uuid.to_string(),
                    a.state.to_string(),
                ));
            }
        });
        Signals {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits until a signal equal to `want` has arrived (signals may interleave across streams).
    pub async fn expect(&mut self, want: Sig) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(i) = self.seen.iter().position(|s| *s == want) {
                self.seen.remove(i);
                return;
            }
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(s)) => self.seen.push(s),
                _ => panic!("signal {want:?} never arrived; got {:?}", self.seen),
            }
        }
    }

    /// Every signal that arrived and was not yet expected.
    pub fn drain(&mut self) -> Vec<Sig> {
        while let Ok(s) = self.rx.try_recv() {
            self.seen.push(s);
        }
        std::mem::take(&mut self.seen)
    }
}

/// Connects a test client to `bus`.
pub async fn client(bus: &str) -> Connection {
    vgpu_client::connect(&bus.parse().expect("bus"))
        .await
        .expect("connect")
}

/// Checks the libvirt domain XML file `path` against libvirt's own schema (`virt-xml-validate FILE
/// domain`; Debian packages libvirt-clients and libxml2-utils), unless `VGPU_SKIP_LIBVIRT_SCHEMA=1`
/// says loudly that it is skipped. `what` names the document in messages.
pub fn validate_domain_file(path: &Path, what: &str) {
    if std::env::var("VGPU_SKIP_LIBVIRT_SCHEMA").as_deref() == Ok("1") {
        eprintln!(
            "\n!!! VGPU_SKIP_LIBVIRT_SCHEMA=1: {what} NOT checked against libvirt's schema !!!\n"
        );
        return;
    }
    let v = Command::new("virt-xml-validate")
        .arg(path)
        .arg("domain")
        .output()
        .unwrap_or_else(|e| panic!("cannot run virt-xml-validate ({e}): apt-get install libvirt-clients libxml2-utils, or set VGPU_SKIP_LIBVIRT_SCHEMA=1"));
    assert!(
        v.status.success(),
        "{what} ({}): {}{}\n{}",
        path.display(),
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}
