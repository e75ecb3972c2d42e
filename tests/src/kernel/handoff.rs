//! The VFIO fd hand-off on the real kernel: an unprivileged process receives the fds over D-Bus and
//! maps DMA through them.
//!
//! vgpud runs as root with `--admin-group vgpu-handoff`; an mbochs instance (the sample mediated display
//! GPU) is created through it. A user with no rights to `/dev/vfio` but in that group then runs the
//! shipped `vgpuctl open-device`, which calls `Instance1.OpenDevice`, receives the device fd and the
//! container or iommufd fd, reads the device through them and maps and unmaps a DMA buffer through
//! the IOMMU. With every backend the kernel has (type1 everywhere, iommufd on the custom kernel):
//! - the user cannot open the group node itself (so the fds are what gives it access);
//! - the received fds pass the check (device info, config ids 1234:1111, DMA map, DMA unmap);
//! - `open-device -- COMMAND` runs COMMAND with the fds inherited and the placeholders and variables
//!   set, and while it holds them a second OpenDevice is refused as "already open";
//! - once that process is gone the device opens again, and vgpud itself holds no VFIO fd;
//! - a user outside the group is refused, naming the group.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vgpu_vfio::VfioBackend;

use super::guest::Guest;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::test_uuid;
use super::vfio::{check_err, expected_backend};
use super::vgpud::{TargetKind, Vgpud, Workdir};

/// The tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![Test::new(
        "vfio_handoff_unprivileged_vmm_maps_dma",
        unprivileged_vmm,
    )]
}

/// The group vgpud is told to trust (`--admin-group`).
const GROUP: &str = "vgpu-handoff";
/// An unprivileged user in [`GROUP`] (its primary group).
const VMM_UID: u32 = 4242;
/// An unprivileged user outside it.
const STRANGER_UID: u32 = 4243;
/// mbochs' config-space ids (samples/vfio-mdev/mbochs.c `mbochs_create_config_space`).
const MBOCHS_IDS: &str = "vendor 0x1234, device 0x1111";

/// Adds the two users and the group to the guest's (RAM-backed) /etc files unless present, so that
/// vgpud can resolve the callers (getpwuid, getgrouplist).
fn ensure_accounts() -> Result<(), TestError> {
    let add = |file: &str, name: &str, line: String| -> Result<(), TestError> {
        let path = Path::new(file);
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(|l| l.starts_with(&format!("{name}:"))) {
            return Ok(());
        }
        let mut new = text;
        if !new.is_empty() && !new.ends_with('\n') {
            new.push('\n');
        }
        new.push_str(&line);
        new.push('\n');
        std::fs::write(path, new).map_err(|e| TestError::Check(format!("cannot write {file}: {e}")))
    };
    add(
        "/etc/passwd",
        "root",
        "root:x:0:0:root:/root:/bin/sh".into(),
    )?;
    add("/etc/group", "root", "root:x:0:".into())?;
    add(
        "/etc/passwd",
        "vmm",
        format!("vmm:x:{VMM_UID}:{VMM_UID}:VMM:/tmp:/bin/false"),
    )?;
    add(
        "/etc/passwd",
        "stranger",
        format!("stranger:x:{STRANGER_UID}:{STRANGER_UID}:stranger:/tmp:/bin/false"),
    )?;
    add("/etc/group", GROUP, format!("{GROUP}:x:{VMM_UID}:vmm"))?;
    add(
        "/etc/group",
        "stranger",
        format!("stranger:x:{STRANGER_UID}:"),
    )
}

/// A copy of the shipped vgpuctl in `work` (tmpfs, mode 0755), runnable by any user wherever the share
/// is mounted.
fn vgpuctl_copy(work: &Path) -> Result<PathBuf, TestError> {
    let exe = std::env::current_exe().map_err(check_err)?;
    let shipped = exe.with_file_name("vgpuctl");
    let copy = work.join("vgpuctl");
    std::fs::copy(&shipped, &copy).map_err(|e| {
        TestError::Check(format!(
            "cannot copy {} (scripts/vm-test ships it next to kernel-tests): {e}",
            shipped.display()
        ))
    })?;
    for p in [work, copy.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).map_err(check_err)?;
    }
    Ok(copy)
}

/// Runs `program args` as `uid` (primary group = its own, no supplementary groups: std drops them).
fn run_as(uid: u32, program: &Path, args: &[&str]) -> Result<Output, TestError> {
    Command::new(program)
        .args(args)
        .uid(uid)
        .gid(uid)
        .env_remove("VGPU_SYSFS_ROOT")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            TestError::Check(format!(
                "cannot run {} as uid {uid}: {e}",
                program.display()
            ))
        })
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn backend_name(b: VfioBackend) -> &'static str {
    match b {
        VfioBackend::Type1 => "type1",
        VfioBackend::Iommufd => "iommufd",
    }
}

/// The VFIO fds vgpud holds (links to /dev/vfio/* or /dev/iommu, or VFIO anon inodes).
fn vfio_fds_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|l| l.display().to_string())
                .filter(|l| {
                    l.starts_with("/dev/vfio")
                        || l == "/dev/iommu"
                        || l.starts_with("anon_inode:[vfio")
                })
                .collect()
        })
        .unwrap_or_default()
}

/// vgpud trusting [`GROUP`], a copy of vgpuctl any user can run, and one running mbochs instance.
struct Fixture {
    /// Kept for its Drop (removes the directory).
    _work: Workdir,
    vgpuctl: PathBuf,
    d: Vgpud,
    uuid: mdev_types::ids::MdevUuid,
}

impl Fixture {
    fn new(tag: &str) -> Result<Fixture, TestError> {
        ensure_accounts()?;
        let work = Workdir::new(tag)?;
        let vgpuctl = vgpuctl_copy(work.path())?;
        let d = Vgpud::spawn_with(
            work.path(),
            &work.path().join("state"),
            &["--admin-group", GROUP],
        )?;
        let uuid = test_uuid(tag, 0);
        d.create(TargetKind::Type, "mbochs-small", "mbochs", Some(&uuid))
            .map_err(check_err)?;
        Ok(Fixture {
            _work: work,
            vgpuctl,
            d,
            uuid,
        })
    }

    fn finish(self) -> TestResult {
        self.d.destroy(&self.uuid).map_err(check_err)?;
        self.d.stop()?;
        Ok(Outcome::Passed)
    }
}

fn unprivileged_vmm(g: &Guest) -> TestResult {
    let f = Fixture::new("vfio_handoff")?;
    let (vgpuctl, d, uuid) = (&f.vgpuctl, &f.d, f.uuid);
    let bus = d.bus().to_string();
    let u = uuid.to_string();
    let group = d
        .get_instance(&uuid)
        .map_err(check_err)?
        .iommu_group()
        .ok_or_else(|| TestError::Check(format!("instance {u} has no IOMMU group")))?;

    // Without the daemon the user has no way in.
    let node = format!("/dev/vfio/{group}");
    let o = run_as(
        VMM_UID,
        Path::new("/bin/busybox"),
        &["sh", "-c", &format!(": <> {node}")],
    )?;
    ensure(!o.status.success(), || {
        format!("uid {VMM_UID} opened {node} by itself: the test proves nothing")
    })?;

    let mut backends = vec![VfioBackend::Type1];
    if expected_backend(g) == VfioBackend::Iommufd {
        backends.push(VfioBackend::Iommufd);
    }
    // Receives the fds as uid VMM_UID with `extra` options and checks them: `first` steps (the
    // receiver's own binding, for unbound hand-offs), then device info, config ids, DMA map and unmap.
    let check = |name: &str, extra: &[&str], first: &[&str]| -> Result<(), TestError> {
        let mut args = vec![
            "--bus",
            &bus,
            "open-device",
            &u,
            "--backend",
            name,
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = run_as(VMM_UID, vgpuctl, &args)?;
        let out = text(&o.stdout);
        ensure(o.status.success(), || {
            format!(
                "open-device {args:?} as uid {VMM_UID}: {}\n{out}{}",
                o.status,
                text(&o.stderr)
            )
        })?;
        let r: serde_json::Value = serde_json::from_str(&out).map_err(check_err)?;
        ensure_eq(
            format_args!("backend of {out}"),
            &r["backend"],
            &serde_json::json!(name),
        )?;
        let steps: Vec<(String, String)> = r["steps"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        (
                            s["name"].as_str().unwrap_or_default().to_string(),
                            s["outcome"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let passed = |n: &str| (n.to_string(), "passed".to_string());
        let mut expected: Vec<(String, String)> = first.iter().map(|n| passed(n)).collect();
        expected.extend(["device-info", "config-read", "dma-map", "dma-unmap"].map(passed));
        ensure_eq(
            format_args!("steps of the received fds ({out})"),
            steps,
            expected,
        )?;
        let ids = r["steps"][first.len() + 1]["detail"]
            .as_str()
            .unwrap_or_default();
        ensure_eq(
            "config ids read through the received device fd",
            ids,
            MBOCHS_IDS,
        )
    };
    for b in backends {
        let name = backend_name(b);
        check(name, &[], &[])?;

        // Exec mode: the fds survive into the command, which finds a second open refused.
        let script = format!(
            "readlink /proc/self/fd/{{device-fd}}; readlink /proc/self/fd/$VGPU_IOMMU_FD; \
             echo \"backend=$VGPU_IOMMU_BACKEND group=$VGPU_IOMMU_GROUP\"; \
             exec {} --bus {bus} open-device {u} --backend {name}",
            vgpuctl.display()
        );
        let o = run_as(
            VMM_UID,
            vgpuctl,
            &[
                "--bus",
                &bus,
                "open-device",
                &u,
                "--backend",
                name,
                "--",
                "/bin/busybox",
                "sh",
                "-c",
                &script,
            ],
        )?;
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        let lines: Vec<&str> = out.lines().collect();
        let (device_link, iommu_link) = match b {
            VfioBackend::Type1 => ("anon_inode:[vfio-device]", "/dev/vfio/vfio"),
            VfioBackend::Iommufd => ("/dev/vfio/devices/vfio", "/dev/iommu"),
        };
        ensure(
            lines.len() >= 3
                && lines[0].starts_with(device_link)
                && lines[1] == iommu_link
                && lines[2] == format!("backend={name} group={group}"),
            || format!("the command did not get the fds ({name}): stdout {out:?}, stderr {err:?}"),
        )?;
        ensure(
            o.status.code() == Some(2) && err.contains("already open") && err.contains(&u),
            || {
                format!(
                    "a second OpenDevice while the fds were held ({name}) was not refused as already open: {} {err}",
                    o.status
                )
            },
        )?;

        // The holder is gone: the device is free again, and vgpud kept nothing open.
        check(name, &[], &[])?;
        if let Some(pid) = d.pid() {
            let held = vfio_fds_of(pid);
            ensure(held.is_empty(), || {
                format!("vgpud still holds VFIO fds after the hand-off: {held:?}")
            })?;
        }
    }

    // Unbound: the receiver binds the cdev itself (as QEMU does); type1 cannot hand out an unbound
    // device.
    if expected_backend(g) == VfioBackend::Iommufd {
        check("iommufd", &["--unbound"], &["bind-attach"])?;
    } else {
        let o = run_as(
            VMM_UID,
            vgpuctl,
            &["--bus", &bus, "open-device", &u, "--unbound"],
        )?;
        let err = text(&o.stderr);
        ensure(
            o.status.code() == Some(2) && err.contains("/dev/iommu") && err.contains(&u),
            || {
                format!(
                    "--unbound without iommufd was not refused clearly: {} {err}",
                    o.status
                )
            },
        )?;
    }

    let o = run_as(STRANGER_UID, vgpuctl, &["--bus", &bus, "open-device", &u])?;
    let err = text(&o.stderr);
    ensure(
        o.status.code() == Some(2)
            && err.contains("may not call OpenDevice")
            && err.contains(GROUP),
        || {
            format!(
                "uid {STRANGER_UID} was not refused clearly: {} {err}",
                o.status
            )
        },
    )?;

    f.finish()
}
