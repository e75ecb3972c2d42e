//! An embedded D-Bus bus (busd, a bus implementation on zbus) for `vgpud --listen ADDRESS`, so the
//! daemon and its clients work where no system bus runs (demos, tests, minimal guests).
//!
//! busd runs on its own runtime (zruntime), so it gets its own thread; the daemon connects to it like
//! any client. busd enforces no policy, so the embedded bus accepts clients itself and hands busd
//! each one over a socket of its own ([`socket`]): that is where it limits connections ([`limits`]),
//! message sizes, the calls waiting for replies ([`replies`]), and who may own the daemon's name,
//! and answers calls to unowned names. Every peer
//! may send every method call; the daemon's own caller checks ([`super::auth`]) are what protects
//! mutating calls. Its socket is open to every local user, like the system bus. docs/security.md
//! lists every limit.

use std::path::PathBuf;

use thiserror::Error;

#[cfg(feature = "embedded-bus")]
pub mod limits;
#[cfg(feature = "embedded-bus")]
pub mod replies;
#[cfg(feature = "embedded-bus")]
mod run;
#[cfg(feature = "embedded-bus")]
pub mod screen;
#[cfg(feature = "embedded-bus")]
pub mod socket;
#[cfg(feature = "embedded-bus")]
pub use run::start;

/// Why the embedded bus could not start.
#[derive(Debug, Error)]
pub enum EmbeddedBusError {
    /// The address is not a D-Bus address busd can listen on.
    #[error(
        "--listen {address}: {reason} (give an address such as unix:path=/run/vgpu-manager/bus.sock)"
    )]
    BadAddress {
        /// What was given.
        address: String,
        /// Why it is unusable.
        reason: String,
    },
    /// A live bus already listens there.
    #[error(
        "--listen {address}: a bus is already listening on {path} (another vgpud?); stop it or pick another path"
    )]
    InUse {
        /// The address.
        address: String,
        /// The socket file.
        path: PathBuf,
    },
    /// This build has no embedded bus.
    #[error(
        "--listen {address}: this vgpud was built without the embedded bus (the `embedded-bus` feature, on by default); use --bus instead"
    )]
    NotBuilt {
        /// The address.
        address: String,
    },
    /// busd failed to start.
    #[error("--listen {address}: cannot start the bus: {reason}")]
    Start {
        /// The address.
        address: String,
        /// busd's error.
        reason: String,
    },
}

/// A running embedded bus. Dropping it removes its socket file; the bus thread ends with the process.
#[derive(Debug)]
pub struct EmbeddedBus {
    address: String,
    socket: Option<PathBuf>,
}

impl EmbeddedBus {
    /// The address clients connect to (with the bus's guid).
    pub fn address(&self) -> &str {
        &self.address
    }
}

impl Drop for EmbeddedBus {
    fn drop(&mut self) {
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// How long a call on the embedded bus keeps its place before the bus gives up on its reply, unless
/// it is started with another ([`BusOptions`], `vgpud --bus-reply-timeout`): 120 s. Then the bus
/// answers it with `org.freedesktop.DBus.Error.NoReply` and drops a reply that comes later, as
/// dbus-daemon does at its `reply_timeout` (bus/connection.c `bus_pending_reply_expired`). That is
/// twice the longest any of vgpud's clients waits (60 s, the blocking client's call timeout) and
/// well past libdbus's default of 25 s, so the bus never fails a call its caller still waits for,
/// while a callee that stays connected and never answers holds a client's places for 2 minutes,
/// not for ever (dbus-daemon's default, `-1`, is never).
pub const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// What an embedded bus may be started with besides its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusOptions {
    /// How long a call waits for its reply before the bus answers it
    /// `org.freedesktop.DBus.Error.NoReply` itself and drops a reply that comes later (dbus-daemon's
    /// `reply_timeout` limit). Default: [`REPLY_TIMEOUT`].
    pub reply_timeout: std::time::Duration,
}

impl Default for BusOptions {
    fn default() -> Self {
        Self {
            reply_timeout: REPLY_TIMEOUT,
        }
    }
}

/// Starts a bus listening on `address`: this build has none, so it says so.
#[cfg(not(feature = "embedded-bus"))]
pub fn start(address: &str, _options: &BusOptions) -> Result<EmbeddedBus, EmbeddedBusError> {
    Err(EmbeddedBusError::NotBuilt {
        address: address.to_string(),
    })
}
