//! Kernel uevent datagrams (`vgpu_host::uevent::parse_uevent`, what vgpud reads from
//! `NETLINK_KOBJECT_UEVENT`). Beyond "no panic": a parsed event has the header's shape (non-empty
//! action without `@`, an absolute devpath), its `subsystem` is its `SUBSYSTEM` variable, and its
//! wire form (lib/kobject_uevent.c: `ACTION@DEVPATH` then NUL-separated `KEY=VALUE`) parses back to
//! the same event.

use vgpu_host::uevent::{Uevent, parse_uevent};

/// The datagram the kernel would send for `ev`.
pub fn wire(ev: &Uevent) -> Vec<u8> {
    let mut out = format!("{}@{}", ev.action, ev.devpath).into_bytes();
    out.push(0);
    for (k, v) in &ev.env {
        out.extend_from_slice(format!("{k}={v}").as_bytes());
        out.push(0);
    }
    out
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Some(ev) = parse_uevent(data) else {
        return;
    };
    assert!(!ev.action.is_empty() && !ev.action.contains('@'), "{ev:?}");
    assert!(ev.devpath.starts_with('/'), "{ev:?}");
    assert_eq!(ev.subsystem.as_ref(), ev.env.get("SUBSYSTEM"), "{ev:?}");
    let _ = ev.is_relevant();
    let again = parse_uevent(&wire(&ev));
    assert_eq!(
        again.as_ref(),
        Some(&ev),
        "the wire form of {ev:?} reads back differently"
    );
}
