//! vgpud's private socket, seen from a client: where it is, whether this process may use it, and
//! the peer-to-peer connection over it.
//!
//! `vgpud --private-socket PATH` serves Manager1's methods there for root and vgpud's own user (the
//! socket is mode 0600 and vgpud checks each peer's credentials). A one-shot client of theirs
//! (`vgpuctl create`, the `mdevctl` front end as libvirt runs it) calls through it when it can and
//! through the bus otherwise: the answer is the same, the bus broker's hops and the connection's
//! `Hello` are saved. Signals and the per-instance objects are on the bus only.

use std::ffi::OsStr;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use zbus::{Connection, connection};

use crate::{BusAddress, ClientError};

/// Where the shipped unit has vgpud put its private socket (`--private-socket`).
pub const PRIVATE_SOCKET: &str = "/run/vgpu-manager/private";

/// The environment variable naming the private socket instead of [`PRIVATE_SOCKET`]; set and empty,
/// it turns the private socket off.
pub const PRIVATE_SOCKET_ENV: &str = "VGPU_PRIVATE_SOCKET";

/// Where a client of `bus` looks for vgpud's private socket: the path in `env` (the value of
/// [`PRIVATE_SOCKET_ENV`]; empty means nowhere), else [`PRIVATE_SOCKET`] for the system bus, else
/// nowhere (a session bus or an explicit address names another vgpud than the shipped unit's).
pub fn private_socket_path(bus: &BusAddress, env: Option<&OsStr>) -> Option<PathBuf> {
    match env {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => (*bus == BusAddress::System).then(|| PathBuf::from(PRIVATE_SOCKET)),
    }
}

/// Whether a process with effective uid `euid` may connect to the socket at `path`: it is a socket,
/// and the process is root or owns it (vgpud creates it mode 0600). Anyone else would be refused, so
/// they do not try.
pub fn may_use(path: &Path, euid: u32) -> bool {
    match std::fs::metadata(path) {
        Ok(m) => m.file_type().is_socket() && (euid == 0 || m.uid() == euid),
        Err(_) => false,
    }
}

/// Connects to vgpud's private socket at `path`, peer to peer (no bus, no `Hello`). Must run inside
/// a Tokio runtime.
pub async fn connect_private(path: &Path) -> Result<Connection, ClientError> {
    let failed = |source| ClientError::Connect {
        bus: BusAddress::Private(path.to_path_buf()).to_string(),
        source,
    };
    let stream = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| failed(zbus::Error::InputOutput(e.into())))?;
    connection::Builder::unix_stream(stream)
        .p2p()
        .build()
        .await
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_bus_looks_at_the_shipped_path_unless_told_otherwise() {
        assert_eq!(
            private_socket_path(&BusAddress::System, None),
            Some(PathBuf::from(PRIVATE_SOCKET))
        );
        assert_eq!(
            private_socket_path(&BusAddress::System, Some(OsStr::new("/tmp/p"))),
            Some(PathBuf::from("/tmp/p"))
        );
        assert_eq!(
            private_socket_path(&BusAddress::System, Some(OsStr::new(""))),
            None
        );
    }

    #[test]
    fn other_buses_look_only_where_the_environment_says() {
        let addr = BusAddress::Address("unix:path=/tmp/bus".into());
        assert_eq!(private_socket_path(&addr, None), None);
        assert_eq!(private_socket_path(&BusAddress::Session, None), None);
        assert_eq!(
            private_socket_path(&addr, Some(OsStr::new("/tmp/p"))),
            Some(PathBuf::from("/tmp/p"))
        );
    }

    #[test]
    fn only_a_socket_of_ones_own_or_roots_is_tried() {
        let dir = std::env::temp_dir().join(format!("vgpu-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s");
        let _ = std::fs::remove_file(&sock);
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let owner = std::fs::metadata(&sock).unwrap().uid();
        assert!(may_use(&sock, owner));
        assert!(may_use(&sock, 0));
        assert!(!may_use(&sock, owner.wrapping_add(12345).max(1)));
        let file = dir.join("f");
        std::fs::write(&file, "").unwrap();
        assert!(!may_use(&file, 0), "a plain file is not a socket");
        assert!(!may_use(&dir.join("missing"), 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
