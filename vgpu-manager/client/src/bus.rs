//! Which bus to talk on: `system` (the default), `session`, or a D-Bus address such as
//! `unix:path=/run/vgpu/bus.sock` (the embedded bus of `vgpud --listen`); or, for Manager1's
//! methods alone, vgpud's private socket ([`crate::private`]).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use zbus::{Address, Connection, connection};

use crate::ClientError;

/// A bus to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusAddress {
    /// The system bus (`DBUS_SYSTEM_BUS_ADDRESS` or `/run/dbus/system_bus_socket`).
    System,
    /// The session bus of the calling user.
    Session,
    /// An explicit D-Bus address.
    Address(String),
    /// vgpud's private socket at this path: a peer-to-peer connection to vgpud itself, serving
    /// Manager1's methods and properties only (no signals, no other objects; [`crate::private`]).
    Private(PathBuf),
}

impl FromStr for BusAddress {
    type Err = ClientError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "system" => Ok(BusAddress::System),
            "session" => Ok(BusAddress::Session),
            other => match Address::from_str(other) {
                Ok(_) => Ok(BusAddress::Address(other.to_string())),
                Err(e) => Err(ClientError::BadAddress {
                    address: s.to_string(),
                    reason: e.to_string(),
                }),
            },
        }
    }
}

impl fmt::Display for BusAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BusAddress::System => f.write_str("the system bus"),
            BusAddress::Session => f.write_str("the session bus"),
            BusAddress::Address(a) => write!(f, "bus {a}"),
            BusAddress::Private(p) => write!(f, "vgpud's private socket {}", p.display()),
        }
    }
}

impl BusAddress {
    /// A connection builder for this bus (for callers that serve objects or set options).
    pub fn builder(&self) -> connection::Builder<'static> {
        match self {
            BusAddress::System => connection::Builder::system(),
            BusAddress::Session => connection::Builder::session(),
            BusAddress::Address(a) => connection::Builder::address(a.as_str()),
            BusAddress::Private(p) => {
                connection::Builder::address(format!("unix:path={}", escape_path(p)).as_str()).p2p()
            }
        }
    }
}

/// `path` as the value of a D-Bus address key: bytes outside the optionally-escaped set
/// `[-0-9A-Za-z_/.*]` as `%XX` (D-Bus specification, "Server Addresses"; escaping any byte is allowed).
fn escape_path(path: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"-_/.*".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// Connects to `bus`. Must run inside a Tokio runtime.
pub async fn connect(bus: &BusAddress) -> Result<Connection, ClientError> {
    bus.builder()
        .build()
        .await
        .map_err(|source| ClientError::Connect {
            bus: bus.to_string(),
            source,
        })
}

/// Connects to `bus` and checks that vgpud owns its name there (one round trip more than
/// [`connect`]), for a client that must know before its first call; a bus that answers calls to an
/// unowned name with `ServiceUnknown` (dbus-daemon, and vgpud's embedded bus) tells at the first
/// call anyway. Must run inside a Tokio runtime.
pub async fn connect_daemon(bus: &BusAddress) -> Result<Connection, ClientError> {
    let conn = connect(bus).await?;
    let call_err = |e: zbus::Error| ClientError::from_call("NameHasOwner", &bus.to_string(), e);
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.map_err(call_err)?;
    let name = zbus::names::BusName::try_from(crate::SERVICE).map_err(call_err)?;
    let owned = dbus
        .name_has_owner(name)
        .await
        .map_err(|e| call_err(zbus::Error::from(e)))?;
    if !owned {
        return Err(ClientError::NotRunning {
            bus: bus.to_string(),
        });
    }
    Ok(conn)
}

/// The one-thread tokio runtime a synchronous client (vgpuctl, the libvirt hook) drives its D-Bus calls
/// on.
pub fn runtime() -> Result<tokio::runtime::Runtime, ClientError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keywords_and_addresses() {
        assert_eq!(
            "system".parse::<BusAddress>().ok(),
            Some(BusAddress::System)
        );
        assert_eq!(
            "session".parse::<BusAddress>().ok(),
            Some(BusAddress::Session)
        );
        assert_eq!(
            "unix:path=/tmp/x.sock".parse::<BusAddress>().ok(),
            Some(BusAddress::Address("unix:path=/tmp/x.sock".into()))
        );
        assert_eq!(
            escape_path(std::path::Path::new("/run/a b/p%q")),
            "/run/a%20b/p%25q"
        );
        let err = "/tmp/x.sock".parse::<BusAddress>().unwrap_err().to_string();
        assert!(
            err.contains("/tmp/x.sock") && err.contains("unix:path="),
            "{err}"
        );
    }
}
