//! The embedded bus itself: busd on its own thread and runtime, behind an accept loop of ours that
//! applies the bus's connection limits and hands busd each client over [`socket`].

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use busd::bus::Bus;
use busd::peer::SEND_TIMEOUT;

/// How long the bus waits for vgpud's own connection to take the messages sent to it before it
/// disconnects it (other clients get busd's `SEND_TIMEOUT`, 100 ms).
const DAEMON_SEND_TIMEOUT: Duration = Duration::from_secs(30);
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use zbus::Address;
use zbus::address::transport::{Transport, Unix, UnixSocket};
use zbus::connection::AuthMechanism;
use zruntime::net::unix::UnixListener;
use zruntime::{Shared, SharedRuntime};

use super::limits::{AUTH_TIMEOUT, ConnectionLimits, MAX_CONNECTIONS_PER_UID, connection_cap};
use super::screen;
use super::socket::{self, PeerCred};
use super::{BusOptions, EmbeddedBus, EmbeddedBusError};

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

/// Where busd's own listener goes: busd binds one for the address it is given, and the embedded
/// bus accepts on a socket of its own instead (see [`serve`]), so busd's is bound next to it and
/// removed at once, which leaves nobody a way to reach it.
fn unused_busd_socket(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".busd-{}", std::process::id()));
    PathBuf::from(name)
}

/// The address of the socket file `path`, as clients are given it.
fn unix_address(path: &Path) -> Address {
    Address::new(Transport::Unix(Unix::new(UnixSocket::File(
        path.to_path_buf(),
    ))))
}

/// Starts a bus listening on `address` with `options` and returns once it accepts connections.
///
/// Only `unix:path=` addresses: the bus reads each client's credentials from its socket.
pub fn start(address: &str, options: &BusOptions) -> Result<EmbeddedBus, EmbeddedBusError> {
    let reply_timeout = options.reply_timeout;
    let Some(path) = socket_file(address)? else {
        return Err(EmbeddedBusError::BadAddress {
            address: address.to_string(),
            reason: "the embedded bus listens on a socket file only".into(),
        });
    };
    clear_stale_socket(address, &path)?;
    let limits =
        ConnectionLimits::new(connection_cap(nofile_soft_limit()), MAX_CONNECTIONS_PER_UID);
    let (tx, rx) = mpsc::channel::<Result<String, String>>();
    let listen = path.clone();
    thread::Builder::new()
        .name("embedded-bus".into())
        .spawn(move || {
            zruntime::block_on(async move {
                let (bus, runtime, listener, bound) = match open(&listen).await {
                    Ok(up) => up,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(bound));
                serve(&runtime, &listener, &bus, &limits, reply_timeout).await;
            });
        })
        .map_err(|e| EmbeddedBusError::Start {
            address: address.to_string(),
            reason: format!("cannot start its thread: {e}"),
        })?;
    match rx.recv() {
        Ok(Ok(bound)) => {
            open_to_everyone(address, &path)?;
            tracing::info!(address = %bound, "embedded bus listening");
            Ok(EmbeddedBus {
                address: bound,
                socket: Some(path),
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

/// The soft `RLIMIT_NOFILE` of the process, or 1024 (systemd's and the kernel's default) if it
/// cannot be read.
fn nofile_soft_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024)
}

/// busd's bus, the runtime, and the listener of `path`, with the address clients are given.
async fn open(path: &Path) -> Result<(Bus, SharedRuntime, UnixListener<Shared>, String), String> {
    let runtime = SharedRuntime::current().map_err(|e| format!("no runtime: {e}"))?;
    let unused = unused_busd_socket(path);
    let _ = std::fs::remove_file(&unused);
    let bus = Bus::for_address(Some(&unix_address(&unused).to_string()))
        .await
        .map_err(|e| format!("{e:#}"))?;
    let _ = std::fs::remove_file(&unused);
    let std_listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let listener = UnixListener::from_std(&runtime, std_listener)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let bound = unix_address(path)
        .set_guid(bus.guid().clone())
        .map_err(|e| e.to_string())?
        .to_string();
    Ok((bus, runtime, listener, bound))
}

/// How long the accept loop waits after a failed accept (out of file descriptors, mostly) before
/// it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How often the accept loop logs refusals and failures at most.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Accepts clients for ever: each gets a slot in `limits` or is closed at once, and has
/// [`AUTH_TIMEOUT`] to authenticate before busd serves it. A failed accept (`EMFILE`, `ENFILE`)
/// is logged and retried after [`ACCEPT_BACKOFF`]; it never stops the bus.
async fn serve(
    runtime: &SharedRuntime,
    listener: &UnixListener<Shared>,
    bus: &Bus,
    limits: &Arc<ConnectionLimits>,
    reply_timeout: Duration,
) {
    let mut next_id = 0usize;
    let mut last_log: Option<Instant> = None;
    let quiet = |last: &mut Option<Instant>| {
        let now = Instant::now();
        let loud = last.is_none_or(|t| now.duration_since(t) >= LOG_EVERY);
        if loud {
            *last = Some(now);
        }
        !loud
    };
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream.into_std(),
            Err(e) => {
                if !quiet(&mut last_log) {
                    tracing::warn!(
                        error = %e,
                        held = limits.held(),
                        "the embedded bus cannot accept a connection now; retrying"
                    );
                }
                runtime.sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let cred = match getsockopt(&stream, PeerCredentials) {
            Ok(c) => PeerCred {
                uid: c.uid(),
                gid: c.gid(),
                pid: u32::try_from(c.pid()).unwrap_or(0),
            },
            Err(e) => {
                tracing::debug!(error = %e, "a client went before its credentials were read");
                continue;
            }
        };
        let slot = match limits.take(cred.uid, screen::may_own_daemon_name(cred.uid)) {
            Ok(slot) => slot,
            Err(refused) => {
                if !quiet(&mut last_log) {
                    tracing::warn!(
                        uid = cred.uid,
                        pid = cred.pid,
                        ?refused,
                        "the embedded bus refused a connection: too many connections"
                    );
                }
                continue;
            }
        };
        next_id += 1;
        let id = next_id;
        // vgpud's own connection (from this process) is not cut for reading slowly under a flood of
        // calls: every client waits on it, and cutting it stops the service for all of them.
        let send_timeout = if cred.pid == std::process::id() {
            DAEMON_SEND_TIMEOUT
        } else {
            SEND_TIMEOUT
        };
        let client = socket::NewClient {
            cred,
            id,
            send_timeout,
            reply_timeout,
        };
        let split = match socket::split(stream, client, slot, bus.peers().clone(), runtime) {
            Ok(split) => split,
            Err(e) => {
                tracing::warn!(error = %e, "cannot serve a client's socket");
                continue;
            }
        };
        let peers = bus.peers().clone();
        let guid = bus.guid().clone();
        let timer = runtime.clone();
        zruntime::spawn(async move {
            let add = peers.add(
                &guid,
                id,
                zbus::connection::Builder::socket(split),
                AuthMechanism::External,
                send_timeout,
            );
            match timer.timeout(AUTH_TIMEOUT, add).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(uid = cred.uid, error = %format!("{e:#}"), "a client failed to connect"),
                Err(_) => tracing::info!(
                    uid = cred.uid,
                    pid = cred.pid,
                    "closed a connection that did not authenticate within {} s",
                    AUTH_TIMEOUT.as_secs()
                ),
            }
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_addresses_are_named() {
        let e = start("nonsense", &BusOptions::default())
            .unwrap_err()
            .to_string();
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
        let bus = start(&address, &BusOptions::default()).unwrap();
        assert!(bus.address().contains(&sock.display().to_string()));
        let e = start(&address, &BusOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("already listening"), "{e}");
        drop(bus);
        assert!(!sock.exists());
    }
}
