//! The embedded bus's connection limits: how many clients it serves in all and per user, and how
//! long a client has to finish the authentication handshake.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::replies::UserReplies;

/// How long a client has, from when it connects, to finish the SASL handshake (D-Bus
/// specification, "Authentication Protocol") and send `Hello` before the bus closes its
/// connection: 10 s. dbus-daemon holds a connection "incomplete" until its `Hello` and closes one
/// still incomplete at its `auth_timeout` (bus/connection.c `bus_connections_expire_incomplete`),
/// 5 s on the system bus; this is more forgiving on a loaded host, and the per-user cap bounds what
/// a user holds meanwhile.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// How many connections one user may hold on the embedded bus, authenticated or not: 64. vgpuctl
/// and a management stack need a handful; dbus-daemon's system bus allows 256
/// (`max_connections_per_user`) for a bus that every service of the host shares.
pub const MAX_CONNECTIONS_PER_UID: usize = 64;

/// The most connections the embedded bus serves at once, whatever the file-descriptor budget:
/// 2048, as dbus-daemon's system bus (`max_completed_connections`).
pub const MAX_CONNECTIONS: usize = 2048;

/// The file descriptors kept for vgpud's own work (its bus connection, state and sysfs files,
/// VFIO devices, the runtime's own) when the connection cap is derived from `RLIMIT_NOFILE`.
pub const FD_RESERVE: usize = 256;

/// The connection cap for a soft `RLIMIT_NOFILE` of `nofile`: one descriptor per connection, with
/// [`FD_RESERVE`] kept free and room for the privileged users' own [`MAX_CONNECTIONS_PER_UID`]
/// (they are not held to this cap), at most [`MAX_CONNECTIONS`] and at least 16.
pub fn connection_cap(nofile: u64) -> usize {
    let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
    nofile
        .saturating_sub(FD_RESERVE + MAX_CONNECTIONS_PER_UID)
        .clamp(16, MAX_CONNECTIONS)
}

/// The connections the bus serves, in all and by user.
#[derive(Debug)]
pub struct ConnectionLimits {
    total_cap: usize,
    per_uid_cap: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_uid: HashMap<u32, usize>,
    /// The reply places each unprivileged user with connections shares among them.
    replies_by_uid: HashMap<u32, Arc<UserReplies>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The bus serves its most connections.
    Total(usize),
    /// The user holds its most connections.
    PerUid(usize),
}

impl ConnectionLimits {
    /// Limits of `total_cap` connections in all and `per_uid_cap` per user.
    pub fn new(total_cap: usize, per_uid_cap: usize) -> Arc<Self> {
        Arc::new(Self {
            total_cap,
            per_uid_cap,
            held: Mutex::new(Held::default()),
        })
    }

    /// The cap on all connections.
    pub fn total_cap(&self) -> usize {
        self.total_cap
    }

    /// A slot for a connection of `uid`, held until the slot drops, or why there is none. A
    /// `privileged` user (root, vgpud's own) is held to its per-user cap only, so that many
    /// unprivileged users together cannot lock vgpud and its administrators out.
    pub fn take(self: &Arc<Self>, uid: u32, privileged: bool) -> Result<ConnectionSlot, Refused> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if !privileged && held.total >= self.total_cap {
            return Err(Refused::Total(self.total_cap));
        }
        let mine = held.by_uid.entry(uid).or_default();
        if *mine >= self.per_uid_cap {
            return Err(Refused::PerUid(self.per_uid_cap));
        }
        *mine += 1;
        held.total += 1;
        let user_replies =
            (!privileged).then(|| held.replies_by_uid.entry(uid).or_default().clone());
        Ok(ConnectionSlot {
            limits: self.clone(),
            uid,
            user_replies,
        })
    }

    /// How many connections are held, in all.
    pub fn held(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

/// One connection's place in the limits; dropping it frees the place.
#[derive(Debug)]
pub struct ConnectionSlot {
    limits: Arc<ConnectionLimits>,
    uid: u32,
    user_replies: Option<Arc<UserReplies>>,
}

impl ConnectionSlot {
    /// The reply places the connection shares with the other connections of its user, for an
    /// unprivileged user (see [`MAX_PENDING_REPLIES_PER_USER`](super::replies::MAX_PENDING_REPLIES_PER_USER)).
    pub fn user_replies(&self) -> Option<Arc<UserReplies>> {
        self.user_replies.clone()
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut held = self
            .limits
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_uid.remove(&self.uid);
                held.replies_by_uid.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_per_user_and_in_all_and_come_back() {
        let l = ConnectionLimits::new(3, 2);
        let a = l.take(1, false).unwrap();
        let _b = l.take(1, false).unwrap();
        assert_eq!(l.take(1, false).unwrap_err(), Refused::PerUid(2));
        let _c = l.take(2, false).unwrap();
        assert_eq!(l.take(3, false).unwrap_err(), Refused::Total(3));
        // Root is past the total cap, within its own.
        let _r = l.take(0, true).unwrap();
        let _r2 = l.take(0, true).unwrap();
        assert_eq!(l.take(0, true).unwrap_err(), Refused::PerUid(2));
        drop(a);
        assert_eq!(l.held(), 4);
        assert_eq!(l.take(3, false).unwrap_err(), Refused::Total(3));
    }

    #[test]
    fn the_cap_follows_the_descriptor_budget() {
        assert_eq!(connection_cap(1024), 704);
        assert_eq!(connection_cap(8192), MAX_CONNECTIONS);
        assert_eq!(connection_cap(100), 16);
    }
}
