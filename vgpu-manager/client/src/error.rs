//! Client-side failures, each one line that says what went wrong and what to do.

use thiserror::Error;

use crate::{ADMIN_GROUP, ERROR_PREFIX, SERVICE};

/// Why a call to vgpud failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// `--bus` is neither `system`, `session` nor a D-Bus address.
    #[error(
        "'{address}' is not a bus: give `system`, `session` or a D-Bus address such as unix:path=/run/vgpu/bus.sock ({reason})"
    )]
    BadAddress {
        /// The text given as the bus.
        address: String,
        /// Why zbus's address parser refused it.
        reason: String,
    },
    /// The bus could not be reached.
    #[error(
        "cannot connect to {bus}: {source} (is vgpud running? `systemctl status vgpud`, or start one with `vgpud --listen ADDRESS`)"
    )]
    Connect {
        /// The bus, as [`crate::BusAddress`] displays it.
        bus: String,
        /// Why zbus could not connect or authenticate.
        source: zbus::Error,
    },
    /// Nobody owns the daemon's name on the bus.
    #[error(
        "vgpud is not running on {bus} (nobody owns {SERVICE}): start it with `systemctl start vgpud` or `vgpud --listen ADDRESS`"
    )]
    NotRunning {
        /// The bus, as [`crate::BusAddress`] displays it.
        bus: String,
    },
    /// vgpud is not running and the bus could not start it through D-Bus activation (an
    /// `org.freedesktop.DBus.Error.Spawn.*` answer: e.g. its activation file names a systemd unit on a
    /// host without systemd, or the launch helper failed).
    #[error(
        "vgpud is not running on {bus} and the bus could not start it ({detail}): start it with `systemctl start vgpud` or `vgpud --listen ADDRESS`"
    )]
    ActivationFailed {
        /// The bus, as [`crate::BusAddress`] displays it.
        bus: String,
        /// The bus's error name and message.
        detail: String,
    },
    /// The daemon refused or failed the request; `message` says why and what to do.
    #[error("{message}")]
    Daemon {
        /// The short kind (`NotFound`, `TypeFull`, `AccessDenied`, …) from `org.vgpumanager.Error.<Kind>`.
        kind: String,
        /// The daemon's message.
        message: String,
    },
    /// The bus's security policy refused the call before it reached the daemon.
    #[error(
        "{method} refused by the D-Bus policy of {SERVICE}: changes need root or membership in group {ADMIN_GROUP} (an administrator can run `usermod -aG {ADMIN_GROUP} USER`; log in again afterwards)"
    )]
    PolicyDenied {
        /// The D-Bus method that was refused.
        method: String,
        /// The bus's own message, for logs.
        detail: String,
    },
    /// The async runtime for the D-Bus connection could not be created.
    #[error("cannot start the runtime for the D-Bus connection: {0}")]
    Runtime(#[source] std::io::Error),
    /// A JSON report of the daemon (`Apply`, `PoolStatus`, …) is not the shape this client knows: the
    /// client and the daemon are of different versions.
    #[error(
        "vgpud's {method} answer is not the documented JSON ({source}): are vgpuctl and vgpud the same version?"
    )]
    BadJson {
        /// The method whose answer it was.
        method: String,
        /// What serde_json found wrong with it.
        source: serde_json::Error,
    },
    /// The daemon answered `Create` or `Define` with an object path that is not an instance's.
    #[error(
        "vgpud's {method} answer {path} is not an instance object path: are vgpuctl and vgpud the same version?"
    )]
    BadObjectPath {
        /// The method whose answer it was.
        method: String,
        /// The object path vgpud answered with, which is not an instance object path.
        path: String,
    },
    /// Any other D-Bus failure.
    #[error("D-Bus error from {SERVICE} while calling {method}: {source}")]
    Bus {
        /// The D-Bus method (or `(connect)`) being called.
        method: String,
        /// What zbus reported.
        source: zbus::Error,
    },
}

/// The prefix of the bus's errors for a failed D-Bus activation (D-Bus specification, "Message Bus
/// Starting Services"; dbus-daemon's `DBUS_ERROR_SPAWN_*`).
const SPAWN_ERROR_PREFIX: &str = "org.freedesktop.DBus.Error.Spawn.";

impl ClientError {
    /// Classifies the failure of calling `method` on `bus`.
    pub fn from_call(method: &str, bus: &str, e: zbus::Error) -> ClientError {
        if let zbus::Error::MethodError(name, desc, _) = &e {
            let kind = name
                .as_str()
                .strip_prefix(ERROR_PREFIX)
                .and_then(|k| k.strip_prefix('.'));
            if let Some(kind) = kind {
                return ClientError::Daemon {
                    kind: kind.to_string(),
                    message: desc.clone().unwrap_or_else(|| name.to_string()),
                };
            }
        }
        if let zbus::Error::MethodError(name, desc, _) = &e
            && name.as_str().starts_with(SPAWN_ERROR_PREFIX)
        {
            return ClientError::ActivationFailed {
                bus: bus.to_string(),
                detail: format!("{name}: {}", desc.as_deref().unwrap_or("")),
            };
        }
        match e {
            zbus::Error::FDO(fdo) => match *fdo {
                e @ (zbus::fdo::Error::SpawnChildExited(_)
                | zbus::fdo::Error::SpawnChildSignaled(_)
                | zbus::fdo::Error::SpawnConfigInvalid(_)
                | zbus::fdo::Error::SpawnExecFailed(_)
                | zbus::fdo::Error::SpawnFailed(_)
                | zbus::fdo::Error::SpawnFailedToSetup(_)
                | zbus::fdo::Error::SpawnFileInvalid(_)
                | zbus::fdo::Error::SpawnForkFailed(_)
                | zbus::fdo::Error::SpawnNoMemory(_)
                | zbus::fdo::Error::SpawnPermissionsInvalid(_)
                | zbus::fdo::Error::SpawnServiceNotFound(_)
                | zbus::fdo::Error::SpawnServiceNotValid(_)) => ClientError::ActivationFailed {
                    bus: bus.to_string(),
                    detail: e.to_string(),
                },
                zbus::fdo::Error::AccessDenied(detail) => ClientError::PolicyDenied {
                    method: method.to_string(),
                    detail,
                },
                zbus::fdo::Error::ServiceUnknown(_) | zbus::fdo::Error::NameHasNoOwner(_) => {
                    ClientError::NotRunning {
                        bus: bus.to_string(),
                    }
                }
                other => ClientError::Bus {
                    method: method.to_string(),
                    source: zbus::Error::FDO(Box::new(other)),
                },
            },
            other => ClientError::Bus {
                method: method.to_string(),
                source: other,
            },
        }
    }

    /// The daemon's error kind, for daemon refusals.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ClientError::Daemon { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

#[cfg(test)]
mod activation_tests {
    use super::*;

    #[test]
    fn a_failed_activation_is_named_as_such_not_as_a_bus_error() {
        let e = zbus::Error::FDO(Box::new(zbus::fdo::Error::SpawnChildExited(
            "Launch helper exited with unknown return code 1".into(),
        )));
        let c = ClientError::from_call("ListInstances", "system", e);
        assert!(
            matches!(&c, ClientError::ActivationFailed { bus, .. } if bus == "system"),
            "{c:?}"
        );
        let text = c.to_string();
        assert!(
            text.contains("could not start it") && text.contains("Launch helper exited"),
            "{text}"
        );
    }
}
