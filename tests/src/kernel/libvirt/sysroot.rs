//! A writable root for the host's own programs in the guest: the host's root (9p, read-only, at
//! [`HOSTROOT`]) under an overlay whose upper layer is a fresh tmpfs, with the guest's `/proc`, `/sys`,
//! `/dev` and `/tmp` bound in and a tmpfs on `/run`. Every program a host runs for libvirt (udevd, the
//! system bus, vgpud, libvirtd, virsh, QEMU) runs chrooted into it, so whatever they write (`/etc/libvirt`,
//! `/etc/mdevctl.d`, `/var/lib/libvirt`, `/var/lib/vgpu-manager`, `/run/…`) lands in tmpfs and is gone
//! with the [`Sysroot`]; each test starts from the host's pristine tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::super::qemu_attach::HOSTROOT;
use super::super::runner::TestError;

/// `PATH` inside the sysroot, as systemd gives services: `/usr/sbin` before `/usr/bin`, so the bare name
/// `mdevctl` that libvirt runs is `/usr/sbin/mdevctl` (vgpu-manager's link to `vgpuctl`).
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why the guest cannot build a sysroot: a kernel without overlayfs (the custom kernel has
/// `CONFIG_OVERLAY_FS` unset), read from `/proc/filesystems`. `None` when it can.
pub fn kernel_lacks_overlay() -> Option<String> {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"))
    {
        None
    } else {
        Some(
            "kernel has no overlayfs (CONFIG_OVERLAY_FS unset): no writable host root for libvirt"
                .into(),
        )
    }
}

/// Which libvirt the sysroot runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Libvirt {
    /// Debian bookworm's libvirt 9.0, installed on the host that boots the guest (.ci/run installs
    /// it).
    V9_0,
    /// bookworm-backports' libvirt 11.3: its packages extracted by scripts/vm-test into the share's
    /// [`LIBVIRT_11_3_DIR`], laid over the host's root (the host keeps 9.0 installed).
    V11_3,
}

/// The directory of the share holding bookworm-backports' libvirt 11.3 packages, extracted
/// (scripts/vm/lib.sh `prepare_libvirt_11_3`).
pub const LIBVIRT_11_3_DIR: &str = "libvirt-11.3";

impl Libvirt {
    /// A short name for scratch directories and messages.
    pub fn tag(self) -> &'static str {
        match self {
            Libvirt::V9_0 => "libvirt90",
            Libvirt::V11_3 => "libvirt113",
        }
    }

    /// The version `libvirtd --version` prints.
    pub fn version(self) -> &'static str {
        match self {
            Libvirt::V9_0 => "9.0.0",
            Libvirt::V11_3 => "11.3.0",
        }
    }
}

/// The mounted sysroot; unmounted (lazily, innermost first) when dropped.
#[derive(Debug)]
pub struct Sysroot {
    root: PathBuf,
    /// Mount points, in mount order.
    mounts: Vec<PathBuf>,
    /// The test share's path inside the sysroot (its host path: `vmtest.share=`).
    share: PathBuf,
}

/// The host path of the test share (`vmtest.share=` on the kernel command line).
pub fn share_path() -> Result<PathBuf, TestError> {
    let cmdline = std::fs::read_to_string("/proc/cmdline")
        .map_err(|e| TestError::Check(format!("cannot read /proc/cmdline: {e}")))?;
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("vmtest.share="))
        .map(PathBuf::from)
        .ok_or_else(|| TestError::Check("no vmtest.share= on the kernel command line".into()))
}

/// The lower layers of every sysroot of libvirt `v`, made on first use in this boot: the host's root,
/// for 11.3 under a copy of its extracted packages (overlayfs refuses a lower layer inside another,
/// "overlapping lowerdir path", and the share is inside the host's root; 12 MB), and on top the upper
/// layer of a sysroot in which [`Sysroot::prepare_host`] and [`install_vgpu_manager`] ran (dpkg over
/// 9p under TCG takes minutes: once per boot, not per test). Kept in a tmpfs at
/// `/run/sysroot-base-<tag>` for the rest of the boot.
fn base_lower(v: Libvirt) -> Result<String, TestError> {
    static BASES: Mutex<Vec<(Libvirt, String)>> = Mutex::new(Vec::new());
    let mut bases = BASES
        .lock()
        .map_err(|_| TestError::Check("a sysroot base failed in another test".into()))?;
    if let Some((_, lower)) = bases.iter().find(|(b, _)| *b == v) {
        return Ok(lower.clone());
    }
    let dir = PathBuf::from(format!("/run/sysroot-base-{}", v.tag()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| TestError::Check(format!("cannot create {}: {e}", dir.display())))?;
    run(
        Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&dir),
        &format!("mount -t tmpfs tmpfs {}", dir.display()),
    )?;
    let below = match v {
        Libvirt::V9_0 => HOSTROOT.to_string(),
        Libvirt::V11_3 => {
            let share = share_path()?;
            let tree = Path::new(HOSTROOT)
                .join(share.strip_prefix("/").unwrap_or(&share))
                .join(LIBVIRT_11_3_DIR);
            if !tree.join("usr/sbin/libvirtd").is_file() {
                return Err(TestError::Check(format!(
                    "{} holds no libvirtd: scripts/vm-test extracts bookworm-backports' libvirt 11.3 there (prepare_libvirt_11_3)",
                    tree.display()
                )));
            }
            let copy = dir.join(LIBVIRT_11_3_DIR);
            run(
                Command::new("cp").arg("-a").arg(&tree).arg(&copy),
                &format!("cp -a {} {}", tree.display(), copy.display()),
            )?;
            format!("{}:{HOSTROOT}", copy.display())
        }
    };
    let installed = dir.join("installed");
    {
        let s = Sysroot::mount_over(&below, Some(&installed))?;
        if v == Libvirt::V11_3 {
            hide_other_libvirt_modules(&s, &dir.join(LIBVIRT_11_3_DIR))?;
        }
        s.prepare_host()?;
        install_vgpu_manager(&s)?;
    }
    let lower = format!("{}/upper:{below}", installed.display());
    bases.push((v, lower.clone()));
    Ok(lower)
}

/// libvirt's loadable modules: a libvirtd loads each driver it finds there, and one built for another
/// libvirt fails to load (measured: 11.3's libvirtd exits on 9.0's `libvirt_driver_network.so`,
/// "version `LIBVIRT_PRIVATE_9.0.0' not found").
const LIBVIRT_MODULE_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver",
    "/usr/lib/x86_64-linux-gnu/libvirt/lock-driver",
    "/usr/lib/x86_64-linux-gnu/libvirt/storage-backend",
    "/usr/lib/x86_64-linux-gnu/libvirt/storage-file",
];

/// Removes from sysroot `s` every libvirt module of the host's 9.0 that the 11.3 packages in `tree`
/// do not replace, as a host with only 11.3's QEMU and node-device drivers installed has it (a
/// missing driver module is skipped by libvirtd; the 11.3 packages here are those two drivers).
fn hide_other_libvirt_modules(s: &Sysroot, tree: &Path) -> Result<(), TestError> {
    for dir in LIBVIRT_MODULE_DIRS {
        let Ok(entries) = std::fs::read_dir(s.path(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let ours = tree.join(dir.trim_start_matches('/')).join(&name);
            if !ours.exists() {
                std::fs::remove_file(e.path()).map_err(|err| {
                    TestError::Check(format!(
                        "cannot hide 9.0's module {} in the 11.3 sysroot: {err}",
                        e.path().display()
                    ))
                })?;
            }
        }
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<(), TestError> {
    let out = cmd
        .output()
        .map_err(|e| TestError::Check(format!("cannot run {what}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TestError::Check(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Sysroot {
    /// Mounts a new sysroot at `/sysroot-N` (the guest's root is the initramfs, writable) running
    /// libvirt `v`, with vgpu-manager installed: over the base layer of `v` (`base_lower`), made
    /// once per boot, so each sysroot starts from the same freshly installed host.
    pub fn mount(v: Libvirt) -> Result<Sysroot, TestError> {
        let lower = base_lower(v)?;
        Sysroot::mount_over(&lower, None)
    }

    /// A sysroot whose overlay has the lower layers `lower` (overlayfs's `lowerdir=`, topmost first)
    /// and its upper and work directories in `layers` (a tmpfs the caller keeps mounted) or, for
    /// `None`, in a tmpfs of its own, unmounted with it.
    fn mount_over(lower: &str, layers: Option<&Path>) -> Result<Sysroot, TestError> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let share = share_path()?;
        let root = PathBuf::from(format!("/sysroot-{n}"));
        let mut s = Sysroot {
            root: root.clone(),
            mounts: Vec::new(),
            share,
        };
        let layers = match layers {
            Some(l) => l.to_path_buf(),
            None => {
                let l = PathBuf::from(format!("/run/sysroot-layers-{n}"));
                std::fs::create_dir_all(&l)
                    .map_err(|e| TestError::Check(format!("cannot create {}: {e}", l.display())))?;
                s.mount_one(&["-t", "tmpfs", "tmpfs"], &l)?;
                l
            }
        };
        std::fs::create_dir_all(&root)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", root.display())))?;
        for d in ["upper", "work"] {
            std::fs::create_dir_all(layers.join(d)).map_err(|e| {
                TestError::Check(format!("cannot create {d} in {}: {e}", layers.display()))
            })?;
        }
        let opts = format!(
            "lowerdir={lower},upperdir={0}/upper,workdir={0}/work",
            layers.display()
        );
        s.mount_one(&["-t", "overlay", "overlay", "-o", &opts], &root)?;
        for d in ["proc", "sys", "dev", "tmp"] {
            let from = format!("/{d}");
            s.mount_one(&["--bind", &from], &root.join(d))?;
        }
        s.mount_one(&["-t", "tmpfs", "tmpfs"], &root.join("run"))?;
        // What a host's tmpfiles.d makes in /run at boot and the services below expect.
        std::fs::create_dir_all(root.join("run/dbus")).map_err(|e| {
            TestError::Check(format!("cannot create /run/dbus in the sysroot: {e}"))
        })?;
        Ok(s)
    }

    fn mount_one(&mut self, args: &[&str], on: &Path) -> Result<(), TestError> {
        run(
            Command::new("mount").args(args).arg(on),
            &format!("mount {} {}", args.join(" "), on.display()),
        )?;
        self.mounts.push(on.to_path_buf());
        Ok(())
    }

    /// Binds directory `from` (a guest path, e.g. another sysroot's `/run/libvirt`) at `at` (as the
    /// chrooted programs see it), unmounted with the sysroot: a chroot shares the guest's mount
    /// namespace, so the bind is what its programs see there.
    pub fn bind(&mut self, from: &Path, at: &str) -> Result<(), TestError> {
        let on = self.path(at);
        std::fs::create_dir_all(&on)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", on.display())))?;
        let from = from.display().to_string();
        self.mount_one(&["--bind", &from], &on)
    }

    /// Its root, as the guest sees it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `path` (absolute, as the chrooted programs see it) is, as the guest sees it.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// The test share (the static binaries and `data/`), as the chrooted programs see it.
    pub fn share(&self) -> &Path {
        &self.share
    }

    /// `program args…` chrooted into the sysroot, with a clean environment: [`PATH`], `LANG=C` and
    /// `SYSTEMD_IGNORE_CHROOT=1` (udevd and udevadm otherwise refuse to act in a chroot).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("chroot");
        c.arg(&self.root)
            .arg(program)
            .env_clear()
            .env("PATH", PATH)
            .env("LANG", "C")
            .env("HOME", "/root")
            .env("SYSTEMD_IGNORE_CHROOT", "1");
        c
    }

    /// Runs `program args…` in the sysroot to completion; its stdout, or an error quoting stderr.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, TestError> {
        let out =
            self.command(program).args(args).output().map_err(|e| {
                TestError::Check(format!("cannot run {program} in the sysroot: {e}"))
            })?;
        if !out.status.success() {
            return Err(TestError::Check(format!(
                "`{program} {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Writes `text` to `path` (as the chrooted programs see it), creating its directory.
    pub fn write(&self, path: &str, text: &str) -> Result<(), TestError> {
        let p = self.path(path);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| TestError::Check(format!("cannot create {}: {e}", dir.display())))?;
        }
        std::fs::write(&p, text)
            .map_err(|e| TestError::Check(format!("cannot write {}: {e}", p.display())))
    }

    /// A symlink `path` → `target` (both as the chrooted programs see them), replacing what was there.
    pub fn symlink(&self, target: &Path, path: &str) -> Result<(), TestError> {
        let p = self.path(path);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| TestError::Check(format!("cannot create {}: {e}", dir.display())))?;
        }
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(target, &p).map_err(|e| {
            TestError::Check(format!(
                "cannot link {} to {}: {e}",
                p.display(),
                target.display()
            ))
        })
    }

    /// What a booted Debian host has that the busybox guest lacks, for the host's programs:
    /// `/dev/fd` and `/dev/std{in,out,err}` (systemd makes them at boot; libvirt hands mdevctl its JSON
    /// as `--jsonfile /dev/stdin`), the accounts `libvirt-daemon-system` adds (`libvirt-qemu`, groups
    /// `libvirt` and `kvm`: libvirtd resolves its default QEMU user before reading qemu.conf), a
    /// `qemu.conf` running QEMU as root with logs in files (no virtlogd in the guest) and no
    /// confinement (no AppArmor in the guest), and no private `/dev` for QEMU (libvirt's
    /// mount namespace cannot rebuild `/dev` inside the chroot: QEMU then finds neither /dev/null nor
    /// /dev/kvm).
    pub fn prepare_host(&self) -> Result<(), TestError> {
        for (name, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            let link = Path::new("/dev").join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(target, &link).map_err(|e| {
                    TestError::Check(format!("cannot link {} to {target}: {e}", link.display()))
                })?;
            }
        }
        for group in ["libvirt", "kvm", "libvirt-qemu"] {
            self.run("groupadd", &["-f", "-r", group])?;
        }
        self.run(
            "sh",
            &[
                "-c",
                "id -u libvirt-qemu >/dev/null 2>&1 || useradd -r -g libvirt-qemu -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu",
            ],
        )?;
        // libvirt ≥ 10 looks for a VFIO variant driver of a PCI hostdev in the running kernel's
        // modules.alias (virpci.c, virPCIDeviceFindBestVFIOVariant) and refuses the start without
        // the file; a host has it for its kernel, the host root here has it for another.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_err(|e| TestError::Check(format!("cannot read the kernel release: {e}")))?;
        let alias = format!("/lib/modules/{}/modules.alias", release.trim());
        let text = std::fs::read_to_string(&alias).unwrap_or_default();
        self.write(&alias, &text)?;
        self.write(
            "/etc/libvirt/qemu.conf",
            "user = \"root\"\ngroup = \"root\"\nstdio_handler = \"file\"\nsecurity_driver = \"none\"\nnamespaces = [ ]\n",
        )?;
        for d in [
            "/var/lib/libvirt",
            "/var/cache/libvirt",
            "/var/log/libvirt/qemu",
        ] {
            std::fs::create_dir_all(self.path(d))
                .map_err(|e| TestError::Check(format!("cannot create {d} in the sysroot: {e}")))?;
        }
        Ok(())
    }
}

/// Installs vgpu-manager in the sysroot as a host does, from the packages in the share (scripts/vm-test
/// puts them there): Debian's `mdevctl` 1.2.0 first (libvirt 11's node-device package depends on it, so
/// a host has it), then our `.deb` (scripts/package) with `dpkg -i`, which diverts mdevctl's
/// `/usr/bin/mdevctl` and `/usr/bin/lsmdev` to `*.distrib` and links `mdevctl` (`/usr/bin`, and
/// `/usr/sbin`, which comes first on libvirt's [`PATH`]: Debian's libvirt runs the bare name) to
/// `vgpuctl`. Then what data/README.md asks the administrator to do: link the hook as
/// `/etc/libvirt/hooks/qemu.d/vgpu-manager`. `mdevctl`'s dependency on `udev` is the host's own
/// (installed, not registered in the chroot's dpkg database when the host's is read-only): forced.
pub fn install_vgpu_manager(root: &Sysroot) -> Result<(), TestError> {
    let share = root.share().to_path_buf();
    let mut log = String::new();
    // man-db's dpkg trigger rebuilds the manual index (minutes over 9p under TCG) unless this file is
    // gone (man-db's postinst checks it); the manual pages are not under test.
    let _ = std::fs::remove_file(root.path("/var/lib/man-db/auto-update"));
    for (deb, what) in [
        ("mdevctl.deb", "Debian's mdevctl 1.2.0"),
        ("vgpu-manager.deb", "vgpu-manager (scripts/package)"),
    ] {
        let path = share.join(deb);
        if !root.path(&path.display().to_string()).is_file() {
            return Err(TestError::Check(format!(
                "{what} is not in the share as {} (scripts/vm-test puts it there)",
                path.display()
            )));
        }
        let said = root
            // The full path: the guest's busybox chroot prefers its own applets (it has a `dpkg`)
            // over a bare name.
            .run(
                "/usr/bin/dpkg",
                &["-i", "--force-depends", &path.display().to_string()],
            )
            .map_err(|e| TestError::Check(format!("installing {what}: {e}")))?;
        log.push_str(&said);
    }
    for (path, want) in [
        ("/usr/sbin/mdevctl", "/usr/bin/vgpuctl"),
        ("/usr/bin/mdevctl", "/usr/bin/vgpuctl"),
    ] {
        let got = root.run("readlink", &["-f", path])?;
        if got.trim() != want {
            return Err(TestError::Check(format!(
                "after dpkg -i, {path} resolves to {:?}, not {want}",
                got.trim()
            )));
        }
    }
    if !root.path(REAL_MDEVCTL).is_file() {
        let files = root
            .run(
                "sh",
                &[
                    "-c",
                    "ls -la /usr/bin/mdevctl* /usr/sbin/mdevctl*; dpkg-divert --list",
                ],
            )
            .unwrap_or_else(|e| e.to_string());
        return Err(TestError::Check(format!(
            "after dpkg -i, the real mdevctl is not diverted to {REAL_MDEVCTL}:\n{files}\ndpkg said:\n{log}"
        )));
    }
    root.symlink(
        Path::new("/usr/libexec/vgpu-manager/vgpu-libvirt-hook"),
        "/etc/libvirt/hooks/qemu.d/vgpu-manager",
    )?;
    Ok(())
}

/// The real mdevctl 1.2.0 in the sysroot, where vgpu-manager's package diverted it.
pub const REAL_MDEVCTL: &str = "/usr/bin/mdevctl.distrib";

impl Drop for Sysroot {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).output();
        }
    }
}
