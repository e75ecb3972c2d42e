//! Kernel uevents: what the kernel broadcasts on `NETLINK_KOBJECT_UEVENT` when devices come and go
//! (a parent registering when its driver loads, an mdev created or removed behind our back).
//!
//! Message format (lib/kobject_uevent.c `kobject_uevent_env`, broadcast to multicast group 1): a header
//! `ACTION@DEVPATH` then NUL-separated `KEY=VALUE` pairs (`ACTION`, `DEVPATH`, `SUBSYSTEM`, `DRIVER`, `SEQNUM`,
//! `MDEV_TYPE`, …). udev's re-broadcasts (group 2, starting with `libudev`) are not read.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, socket,
};
use serde::{Deserialize, Serialize};

/// One kernel uevent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uevent {
    /// `add`, `remove`, `change`, `bind`, `unbind`, `move`, `online`, `offline`.
    pub action: String,
    /// The kobject path below `/sys`, e.g. `/devices/pci0000:00/0000:00:02.0/<uuid>`.
    pub devpath: String,
    /// `SUBSYSTEM` (`mdev`, `pci`, `mdev_bus`, …), when present.
    pub subsystem: Option<String>,
    /// Every `KEY=VALUE` pair.
    pub env: BTreeMap<String, String>,
}

impl Uevent {
    /// Builds an event (used by the simulated host, which broadcasts the same messages the kernel would).
    pub fn new(action: &str, devpath: &str, subsystem: Option<&str>) -> Self {
        let mut env = BTreeMap::new();
        env.insert("ACTION".to_string(), action.to_string());
        env.insert("DEVPATH".to_string(), devpath.to_string());
        if let Some(s) = subsystem {
            env.insert("SUBSYSTEM".to_string(), s.to_string());
        }
        Self {
            action: action.to_string(),
            devpath: devpath.to_string(),
            subsystem: subsystem.map(str::to_string),
            env,
        }
    }

    /// True for events that can change what vgpu-manager manages: mdev devices, mdev parents (class
    /// `mdev_bus`), PCI devices and driver (un)binding.
    pub fn is_relevant(&self) -> bool {
        matches!(
            self.subsystem.as_deref(),
            Some("mdev" | "mdev_bus" | "pci" | "drivers" | "module")
        ) || self.env.contains_key("MDEV_TYPE")
    }
}

/// Parses one kernel uevent datagram; `None` for anything that is not one (udev's re-broadcasts,
/// truncated or malformed messages).
pub fn parse_uevent(buf: &[u8]) -> Option<Uevent> {
    let mut parts = buf.split(|b| *b == 0).filter(|p| !p.is_empty());
    let header = std::str::from_utf8(parts.next()?).ok()?;
    let (action, devpath) = header.split_once('@')?;
    if action.is_empty() || !devpath.starts_with('/') {
        return None;
    }
    let mut env = BTreeMap::new();
    for p in parts {
        let Ok(kv) = std::str::from_utf8(p) else {
            continue;
        };
        if let Some((k, v)) = kv.split_once('=') {
            env.insert(k.to_string(), v.to_string());
        }
    }
    Some(Uevent {
        action: action.to_string(),
        devpath: devpath.to_string(),
        subsystem: env.get("SUBSYSTEM").cloned(),
        env,
    })
}

/// A socket subscribed to the kernel's uevent broadcasts.
#[derive(Debug)]
pub struct UeventSocket {
    fd: OwnedFd,
    /// One datagram, kept between calls. A uevent is its `ACTION@DEVPATH` header (a sysfs path) plus
    /// at most 2 KiB of variables (`UEVENT_BUFFER_SIZE`, include/linux/kobject.h): 16 KiB holds any.
    buf: Vec<u8>,
}

impl UeventSocket {
    /// Opens `NETLINK_KOBJECT_UEVENT` and joins the kernel's multicast group (1).
    pub fn open() -> nix::Result<Self> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkKObjectUEvent,
        )?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 1))?;
        Ok(Self {
            fd,
            buf: vec![0; 16 * 1024],
        })
    }

    /// Blocks until the next kernel uevent and returns it (skipping anything unparsable).
    pub fn next_event(&mut self) -> nix::Result<Uevent> {
        loop {
            let n = recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty())?;
            if let Some(ev) = parse_uevent(&self.buf[..n]) {
                return Ok(ev);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_an_mdev_add() {
        let msg = b"add@/devices/virtual/mbochs/mbochs/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\0ACTION=add\0DEVPATH=/devices/virtual/mbochs/mbochs/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001\0SUBSYSTEM=mdev\0MDEV_TYPE=mbochs-medium\0SEQNUM=1234\0";
        let ev = parse_uevent(msg).unwrap();
        assert_eq!(ev.action, "add");
        assert_eq!(ev.subsystem.as_deref(), Some("mdev"));
        assert_eq!(
            ev.env.get("MDEV_TYPE").map(String::as_str),
            Some("mbochs-medium")
        );
        assert!(ev.is_relevant());
    }

    #[test]
    fn ignores_udev_rebroadcasts_and_garbage() {
        assert_eq!(parse_uevent(b"libudev\0\xfe\xed\xca\xfe"), None);
        assert_eq!(parse_uevent(b""), None);
        assert_eq!(parse_uevent(b"add@relative\0"), None);
        let block =
            parse_uevent(b"change@/devices/virtual/block/loop0\0SUBSYSTEM=block\0").unwrap();
        assert!(!block.is_relevant());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_uevent(&bytes);
        }
    }
}
