//! Module load/unload, uevents and the journal that lets the simulated kernel outlive a process.

use std::path::Path;

use nix::errno::Errno;

use super::{p, rd};
use crate::SimHost;
use vgpu_host::Host;

const U1: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";
const U2: &str = "4b20d080-1b54-4048-85b3-a6a62d165c02";
const MEDIUM: &str = "/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-medium";

#[test]
fn uevents_follow_mdev_and_driver_changes() {
    let h = SimHost::builtin("samples").unwrap();
    let rx = h.subscribe().unwrap();
    h.write(&p(MEDIUM).join("create"), U1).unwrap();
    let ev = rx.try_recv().unwrap();
    assert_eq!(
        (ev.action.as_str(), ev.subsystem.as_deref()),
        ("add", Some("mdev"))
    );
    assert!(
        ev.devpath.starts_with("/devices/virtual/mbochs/mbochs/") && ev.devpath.ends_with(U1),
        "{ev:?}"
    );
    assert_eq!(
        ev.env.get("MDEV_TYPE").map(String::as_str),
        Some("mbochs-medium")
    );
    assert!(rx.try_recv().is_err(), "one change, one event");
    // A failed write changes nothing and sends nothing.
    assert!(h.write(&p(MEDIUM).join("create"), U1).is_err());
    assert!(rx.try_recv().is_err());
    h.write(&p(&format!("/sys/bus/mdev/devices/{U1}/remove")), "1")
        .unwrap();
    assert_eq!(rx.try_recv().unwrap().action, "remove");
}

#[test]
fn modules_load_late_and_refuse_to_unload_while_used() {
    let text = include_str!("../../../sims/samples.toml").replace(
        "device = \"mbochs\"\nvirtual_class = \"mbochs\"",
        "device = \"mbochs\"\nvirtual_class = \"mbochs\"\nunloaded = true",
    );
    let h = SimHost::from_toml("late.toml", &text).unwrap();
    assert!(!h.exists(Path::new("/sys/class/mdev_bus/mbochs")));
    let rx = h.subscribe().unwrap();
    h.load_module("mbochs").unwrap();
    assert_eq!(rd(&h, &format!("{MEDIUM}/available_instances")), "16");
    let evs: Vec<_> = rx.try_iter().collect();
    assert_eq!(
        evs.iter()
            .map(|e| (e.action.as_str(), e.devpath.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("add", "/devices/virtual/mbochs/mbochs"),
            ("add", "/module/mbochs")
        ]
    );
    h.write(&p(MEDIUM).join("create"), U1).unwrap();
    assert_eq!(h.unload_module("mbochs"), Err(Errno::EBUSY));
    assert_eq!(h.load_module("nosuch"), Err(Errno::ENOENT));
    h.write(&p(&format!("/sys/bus/mdev/devices/{U1}/remove")), "1")
        .unwrap();
    h.unload_module("mbochs").unwrap();
    assert!(!h.exists(Path::new("/sys/class/mdev_bus/mbochs")));
}

#[test]
fn the_journal_carries_state_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("kernel.journal");
    {
        let h = SimHost::builtin("samples")
            .unwrap()
            .with_journal(&j)
            .unwrap();
        h.write(&p(MEDIUM).join("create"), U1).unwrap();
        h.write(&p(MEDIUM).join("create"), U2).unwrap();
        h.write(&p(&format!("/sys/bus/mdev/devices/{U1}/remove")), "1")
            .unwrap();
        // Failed writes are not journalled.
        assert!(h.write(&p(MEDIUM).join("create"), U2).is_err());
    }
    // A writer killed mid-append leaves a torn line: that change never happened.
    let mut text = std::fs::read_to_string(&j).unwrap();
    assert_eq!(text.lines().count(), 3);
    text.push_str("{\"op\":\"write\",\"path\":\"/sys/cla");
    std::fs::write(&j, text).unwrap();
    let h = SimHost::builtin("samples")
        .unwrap()
        .with_journal(&j)
        .unwrap();
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{U1}"))));
    assert!(h.exists(&p(&format!("/sys/bus/mdev/devices/{U2}"))));
    assert_eq!(rd(&h, &format!("{MEDIUM}/available_instances")), "15");
    // A journal from another host does not apply, and says so.
    let e = SimHost::builtin("demo")
        .unwrap()
        .with_journal(&j)
        .unwrap_err();
    assert!(
        e.to_string().contains("kernel.journal") && e.to_string().contains("change 1"),
        "{e}"
    );
}

#[test]
fn reopening_compacts_the_journal_to_what_still_exists() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("kernel.journal");
    {
        let h = SimHost::builtin("samples")
            .unwrap()
            .with_journal(&j)
            .unwrap();
        for _ in 0..20 {
            h.write(&p(MEDIUM).join("create"), U1).unwrap();
            h.write(&p(&format!("/sys/bus/mdev/devices/{U1}/remove")), "1")
                .unwrap();
        }
        h.write(&p(MEDIUM).join("create"), U2).unwrap();
        h.write(
            &p("/sys/bus/pci/devices/0000:01:00.0/sriov_drivers_autoprobe"),
            "0",
        )
        .unwrap();
    }
    assert_eq!(std::fs::read_to_string(&j).unwrap().lines().count(), 42);
    let h = SimHost::builtin("samples")
        .unwrap()
        .with_journal(&j)
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&j).unwrap().lines().count(),
        2,
        "history of removed devices dropped"
    );
    assert!(h.exists(&p(&format!("/sys/bus/mdev/devices/{U2}"))));
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{U1}"))));
    assert_eq!(
        rd(
            &h,
            "/sys/bus/pci/devices/0000:01:00.0/sriov_drivers_autoprobe"
        ),
        "0"
    );
    // A read-only replay sees the same state and leaves the file alone.
    drop(h);
    let r = SimHost::builtin("samples").unwrap().replayed(&j).unwrap();
    assert_eq!(rd(&r, &format!("{MEDIUM}/available_instances")), "15");
}
