//! Real QEMU attaching our devices, inside the real-kernel guest, with the arguments `qemu-glue` emits.
//!
//! The guest has no QEMU of its own: scripts/vm-test shares the host's root read-only over 9p and
//! scripts/vm/init mounts it at [`HOSTROOT`] with the guest's `/proc`, `/sys`, `/dev` and `/tmp`
//! bind-mounted into it, so the host's `qemu-system-x86_64` runs chrooted there against the guest's
//! kernel. The guest's CPU offers SVM (QEMU `-cpu max` under TCG), so `kvm_amd` gives it `/dev/kvm` and
//! the inner QEMU runs with `-accel kvm` (nested). Each test creates or binds a device through
//! `vgpu_host::ops`, starts QEMU stopped (`-S`) with the device arguments from
//! [`qemu_glue::mdev_qemu_args`] / [`qemu_glue::pci_qemu_args`], asks the monitor for `info pci`, quits,
//! checks QEMU listed the device with its vendor:device id, and puts the device back.
//!
//! `info pci` prints each function as `<class name>: PCI device <vendor>:<device>`, the class name from
//! QEMU's `pci_class_descriptions` (hw/pci/pci.c; unnamed classes print as `Class NNNN`), as measured
//! with QEMU 10.0 (measured: mbochs shows as `Display controller: PCI device 1234:1111`).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;
use qemu_glue::{MdevDisplay, mdev_qemu_args, pci_qemu_args};
use vgpu_host::ops::{bind_driver, create_mdev, remove_mdev, restore_driver};
use vgpu_host::{Host, HostExt, paths};

use super::guest::{Guest, driver_of};
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, test_uuid, type_id};
use super::sriov::{IGB_VF, Pf, PfGuard};

/// Where scripts/vm/init mounts the host's root (9p mount tag `hostroot`).
pub const HOSTROOT: &str = "/hostroot";
/// The host's QEMU, inside [`HOSTROOT`] (Debian's qemu-system-x86, which scripts/vm-test installs to
/// boot the guest).
pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";
/// How long one QEMU run may take: it loads from 9p under TCG (a few seconds measured), so this only
/// catches a hang.
pub const QEMU_TIMEOUT: Duration = Duration::from_secs(120);

/// mbochs' PCI id (samples/vfio-mdev/mbochs.c `mbochs_create_config_space`: 1234:1111, class
/// PCI_CLASS_DISPLAY_OTHER, which QEMU names "Display controller").
const MBOCHS_LINE: &str = "Display controller: PCI device 1234:1111";
/// mdpy's PCI id (samples/vfio-mdev/mdpy-defs.h: PCI_VENDOR_ID_REDHAT 1b36, device 000f; class
/// PCI_CLASS_DISPLAY_OTHER in mdpy.c).
const MDPY_LINE: &str = "Display controller: PCI device 1b36:000f";

/// The QEMU tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("qemu_attach_mbochs_mdev", mbochs_mdev),
        Test::new("qemu_attach_mdpy_display_ramfb", mdpy_display_ramfb),
        Test::new("qemu_attach_igb_vf_vfio_pci", igb_vf),
    ]
}

/// What one QEMU run printed.
#[derive(Debug)]
pub struct QemuRun {
    /// The full command line (for messages).
    pub command: String,
    /// How QEMU exited.
    pub status: ExitStatus,
    /// The monitor's output (stdio).
    pub stdout: String,
    /// QEMU's own messages.
    pub stderr: String,
}

impl QemuRun {
    /// The `<class>: PCI device <vendor>:<device>` lines of `info pci`, trimmed.
    pub fn pci_lines(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .map(str::trim)
            .filter(|l| l.contains(": PCI device "))
            .collect()
    }

    /// Everything QEMU printed, for failure messages.
    fn transcript(&self) -> String {
        format!(
            "command: {}\nexit: {}\nstdout:\n{}\nstderr:\n{}",
            self.command,
            self.status,
            strip_escapes(&self.stdout),
            self.stderr
        )
    }
}

/// Drops the terminal escapes the monitor's line editor echoes (`ESC [ ... letter`).
pub(super) fn strip_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// The VM of every run besides its device and monitor: nested KVM, a bare q35 with 128 MB, no
/// display, CPUs stopped (`-S`: the devices are realized — VFIO opens them and maps guest memory for
/// DMA — but no guest code runs; the command line measured to work with QEMU 10.0).
pub(super) fn vm_args() -> Vec<String> {
    [
        "-accel",
        "kvm",
        "-machine",
        "q35",
        "-cpu",
        "host",
        "-m",
        "128M",
        "-nodefaults",
        "-display",
        "none",
        "-S",
    ]
    .map(String::from)
    .to_vec()
}

/// [`vm_args`] with the monitor on stdio.
fn base_args() -> Vec<String> {
    let mut args = vm_args();
    args.extend(["-monitor".to_string(), "stdio".to_string()]);
    args
}

/// Fails loudly unless the guest can run the host's QEMU with KVM: every kernel scripts/vm-test boots
/// loads kvm and kvm_amd as required modules (scripts/vm/modules), so a missing `/dev/kvm` is a broken
/// guest, never a reason to skip.
fn preflight(g: &Guest) -> Result<(), TestError> {
    let qemu = Path::new(HOSTROOT).join(QEMU.trim_start_matches('/'));
    ensure(g.host.exists(Path::new("/dev/kvm")), || {
        "/dev/kvm is missing: the nested QEMU needs KVM (kvm_amd, scripts/vm/modules)".into()
    })?;
    ensure(g.host.exists(&qemu), || {
        format!(
            "{} is missing: scripts/vm/init mounts the host's root at {HOSTROOT} and the host needs \
             qemu-system-x86 (scripts/vm-test installs it)",
            qemu.display()
        )
    })?;
    for dir in ["sys/bus/pci/devices", "dev/vfio", "proc/self"] {
        let p = Path::new(HOSTROOT).join(dir);
        ensure(g.host.exists(&p), || {
            format!(
                "{} is missing: scripts/vm/init bind-mounts the guest's /proc, /sys and /dev into {HOSTROOT}",
                p.display()
            )
        })?;
    }
    Ok(())
}

fn reader(mut from: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // A read error ends the transcript early; what was read is still reported.
        let _ = from.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Waits for `child` until `deadline`, killing it when the deadline passes.
fn wait_until(child: &mut Child, deadline: Instant) -> Result<Option<ExitStatus>, TestError> {
    loop {
        let polled = child
            .try_wait()
            .map_err(|e| TestError::Check(format!("waiting for QEMU failed: {e}")))?;
        if let Some(status) = polled {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the host's QEMU chrooted into [`HOSTROOT`] with `device_args`, sends `info pci` and `quit` to
/// its monitor and returns what it printed. Fails when QEMU cannot start, does not exit within
/// [`QEMU_TIMEOUT`], or exits unsuccessfully.
pub fn run_qemu(device_args: &[String]) -> Result<QemuRun, TestError> {
    let mut args = base_args();
    args.extend_from_slice(device_args);
    let command = format!("chroot {HOSTROOT} {QEMU} {}", args.join(" "));
    // busybox chroot (the guest's PATH is /bin); a clean environment so nothing of the guest's leaks
    // into the host's programs.
    let mut child = Command::new("chroot")
        .arg(HOSTROOT)
        .arg(QEMU)
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TestError::Check(format!("cannot start {command}: {e}")))?;
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    // Both commands at once: the monitor reads stdin line by line and runs them in order. stdin stays
    // open until QEMU exits so an early EOF cannot race the quit.
    let mut stdin = child.stdin.take();
    if let Some(s) = stdin.as_mut() {
        // A write error means QEMU already exited; its status and stderr say why.
        let _ = s.write_all(b"info pci\nquit\n");
        let _ = s.flush();
    }
    let status = wait_until(&mut child, Instant::now() + QEMU_TIMEOUT)?;
    drop(stdin);
    let join = |h: Option<JoinHandle<String>>| {
        h.map(|h| h.join().unwrap_or_else(|_| "(reader panicked)".into()))
            .unwrap_or_default()
    };
    let (stdout, stderr) = (join(out), join(err));
    let Some(status) = status else {
        return Err(TestError::Check(format!(
            "QEMU did not exit within {} s and was killed\ncommand: {command}\nstdout:\n{}\nstderr:\n{stderr}",
            QEMU_TIMEOUT.as_secs(),
            strip_escapes(&stdout)
        )));
    };
    let run = QemuRun {
        command,
        status,
        stdout,
        stderr,
    };
    ensure(run.status.success(), || {
        format!("QEMU failed\n{}", run.transcript())
    })?;
    Ok(run)
}

/// Fails unless `info pci` listed exactly one function whose line is `expected`.
fn expect_pci_line(run: &QemuRun, expected: &str) -> Result<(), TestError> {
    let lines = run.pci_lines();
    let n = lines.iter().filter(|l| **l == expected).count();
    ensure(n == 1, || {
        format!(
            "info pci listed {n} functions as \"{expected}\" (expected 1); its lines: {lines:?}\n{}",
            run.transcript()
        )
    })
}

/// Creates an mdev of `parent`/`ty`, runs QEMU with `mdev_qemu_args(uuid, display)`, expects
/// `expected` in `info pci`, then removes the mdev once QEMU has exited.
fn attach_mdev(
    g: &Guest,
    test: &str,
    parent: &str,
    ty: &str,
    display: MdevDisplay,
    expected: &str,
) -> TestResult {
    preflight(g)?;
    let h: &dyn Host = &g.host;
    let mut mdevs = Mdevs::new(h);
    let uuid: MdevUuid = test_uuid(test, 0);
    create_mdev(h, parent, &type_id(ty)?, &uuid)?;
    mdevs.adopt(uuid);
    let device = mdev_qemu_args(&uuid, display);
    let run = run_qemu(&device)?;
    expect_pci_line(&run, expected)?;
    remove_mdev(h, &uuid)?;
    mdevs.forget(&uuid);
    g.wait_for(&paths::mdev_device(&uuid), false)?;
    Ok(Outcome::Passed)
}

/// An mbochs instance attached as plain `vfio-pci,sysfsdev=...` shows as mbochs' display controller.
fn mbochs_mdev(g: &Guest) -> TestResult {
    attach_mdev(
        g,
        "qemu_attach_mbochs_mdev",
        "mbochs",
        "mbochs-small",
        MdevDisplay::default(),
        MBOCHS_LINE,
    )
}

/// The desktop form (`vfio-pci-nohotplug,...,display=on,ramfb=on`) is accepted by real QEMU: mdpy
/// offers a region display (samples/vfio-mdev/mdpy.c, `MDPY_DISPLAY_REGION`), which QEMU can show
/// without OpenGL, unlike mbochs' dma-buf display (hw/vfio/display.c needs OpenGL for dma-bufs).
fn mdpy_display_ramfb(g: &Guest) -> TestResult {
    attach_mdev(
        g,
        "qemu_attach_mdpy_display_ramfb",
        "mdpy",
        "mdpy-vga",
        MdevDisplay::DESKTOP,
        MDPY_LINE,
    )
}

/// An igb VF bound to vfio-pci with `bind_driver` attaches as `vfio-pci,host=...` and shows as an
/// 82576 VF (8086:10ca, class "Ethernet controller"); `restore_driver` then gives it back to the
/// driver it had (none: the guest loads no igbvf, so the VF starts driverless).
fn igb_vf(g: &Guest) -> TestResult {
    preflight(g)?;
    let h: &dyn Host = &g.host;
    let guard = PfGuard::new(h, Pf::Igb)?;
    let vf = guard.enable_vfs(1)?[0];
    let original = driver_of(h, &vf)?;
    let record = bind_driver(h, &vf, "vfio-pci")?;
    ensure_eq(
        format_args!("BindRecord.previous_driver of {vf}"),
        &record.previous_driver,
        &original,
    )?;
    ensure_eq(
        format_args!("driver of {vf} after bind_driver"),
        driver_of(h, &vf)?,
        Some("vfio-pci".to_string()),
    )?;
    let run = run_qemu(&pci_qemu_args(&vf))?;
    let expected = format!(
        "Ethernet controller: PCI device {:04x}:{:04x}",
        IGB_VF.0, IGB_VF.1
    );
    expect_pci_line(&run, &expected)?;
    restore_driver(h, &record)?;
    ensure_eq(
        format_args!("driver of {vf} after restore_driver"),
        driver_of(h, &vf)?,
        original,
    )?;
    ensure_eq(
        format_args!("{vf}/driver_override after restore_driver"),
        h.read_trimmed(&paths::pci_attr(&vf, "driver_override"))?,
        "(null)".to_string(),
    )?;
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_carriage_returns_are_dropped() {
        assert_eq!(
            strip_escapes("(qemu) i\u{1b}[K\u{1b}[Din\u{1b}[K\r\n  Bus  0\r\n"),
            "(qemu) iin\n  Bus  0\n"
        );
    }

    #[test]
    fn pci_lines_are_the_function_lines() {
        let run = QemuRun {
            command: String::new(),
            status: std::os::unix::process::ExitStatusExt::from_raw(0),
            stdout: "(qemu) info pci\r\n  Bus  0, device   0, function 0:\r\n    Host bridge: PCI device 8086:29c0\r\n      BAR0: 32 bit memory\r\n    Display controller: PCI device 1234:1111\r\n".into(),
            stderr: String::new(),
        };
        assert_eq!(
            run.pci_lines(),
            [
                "Host bridge: PCI device 8086:29c0",
                "Display controller: PCI device 1234:1111"
            ]
        );
        assert!(expect_pci_line(&run, MBOCHS_LINE).is_ok());
        assert!(expect_pci_line(&run, MDPY_LINE).is_err());
    }
}
