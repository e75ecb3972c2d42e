//! The embedded bus itself: busd on its own thread and runtime.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::mpsc;
use std::thread;

use zbus::Address;
use zbus::address::transport::{Transport, UnixSocket};

use super::{EmbeddedBus, EmbeddedBusError};

/// The socket file of a `unix:path=` address, if it is one.
fn socket_file(address: &str) -> Result<Option<PathBuf>, EmbeddedBusError> {
    let parsed = Address::from_str(address).map_err(|e| EmbeddedBusError::BadAddress {
        address: address.to_string(),
        reason: e.to_string(),
    })?;
    Ok(match parsed.transport() {
        Transport::Unix(u) => match u.path() {
            UnixSocket::File(p) => Some(p.clone()),
            _ => None,
        },
        _ => None,
    })
}

/// Removes a socket file left by a bus that died without cleaning up; refuses if a bus answers there.
fn clear_stale_socket(address: &str, path: &Path) -> Result<(), EmbeddedBusError> {
    if !path.exists() {
        return Ok(());
    }
    if UnixStream::connect(path).is_ok() {
        return Err(EmbeddedBusError::InUse {
            address: address.to_string(),
            path: path.to_path_buf(),
        });
    }
    tracing::info!(path = %path.display(), "removing the stale socket of an earlier bus");
    std::fs::remove_file(path).map_err(|e| EmbeddedBusError::Start {
        address: address.to_string(),
        reason: format!("cannot remove stale socket {}: {e}", path.display()),
    })
}

/// Lets every local user connect, as to the system bus (dbus-daemon makes its sockets world-writable
/// too): anyone may read, and the daemon itself refuses changes from callers who are not root or in
/// the admin group.
fn open_to_everyone(address: &str, path: &Path) -> Result<(), EmbeddedBusError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(|e| {
        EmbeddedBusError::Start {
            address: address.to_string(),
            reason: format!("cannot open socket {} to clients: {e}", path.display()),
        }
    })
}

/// Starts a bus listening on `address` and returns once it accepts connections.
pub fn start(address: &str) -> Result<EmbeddedBus, EmbeddedBusError> {
    let socket = socket_file(address)?;
    if let Some(p) = &socket {
        clear_stale_socket(address, p)?;
    }
    let (tx, rx) = mpsc::channel::<Result<String, String>>();
    let listen = address.to_string();
    thread::Builder::new()
        .name("embedded-bus".into())
        .spawn(move || {
            zruntime::block_on(async move {
                let mut bus = match busd::bus::Bus::for_address(Some(&listen)).await {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                let _ = tx.send(Ok(bus.address().to_string()));
                if let Err(e) = bus.run().await {
                    tracing::error!(error = %format!("{e:#}"), "the embedded bus stopped");
                }
            });
        })
        .map_err(|e| EmbeddedBusError::Start {
            address: address.to_string(),
            reason: format!("cannot start its thread: {e}"),
        })?;
    match rx.recv() {
        Ok(Ok(bound)) => {
            if let Some(p) = &socket {
                open_to_everyone(address, p)?;
            }
            tracing::info!(address = %bound, "embedded bus listening");
            Ok(EmbeddedBus {
                address: bound,
                socket,
            })
        }
        Ok(Err(reason)) => Err(EmbeddedBusError::Start {
            address: address.to_string(),
            reason,
        }),
        Err(_) => Err(EmbeddedBusError::Start {
            address: address.to_string(),
            reason: "the bus thread ended before it was ready".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_addresses_are_named() {
        let e = start("nonsense").unwrap_err().to_string();
        assert!(e.contains("--listen nonsense"), "{e}");
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_bus_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("bus.sock");
        // A socket file nobody listens on, as a crashed bus leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(sock.exists());
        let address = format!("unix:path={}", sock.display());
        let bus = start(&address).unwrap();
        assert!(bus.address().contains(&sock.display().to_string()));
        let e = start(&address).unwrap_err().to_string();
        assert!(e.contains("already listening"), "{e}");
        drop(bus);
        assert!(!sock.exists());
    }
}
