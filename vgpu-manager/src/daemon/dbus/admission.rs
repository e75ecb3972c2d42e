//! How much of the daemon one client may occupy, and what happens to the calls of a client that
//! has gone.
//!
//! Every client reaches vgpud over one bus connection, so the bus alone does not keep one client
//! from queueing so much work that everyone else waits behind it (dbus-daemon bounds pending replies
//! per connection with `max_replies_per_connection`, dbus-daemon(1); an embedded bus may not). Per
//! client (per unique bus name) vgpud therefore admits at most [`MAX_PENDING`] calls at a time, and
//! refuses more with `org.vgpumanager.Error.LimitsExceeded`, which names the limit; of the admitted
//! calls at most [`MAX_RUNNING`] occupy a worker thread at once, so a flooding client holds few of
//! the workers and another client's call waits behind a bounded amount of work. A call that has not
//! started when its client disconnects (the bus's `NameOwnerChanged` with no new owner) is dropped,
//! never executed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use super::errors::ApiError;

/// Calls one client may have pending (admitted and not yet answered).
pub const MAX_PENDING: usize = 64;
/// Admitted calls of one client that run on a worker thread at once; the others wait, costing no
/// thread and no file descriptor.
pub const MAX_RUNNING: usize = 2;

/// Calls of all clients together that run on a worker thread at once: what holds the blocking pool
/// (and the CPU) is bounded, so the threads that read the bus connection keep up however many
/// clients flood, and the calls of different clients take turns (first come, first served).
pub const MAX_WORKERS: usize = 4;

/// The admission state of every client with calls pending.
#[derive(Debug)]
pub(super) struct Admission {
    clients: Mutex<HashMap<String, Arc<Client>>>,
    workers: Semaphore,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            clients: Mutex::default(),
            workers: Semaphore::new(MAX_WORKERS),
        }
    }
}

/// One client with calls pending.
#[derive(Debug)]
pub(super) struct Client {
    name: String,
    pending: std::sync::atomic::AtomicUsize,
    gone: AtomicBool,
    gone_notify: Notify,
    running: Semaphore,
}

/// An admitted call; dropping it (the call answered) frees its place.
#[derive(Debug)]
pub(super) struct Ticket {
    admission: Arc<Admission>,
    client: Arc<Client>,
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
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Client>>> {
        // Plain counters: a panic elsewhere cannot leave them inconsistent.
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one call of `sender` (its unique bus name; `None` for a peer-to-peer caller), or refuses
    /// it when that client already has [`MAX_PENDING`] calls pending.
    pub(super) fn admit(
        self: &Arc<Self>,
        sender: Option<&str>,
        method: &str,
    ) -> Result<Ticket, ApiError> {
        let name = sender.unwrap_or("");
        let mut clients = self.lock();
        let client = clients
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(Client {
                    name: name.to_string(),
                    pending: 0.into(),
                    gone: AtomicBool::new(false),
                    gone_notify: Notify::new(),
                    running: Semaphore::new(MAX_RUNNING),
                })
            })
            .clone();
        let pending = client.pending.load(Ordering::Relaxed);
        if pending >= MAX_PENDING {
            return Err(limits_exceeded(name, method));
        }
        client.pending.store(pending + 1, Ordering::Relaxed);
        drop(clients);
        Ok(Ticket {
            admission: Arc::clone(self),
            client,
        })
    }

    /// Marks `name` as disconnected: its admitted calls that have not started are dropped.
    pub(super) fn disconnected(&self, name: &str) {
        if let Some(c) = self.lock().get(name) {
            c.gone.store(true, Ordering::SeqCst);
            c.gone_notify.notify_waiters();
        }
    }

    /// Clients with calls pending (for tests and logs).
    #[cfg(test)]
    fn clients(&self) -> usize {
        self.lock().len()
    }
}

impl Ticket {
    /// Waits for one of the client's [`MAX_RUNNING`] places on the workers, then for one of the
    /// [`MAX_WORKERS`] of all clients; `Err(Gone)` once the client has disconnected (then the call
    /// must not run).
    pub(super) async fn running(&self) -> Result<Running<'_>, Gone> {
        let own = self.own_place().await?;
        let c = &self.client;
        let gone = c.gone_notify.notified();
        tokio::pin!(gone);
        gone.as_mut().enable();
        if c.gone.load(Ordering::SeqCst) {
            return Err(Gone);
        }
        tokio::select! {
            permit = self.admission.workers.acquire() => match permit {
                Ok(p) if !c.gone.load(Ordering::SeqCst) => Ok(Running { _own: own, _worker: p }),
                _ => Err(Gone),
            },
            () = &mut gone => Err(Gone),
        }
    }

    async fn own_place(&self) -> Result<SemaphorePermit<'_>, Gone> {
        let c = &self.client;
        let gone = c.gone_notify.notified();
        tokio::pin!(gone);
        // Registered before the check, so a disconnection in between is not missed.
        gone.as_mut().enable();
        if c.gone.load(Ordering::SeqCst) {
            return Err(Gone);
        }
        tokio::select! {
            permit = c.running.acquire() => match permit {
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
        let mut clients = self.admission.lock();
        let left = self
            .client
            .pending
            .load(Ordering::Relaxed)
            .saturating_sub(1);
        self.client.pending.store(left, Ordering::Relaxed);
        if left == 0
            && clients
                .get(&self.client.name)
                .is_some_and(|c| Arc::ptr_eq(c, &self.client))
        {
            clients.remove(&self.client.name);
        }
    }
}

/// The refusal of a call over the per-client limit (`Error.LimitsExceeded`, as dbus-daemon names its
/// own limits).
fn limits_exceeded(name: &str, method: &str) -> ApiError {
    ApiError::new(
        "LimitsExceeded",
        format!(
            "{method} refused: client {name} already has {MAX_PENDING} calls pending at vgpud (the limit per connection); wait for their replies before sending more"
        ),
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
            .map(|_| a.admit(Some(":1.5"), "ListGpus").unwrap())
            .collect();
        let e = a.admit(Some(":1.5"), "ListGpus").unwrap_err();
        assert_eq!(e.error_name(), "org.vgpumanager.Error.LimitsExceeded");
        assert!(e.message().contains(":1.5"), "{}", e.message());
        assert!(e.message().contains("64"), "{}", e.message());
        // Another client is not affected.
        let other = a.admit(Some(":1.6"), "Ping").unwrap();
        drop(tickets);
        assert!(a.admit(Some(":1.5"), "ListGpus").is_ok());
        drop(other);
        assert_eq!(a.clients(), 0, "answered clients are forgotten");
    }

    #[tokio::test]
    async fn calls_of_a_client_that_has_gone_do_not_run() {
        let a = Arc::new(Admission::default());
        let t: Vec<Ticket> = (0..MAX_RUNNING + 1)
            .map(|_| a.admit(Some(":1.7"), "ListGpus").unwrap())
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
}
