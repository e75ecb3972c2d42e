//! The real `vgpu-libvirt-hook` binary, called the way libvirtd calls it (arguments
//! `<domain> <op> <subop> -`, the domain XML on stdin), against the real `vgpud --sim demo` on its
//! embedded bus. The domains are the fixtures in tests/fixtures/libvirt, and the calls replay
//! `invocations.txt`, libvirt's hook sequence over one start and stop of a domain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use dbus_common::{Daemon, ok, ok_json, validate_domain_file, vgpuctl};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/libvirt");
const DESK_VGPU: &str = "6a1e3f40-7c1d-4c5e-9d2a-0b7f0c3e8a11";
const WS1: &str = "2d9b6c10-0f4e-4d8a-b1c3-5e6f7a8b9c01";
const WS2: &str = "2d9b6c10-0f4e-4d8a-b1c3-5e6f7a8b9c02";
const KIOSK_VGPU: &str = "e3b0c442-98fc-4c14-9afb-f4c8996fb924";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap()
}

/// Runs the hook binary as libvirt does.
fn hook(bus: &str, domain: &str, op: &str, sub: &str, xml: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpu-libvirt-hook"))
        .args([domain, op, sub, "-"])
        .env("VGPU_BUS", bus)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // libvirt writes the XML whether or not the hook reads it; a hook that exits first closes the pipe.
    let _ = child.stdin.take().unwrap().write_all(xml.as_bytes());
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok_hook(o: &Output) {
    assert!(
        o.status.success(),
        "hook failed ({}): {}",
        o.status,
        stderr(o)
    );
}

async fn instance(bus: &str, uuid: &str) -> Option<Value> {
    let o = vgpuctl(bus, &["status", uuid, "--json"]).await;
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).unwrap())
}

/// The recorded call sequence: (op, subop) per line.
fn invocations() -> Vec<(String, String)> {
    fixture("invocations.txt")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[1].to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_desktop_gets_its_vgpu_for_one_start_stop_cycle() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let xml = fixture("vdi-desk.xml");
    assert!(instance(&bus, DESK_VGPU).await.is_none());
    for (op, sub) in invocations() {
        ok_hook(&hook(&bus, "vdi-desk-07", &op, &sub, &xml));
        let i = instance(&bus, DESK_VGPU).await;
        match (op.as_str(), sub.as_str()) {
            ("prepare", "begin") | ("start", _) | ("started", _) | ("stopped", _) => {
                let i = i.unwrap_or_else(|| panic!("no vGPU after {op} {sub}"));
                assert_eq!(i["state"], "running", "{i}");
                assert_eq!(i["profile"], "vdi-2g", "{i}");
                assert_eq!(i["label"], "libvirt:vdi-desk-07", "{i}");
                assert_eq!(i["defined"], false, "{i}");
            }
            ("release", "end") => assert!(i.is_none(), "still there after release: {i:?}"),
            other => panic!("unexpected recorded call {other:?}"),
        }
    }
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_vgpus_by_type_and_a_rollback_when_the_second_cannot_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let ws = fixture("workstation.xml");
    ok_hook(&hook(&bus, "cad-ws-2", "prepare", "begin", &ws));
    for u in [WS1, WS2] {
        let i = instance(&bus, u)
            .await
            .unwrap_or_else(|| panic!("{u} missing"));
        assert_eq!(
            (i["type"].as_str(), i["gpu"].as_str()),
            (Some("nvidia-231"), Some("0000:01:00.0"))
        );
    }
    ok_hook(&hook(&bus, "cad-ws-2", "release", "end", &ws));
    assert!(instance(&bus, WS1).await.is_none() && instance(&bus, WS2).await.is_none());

    // A second vGPU of another type on the same T4 cannot exist (NVIDIA time-sliced vGPUs on one GPU
    // share a type, and the demo T4 follows that rule), so the first one is rolled back.
    let mixed = ws.replacen(
        &format!("uuid=\"{WS2}\" type=\"nvidia-231\""),
        &format!("uuid=\"{WS2}\" type=\"nvidia-222\""),
        1,
    );
    assert_ne!(mixed, ws);
    let o = hook(&bus, "cad-ws-2", "prepare", "begin", &mixed);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("cad-ws-2") && e.contains(WS2), "{e}");
    assert!(
        instance(&bus, WS1).await.is_none(),
        "first vGPU not rolled back"
    );
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_on_demand_definition_is_started_and_stopped_but_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let kiosk = fixture("defined-vgpu.xml");
    // Without a definition or metadata the start is refused, saying what to add.
    let o = hook(&bus, "kiosk-3", "prepare", "begin", &kiosk);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("<vgpu:mdev") && stderr(&o).contains(KIOSK_VGPU),
        "{}",
        stderr(&o)
    );
    ok(&vgpuctl(
        &bus,
        &[
            "define",
            "--uuid",
            KIOSK_VGPU,
            "--type",
            "nvidia-231",
            "--gpu",
            "0000:01:00.0",
        ],
    )
    .await);
    ok_hook(&hook(&bus, "kiosk-3", "prepare", "begin", &kiosk));
    assert_eq!(
        instance(&bus, KIOSK_VGPU).await.unwrap()["state"],
        "running"
    );
    ok_hook(&hook(&bus, "kiosk-3", "release", "end", &kiosk));
    let i = instance(&bus, KIOSK_VGPU).await.unwrap();
    assert_eq!(
        (i["state"].as_str(), i["defined"].as_bool()),
        (Some("stopped"), Some(true))
    );
    // With autostart on, the vGPU belongs to the host: release leaves it running.
    ok(&vgpuctl(&bus, &["autostart", KIOSK_VGPU]).await);
    ok(&vgpuctl(&bus, &["start", KIOSK_VGPU]).await);
    ok_hook(&hook(&bus, "kiosk-3", "prepare", "begin", &kiosk));
    ok_hook(&hook(&bus, "kiosk-3", "release", "end", &kiosk));
    assert_eq!(
        instance(&bus, KIOSK_VGPU).await.unwrap()["state"],
        "running"
    );
    let listed = ok_json(&vgpuctl(&bus, &["list", "--json"]).await);
    assert_eq!(
        listed.as_array().map(|a| a.len()),
        Some(2),
        "the demo's foreign mdev and ours: {listed}"
    );
    drop(daemon);
}

#[test]
fn guests_without_vgpus_and_other_operations_never_need_the_daemon() {
    let nowhere = "unix:path=/nonexistent/vgpu-bus.sock";
    ok_hook(&hook(
        nowhere,
        "build-runner",
        "prepare",
        "begin",
        &fixture("no-vgpu.xml"),
    ));
    ok_hook(&hook(
        nowhere,
        "build-runner",
        "release",
        "end",
        &fixture("no-vgpu.xml"),
    ));
    for (op, sub) in invocations()
        .into_iter()
        .filter(|(o, _)| o != "prepare" && o != "release")
    {
        ok_hook(&hook(
            nowhere,
            "vdi-desk-07",
            &op,
            &sub,
            &fixture("vdi-desk.xml"),
        ));
    }
    // A desktop that needs its vGPU fails to start when vgpud is unreachable, and says so.
    let o = hook(
        nowhere,
        "vdi-desk-07",
        "prepare",
        "begin",
        &fixture("vdi-desk.xml"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("vdi-desk-07") && stderr(&o).contains("vgpud"),
        "{}",
        stderr(&o)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_vgpu-libvirt-hook"))
        .arg("x")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("got 1"), "{}", stderr(&o));
}

#[test]
fn the_fixtures_are_valid_libvirt_domains() {
    for f in [
        "vdi-desk.xml",
        "workstation.xml",
        "defined-vgpu.xml",
        "no-vgpu.xml",
    ] {
        validate_domain_file(&Path::new(FIXTURES).join(f), "hook fixture domain");
    }
}
