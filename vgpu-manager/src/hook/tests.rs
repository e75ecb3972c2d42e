//! The hook's decisions against the fake daemon, fed with the fixture domains of tests/fixtures/libvirt.

use super::fake::{FakeDaemon, instance};
use super::*;

const DESK: &str = include_str!("../../tests/fixtures/libvirt/vdi-desk.xml");
const WS: &str = include_str!("../../tests/fixtures/libvirt/workstation.xml");
const KIOSK: &str = include_str!("../../tests/fixtures/libvirt/defined-vgpu.xml");
const PLAIN: &str = include_str!("../../tests/fixtures/libvirt/no-vgpu.xml");

const DESK_VGPU: &str = "6a1e3f40-7c1d-4c5e-9d2a-0b7f0c3e8a11";
const WS1: &str = "2d9b6c10-0f4e-4d8a-b1c3-5e6f7a8b9c01";
const WS2: &str = "2d9b6c10-0f4e-4d8a-b1c3-5e6f7a8b9c02";
const KIOSK_VGPU: &str = "e3b0c442-98fc-4c14-9afb-f4c8996fb924";

fn inv(domain: &str, op: &str, sub: &str) -> Invocation {
    Invocation::from_args(&[domain, op, sub, "-"]).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs the hook with `xml` on stdin against `fake`.
fn hook(
    fake: &mut FakeDaemon,
    domain: &str,
    op: &str,
    sub: &str,
    xml: &str,
) -> Result<Vec<HookAction>, HookError> {
    run(
        &inv(domain, op, sub),
        || Ok(xml.to_string()),
        || Ok(fake),
        |_| panic!("existence asked while the daemon is reachable"),
    )
}

#[test]
fn a_full_cycle_creates_on_prepare_and_destroys_on_release() {
    let mut f = FakeDaemon::new();
    let steps =
        hook(&mut f, "vdi-desk-07", "prepare", "begin", DESK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        steps,
        [HookAction::Created(
            DESK_VGPU.into(),
            "profile vdi-2g".into()
        )]
    );
    assert_eq!(
        f.log,
        [format!(
            "create {DESK_VGPU} profile vdi-2g gpu - label libvirt:vdi-desk-07"
        )]
    );
    for (op, sub) in [("start", "begin"), ("started", "begin"), ("stopped", "end")] {
        assert_eq!(
            hook(&mut f, "vdi-desk-07", op, sub, DESK).ok(),
            Some(vec![])
        );
    }
    assert_eq!(f.log.len(), 1, "only prepare and release act: {:?}", f.log);
    let steps =
        hook(&mut f, "vdi-desk-07", "release", "end", DESK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps, [HookAction::Destroyed(DESK_VGPU.into())]);
    assert!(f.instances.is_empty());
    // A second release (libvirt can call it again after a failed start) finds nothing to do.
    let steps =
        hook(&mut f, "vdi-desk-07", "release", "end", DESK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps, [HookAction::Left(DESK_VGPU.into(), "already gone")]);
}

#[test]
fn ignored_operations_neither_read_stdin_nor_connect() {
    for (op, sub) in [
        ("start", "begin"),
        ("started", "begin"),
        ("stopped", "end"),
        ("migrate", "begin"),
        ("reconnect", "begin"),
        ("prepare", "end"),
    ] {
        let out = run::<FakeDaemon, _, _, _>(
            &inv("x", op, sub),
            || panic!("stdin read for {op} {sub}"),
            || panic!("connected for {op} {sub}"),
            |_| panic!("existence asked for {op} {sub}"),
        );
        assert_eq!(out.ok(), Some(vec![]));
    }
}

#[test]
fn a_domain_without_vgpus_never_connects() {
    let out = run::<FakeDaemon, _, _, _>(
        &inv("build-runner", "prepare", "begin"),
        || Ok(PLAIN.to_string()),
        || {
            Err(ClientError::NotRunning {
                bus: "the system bus".into(),
            })
        },
        |_| panic!("existence asked for a domain without mdevs"),
    );
    assert_eq!(out.ok(), Some(vec![]));
}

#[test]
fn two_vgpus_by_type_on_a_pinned_gpu_and_rollback_when_the_second_fails() {
    let mut f = FakeDaemon::new();
    f.fail.insert(WS2.into());
    let e = hook(&mut f, "cad-ws-2", "prepare", "begin", WS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cad-ws-2") && e.contains(WS2) && e.contains("no room"),
        "{e}"
    );
    assert_eq!(
        f.log,
        [
            format!("create {WS1} type nvidia-231 gpu 0000:01:00.0 label libvirt:cad-ws-2"),
            format!("create {WS2} type nvidia-231 gpu 0000:01:00.0 label libvirt:cad-ws-2"),
            format!("destroy {WS1}"),
        ]
    );
    assert!(
        f.instances.is_empty(),
        "rolled back: {:?}",
        f.instances.keys()
    );
    f.fail.clear();
    let steps = hook(&mut f, "cad-ws-2", "prepare", "begin", WS).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps.len(), 2);
    assert_eq!(f.instances.len(), 2);
}

#[test]
fn a_stopped_definition_is_started_and_stopped_again_unless_autostart() {
    let mut f = FakeDaemon::new().with(instance(
        KIOSK_VGPU,
        "nvidia-231",
        "stopped",
        true,
        "daemon",
    ));
    let steps =
        hook(&mut f, "kiosk-3", "prepare", "begin", KIOSK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps, [HookAction::Started(KIOSK_VGPU.into())]);
    let steps = hook(&mut f, "kiosk-3", "release", "end", KIOSK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps, [HookAction::Stopped(KIOSK_VGPU.into())]);
    assert_eq!(f.instances[KIOSK_VGPU].state, "stopped");
    // With autostart on, the vGPU belongs to the host, not to the domain: it stays.
    let mut i = instance(KIOSK_VGPU, "nvidia-231", "running", true, "daemon");
    i.autostart = true;
    let mut f = FakeDaemon::new().with(i);
    let steps =
        hook(&mut f, "kiosk-3", "prepare", "begin", KIOSK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(steps, [HookAction::AlreadyRunning(KIOSK_VGPU.into())]);
    let steps = hook(&mut f, "kiosk-3", "release", "end", KIOSK).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        steps,
        [HookAction::Left(KIOSK_VGPU.into(), "autostart definition")]
    );
    assert!(f.log.is_empty(), "{:?}", f.log);
}

#[test]
fn foreign_and_other_transient_devices_are_never_removed() {
    let mut other = instance(KIOSK_VGPU, "nvidia-231", "running", false, "daemon");
    other.label = "libvirt:someone-else".into();
    let mut f = FakeDaemon::new().with(other);
    assert_eq!(
        hook(&mut f, "kiosk-3", "release", "end", KIOSK).ok(),
        Some(vec![HookAction::Left(
            KIOSK_VGPU.into(),
            "transient, not created for this domain"
        )])
    );
    let mut f = FakeDaemon::new().with(instance(
        KIOSK_VGPU,
        "nvidia-231",
        "running",
        false,
        "foreign",
    ));
    assert_eq!(
        hook(&mut f, "kiosk-3", "prepare", "begin", KIOSK).ok(),
        Some(vec![HookAction::AlreadyRunning(KIOSK_VGPU.into())])
    );
    assert_eq!(
        hook(&mut f, "kiosk-3", "release", "end", KIOSK).ok(),
        Some(vec![HookAction::Left(
            KIOSK_VGPU.into(),
            "not created by vgpu-manager"
        )])
    );
    assert!(f.log.is_empty(), "{:?}", f.log);
}

#[test]
fn an_unknown_vgpu_without_metadata_fails_saying_what_to_add() {
    let mut f = FakeDaemon::new();
    let e = hook(&mut f, "kiosk-3", "prepare", "begin", KIOSK)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(KIOSK_VGPU) && e.contains("<vgpu:mdev") && e.contains("vgpuctl define"),
        "{e}"
    );
}

#[test]
fn a_running_vgpu_of_another_type_than_requested_is_refused() {
    let mut f = FakeDaemon::new()
        .with(instance(WS1, "nvidia-222", "running", false, "daemon"))
        .with(instance(WS2, "nvidia-231", "running", false, "daemon"));
    let e = hook(&mut f, "cad-ws-2", "prepare", "begin", WS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nvidia-222") && e.contains("nvidia-231") && e.contains(WS1),
        "{e}"
    );
}

#[test]
fn bad_arguments_and_bad_xml_are_reported() {
    let e = Invocation::from_args(&["only", "three", "args"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("got 3"), "{e}");
    let out = run::<FakeDaemon, _, _, _>(
        &inv("d", "prepare", "begin"),
        || Ok("<domain>".into()),
        || panic!("connected"),
        |_| false,
    );
    let e = out.unwrap_err().to_string();
    assert!(
        e.starts_with("domain d:") && e.contains("not well-formed"),
        "{e}"
    );
}

#[test]
fn existing_devices_need_no_daemon_to_start_but_missing_ones_do() {
    let unreachable = || -> Result<FakeDaemon, ClientError> {
        Err(ClientError::NotRunning {
            bus: "the system bus".into(),
        })
    };
    let all = run(
        &inv("cad-ws-2", "prepare", "begin"),
        || Ok(WS.to_string()),
        unreachable,
        |_| true,
    );
    assert_eq!(
        all.ok(),
        Some(vec![
            HookAction::Left(WS1.into(), "vgpud unreachable, device exists"),
            HookAction::Left(WS2.into(), "vgpud unreachable, device exists"),
        ])
    );
    let one_missing = run(
        &inv("cad-ws-2", "prepare", "begin"),
        || Ok(WS.to_string()),
        unreachable,
        |u| u.to_string() == WS1,
    );
    let e = one_missing.unwrap_err().to_string();
    assert!(e.contains("cad-ws-2") && e.contains("not running"), "{e}");
    // Release has nothing to do without the daemon, and says why.
    let release = run(
        &inv("cad-ws-2", "release", "end"),
        || Ok(WS.to_string()),
        unreachable,
        |_| true,
    );
    assert!(matches!(release, Err(HookError::Connect { .. })));
}
