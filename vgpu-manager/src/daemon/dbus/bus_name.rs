//! Owning the well-known name `org.vgpumanager.Manager1`, exclusively.
//!
//! The name is requested with `DBUS_NAME_FLAG_DO_NOT_QUEUE` only: no `ALLOW_REPLACEMENT`, so another
//! connection's `RequestName(name, REPLACE_EXISTING)` cannot take it (D-Bus specification, "Message
//! Bus Messages", `org.freedesktop.DBus.RequestName`), and no `REPLACE_EXISTING`, so a second vgpud
//! never takes it from a first one. When another connection owns the name already, [`own`] fails
//! with [`NameError::Taken`], which names that owner (unique name, pid, uid) from the bus.
//!
//! A conforming bus never takes the name back from a connection that did not allow replacement; if
//! it ever says so anyway (a `NameLost` signal from the bus, and the bus confirms another owner or
//! none), [`OwnedName::lost`] returns, and the daemon must exit rather than run without its name.
//! A `NameLost` sent by anyone else than the bus (a unicast signal from any client) is ignored.

use futures_util::StreamExt;
use thiserror::Error;
use zbus::Connection;
use zbus::fdo::{DBusProxy, NameLostStream, RequestNameFlags, RequestNameReply};
use zbus::names::{BusName, OwnedUniqueName, WellKnownName};

/// The bus's own name: the sender of the signals the bus emits (D-Bus specification, "Message Bus
/// Specification": the bus "owns" `org.freedesktop.DBus` and sends its messages under that name).
const BUS_DRIVER: &str = "org.freedesktop.DBus";

/// The flags vgpud requests its name with: exclusive, never queued, never replaceable.
pub const FLAGS: RequestNameFlags = RequestNameFlags::DO_NOT_QUEUE;

/// Who owns a name, as far as the bus tells (`GetNameOwner`, `GetConnectionCredentials`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameOwner {
    /// The owner's unique connection name (`:1.42`); `None` when the name has no owner (any more).
    pub unique: Option<String>,
    /// The owner's process id, where the bus reports it.
    pub pid: Option<u32>,
    /// The owner's user id, where the bus reports it.
    pub uid: Option<u32>,
}

impl std::fmt::Display for NameOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(unique) = &self.unique else {
            return f.write_str("no connection (the owner has left)");
        };
        write!(f, "connection {unique}")?;
        let num = |v: Option<u32>| v.map_or_else(|| "unknown".to_string(), |v| v.to_string());
        write!(f, " (pid {}, uid {})", num(self.pid), num(self.uid))
    }
}

/// Why the name could not be owned, or was lost.
#[derive(Debug, Error)]
pub enum NameError {
    /// Another connection owns the name.
    #[error(
        "{name} is already owned on {bus} by {owner}: another vgpud runs there (`systemctl status vgpud`) or another program holds the name; stop it first"
    )]
    Taken {
        /// The name.
        name: String,
        /// The bus, in a line.
        bus: String,
        /// Its owner.
        owner: NameOwner,
    },
    /// The bus refused the request (on the system bus: the policy does not let this user own it).
    #[error(
        "cannot request {name} on {bus} (on the system bus only root may own it: install data/org.vgpumanager.Manager1.conf)"
    )]
    Request {
        /// The name.
        name: String,
        /// The bus, in a line.
        bus: String,
        /// What the bus said.
        #[source]
        source: zbus::Error,
    },
    /// The bus answered the request in a way the flags exclude (queued).
    #[error(
        "the bus on {bus} answered RequestName({name}) with {reply:?}, which DO_NOT_QUEUE excludes"
    )]
    Unexpected {
        /// The name.
        name: String,
        /// The bus, in a line.
        bus: String,
        /// The reply.
        reply: RequestNameReply,
    },
    /// The bus took the name away although it was requested without ALLOW_REPLACEMENT.
    #[error(
        "lost {name} on {bus}: it is now owned by {owner}; exiting so that the service manager restarts vgpud"
    )]
    Lost {
        /// The name.
        name: String,
        /// The bus, in a line.
        bus: String,
        /// Its owner now.
        owner: NameOwner,
    },
    /// The connection to the bus ended while the name was owned.
    #[error("the bus on {bus} closed the connection: {name} is no longer owned by vgpud")]
    Closed {
        /// The name.
        name: String,
        /// The bus, in a line.
        bus: String,
    },
}

/// The name, owned by this connection, with the watch that notices if the bus ever takes it away.
pub struct OwnedName {
    name: WellKnownName<'static>,
    bus: String,
    dbus: DBusProxy<'static>,
    lost: NameLostStream,
    unique: OwnedUniqueName,
}

impl std::fmt::Debug for OwnedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedName")
            .field("name", &self.name.as_str())
            .field("bus", &self.bus)
            .field("unique", &self.unique.as_str())
            .finish_non_exhaustive()
    }
}

/// Who owns `name` now.
pub async fn owner_of(dbus: &DBusProxy<'_>, name: &WellKnownName<'_>) -> NameOwner {
    let unique = match dbus.get_name_owner(BusName::from(name.as_ref())).await {
        Ok(u) => u,
        Err(_) => {
            return NameOwner {
                unique: None,
                pid: None,
                uid: None,
            };
        }
    };
    let creds = dbus
        .get_connection_credentials(BusName::from(unique.as_ref()))
        .await
        .ok();
    NameOwner {
        unique: Some(unique.to_string()),
        pid: creds.as_ref().and_then(|c| c.process_id()),
        uid: creds.as_ref().and_then(|c| c.unix_user_id()),
    }
}

/// Requests `name` on `conn` with [`FLAGS`]; `bus` names the bus in messages. Call it after every
/// object is served, so that clients never see the name before the objects.
pub async fn own(conn: &Connection, name: &str, bus: &str) -> Result<OwnedName, NameError> {
    let request = |source| NameError::Request {
        name: name.to_string(),
        bus: bus.to_string(),
        source,
    };
    let wk = WellKnownName::try_from(name.to_string()).map_err(request)?;
    let dbus = DBusProxy::new(conn).await.map_err(request)?;
    // Subscribed before the request, so that no loss can slip in between.
    let lost = dbus
        .receive_name_lost_with_args(&[(0, name)])
        .await
        .map_err(request)?;
    let unique = conn
        .unique_name()
        .cloned()
        .ok_or_else(|| request(zbus::Error::MissingField))?;
    match conn.request_name_with_flags(wk.clone(), FLAGS).await {
        Ok(RequestNameReply::PrimaryOwner | RequestNameReply::AlreadyOwner) => Ok(OwnedName {
            name: wk,
            bus: bus.to_string(),
            dbus,
            lost,
            unique,
        }),
        Ok(reply) => Err(NameError::Unexpected {
            name: name.to_string(),
            bus: bus.to_string(),
            reply,
        }),
        Err(zbus::Error::NameTaken) => Err(NameError::Taken {
            name: name.to_string(),
            bus: bus.to_string(),
            owner: owner_of(&dbus, &wk).await,
        }),
        Err(source) => Err(request(source)),
    }
}

impl OwnedName {
    /// Waits until the bus has really taken the name away (then returns [`NameError::Lost`]) or the
    /// connection ended ([`NameError::Closed`]). A `NameLost` that does not come from the bus, or after
    /// which the bus still names this connection as the owner, is logged and ignored.
    pub async fn lost(&mut self) -> NameError {
        while let Some(signal) = self.lost.next().await {
            let sender = signal.message().header().sender().map(|s| s.to_string());
            if sender.as_deref() != Some(BUS_DRIVER) {
                tracing::warn!(
                    sender = sender.as_deref().unwrap_or("none"),
                    name = %self.name,
                    "ignored a NameLost signal that the bus did not send"
                );
                continue;
            }
            let owner = owner_of(&self.dbus, &self.name).await;
            if owner.unique.as_deref() == Some(self.unique.as_str()) {
                tracing::warn!(name = %self.name, "the bus said NameLost, yet this connection still owns the name: ignored");
                continue;
            }
            return NameError::Lost {
                name: self.name.to_string(),
                bus: self.bus.clone(),
                owner,
            };
        }
        NameError::Closed {
            name: self.name.to_string(),
            bus: self.bus.clone(),
        }
    }

    /// Gives the name up (at shutdown, so that no new call arrives).
    pub async fn release(&self, conn: &Connection) -> zbus::Result<bool> {
        conn.release_name(self.name.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_neither_replaceable_nor_queued_nor_taken() {
        assert!(FLAGS.contains(RequestNameFlags::DO_NOT_QUEUE));
        assert!(!FLAGS.contains(RequestNameFlags::ALLOW_REPLACEMENT));
        assert!(!FLAGS.contains(RequestNameFlags::REPLACE_EXISTING));
    }

    #[test]
    fn a_taken_name_names_its_owner() {
        let e = NameError::Taken {
            name: "org.vgpumanager.Manager1".into(),
            bus: "unix:path=/run/dbus/system_bus_socket".into(),
            owner: NameOwner {
                unique: Some(":1.7".into()),
                pid: Some(4242),
                uid: Some(65534),
            },
        };
        let msg = e.to_string();
        assert!(
            msg.contains("by connection :1.7 (pid 4242, uid 65534)"),
            "{msg}"
        );
        let gone = NameOwner {
            unique: None,
            pid: None,
            uid: None,
        };
        assert_eq!(gone.to_string(), "no connection (the owner has left)");
    }
}
