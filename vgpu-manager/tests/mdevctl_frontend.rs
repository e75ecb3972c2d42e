//! `vgpuctl mdevctl` against the real `vgpud --sim demo`, run the way libvirt's node-device driver runs
//! mdevctl: through a program named `mdevctl` (a symlink to vgpuctl), with the exact argument vectors of
//! libvirt's node_device_driver.c (`--opt=value` pairs, the configuration on stdin as
//! `--jsonfile=/dev/stdin`), its output read back with mdevctl's JSON shapes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use dbus_common::{Daemon, ok, ok_json, validate_domain_file, vgpuctl};
use qemu_glue::mdevctl::{StartMode, parse_list_json, parse_types_json};

const A: &str = "51a7c0de-0000-4000-8000-00000000000a";
const B: &str = "51a7c0de-0000-4000-8000-00000000000b";
const T4: &str = "0000:01:00.0";

/// A directory holding `mdevctl` → vgpuctl, as a package would install it.
fn mdevctl_link(dir: &Path) -> PathBuf {
    let link = dir.join("mdevctl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpuctl"), &link).unwrap();
    link
}

/// Runs `mdevctl ARGS` with `stdin` and VGPU_BUS set (libvirt passes no bus option).
fn run(mdevctl: &Path, bus: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(mdevctl)
        .args(args)
        .env("VGPU_BUS", bus)
        // No sysfs below this root: `types` asks vgpud (on its simulated host) even where the machine
        // running the test has mdev parents of its own.
        .env("VGPU_SYSFS_ROOT", mdevctl.parent().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn out(o: &Output) -> String {
    assert!(
        o.status.success(),
        "mdevctl failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn libvirt_nodedev_calls_against_vgpud() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let m = mdevctl_link(tmp.path());

    // Start-up: libvirt lists active and defined devices. The demo has one foreign mdev on the second T4.
    let active =
        parse_list_json(&out(&run(&m, &bus, &["list", "--dumpjson"], "")), "list").unwrap();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].parent, "0000:83:00.0");
    assert_eq!(active[0].config.mdev_type.as_str(), "nvidia-231");
    let defined = out(&run(&m, &bus, &["list", "--dumpjson", "--defined"], ""));
    assert_eq!(defined.trim(), "[]");

    // virsh nodedev-create: start --parent=P --jsonfile=/dev/stdin --uuid=U with libvirt's compact JSON.
    let cfg = r#"{"mdev_type":"nvidia-231","start":"manual"}"#;
    out(&run(
        &m,
        &bus,
        &[
            "start",
            &format!("--parent={T4}"),
            "--jsonfile=/dev/stdin",
            &format!("--uuid={A}"),
        ],
        cfg,
    ));
    let a = ok_json(&vgpuctl(&bus, &["status", A, "--json"]).await);
    assert_eq!(
        (a["state"].as_str(), a["type"].as_str(), a["gpu"].as_str()),
        (Some("running"), Some("nvidia-231"), Some(T4))
    );

    // virsh nodedev-define without a UUID: the new UUID comes back on stdout.
    let auto = r#"{"mdev_type":"nvidia-231","start":"auto"}"#;
    let printed = out(&run(
        &m,
        &bus,
        &["define", &format!("--parent={T4}"), "--jsonfile=/dev/stdin"],
        auto,
    ));
    let new_uuid = printed.trim().to_string();
    assert!(
        new_uuid.parse::<mdev_types::ids::MdevUuid>().is_ok(),
        "{printed}"
    );
    // …and with one.
    out(&run(
        &m,
        &bus,
        &[
            "define",
            &format!("--parent={T4}"),
            "--jsonfile=/dev/stdin",
            &format!("--uuid={B}"),
        ],
        cfg,
    ));
    let defined = parse_list_json(
        &out(&run(&m, &bus, &["list", "--dumpjson", "--defined"], "")),
        "list",
    )
    .unwrap();
    let starts: Vec<(String, StartMode)> = defined
        .iter()
        .map(|d| (d.uuid.to_string(), d.config.start))
        .collect();
    assert!(
        starts.contains(&(new_uuid.clone(), StartMode::Auto))
            && starts.contains(&(B.to_string(), StartMode::Manual)),
        "{starts:?}"
    );

    // nodedev-start / nodedev-destroy / nodedev-autostart / nodedev-undefine.
    out(&run(&m, &bus, &["start", &format!("--uuid={B}")], ""));
    assert_eq!(
        ok_json(&vgpuctl(&bus, &["status", B, "--json"]).await)["state"],
        "running"
    );
    out(&run(&m, &bus, &["stop", &format!("--uuid={B}")], ""));
    assert_eq!(
        ok_json(&vgpuctl(&bus, &["status", B, "--json"]).await)["state"],
        "stopped"
    );
    out(&run(&m, &bus, &["modify", "--uuid", B, "--auto"], ""));
    assert_eq!(
        ok_json(&vgpuctl(&bus, &["status", B, "--json"]).await)["autostart"],
        true
    );
    out(&run(&m, &bus, &["undefine", &format!("--uuid={B}")], ""));
    assert!(
        !vgpuctl(&bus, &["status", B, "--json"])
            .await
            .status
            .success()
    );

    // The probe libvirt runs before `modify --jsonfile`: exit 0 means supported.
    let probe = run(
        &m,
        &bus,
        &["modify", "--defined", "--live", "--jsonfile", "b", "--help"],
        "",
    );
    assert!(
        probe.status.success(),
        "{}",
        String::from_utf8_lossy(&probe.stderr)
    );

    // nodedev-define of an existing definition with a new type: modify --parent=P --jsonfile --uuid --defined.
    let retype = r#"{"mdev_type":"nvidia-222","start":"manual"}"#;
    out(&run(
        &m,
        &bus,
        &[
            "modify",
            &format!("--parent={T4}"),
            "--jsonfile=/dev/stdin",
            &format!("--uuid={new_uuid}"),
            "--defined",
        ],
        retype,
    ));
    let n = ok_json(&vgpuctl(&bus, &["status", &new_uuid, "--json"]).await);
    assert_eq!(
        (n["type"].as_str(), n["autostart"].as_bool()),
        (Some("nvidia-222"), Some(false))
    );

    // types --dumpjson: availability follows what exists (the T4 runs nvidia-231 now, so the NVIDIA
    // homogeneous rule leaves only nvidia-231 with room there).
    let types = parse_types_json(
        &out(&run(&m, &bus, &["types", "--dumpjson", "-p", T4], "")),
        "types",
    )
    .unwrap();
    assert_eq!(types.len(), 1);
    let avail: Vec<(String, u32)> = types[0]
        .1
        .iter()
        .map(|t| (t.type_id.clone(), t.available_instances))
        .collect();
    assert!(
        avail.iter().any(|(t, n)| t == "nvidia-231" && *n > 0),
        "{avail:?}"
    );
    assert!(
        avail.iter().all(|(t, n)| t == "nvidia-231" || *n == 0),
        "{avail:?}"
    );

    // lsmdev is `mdevctl list`.
    let lsmdev = tmp.path().join("lsmdev");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpuctl"), &lsmdev).unwrap();
    let text = out(&run(&lsmdev, &bus, &[], ""));
    assert!(
        text.contains(&format!("{A} {T4} nvidia-231 manual")),
        "{text}"
    );

    // A refusal is one line on stderr and a non-zero exit, which libvirt shows to the user.
    let refused = run(&m, &bus, &["stop", &format!("--uuid={B}")], "");
    // mdevctl reports a failed command with status 1 (its main returns the error).
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not running"));
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn export_and_import_through_definition_files() {
    let tmp = tempfile::tempdir().unwrap();
    let first = Daemon::embedded(tmp.path(), &tmp.path().join("state1")).await;
    ok(&vgpuctl(
        &first.bus,
        &[
            "define",
            "--uuid",
            A,
            "--type",
            "nvidia-231",
            "--gpu",
            T4,
            "--autostart",
        ],
    )
    .await);
    let dir = tmp.path().join("mdevctl.d");
    let d = dir.to_str().unwrap();
    let written = ok(&vgpuctl(&first.bus, &["mdevctl", "export", "--dir", d]).await);
    assert_eq!(written.trim(), dir.join(T4).join(A).display().to_string());
    first.terminate();

    let second_dir = tmp.path().join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let second = Daemon::embedded(&second_dir, &tmp.path().join("state2")).await;
    assert!(
        !vgpuctl(&second.bus, &["status", A, "--json"])
            .await
            .status
            .success()
    );
    ok(&vgpuctl(&second.bus, &["mdevctl", "import", "--dir", d]).await);
    let a = ok_json(&vgpuctl(&second.bus, &["status", A, "--json"]).await);
    assert_eq!(
        (
            a["type"].as_str(),
            a["gpu"].as_str(),
            a["autostart"].as_bool()
        ),
        (Some("nvidia-231"), Some(T4), Some(true))
    );
    let again = ok(&vgpuctl(&second.bus, &["mdevctl", "import", "--dir", d]).await);
    assert!(again.contains("already defined"), "{again}");
    drop(second);
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpuctl_xml_output_is_valid_libvirt_xml() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let i = ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await);
    let uuid = i["uuid"].as_str().unwrap().to_string();
    let hostdev = ok(&vgpuctl(&bus, &["xml", &uuid]).await);
    assert!(
        hostdev.contains(&format!("<address uuid='{uuid}'/>")),
        "{hostdev}"
    );
    let domain = ok(&vgpuctl(
        &bus,
        &[
            "xml",
            &uuid,
            "--domain",
            "--display",
            "--ramfb",
            "--name",
            "desk-1",
        ],
    )
    .await);
    let parsed = qemu_glue::parse_domain(&domain).unwrap();
    assert_eq!(
        parsed
            .request_for(&uuid.parse().unwrap())
            .map(|r| r.target.clone()),
        Some(qemu_glue::VgpuTarget::Profile("vdi-2g".into()))
    );
    let qemu = ok(&vgpuctl(&bus, &["xml", &uuid, "--qemu"]).await);
    assert_eq!(
        qemu.trim(),
        format!("-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{uuid}")
    );
    let missing = vgpuctl(&bus, &["xml", "00000000-0000-4000-8000-000000000000"]).await;
    assert_eq!(missing.status.code(), Some(2));
    let pool = vgpuctl(&bus, &["xml", "vdi-pool"]).await;
    assert!(String::from_utf8_lossy(&pool.stderr).contains("not an instance UUID"));

    let f = tmp.path().join("domain.xml");
    std::fs::write(&f, &domain).unwrap();
    validate_domain_file(&f, "`vgpuctl xml --domain` output");
    drop(daemon);
}
