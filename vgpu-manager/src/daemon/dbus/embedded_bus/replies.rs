//! The method calls of one client of the embedded bus that wait for their replies, as dbus-daemon
//! counts them (`max_replies_per_connection`, dbus-daemon(1); bus/connection.c
//! `bus_connections_expect_reply`): a call that expects a reply, to any peer but the bus itself,
//! holds one place from when the client sends it until its reply (or an error in its place) is
//! written to the client, or until [`REPLY_TIMEOUT`] passes. A client that holds all
//! [`MAX_PENDING_REPLIES`] places has its next such call answered by the bus with
//! `org.freedesktop.DBus.Error.LimitsExceeded` instead of passed on.
//!
//! This bounds what one connection can have waiting anywhere on the bus: in its callees' queues, in
//! zbus's replies to the interfaces it answers by itself (`Peer`, `Introspectable`, `Properties`,
//! `ObjectManager`), and in busd's records of calls that wait on a callee that never answers.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use zbus::Message;
use zbus::names::OwnedUniqueName;

/// How many calls of one connection may wait for their replies at once: 128, dbus-daemon's default
/// for the system bus (`max_replies_per_connection`, bus/config-parser.c; listed in Debian's
/// /usr/share/dbus-1/system.conf). vgpuctl waits for each reply before its next call; a management
/// stack that pipelines has 128 in flight.
pub const MAX_PENDING_REPLIES: usize = 128;

/// How many calls all connections of one unprivileged user together may have waiting for their
/// replies: 256. dbus-daemon has no such limit, but a user may open 64 connections to this bus, and
/// the interfaces zbus answers by itself (`Introspectable` above all, whose answer renders every
/// object below the called path) cost vgpud memory per call waiting; 64 × 128 calls let one user
/// hold hundreds of MiB of vgpud's memory, 256 a few MiB. Root and vgpud's own user have no such
/// limit.
pub const MAX_PENDING_REPLIES_PER_USER: usize = 256;

/// The places one unprivileged user's connections share (see [`MAX_PENDING_REPLIES_PER_USER`]).
#[derive(Debug, Default)]
pub struct UserReplies {
    waiting: std::sync::atomic::AtomicUsize,
}

impl UserReplies {
    /// Takes a place, unless the user has all of them.
    fn take(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < MAX_PENDING_REPLIES_PER_USER).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives `n` places back.
    fn give(&self, n: usize) {
        use std::sync::atomic::Ordering;
        let _ = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                Some(w.saturating_sub(n))
            });
    }

    /// How many places the user's connections hold.
    pub fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }
}

pub use super::REPLY_TIMEOUT;

/// The error name of the bus's refusal of a call past [`MAX_PENDING_REPLIES`].
pub const LIMITS_EXCEEDED: &str = "org.freedesktop.DBus.Error.LimitsExceeded";

/// How long the bus waits, after refusing a call of a connection past its limit, before it reads
/// the connection's next message: 1 ms, so a flood past the limit is refused at 1,000 calls a
/// second at most (about 300 KB/s of errors for the client to read).
pub const REFUSAL_PACE: Duration = Duration::from_millis(1);

/// A call that waits for its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The call's serial, which its reply names.
    pub serial: NonZeroU32,
    /// The unique name of the peer the call went to.
    pub callee: OwnedUniqueName,
    /// When the bus gives up on the reply.
    pub deadline: Instant,
}

/// The calls of one connection that wait for their replies, oldest first (so also by deadline):
/// never more than [`MAX_PENDING_REPLIES`].
#[derive(Debug)]
pub struct PendingReplies {
    calls: VecDeque<Waiting>,
    /// The places of the connection's user, for an unprivileged user.
    user: Option<std::sync::Arc<UserReplies>>,
    /// How long a call keeps its place ([`REPLY_TIMEOUT`] unless the bus was started with another).
    timeout: Duration,
}

impl Drop for PendingReplies {
    fn drop(&mut self) {
        // The connection closed: its calls hold the user's places no more.
        if let Some(u) = &self.user {
            u.give(self.calls.len());
        }
    }
}

/// A call the client may not make now: it has [`MAX_PENDING_REPLIES`] calls waiting, or its user
/// has [`MAX_PENDING_REPLIES_PER_USER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The connection's own limit.
    Connection,
    /// The limit of all the user's connections together.
    User,
}

impl PendingReplies {
    /// The waiting calls of a connection whose calls keep their places for `timeout`, not counted
    /// against a user (a privileged user's connection).
    pub fn new(timeout: Duration) -> PendingReplies {
        PendingReplies {
            calls: VecDeque::new(),
            user: None,
            timeout,
        }
    }

    /// The waiting calls of a connection of an unprivileged user, sharing `user`'s places with the
    /// user's other connections; each call keeps its place for `timeout`.
    pub fn of_user(user: std::sync::Arc<UserReplies>, timeout: Duration) -> PendingReplies {
        PendingReplies {
            calls: VecDeque::new(),
            user: Some(user),
            timeout,
        }
    }

    /// How long a call keeps its place before the bus answers it `NoReply`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Records a call with `serial` to `callee` made at `now`, or refuses it if the connection has
    /// its most calls waiting. A client may reuse a serial for calls to different peers (busd
    /// refuses a second one to the same peer); each holds a place of its own.
    pub fn admit(
        &mut self,
        serial: NonZeroU32,
        callee: OwnedUniqueName,
        now: Instant,
    ) -> Result<(), Full> {
        if self.calls.len() >= MAX_PENDING_REPLIES {
            return Err(Full::Connection);
        }
        if let Some(u) = &self.user
            && !u.take()
        {
            return Err(Full::User);
        }
        self.calls.push_back(Waiting {
            serial,
            callee,
            deadline: now + self.timeout,
        });
        Ok(())
    }

    /// Frees the place of the call that `reply`, a message written to the client, answers, if it
    /// answers one: a method return or an error from the callee itself (busd passes one on only if it
    /// answers a call that waits on its sender), or busd's own errors in place of a reply:
    /// `NoReply` (the callee went) and `AccessDenied` (a second call with the same serial to the
    /// same callee). The bus's replies to calls to the bus itself hold no place and free none.
    pub fn answered(&mut self, reply: &Message) -> bool {
        let header = reply.header();
        let Some(serial) = header.reply_serial() else {
            return false;
        };
        let sender = header.sender().map(|s| s.as_str());
        let at = match sender {
            Some(BUS) | None => {
                let stands_in = header
                    .error_name()
                    .is_some_and(|e| BUS_ANSWERS.contains(&e.as_str()));
                if !stands_in {
                    return false;
                }
                self.calls.iter().position(|w| w.serial == serial)
            }
            Some(peer) => self
                .calls
                .iter()
                .position(|w| w.serial == serial && w.callee.as_str() == peer)
                .or_else(|| self.calls.iter().position(|w| w.serial == serial)),
        };
        match at {
            Some(at) => {
                self.calls.remove(at);
                if let Some(u) = &self.user {
                    u.give(1);
                }
                true
            }
            None => false,
        }
    }

    /// Takes away the calls whose deadline has passed at `now`, oldest first.
    pub fn expire(&mut self, now: Instant) -> Vec<Waiting> {
        let late = self.calls.iter().take_while(|w| w.deadline <= now).count();
        if let Some(u) = &self.user {
            u.give(late);
        }
        self.calls.drain(..late).collect()
    }

    /// When the oldest call's deadline passes, if a call waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.calls.front().map(|w| w.deadline)
    }

    /// How many calls wait.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether no call waits.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

/// The bus's name, the sender of what the bus itself says.
const BUS: &str = "org.freedesktop.DBus";

/// The errors busd sends in place of a callee's reply (busd's peers.rs: `NoReply` to the calls that
/// wait on a callee that goes, `AccessDenied` to a call whose serial a waiting call to the same
/// callee has). busd's own methods answer neither.
const BUS_ANSWERS: [&str; 2] = [
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.AccessDenied",
];

/// The bus's `LimitsExceeded` answer to `call`, from a connection of `uid` that has its most calls
/// waiting (`full` says which limit).
pub fn limits_exceeded(call: &Message, uid: u32, full: Full) -> zbus::Result<Message> {
    let text = match full {
        Full::Connection => format!(
            "uid {uid}: this connection already has {MAX_PENDING_REPLIES} method calls waiting for \
             their replies, the embedded bus's limit (as dbus-daemon's max_replies_per_connection); \
             wait for some of those replies before calling again"
        ),
        Full::User => format!(
            "uid {uid}: this user's connections already have {MAX_PENDING_REPLIES_PER_USER} method \
             calls waiting for their replies, the embedded bus's limit per user; wait for some of \
             those replies before calling again"
        ),
    };
    Message::error(&call.header(), LIMITS_EXCEEDED)
        .sender(BUS)
        .build(&text)
}

/// The bus's `NoReply` answer to the call with `serial` whose reply did not come within `timeout`.
pub fn no_reply(serial: NonZeroU32, callee: &str, timeout: Duration) -> zbus::Result<Message> {
    // zbus builds an error only as the answer to a call's header; the bus keeps only the serial of
    // a waiting call, which is all the error takes of it.
    let call = Message::method_call("/org/freedesktop/DBus", "Call")
        .serial(serial)
        .build(&())?;
    let text = format!(
        "{callee} did not reply within {} s; the embedded bus gave up on the reply (as dbus-daemon \
         at its reply_timeout)",
        timeout.as_secs()
    );
    Message::error(&call.header(), "org.freedesktop.DBus.Error.NoReply")
        .sender(BUS)
        .build(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serial(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    fn name(s: &str) -> OwnedUniqueName {
        OwnedUniqueName::try_from(s).unwrap()
    }

    fn reply(from: &str, to: u32) -> Message {
        let call = Message::method_call("/", "M")
            .serial(serial(to))
            .build(&())
            .unwrap();
        Message::method_return(&call.header())
            .sender(from)
            .build(&())
            .unwrap()
    }

    fn bus_error(error: &str, to: u32) -> Message {
        let call = Message::method_call("/", "M")
            .serial(serial(to))
            .build(&())
            .unwrap();
        Message::error(&call.header(), error)
            .sender(BUS)
            .build(&"x")
            .unwrap()
    }

    #[test]
    fn places_are_capped_and_come_back_with_the_replies() {
        let now = Instant::now();
        let mut p = PendingReplies::new(REPLY_TIMEOUT);
        for n in 1..=MAX_PENDING_REPLIES as u32 {
            p.admit(serial(n), name(":busd.2"), now).unwrap();
        }
        assert_eq!(
            p.admit(serial(999), name(":busd.2"), now),
            Err(Full::Connection)
        );
        // A reply to a call that holds no place frees none.
        assert!(!p.answered(&reply(":busd.2", 999)));
        assert!(p.answered(&reply(":busd.2", 7)));
        assert!(!p.answered(&reply(":busd.2", 7)));
        assert_eq!(p.len(), MAX_PENDING_REPLIES - 1);
        p.admit(serial(999), name(":busd.2"), now).unwrap();
    }

    #[test]
    fn the_bus_frees_a_place_only_with_the_errors_it_sends_in_place_of_a_reply() {
        let now = Instant::now();
        let mut p = PendingReplies::new(REPLY_TIMEOUT);
        p.admit(serial(5), name(":busd.2"), now).unwrap();
        // The bus's reply to a call of the bus with the same serial (a client may reuse one).
        assert!(!p.answered(&reply(BUS, 5)));
        assert!(!p.answered(&bus_error("org.freedesktop.DBus.Error.NameHasNoOwner", 5)));
        assert!(p.answered(&bus_error("org.freedesktop.DBus.Error.NoReply", 5)));
        assert!(p.is_empty());
    }

    #[test]
    fn a_reused_serial_is_matched_to_its_callee() {
        let now = Instant::now();
        let mut p = PendingReplies::new(REPLY_TIMEOUT);
        p.admit(serial(5), name(":busd.2"), now).unwrap();
        p.admit(serial(5), name(":busd.3"), now).unwrap();
        assert!(p.answered(&reply(":busd.3", 5)));
        assert_eq!(p.expire(now + REPLY_TIMEOUT)[0].callee, name(":busd.2"));
    }

    #[test]
    fn a_bus_started_with_another_reply_timeout_keeps_places_that_long() {
        let t0 = Instant::now();
        let short = Duration::from_secs(40);
        let mut p = PendingReplies::new(short);
        p.admit(serial(1), name(":busd.2"), t0).unwrap();
        assert_eq!(p.next_deadline(), Some(t0 + short));
        assert!(p.expire(t0 + short - Duration::from_millis(1)).is_empty());
        assert_eq!(p.expire(t0 + short).len(), 1);
        let e = no_reply(serial(1), ":busd.2", short).unwrap();
        let text: String = e.body().deserialize().unwrap();
        assert!(text.contains("within 40 s"), "{text}");
    }

    #[test]
    fn calls_expire_oldest_first_at_their_deadline() {
        let t0 = Instant::now();
        let mut p = PendingReplies::new(REPLY_TIMEOUT);
        p.admit(serial(1), name(":busd.2"), t0).unwrap();
        p.admit(serial(2), name(":busd.2"), t0 + Duration::from_secs(1))
            .unwrap();
        assert_eq!(p.next_deadline(), Some(t0 + REPLY_TIMEOUT));
        assert!(
            p.expire(t0 + REPLY_TIMEOUT - Duration::from_millis(1))
                .is_empty()
        );
        let late = p.expire(t0 + REPLY_TIMEOUT);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].serial, serial(1));
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn the_answers_name_the_limit_and_the_call() {
        let call = Message::method_call("/", "M")
            .serial(serial(9))
            .build(&())
            .unwrap();
        let e = limits_exceeded(&call, 65534, Full::Connection).unwrap();
        assert_eq!(e.header().reply_serial(), Some(serial(9)));
        let text: String = e.body().deserialize().unwrap();
        assert!(text.contains("128") && text.contains("uid 65534"), "{text}");
        let e = no_reply(serial(9), ":busd.4", REPLY_TIMEOUT).unwrap();
        assert_eq!(e.header().reply_serial(), Some(serial(9)));
    }

    #[test]
    fn the_connections_of_one_user_share_its_places_and_give_them_back() {
        let user = std::sync::Arc::new(UserReplies::default());
        let now = Instant::now();
        let mut conns: Vec<PendingReplies> = (0..3)
            .map(|_| PendingReplies::of_user(user.clone(), REPLY_TIMEOUT))
            .collect();
        let mut n = 0u32;
        'fill: for c in conns.iter_mut() {
            for _ in 0..MAX_PENDING_REPLIES {
                n += 1;
                match c.admit(serial(n), name(":busd.2"), now) {
                    Ok(()) => {}
                    Err(Full::User) => break 'fill,
                    Err(Full::Connection) => break,
                }
            }
        }
        assert_eq!(user.waiting(), MAX_PENDING_REPLIES_PER_USER);
        assert_eq!(
            conns[2].admit(serial(9999), name(":busd.2"), now),
            Err(Full::User),
            "a third connection of the user gets no more places"
        );
        // Expiry and a closed connection give places back.
        let expired = conns[0].expire(now + REPLY_TIMEOUT).len();
        assert_eq!(user.waiting(), MAX_PENDING_REPLIES_PER_USER - expired);
        conns.clear();
        assert_eq!(user.waiting(), 0);
    }
}
