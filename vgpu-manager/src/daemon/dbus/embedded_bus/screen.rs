//! What the embedded bus answers itself in place of passing a client's call on: its ownership
//! policy (vgpud's name and polkit's, `BecomeMonitor`), calls to names nobody owns, and calls past
//! the connection's limit of calls waiting for replies ([`super::replies`]).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use busd::peers::Peers;
use zbus::Message;
use zbus::message::{Flags, Type};
use zbus::names::{BusName, OwnedUniqueName};

use super::replies::{self, MAX_PENDING_REPLIES, MAX_PENDING_REPLIES_PER_USER, PendingReplies};
use super::socket::PeerCred;
use vgpu_client::SERVICE as BUS_NAME;

/// The bus's own name, whose calls busd answers itself.
pub(super) const DBUS_NAME: &str = "org.freedesktop.DBus";

/// The names only root and vgpud's own user may own on the embedded bus: vgpud's, and polkit's,
/// which vgpud asks about callers where it has an owner.
const PROTECTED_NAMES: [&str; 2] = [BUS_NAME, "org.freedesktop.PolicyKit1"];

/// Who may own vgpud's name on the embedded bus (and polkit's, and monitor it): root and the user
/// vgpud runs as.
pub fn may_own_daemon_name(uid: u32) -> bool {
    crate::daemon::dbus::auth::is_privileged_uid(uid)
}

/// Whether `msg` is the `Hello` call to the bus with which a client starts (D-Bus specification,
/// "Message Bus Messages").
pub(super) fn is_hello(msg: &Message) -> bool {
    let header = msg.header();
    msg.message_type() == Type::MethodCall
        && header
            .destination()
            .is_some_and(|d| d.as_str() == DBUS_NAME)
        && header.member().is_some_and(|m| m.as_str() == "Hello")
}

/// The calls that wait for replies, locked (nothing panics while they are).
pub(super) fn lock(replies: &Mutex<PendingReplies>) -> MutexGuard<'_, PendingReplies> {
    replies.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error the bus answers `msg` with in place of passing it on, if it does.
pub(super) async fn refusal(
    msg: &Message,
    cred: PeerCred,
    peers: &Peers,
    replies: Option<&Mutex<PendingReplies>>,
) -> zbus::Result<Option<Message>> {
    if msg.message_type() != Type::MethodCall {
        return Ok(None);
    }
    let header = msg.header();
    let Some(destination) = header.destination() else {
        return Ok(None);
    };
    let expects_reply = !msg
        .primary_header()
        .flags()
        .contains(Flags::NO_REPLY_EXPECTED);
    if destination.as_str() == DBUS_NAME {
        let member = header.member().map(|m| m.as_str());
        let uid = cred.uid;
        let refused = match member {
            Some("RequestName") => msg
                .body()
                .deserialize::<(&str, u32)>()
                .ok()
                .map(|(name, _)| name)
                .filter(|name| PROTECTED_NAMES.contains(name) && !may_own_daemon_name(uid))
                .map(|name| {
                    format!(
                        "uid {uid} may not own {name} on this bus: only root and the user vgpud runs as may"
                    )
                }),
            // A monitor sees every message, other users' calls included; dbus-daemon allows it
            // to root and the bus's own user only (D-Bus specification, "Monitoring").
            Some("BecomeMonitor") if !may_own_daemon_name(uid) => Some(format!(
                "uid {uid} may not monitor this bus: only root and the user vgpud runs as may"
            )),
            _ => None,
        };
        return match refused {
            None => Ok(None),
            Some(text) => {
                tracing::warn!(
                    uid,
                    pid = cred.pid,
                    call = member.unwrap_or_default(),
                    "refused a bus call of an unprivileged user"
                );
                Ok(Some(
                    Message::error(&header, "org.freedesktop.DBus.Error.AccessDenied")
                        .sender(DBUS_NAME)
                        .build(&text)?,
                ))
            }
        };
    }
    if !expects_reply {
        return Ok(None);
    }
    let callee: Option<OwnedUniqueName> = match destination {
        BusName::WellKnown(name) => peers.name_registry().await.lookup(name.clone()),
        BusName::Unique(name) => peers
            .peers()
            .await
            .contains_key(name.as_str())
            .then(|| name.to_owned().into()),
    };
    if let Some(callee) = callee {
        let Some(replies) = replies else {
            return Ok(None);
        };
        let serial = msg.primary_header().serial_num();
        let Err(full) = lock(replies).admit(serial, callee, Instant::now()) else {
            return Ok(None);
        };
        tracing::debug!(
            uid = cred.uid,
            pid = cred.pid,
            ?full,
            "refused a call past the {MAX_PENDING_REPLIES} calls waiting for replies of a connection, or {MAX_PENDING_REPLIES_PER_USER} of a user"
        );
        return Ok(Some(replies::limits_exceeded(msg, cred.uid, full)?));
    }
    let text = format!("The name {destination} is not owned by any connection on this bus");
    Ok(Some(
        Message::error(&header, "org.freedesktop.DBus.Error.ServiceUnknown")
            .sender(DBUS_NAME)
            .build(&text)?,
    ))
}
