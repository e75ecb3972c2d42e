//! A real live migration on the real kernel: an mtty mdev made by vgpud moves from QEMU A to QEMU B
//! (the host's QEMU, chrooted into its root like [`super::qemu_attach`]), with the target mdev made by
//! `vgpuctl migration prepare` from A's fingerprint. mtty implements VFIO migration since 6.7
//! (samples/vfio-mdev/mtty.c); before that the test is skipped with the reason.
//!
//! Both QEMUs run with their vCPUs stopped (`-S`): a vCPU running under nested KVM aborts the outer TCG
//! QEMU (see `libvirt::domain`), and no guest OS is needed: the device state moves with the VM state
//! (migration uAPI v2 STOP_COPY). Verified: A's `info migrate` reaches `completed`, B holds the target
//! mdev (`info qtree`) and stays paused as A was, A's instance is released through vgpud, the target
//! becomes an ordinary instance with `vgpuctl migration complete`, and nothing is left in sysfs. The
//! contents of mtty's FIFO are not read back: without a guest nothing can read the port.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;
use qemu_glue::{MdevDisplay, mdev_qemu_args};

use super::daemon::{availability, daemon, device_exists, ensure_restored, vgpuctl};
use super::guest::Guest;
use super::migration::kernel_version;
use super::qemu_attach::{HOSTROOT, QEMU, strip_escapes, vm_args};
use super::runner::{Outcome, Test, TestError, TestResult, ensure};
use super::samples::{Mdevs, test_uuid};
use super::vgpud::TargetKind;

/// The tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![Test::new("migration_mtty_between_two_qemus", two_qemus)]
}

/// How long a QEMU may take to open its monitor, and a migration to complete.
const WITHIN: Duration = Duration::from_secs(120);

/// One QEMU with its human monitor on a Unix socket; killed when dropped.
struct Qemu {
    child: Child,
    monitor: PathBuf,
    log: PathBuf,
}

impl Qemu {
    /// Starts the host's QEMU chrooted into [`HOSTROOT`] with qemu_attach's VM ([`vm_args`]: CPUs
    /// stopped), its monitor on a Unix socket and `extra` arguments (the device, `-incoming`).
    fn spawn(name: &str, extra: &[String]) -> Result<Qemu, TestError> {
        let monitor = PathBuf::from(format!("/tmp/kernel-tests-{name}.monitor"));
        let log = PathBuf::from(format!("/tmp/kernel-tests-{name}.log"));
        let _ = std::fs::remove_file(&monitor);
        let file = std::fs::File::create(&log)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", log.display())))?;
        let err = file
            .try_clone()
            .map_err(|e| TestError::Check(format!("cannot share {}: {e}", log.display())))?;
        let mut args = vm_args();
        args.push("-monitor".into());
        args.push(format!("unix:{},server=on,wait=off", monitor.display()));
        args.extend_from_slice(extra);
        let child = Command::new("chroot")
            .arg(HOSTROOT)
            .arg(QEMU)
            .args(&args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", "/tmp")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| TestError::Check(format!("cannot start {QEMU}: {e}")))?;
        let mut q = Qemu {
            child,
            monitor,
            log,
        };
        let t = Instant::now();
        while !q.monitor.exists() {
            if let Ok(Some(status)) = q.child.try_wait() {
                return Err(q.failure(&format!("QEMU {name} exited at start ({status})")));
            }
            if t.elapsed() > WITHIN {
                return Err(q.failure(&format!("QEMU {name} opened no monitor within {WITHIN:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(q)
    }

    /// Waits until `path` exists (a socket QEMU creates), failing when QEMU exits or
    /// [`WITHIN`] passes first; `what` says what QEMU did once it is there.
    fn wait_for(&mut self, path: &Path, what: &str) -> Result<(), TestError> {
        let t = Instant::now();
        while !path.exists() {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.failure(&format!("QEMU exited ({status}) before it {what}")));
            }
            if t.elapsed() > WITHIN {
                return Err(self.failure(&format!(
                    "QEMU has not {what} within {WITHIN:?} ({} does not exist)",
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn failure(&self, what: &str) -> TestError {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        TestError::Check(format!("{what}; QEMU's output:\n{log}"))
    }

    /// Runs one monitor command and returns what QEMU printed before its next prompt.
    fn hmp(&self, command: &str) -> Result<String, TestError> {
        let mut s = UnixStream::connect(&self.monitor).map_err(|e| {
            self.failure(&format!(
                "cannot connect to {}: {e}",
                self.monitor.display()
            ))
        })?;
        s.set_read_timeout(Some(WITHIN))
            .map_err(|e| TestError::Check(format!("monitor socket: {e}")))?;
        read_to_prompt(&mut s).map_err(|e| self.failure(&format!("monitor banner: {e}")))?;
        s.write_all(format!("{command}\n").as_bytes())
            .map_err(|e| self.failure(&format!("monitor write of {command:?}: {e}")))?;
        let text = read_to_prompt(&mut s)
            .map_err(|e| self.failure(&format!("monitor answer to {command:?}: {e}")))?;
        Ok(strip_escapes(&text))
    }

    /// `quit`, then waits for the exit.
    fn quit(mut self) -> Result<(), TestError> {
        let _ = self.hmp("quit");
        let t = Instant::now();
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            if t.elapsed() > WITHIN {
                return Err(self.failure("QEMU did not quit"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads until the monitor's `(qemu) ` prompt (or EOF).
fn read_to_prompt(s: &mut UnixStream) -> std::io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if buf.ends_with(b"(qemu) ") {
            break;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn ok_out(args: &[&str], out: Output) -> Result<String, TestError> {
    ensure(out.status.success(), || {
        format!(
            "vgpuctl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `-device vfio-pci,sysfsdev=…,enable-migration=on,x-device-dirty-page-tracking=off` for mdev `u`.
/// QEMU ≥ 8.1 migrates a VFIO device that asks for it; without dirty-page tracking it counts all
/// guest memory dirty. mtty has dirty-logging ops, but reading its log fails (measured on 6.12:
/// "Failed to get DMA logging report … Operation not supported", and the migration fails in
/// `ram_save_setup`), so QEMU is told not to use device tracking.
fn device_args(u: &MdevUuid) -> Vec<String> {
    let mut args = mdev_qemu_args(u, MdevDisplay::default());
    if let Some(dev) = args.last_mut() {
        dev.push_str(",enable-migration=on,x-device-dirty-page-tracking=off");
    }
    args
}

fn two_qemus(g: &Guest) -> TestResult {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if kernel_version(release.trim()).is_none_or(|v| v < (6, 7)) {
        return Ok(Outcome::Skipped(
            "mtty implements VFIO migration only since Linux 6.7 (samples/vfio-mdev/mtty.c)".into(),
        ));
    }
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (_work, d) = daemon("migration-qemu")?;
    let source = test_uuid("migration-qemu", 0);
    d.create(TargetKind::Type, "mtty-1", "mtty", Some(&source))?;
    mdevs.adopt(source);
    let s = source.to_string();

    let args = ["migration", "fingerprint", s.as_str()];
    let fp = ok_out(&args, vgpuctl(&d, &args)?)?;
    let fp_file = std::env::temp_dir().join("migration-qemu-fingerprint.json");
    std::fs::write(&fp_file, &fp).map_err(|e| TestError::Check(format!("{e}")))?;
    let fp_path = fp_file.display().to_string();
    let args = [
        "migration",
        "prepare",
        "--target",
        fp_path.as_str(),
        "--json",
    ];
    let prepared = ok_out(&args, vgpuctl(&d, &args)?)?;
    let v: serde_json::Value = serde_json::from_str(&prepared)
        .map_err(|e| TestError::Check(format!("migration prepare --json: {e}: {prepared}")))?;
    let target: MdevUuid = v["uuid"]
        .as_str()
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| TestError::Check(format!("migration prepare named no UUID: {v}")))?;
    mdevs.adopt(target);
    ensure(device_exists(g, &target), || {
        format!("the prepared target {target} is not in sysfs")
    })?;

    let socket = "/tmp/kernel-tests-migration.sock";
    let _ = std::fs::remove_file(socket);
    let mut b_args = device_args(&target);
    b_args.push("-incoming".into());
    b_args.push(format!("unix:{socket}"));
    let mut b = Qemu::spawn("migration-target", &b_args)?;
    // QEMU opens its monitor before it listens for the incoming stream (the `-incoming` socket
    // comes once the machine, its VFIO device included, is set up): the source may connect only then.
    b.wait_for(Path::new(socket), "listened for the incoming migration")?;
    let a = Qemu::spawn("migration-source", &device_args(&source))?;
    let t = Instant::now();
    a.hmp(&format!("migrate -d unix:{socket}"))?;
    let info = loop {
        let info = a.hmp("info migrate")?;
        if info.contains("completed") {
            break info;
        }
        if info.contains("failed") || info.contains("cancelled") {
            return Err(a.failure(&format!("the migration did not complete:\n{info}")));
        }
        if t.elapsed() > WITHIN {
            return Err(a.failure(&format!(
                "the migration is not done within {WITHIN:?}:\n{info}"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "  (migration completed in {:?}; source's info migrate:\n{})",
        t.elapsed(),
        info.lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // QEMU lists the VFIO devices' share of the stream once one took part (mtty's state is a few
    // hundred bytes, printed as 0 kbytes).
    ensure(info.contains("vfio device transferred"), || {
        format!("the source's info migrate shows no VFIO device in the migration:\n{info}")
    })?;
    let qtree = b.hmp("info qtree")?;
    ensure(
        qtree.contains(&format!("/sys/bus/mdev/devices/{target}")),
        || format!("the target QEMU does not hold {target}:\n{qtree}"),
    )?;
    let status = b.hmp("info status")?;
    ensure(status.contains("paused"), || {
        format!("the target VM is not paused as the source was: {status}")
    })?;

    // The source is released, the target kept as an ordinary instance.
    a.quit()?;
    d.destroy(&source)?;
    mdevs.forget(&source);
    ensure(!device_exists(g, &source), || {
        format!("source {source} is still in sysfs")
    })?;
    let t_s = target.to_string();
    let args = ["migration", "complete", t_s.as_str()];
    ok_out(&args, vgpuctl(&d, &args)?)?;
    let again = vgpuctl(&d, &args)?;
    ensure(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("not an incoming migration target"),
        || "a second migration complete is refused: the target is an ordinary instance".to_string(),
    )?;
    ensure(d.get_instance(&target)?.state == "running", || {
        format!("{target} is not running after migration complete")
    })?;
    b.quit()?;
    d.destroy(&target)?;
    mdevs.forget(&target);
    d.stop()?;
    mdevs.remove_all()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}
