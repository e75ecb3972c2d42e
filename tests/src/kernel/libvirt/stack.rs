//! The host's services for libvirt, started in a [`Sysroot`] as a Debian host starts them (the order of
//! their systemd units): `systemd-udevd` (then `udevadm trigger` and `settle`, as
//! systemd-udev-trigger.service does), the system `dbus-daemon`, `vgpud --bus system` (data/vgpud.service's
//! command line) and `libvirtd`. Each runs in the foreground as our child, its stderr in a log file of
//! the test's scratch directory, and is stopped when the [`Stack`] is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::super::runner::TestError;
use super::super::vgpud::{Vgpud, Workdir};
use super::sysroot::{Libvirt, Sysroot};

/// How long a service may take to come up under TCG (measured: a few seconds each).
const UP_WITHIN: Duration = Duration::from_secs(60);
/// How long SIGTERM may take before SIGKILL.
const EXIT_WITHIN: Duration = Duration::from_secs(15);
/// The system bus socket, as the chrooted programs see it (dbus-daemon's system.conf).
pub const SYSTEM_BUS: &str = "/run/dbus/system_bus_socket";
/// libvirtd's socket (libvirt 9.0's monolithic daemon).
pub const LIBVIRTD_SOCKET: &str = "/run/libvirt/libvirt-sock";
/// Subsystems replayed by `udevadm trigger`: what libvirt's node-device driver needs to see.
pub const TRIGGER: &[&str] = &["pci", "mdev", "mtty", "mdpy", "mbochs", "net"];

/// One running service.
#[derive(Debug)]
struct Service {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Service {
    fn stop(mut self) {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + EXIT_WITHIN;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `n` lines of `path`, indented.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sysroot with its services. Fields drop in order: the services (explicitly, newest first),
/// then the sysroot's mounts, then the scratch directory.
pub struct Stack {
    services: Vec<Service>,
    libvirt: Libvirt,
    vgpud: Option<Vgpud>,
    /// The root every service runs in.
    pub root: Sysroot,
    /// Logs and scratch files (below the guest's /tmp, which the sysroot shares).
    pub work: Workdir,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("root", &self.root)
            .field(
                "services",
                &self.services.iter().map(|s| s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Stack {
    /// A sysroot with libvirt `v` and vgpu-manager installed (see [`Sysroot::mount`]), and no service
    /// running yet.
    pub fn new(tag: &str, v: Libvirt) -> Result<Stack, TestError> {
        let work = Workdir::new(&format!("{tag}-{}", v.tag()))?;
        let root = Sysroot::mount(v)?;
        Ok(Stack {
            services: Vec::new(),
            libvirt: v,
            vgpud: None,
            root,
            work,
        })
    }

    /// udevd, the system bus, vgpud and libvirtd (of libvirt `v`), in their units' order.
    pub fn up(tag: &str, v: Libvirt) -> Result<Stack, TestError> {
        let mut s = Stack::new(tag, v)?;
        s.start_udevd()?;
        s.start_dbus()?;
        s.start_vgpud()?;
        s.start_libvirtd()?;
        Ok(s)
    }

    /// As [`Stack::up`], with libvirtd told that its host has UUID `host_uuid` (`host_uuid` in
    /// libvirtd.conf; by default libvirtd takes the machine's SMBIOS UUID, the same for every stack in
    /// one guest, and refuses a migration between two daemons of the same host UUID:
    /// src/qemu/qemu_migration_cookie.c, "Attempt to migrate guest to the same host").
    pub fn up_as_host(tag: &str, v: Libvirt, host_uuid: &str) -> Result<Stack, TestError> {
        let mut s = Stack::new(tag, v)?;
        s.start_udevd()?;
        s.start_dbus()?;
        s.start_vgpud()?;
        let conf = "/etc/libvirt/libvirtd.conf";
        let mut text = std::fs::read_to_string(s.root.path(conf)).unwrap_or_default();
        text.push_str(&format!("\nhost_uuid = \"{host_uuid}\"\n"));
        s.root.write(conf, &text)?;
        s.start_libvirtd()?;
        Ok(s)
    }

    fn spawn(&mut self, name: &'static str, program: &str, args: &[&str]) -> Result<(), TestError> {
        let child = self.spawn_child(name, program, args)?;
        self.services.push(child);
        Ok(())
    }

    fn spawn_child(
        &self,
        name: &'static str,
        program: &str,
        args: &[&str],
    ) -> Result<Service, TestError> {
        let log = self.work.path().join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", log.display())))?;
        let child = self
            .root
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| TestError::Check(format!("cannot start {name} in the sysroot: {e}")))?;
        Ok(Service { name, child, log })
    }

    /// Waits until `ready` holds, failing with `name`'s log when it exits or `UP_WITHIN` passes.
    fn wait_up(
        &mut self,
        name: &str,
        mut ready: impl FnMut(&Stack) -> bool,
    ) -> Result<Duration, TestError> {
        let start = Instant::now();
        loop {
            if ready(self) {
                return Ok(start.elapsed());
            }
            if let Some(s) = self.services.iter_mut().find(|s| s.name == name)
                && let Ok(Some(status)) = s.child.try_wait()
            {
                return Err(TestError::Check(format!(
                    "{name} exited during start-up ({status}); its log:\n{}",
                    tail(&s.log, 30)
                )));
            }
            if start.elapsed() > UP_WITHIN {
                return Err(self.failure(&format!("{name} did not come up within {UP_WITHIN:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `systemd-udevd`, then `udevadm trigger --action=add` of [`TRIGGER`] and `udevadm settle`.
    pub fn start_udevd(&mut self) -> Result<(), TestError> {
        self.spawn("udevd", "/lib/systemd/systemd-udevd", &[])?;
        let control = self.root.path("/run/udev/control");
        self.wait_up("udevd", |_| control.exists())?;
        let mut args = vec!["trigger", "--action=add"];
        let matches: Vec<String> = TRIGGER
            .iter()
            .map(|s| format!("--subsystem-match={s}"))
            .collect();
        args.extend(matches.iter().map(String::as_str));
        self.root.run("udevadm", &args)?;
        self.root.run("udevadm", &["settle", "--timeout=60"])?;
        Ok(())
    }

    /// `dbus-daemon --system` (Debian's system.conf, with our policy in system.d).
    pub fn start_dbus(&mut self) -> Result<(), TestError> {
        self.spawn(
            "dbus-daemon",
            "dbus-daemon",
            &["--system", "--nofork", "--nopidfile"],
        )?;
        let sock = self.root.path(SYSTEM_BUS);
        self.wait_up("dbus-daemon", |_| sock.exists())?;
        Ok(())
    }

    /// The system bus's address from the guest (outside the chroot).
    pub fn bus_address(&self) -> String {
        format!("unix:path={}", self.root.path(SYSTEM_BUS).display())
    }

    /// `vgpud --bus system --state-dir /var/lib/vgpu-manager` (data/vgpud.service), adopted as a
    /// [`Vgpud`] so the test can ask it over D-Bus.
    pub fn start_vgpud(&mut self) -> Result<(), TestError> {
        let s = self.spawn_child(
            "vgpud",
            "vgpud",
            &["--bus", "system", "--state-dir", "/var/lib/vgpu-manager"],
        )?;
        let Service { child, log, .. } = s;
        self.vgpud = Some(Vgpud::adopt(child, self.bus_address(), log)?);
        Ok(())
    }

    /// Stops vgpud (SIGTERM, clean exit required).
    pub fn stop_vgpud(&mut self) -> Result<(), TestError> {
        match self.vgpud.take() {
            Some(d) => d.stop(),
            None => Ok(()),
        }
    }

    /// The running vgpud.
    pub fn vgpud(&self) -> Result<&Vgpud, TestError> {
        self.vgpud
            .as_ref()
            .ok_or_else(|| TestError::Check("vgpud is not running in the sysroot".into()))
    }

    /// `libvirtd` (monolithic: Debian's 9.0 and its 11.3 from bookworm-backports ship no modular
    /// daemons such as virtnodedevd or virtqemud, measured from the packages' file lists), up once its socket exists and its node-device driver lists the
    /// mtty parent (it enumerates udev's devices in a thread after start).
    pub fn start_libvirtd(&mut self) -> Result<(), TestError> {
        let version = self.root.run("libvirtd", &["--version"])?;
        let want = self.libvirt.version();
        if version.split_whitespace().last() != Some(want) {
            return Err(TestError::Check(format!(
                "the sysroot's libvirtd is not {want}: `libvirtd --version` printed {:?}",
                version.trim()
            )));
        }
        self.spawn("libvirtd", "libvirtd", &[])?;
        let sock = self.root.path(LIBVIRTD_SOCKET);
        self.wait_up("libvirtd", |_| sock.exists())?;
        self.wait_up("libvirtd", |s| {
            s.virsh(&["nodedev-list", "--cap", "mdev_types"])
                .is_ok_and(|o| o.lines().any(|l| l.trim() == "mtty_mtty"))
        })?;
        Ok(())
    }

    /// Stops libvirtd.
    pub fn stop_libvirtd(&mut self) {
        if let Some(i) = self.services.iter().position(|s| s.name == "libvirtd") {
            self.services.remove(i).stop();
        }
    }

    /// `virsh -q -c qemu:///system args…` in the sysroot: its stdout, or an error with its stderr and
    /// libvirtd's log.
    pub fn virsh(&self, args: &[&str]) -> Result<String, TestError> {
        let out = self.run_virsh(args)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(self.failure(&format!(
                "`virsh {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    }

    /// `virsh -q -c qemu:///system args…` in the sysroot, run to completion.
    fn run_virsh(&self, args: &[&str]) -> Result<std::process::Output, TestError> {
        self.root
            .command("virsh")
            .args(["-q", "-c", "qemu:///system"])
            .args(args)
            .output()
            .map_err(|e| TestError::Check(format!("cannot run virsh: {e}")))
    }

    /// `virsh args…`, which must fail: its stderr.
    pub fn virsh_fails(&self, args: &[&str]) -> Result<String, TestError> {
        let out = self.run_virsh(args)?;
        if out.status.success() {
            return Err(self.failure(&format!(
                "`virsh {}` succeeded, expected a failure; it printed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Writes `text` to a file in the scratch directory (the same path inside the sysroot) and
    /// returns its path, for `virsh … FILE`.
    pub fn file(&self, name: &str, text: &str) -> Result<String, TestError> {
        let p = self.work.path().join(name);
        std::fs::write(&p, text)
            .map_err(|e| TestError::Check(format!("cannot write {}: {e}", p.display())))?;
        Ok(p.display().to_string())
    }

    /// A check failure quoting the last lines of every service's log.
    pub fn failure(&self, what: &str) -> TestError {
        let mut text = what.to_string();
        for s in &self.services {
            text.push_str(&format!(
                "\n  last lines of {} ({}):\n{}",
                s.name,
                s.log.display(),
                tail(&s.log, 12)
            ));
        }
        if let Some(d) = &self.vgpud {
            text.push_str(&format!("\n  vgpud:\n{}", tail_text(&d.log_text(), 12)));
        }
        TestError::Check(text)
    }

    /// Polls `check` every 20 ms until it holds: the time it took, or a failure naming `what` after
    /// `within`.
    pub fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&Stack) -> Result<bool, TestError>,
    ) -> Result<Duration, TestError> {
        let start = Instant::now();
        loop {
            if check(self)? {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(self.failure(&format!("{what}: not within {within:?}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn tail_text(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Drop for Stack {
    fn drop(&mut self) {
        while let Some(s) = self.services.pop() {
            if s.name == "dbus-daemon" {
                // vgpud first: it holds a connection to the bus.
                drop(self.vgpud.take());
            }
            s.stop();
        }
        drop(self.vgpud.take());
    }
}
