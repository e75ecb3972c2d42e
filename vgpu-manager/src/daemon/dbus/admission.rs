//! How much of the daemon one client may occupy, and what happens to the calls of a client that
//! has gone.
//!
//! Every client reaches vgpud over one bus connection, so the bus alone does not keep one client
//! from queueing so much work that everyone else waits behind it (dbus-daemon bounds pending replies
//! per connection with `max_replies_per_connection`, dbus-daemon(1); an embedded bus may not). So
//! vgpud gives each **share** at most [`MAX_PENDING`] calls pending at a time, and refuses more with
//! `org.vgpumanager.Error.LimitsExceeded`, which names the limit; of the admitted calls at most
//! [`MAX_RUNNING`] of a share occupy a worker thread at once, so a flooding share holds few of the
//! workers and another client's call waits behind a bounded amount of work.
//!
//! A share is one **user** for every uid but root's and vgpud's own: all connections of that user
//! together, since a bus lets one user open many (dbus-daemon's `max_connections_per_user`, 256 on a
//! system bus), and per-connection limits would multiply by that. Root and vgpud's own user (the
//! operator, libvirt, the hook) have a share per connection, and [`RESERVED_WORKERS`] workers that
//! only they may take, so unprivileged floods never queue the operator's calls behind them.
//!
//! A call that has not started when its client disconnects (the bus's `NameOwnerChanged` with no new
//! owner) is dropped, never executed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use super::errors::ApiError;

/// Calls one share (a user, or a privileged connection) may have pending (admitted and not yet
/// answered).
pub const MAX_PENDING: usize = 64;
/// Admitted calls of one share that run on a worker thread at once; the others wait, costing no
/// thread and no file descriptor.
pub const MAX_RUNNING: usize = 2;

/// Calls of all clients together that run on a worker thread at once: what holds the blocking pool
/// (and the CPU) is bounded, so the threads that read the bus connection keep up however many
/// clients flood, and the calls of different clients take turns (first come, first served).
pub const MAX_WORKERS: usize = 4;

/// Workers beyond [`MAX_WORKERS`] that only calls of root and of vgpud's own user may take.
pub const RESERVED_WORKERS: usize = 2;

/// Who a call is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Principal {
    /// Root or vgpud's own user: a share per connection, and the reserved workers.
    Privileged,
    /// Any other user: one share for all its connections.
    User(u32),
    /// A caller the bus could not identify (a peer-to-peer connection): a share per connection.
    Unknown,
}

impl Principal {
    /// The principal of a caller with user `uid`.
    pub(super) fn of_uid(uid: u32) -> Principal {
        if super::auth::is_privileged_uid(uid) {
            Principal::Privileged
        } else {
            Principal::User(uid)
        }
    }
}

/// What a share is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ShareKey {
    Connection(String),
    User(u32),
}

/// The admission state of every client and share with calls pending.
#[derive(Debug)]
pub(super) struct Admission {
    state: Mutex<State>,
    workers: Semaphore,
    reserved: Semaphore,
}

#[derive(Debug, Default)]
struct State {
    clients: HashMap<String, Arc<Client>>,
    shares: HashMap<ShareKey, Arc<Share>>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            state: Mutex::default(),
            workers: Semaphore::new(MAX_WORKERS),
            reserved: Semaphore::new(RESERVED_WORKERS),
        }
    }
}

/// One client connection with calls pending.
#[derive(Debug)]
pub(super) struct Client {
    name: String,
    pending: AtomicUsize,
    gone: AtomicBool,
    gone_notify: Notify,
}

/// What calls of one share hold together.
#[derive(Debug)]
struct Share {
    key: ShareKey,
    privileged: bool,
    pending: AtomicUsize,
    running: Semaphore,
}

/// An admitted call; dropping it (the call answered) frees its place.
#[derive(Debug)]
pub(super) struct Ticket {
    admission: Arc<Admission>,
    client: Arc<Client>,
    share: Arc<Share>,
}

/// The places of a running call (see [`Ticket::running`]).
#[derive(Debug)]
pub(super) struct Running<'a> {
    _own: SemaphorePermit<'a>,
    _worker: SemaphorePermit<'a>,
}

/// See [`Ticket::gone_flag`].
#[derive(Debug)]
pub(super) struct GoneFlag(Arc<Client>);

impl GoneFlag {
    /// Whether the client has disconnected.
    pub(super) fn is_gone(&self) -> bool {
        self.0.gone.load(Ordering::SeqCst)
    }
}

/// Why an admitted call did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Gone;

impl Admission {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counters: a panic elsewhere cannot leave them inconsistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one call of `sender` (its unique bus name; `None` for a peer-to-peer caller) counted
    /// against `principal`, or refuses it when that share already has [`MAX_PENDING`] calls pending.
    pub(super) fn admit(
        self: &Arc<Self>,
        sender: Option<&str>,
        principal: Principal,
        method: &str,
    ) -> Result<Ticket, ApiError> {
        let name = sender.unwrap_or("");
        let key = match principal {
            Principal::User(uid) => ShareKey::User(uid),
            Principal::Privileged | Principal::Unknown => ShareKey::Connection(name.to_string()),
        };
        let mut state = self.lock();
        let share = state
            .shares
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Share {
                    key,
                    privileged: principal == Principal::Privileged,
                    pending: 0.into(),
                    running: Semaphore::new(MAX_RUNNING),
                })
            })
            .clone();
        let pending = share.pending.load(Ordering::Relaxed);
        if pending >= MAX_PENDING {
            return Err(limits_exceeded(name, &share.key, method));
        }
        share.pending.store(pending + 1, Ordering::Relaxed);
        let client = state
            .clients
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Client {
                    name: name.to_string(),
                    pending: 0.into(),
                    gone: AtomicBool::new(false),
                    gone_notify: Notify::new(),
                })
            })
            .clone();
        client.pending.fetch_add(1, Ordering::Relaxed);
        drop(state);
        Ok(Ticket {
            admission: Arc::clone(self),
            client,
            share,
        })
    }

    /// Marks `name` as disconnected: its admitted calls that have not started are dropped.
    pub(super) fn disconnected(&self, name: &str) {
        if let Some(c) = self.lock().clients.get(name) {
            c.gone.store(true, Ordering::SeqCst);
            c.gone_notify.notify_waiters();
        }
    }

    /// Clients and shares with calls pending (for tests).
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let s = self.lock();
        (s.clients.len(), s.shares.len())
    }
}

impl Ticket {
    /// Waits for one of the share's [`MAX_RUNNING`] places on the workers, then for one of the
    /// [`MAX_WORKERS`] of all clients (or, for a privileged share, one of the
    /// [`RESERVED_WORKERS`], whichever comes first); `Err(Gone)` once the client has disconnected
    /// (then the call must not run).
    pub(super) async fn running(&self) -> Result<Running<'_>, Gone> {
        let own = self.until_gone(self.share.running.acquire()).await?;
        let admission = &self.admission;
        let worker = if self.share.privileged {
            self.until_gone(async {
                tokio::select! {
                    p = admission.workers.acquire() => p,
                    p = admission.reserved.acquire() => p,
                }
            })
            .await?
        } else {
            self.until_gone(admission.workers.acquire()).await?
        };
        Ok(Running {
            _own: own,
            _worker: worker,
        })
    }

    /// The permit `acquire` gives, unless the client disconnects first (or had already).
    async fn until_gone<'a>(
        &self,
        acquire: impl Future<Output = Result<SemaphorePermit<'a>, tokio::sync::AcquireError>>,
    ) -> Result<SemaphorePermit<'a>, Gone> {
        let c = &self.client;
        let gone = c.gone_notify.notified();
        tokio::pin!(gone);
        // Registered before the check, so a disconnection in between is not missed.
        gone.as_mut().enable();
        if c.gone.load(Ordering::SeqCst) {
            return Err(Gone);
        }
        tokio::select! {
            permit = acquire => match permit {
                Ok(p) if !c.gone.load(Ordering::SeqCst) => Ok(p),
                _ => Err(Gone),
            },
            () = &mut gone => Err(Gone),
        }
    }

    /// Whether the client has disconnected.
    #[cfg(test)]
    pub(super) fn is_gone(&self) -> bool {
        self.client.gone.load(Ordering::SeqCst)
    }

    /// A flag to check on another thread whether the client has disconnected.
    pub(super) fn gone_flag(&self) -> GoneFlag {
        GoneFlag(Arc::clone(&self.client))
    }

    /// The client's unique bus name.
    pub(super) fn client(&self) -> &str {
        &self.client.name
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        let left = self.share.pending.load(Ordering::Relaxed).saturating_sub(1);
        self.share.pending.store(left, Ordering::Relaxed);
        if left == 0
            && state
                .shares
                .get(&self.share.key)
                .is_some_and(|s| Arc::ptr_eq(s, &self.share))
        {
            state.shares.remove(&self.share.key);
        }
        let left = self
            .client
            .pending
            .load(Ordering::Relaxed)
            .saturating_sub(1);
        self.client.pending.store(left, Ordering::Relaxed);
        if left == 0
            && state
                .clients
                .get(&self.client.name)
                .is_some_and(|c| Arc::ptr_eq(c, &self.client))
        {
            state.clients.remove(&self.client.name);
        }
    }
}

/// The refusal of a call over its share's limit (`Error.LimitsExceeded`, as dbus-daemon names its
/// own limits).
fn limits_exceeded(name: &str, key: &ShareKey, method: &str) -> ApiError {
    let whose = match key {
        ShareKey::User(uid) => format!(
            "uid {uid} (client {name}) already has {MAX_PENDING} calls pending at vgpud (the limit per user, all its connections together)"
        ),
        ShareKey::Connection(_) => format!(
            "client {name} already has {MAX_PENDING} calls pending at vgpud (the limit per connection)"
        ),
    };
    ApiError::new(
        "LimitsExceeded",
        format!("{method} refused: {whose}; wait for their replies before sending more"),
    )
}

/// The answer to a call whose client disconnected before it ran (nobody receives it).
pub(super) fn gone_error(ticket: &Ticket, method: &str) -> ApiError {
    ApiError::new(
        "Disconnected",
        format!(
            "{method} of client {} dropped: the client disconnected before it ran",
            ticket.client()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_its_limit_and_a_named_refusal_beyond() {
        let a = Arc::new(Admission::default());
        let tickets: Vec<Ticket> = (0..MAX_PENDING)
            .map(|_| {
                a.admit(Some(":1.5"), Principal::Privileged, "ListGpus")
                    .unwrap()
            })
            .collect();
        let e = a
            .admit(Some(":1.5"), Principal::Privileged, "ListGpus")
            .unwrap_err();
        assert_eq!(e.error_name(), "org.vgpumanager.Error.LimitsExceeded");
        assert!(e.message().contains(":1.5"), "{}", e.message());
        assert!(e.message().contains("64"), "{}", e.message());
        // Another client is not affected.
        let other = a
            .admit(Some(":1.6"), Principal::Privileged, "Ping")
            .unwrap();
        drop(tickets);
        assert!(
            a.admit(Some(":1.5"), Principal::Privileged, "ListGpus")
                .is_ok()
        );
        drop(other);
        assert_eq!(a.held(), (0, 0), "answered clients are forgotten");
    }

    #[tokio::test]
    async fn calls_of_a_client_that_has_gone_do_not_run() {
        let a = Arc::new(Admission::default());
        let t: Vec<Ticket> = (0..MAX_RUNNING + 1)
            .map(|_| {
                a.admit(Some(":1.7"), Principal::User(1000), "ListGpus")
                    .unwrap()
            })
            .collect();
        let held: Vec<_> = {
            let mut v = Vec::new();
            for x in &t[..MAX_RUNNING] {
                v.push(x.running().await.unwrap());
            }
            v
        };
        let waiting = &t[MAX_RUNNING];
        let (r, ()) = tokio::join!(waiting.running(), async {
            tokio::task::yield_now().await;
            a.disconnected(":1.7");
        });
        assert_eq!(r.unwrap_err(), Gone);
        assert!(waiting.is_gone());
        drop(held);
        assert_eq!(t[0].running().await.unwrap_err(), Gone);
    }

    #[test]
    fn the_connections_of_one_user_share_its_limit() {
        let a = Arc::new(Admission::default());
        let user = Principal::User(65534);
        let tickets: Vec<Ticket> = (0..MAX_PENDING)
            .map(|i| a.admit(Some(&format!(":1.{i}")), user, "Plan").unwrap())
            .collect();
        // A new connection of the same user gets no more room.
        let e = a.admit(Some(":1.999"), user, "Plan").unwrap_err();
        assert_eq!(e.error_name(), "org.vgpumanager.Error.LimitsExceeded");
        assert!(e.message().contains("uid 65534"), "{}", e.message());
        assert!(e.message().contains("per user"), "{}", e.message());
        // Another user, and a privileged connection, are not affected.
        let other = a
            .admit(Some(":1.1000"), Principal::User(1000), "Plan")
            .unwrap();
        let root = a
            .admit(Some(":1.1001"), Principal::Privileged, "Plan")
            .unwrap();
        drop((tickets, other, root));
        assert_eq!(a.held(), (0, 0));
    }

    #[tokio::test]
    async fn a_user_runs_at_most_its_share_and_root_gets_the_reserved_workers() {
        let a = Arc::new(Admission::default());
        // Users fill every shared worker (MAX_RUNNING each).
        let users: Vec<Ticket> = (0..MAX_WORKERS)
            .map(|i| {
                let uid = 1000 + u32::try_from(i / MAX_RUNNING).unwrap();
                a.admit(Some(&format!(":1.{i}")), Principal::User(uid), "Plan")
                    .unwrap()
            })
            .collect();
        let mut held = Vec::new();
        for t in &users {
            held.push(t.running().await.unwrap());
        }
        // One more call of the first user waits for its own share, not a worker.
        let more = a
            .admit(Some(":1.50"), Principal::User(1000), "Plan")
            .unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), more.running());
        assert!(waiting.await.is_err(), "a user ran past its share");
        // Root is not queued behind them.
        let roots: Vec<Ticket> = (0..RESERVED_WORKERS)
            .map(|i| {
                a.admit(
                    Some(&format!(":1.{}", 100 + i)),
                    Principal::Privileged,
                    "ListGpus",
                )
                .unwrap()
            })
            .collect();
        for t in &roots {
            let r = tokio::time::timeout(std::time::Duration::from_secs(5), t.running()).await;
            assert!(matches!(r, Ok(Ok(_))), "root waited behind users' calls");
        }
    }
}
