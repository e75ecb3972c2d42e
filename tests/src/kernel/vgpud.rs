//! The real `vgpud` in the guest: started on the guest's sysfs (`--sysfs-root /`) with an embedded bus
//! (`--listen unix:path=…`) and a state directory of the test's choosing, and driven over D-Bus through
//! the client proxies of `vgpu_client`, synchronously (the suite's tests are plain functions).
//!
//! scripts/vm-test ships the statically linked `vgpud` next to `kernel-tests` in the 9p share; the
//! environment variable `VGPUD` overrides where it is looked for.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use thiserror::Error;
use tokio::runtime::Runtime;
use vgpu_client::{
    BusAddress, ClientError, Gpu1Proxy, GpuInfo, Instance1Proxy, InstanceInfo, Manager1Proxy,
    SERVICE, TARGET_PROFILE, TARGET_TYPE, TypeSlot,
};
use zbus::Connection;
use zbus::Variant;

use super::runner::TestError;

/// How long a daemon may take to own its name after starting. Under TCG (the vm-test guest) start-up
/// takes well under a second; only a hang reaches this.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long one D-Bus call may take before the test gives up on it.
const CALL_WITHIN: Duration = Duration::from_secs(30);
/// How long `SIGTERM` may take to end the daemon.
const EXIT_WITHIN: Duration = Duration::from_secs(20);
/// Lines of the daemon's log quoted in failures.
const LOG_TAIL: usize = 25;

/// A daemon call that failed: the daemon's refusal (with its error kind) or no answer at all.
#[derive(Debug, Error)]
#[error("vgpud {method} failed: {message}\n  last lines of {log}:\n{tail}")]
pub struct CallError {
    /// The D-Bus method.
    pub method: &'static str,
    /// The daemon's error kind (`org.vgpumanager.Error.<Kind>`), when the daemon answered with one.
    pub kind: Option<String>,
    /// The error's one-line message.
    pub message: String,
    /// The daemon's log file.
    pub log: String,
    /// Its last lines, indented.
    pub tail: String,
}

impl From<CallError> for TestError {
    fn from(e: CallError) -> Self {
        TestError::Check(e.to_string())
    }
}

/// A scratch directory below the temp dir (tmpfs in the guest), removed when dropped.
#[derive(Debug)]
pub struct Workdir {
    path: PathBuf,
}

impl Workdir {
    /// A new empty directory named after `tag` below `base`.
    pub fn new_in(base: &Path, tag: &str) -> Result<Workdir, TestError> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = base.join(format!(
            "kernel-tests-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|e| {
            TestError::Check(format!("cannot create scratch dir {}: {e}", path.display()))
        })?;
        Ok(Workdir { path })
    }

    /// A new empty directory named after `tag` below the temp dir.
    pub fn new(tag: &str) -> Result<Workdir, TestError> {
        Self::new_in(&std::env::temp_dir(), tag)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The D-Bus side, kept apart so it can be dropped inside the runtime.
struct Client {
    conn: Connection,
    manager: Manager1Proxy<'static>,
}

/// A running `vgpud`; killed (SIGKILL, by pid) when dropped without [`Vgpud::stop`].
pub struct Vgpud {
    child: Option<Child>,
    bus: String,
    log: PathBuf,
    client: Option<Client>,
    rt: Runtime,
}

impl std::fmt::Debug for Vgpud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vgpud")
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("bus", &self.bus)
            .finish()
    }
}

/// Where the `vgpud` binary is: `$VGPUD`, else next to the running test binary.
pub fn binary() -> Result<PathBuf, TestError> {
    if let Some(p) = std::env::var_os("VGPUD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()
        .map_err(|e| TestError::Check(format!("cannot find the running test binary: {e}")))?;
    let path = exe.with_file_name("vgpud");
    if !path.is_file() {
        return Err(TestError::Check(format!(
            "{} is missing: scripts/vm-test ships the static vgpud next to kernel-tests (or set VGPUD)",
            path.display()
        )));
    }
    Ok(path)
}

fn tail_of(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Vgpud {
    /// Starts `vgpud --sysfs-root / --listen unix:path=<work>/bus.sock --state-dir <state>` (log in
    /// `<work>/vgpud-N.log`) and waits until it owns its bus name.
    pub fn spawn(work: &Path, state: &Path) -> Result<Vgpud, TestError> {
        Vgpud::spawn_with(work, state, &[])
    }

    /// [`Vgpud::spawn`] with more command-line arguments (e.g. `--admin-group NAME`).
    pub fn spawn_with(work: &Path, state: &Path, extra: &[&str]) -> Result<Vgpud, TestError> {
        let bus = format!("unix:path={}", work.join("bus.sock").display());
        Vgpud::launch(work, state, "--listen", bus, extra)
    }

    /// [`Vgpud::spawn`] on a bus that is already running (`--bus ADDRESS`, e.g. a
    /// [`super::bus_daemon::BusDaemon`]) instead of its own embedded one.
    pub fn spawn_on_bus(work: &Path, state: &Path, bus: &str) -> Result<Vgpud, TestError> {
        Vgpud::spawn_on_bus_with(work, state, bus, &[])
    }

    /// [`Vgpud::spawn_on_bus`] with more command-line arguments (e.g. `--private-socket PATH`).
    pub fn spawn_on_bus_with(
        work: &Path,
        state: &Path,
        bus: &str,
        extra: &[&str],
    ) -> Result<Vgpud, TestError> {
        Vgpud::launch(work, state, "--bus", bus.to_string(), extra)
    }

    /// A `vgpud` started elsewhere (e.g. chrooted, on a system bus: `super::libvirt`) as `child`,
    /// logging to `log`, reached at `bus`: waits until it owns its name, then drives it like one this
    /// module started (killed when dropped).
    pub fn adopt(child: Child, bus: String, log: PathBuf) -> Result<Vgpud, TestError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestError::Check(format!("cannot start a tokio runtime: {e}")))?;
        let mut d = Vgpud {
            child: Some(child),
            bus,
            log,
            client: None,
            rt,
        };
        d.wait_ready()?;
        Ok(d)
    }

    /// Starts vgpud with `<bus_flag> <bus>` (`--listen` for its own bus, `--bus` for a running one).
    fn launch(
        work: &Path,
        state: &Path,
        bus_flag: &str,
        bus: String,
        extra: &[&str],
    ) -> Result<Vgpud, TestError> {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let bin = binary()?;
        let log = work.join(format!(
            "vgpud-{}.log",
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let log_file = std::fs::File::create(&log)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", log.display())))?;
        let child = Command::new(&bin)
            .args(["--sysfs-root", "/"])
            .args([bus_flag, &bus])
            .arg("--state-dir")
            .arg(state)
            .args(extra)
            .env("VGPU_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| TestError::Check(format!("cannot start {}: {e}", bin.display())))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestError::Check(format!("cannot start a tokio runtime: {e}")))?;
        let mut d = Vgpud {
            child: Some(child),
            bus,
            log,
            client: None,
            rt,
        };
        d.wait_ready()?;
        Ok(d)
    }

    fn wait_ready(&mut self) -> Result<(), TestError> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(self.failure(&format!("vgpud exited during start-up ({status})")));
            }
            if let Some(client) = self.rt.block_on(try_connect(&self.bus)) {
                self.client = Some(client);
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.failure(&format!(
                    "vgpud did not own {SERVICE} on {} within {READY_WITHIN:?}",
                    self.bus
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Makes every later call go through vgpud's private socket at `path` (one connection, kept),
    /// as a root client that makes calls alone would: no bus routes them, and no signals ride on it.
    pub fn call_through_private_socket(&mut self, path: &Path) -> Result<(), TestError> {
        let client = self.rt.block_on(async {
            let conn = vgpu_client::private::connect_private(path).await?;
            let manager = manager_on(&conn)
                .await
                .map_err(|e| ClientError::from_call("(connect)", &path.display().to_string(), e))?;
            Ok::<_, ClientError>(Client { conn, manager })
        });
        let client = client.map_err(|e| {
            self.failure(&format!(
                "cannot connect to the private socket {}: {e}",
                path.display()
            ))
        })?;
        let _in_rt = self.rt.enter();
        self.client = Some(client);
        Ok(())
    }

    /// A check failure quoting the daemon's log.
    pub fn failure(&self, what: &str) -> TestError {
        TestError::Check(format!(
            "{what}\n  last lines of {}:\n{}",
            self.log.display(),
            tail_of(&self.log, LOG_TAIL)
        ))
    }

    /// The daemon's whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's bus address.
    pub fn bus(&self) -> &str {
        &self.bus
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGTERM and waits for a clean exit (status 0): the daemon gives up its name and stops.
    pub fn stop(mut self) -> Result<(), TestError> {
        {
            let _in_rt = self.rt.enter();
            self.client = None;
        }
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGTERM)
            .map_err(|e| TestError::Check(format!("cannot send SIGTERM to vgpud {pid}: {e}")))?;
        match wait_bounded(&mut child, EXIT_WITHIN) {
            Some(status) if status.success() => Ok(()),
            Some(status) => Err(self.failure(&format!("vgpud ended with {status} after SIGTERM"))),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(self.failure(&format!("vgpud ignored SIGTERM for {EXIT_WITHIN:?}")))
            }
        }
    }

    fn manager(&self) -> Result<&Manager1Proxy<'static>, CallError> {
        self.client
            .as_ref()
            .map(|c| &c.manager)
            .ok_or_else(|| self.call_error("(any)", None, "not connected".into()))
    }

    fn call_error(&self, method: &'static str, kind: Option<String>, message: String) -> CallError {
        CallError {
            method,
            kind,
            message,
            log: self.log.display().to_string(),
            tail: tail_of(&self.log, LOG_TAIL),
        }
    }

    /// Runs one call to completion, bounded by [`CALL_WITHIN`].
    fn call<T>(
        &self,
        method: &'static str,
        fut: impl Future<Output = zbus::Result<T>>,
    ) -> Result<T, CallError> {
        // The timer must be made inside the runtime (tokio needs its reactor).
        match self
            .rt
            .block_on(async { tokio::time::timeout(CALL_WITHIN, fut).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let e = ClientError::from_call(method, &self.bus, e);
                Err(self.call_error(method, e.kind().map(str::to_string), e.to_string()))
            }
            Err(_) => {
                Err(self.call_error(method, None, format!("no answer within {CALL_WITHIN:?}")))
            }
        }
    }

    /// `Manager1.Create(kind, target, gpu, uuid, {})`: the new instance's object path.
    pub fn create(
        &self,
        kind: TargetKind,
        target: &str,
        gpu: &str,
        uuid: Option<&MdevUuid>,
    ) -> Result<String, CallError> {
        let m = self.manager()?;
        let uuid = uuid.map(ToString::to_string).unwrap_or_default();
        self.call(
            "Create",
            m.create(kind.as_str(), target, gpu, &uuid, HashMap::new()),
        )
        .map(|p| p.to_string())
    }

    /// `Manager1.Define(kind, target, gpu, uuid, {autostart})`: the instance's object path.
    pub fn define(
        &self,
        kind: TargetKind,
        target: &str,
        gpu: &str,
        uuid: &MdevUuid,
        autostart: bool,
    ) -> Result<String, CallError> {
        let m = self.manager()?;
        let uuid = uuid.to_string();
        let mut options = HashMap::new();
        options.insert("autostart", Variant::from(autostart));
        self.call(
            "Define",
            m.define(kind.as_str(), target, gpu, &uuid, options),
        )
        .map(|p| p.to_string())
    }

    /// `Manager1.Start(uuid)`.
    pub fn start(&self, uuid: &MdevUuid) -> Result<(), CallError> {
        let m = self.manager()?;
        self.call("Start", m.start(&uuid.to_string()))
    }

    /// `Manager1.Stop(uuid)`.
    pub fn stop_instance(&self, uuid: &MdevUuid) -> Result<(), CallError> {
        let m = self.manager()?;
        self.call("Stop", m.stop(&uuid.to_string()))
    }

    /// `Manager1.Destroy(uuid)`.
    pub fn destroy(&self, uuid: &MdevUuid) -> Result<(), CallError> {
        let m = self.manager()?;
        self.call("Destroy", m.destroy(&uuid.to_string()))
    }

    /// `Manager1.ListInstances()`.
    pub fn list_instances(&self) -> Result<Vec<InstanceInfo>, CallError> {
        let m = self.manager()?;
        self.call("ListInstances", m.list_instances())
    }

    /// `Manager1.GetInstance(uuid)`.
    pub fn get_instance(&self, uuid: &MdevUuid) -> Result<InstanceInfo, CallError> {
        let m = self.manager()?;
        self.call("GetInstance", m.get_instance(&uuid.to_string()))
    }

    /// `Manager1.ListGpus()`.
    pub fn list_gpus(&self) -> Result<Vec<GpuInfo>, CallError> {
        let m = self.manager()?;
        self.call("ListGpus", m.list_gpus())
    }

    /// The `Types` property of GPU `id`'s `org.vgpumanager.Gpu1` object (read now, not cached): each
    /// mdev type with how many more instances fit, as the object last learned it.
    pub fn gpu_object_types(&self, id: &str) -> Result<Vec<TypeSlot>, CallError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| self.call_error("Get Gpu1.Types", None, "not connected".into()))?;
        let conn = client.conn.clone();
        let path = vgpu_client::gpu_path(id);
        self.call("Get Gpu1.Types", async move {
            Gpu1Proxy::builder(&conn)
                .path(path)
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?
                .types()
                .await
        })
    }

    /// `Instance1.MigrationInfo()` of instance `uuid`: the JSON of its `MigrationSupport`.
    pub fn migration_info(&self, uuid: &MdevUuid) -> Result<String, CallError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| self.call_error("MigrationInfo", None, "not connected".into()))?;
        let conn = client.conn.clone();
        let path = vgpu_client::instance_path(&uuid.to_string());
        self.call("MigrationInfo", async move {
            Instance1Proxy::builder(&conn)
                .path(path)
                .build()
                .await?
                .migration_info()
                .await
        })
    }

    /// `org.freedesktop.DBus.Peer.Ping` on the daemon: one bare round trip through the same bus.
    pub fn ping(&self) -> Result<(), CallError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| self.call_error("Ping", None, "not connected".into()))?;
        let conn = client.conn.clone();
        self.call("Ping", async move {
            let peer = zbus::fdo::PeerProxy::builder(&conn)
                .destination(SERVICE)
                .path(vgpu_client::MANAGER_PATH)
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?;
            peer.ping().await
        })
    }

    /// Polls `check` every 10 ms until it returns true; fails naming `what` after `within`.
    pub fn wait_until(
        &self,
        what: &str,
        within: Duration,
        mut check: impl FnMut(&Vgpud) -> Result<bool, TestError>,
    ) -> Result<Duration, TestError> {
        let start = Instant::now();
        loop {
            if check(self)? {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(self.failure(&format!("{what}: not within {within:?}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Vgpud {
    fn drop(&mut self) {
        {
            let _in_rt = self.rt.enter();
            self.client = None;
        }
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}

/// Connects and returns a client once the daemon owns its name; `None` while it does not yet.
async fn try_connect(bus: &str) -> Option<Client> {
    let short = Duration::from_secs(2);
    let addr = BusAddress::Address(bus.to_string());
    let conn = tokio::time::timeout(short, vgpu_client::connect(&addr))
        .await
        .ok()?
        .ok()?;
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.ok()?;
    let name = zbus::names::BusName::try_from(SERVICE).ok()?;
    if !dbus.name_has_owner(name).await.ok()? {
        return None;
    }
    let manager = manager_on(&conn).await.ok()?;
    Some(Client { conn, manager })
}

/// The Manager1 proxy over `conn`, reading properties when asked (no `GetAll` or `AddMatch` first).
async fn manager_on(conn: &Connection) -> zbus::Result<Manager1Proxy<'static>> {
    Manager1Proxy::builder(conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
}

fn wait_bounded(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// What `Create`/`Define` are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// An mdev type id.
    Type,
    /// A profile name.
    Profile,
}

impl TargetKind {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Type => TARGET_TYPE,
            TargetKind::Profile => TARGET_PROFILE,
        }
    }
}

/// The entry for `uuid` in a `ListInstances` answer.
pub fn find<'a>(list: &'a [InstanceInfo], uuid: &MdevUuid) -> Option<&'a InstanceInfo> {
    let u = uuid.to_string();
    list.iter().find(|i| i.uuid == u)
}
