//! Callers already identified, by unique bus name.
//!
//! A bus never reuses a unique name (`:1.42`) for another connection (D-Bus specification, "Message
//! Bus: Unique Connection Names"), and a connection's uid and pid do not change, so the answer of
//! `GetConnectionCredentials` for a name holds for the connection's whole life. Caching it saves a bus
//! round trip and a user-database lookup on every mutating call of a client that makes many (a
//! provisioning tool, the libvirt hook). Group membership is read once per connection, as the bus's
//! own policy does: a user added to the admin group reconnects, as the refusal message says.
//!
//! The lookup is made once per connection even when many of its calls arrive together
//! ([`CallerCache::identify_once`]): the others wait for that one answer. Each answer of the bus may
//! carry a file descriptor (`ProcessFD`, a pidfd), so a lookup per pending call would hold one
//! descriptor per call.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

use super::auth::Caller;
use super::errors::ApiError;

/// Names remembered at most; the oldest is forgotten first. Names of closed connections are never
/// asked about again, so a bound is all the cleanup needed.
const CAPACITY: usize = 512;

/// A bounded map from unique bus name to the identified caller (or its lookup under way).
#[derive(Debug, Default)]
pub(super) struct CallerCache {
    inner: Mutex<Entries>,
}

/// A caller identified, or being identified, once.
type Slot = Arc<OnceCell<Caller>>;

#[derive(Debug, Default)]
struct Entries {
    by_name: HashMap<String, Slot>,
    order: VecDeque<String>,
}

impl CallerCache {
    /// The caller on `bus_name`, if identified before.
    #[cfg(test)]
    pub(super) fn get(&self, bus_name: &str) -> Option<Caller> {
        self.lock().by_name.get(bus_name)?.get().cloned()
    }

    /// Remembers an identified caller.
    #[cfg(test)]
    pub(super) fn put(&self, caller: Caller) {
        let slot = self.slot(&caller.bus_name);
        // Already identified: the first answer stands (it cannot differ).
        let _ = slot.set(caller);
    }

    /// The caller on `bus_name`: remembered, or identified by `identify`, which runs for one call at
    /// a time per name; concurrent calls of the same client wait for its answer. A failed lookup is
    /// not remembered (the next call tries again).
    pub(super) async fn identify_once<F, Fut>(
        &self,
        bus_name: &str,
        identify: F,
    ) -> Result<Caller, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Caller, ApiError>>,
    {
        let slot = self.slot(bus_name);
        slot.get_or_try_init(identify).await.cloned()
    }

    /// Forgets `bus_name` (its connection closed).
    pub(super) fn forget(&self, bus_name: &str) {
        let mut e = self.lock();
        if e.by_name.remove(bus_name).is_some() {
            e.order.retain(|n| n != bus_name);
        }
    }

    /// The slot of `bus_name`, made (and the oldest forgotten beyond the bound) if there is none.
    fn slot(&self, bus_name: &str) -> Slot {
        let mut e = self.lock();
        if let Some(s) = e.by_name.get(bus_name) {
            return Arc::clone(s);
        }
        while e.order.len() >= CAPACITY {
            if let Some(old) = e.order.pop_front() {
                e.by_name.remove(&old);
            }
        }
        let s = Slot::default();
        e.order.push_back(bus_name.to_string());
        e.by_name.insert(bus_name.to_string(), Arc::clone(&s));
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The map holds plain data: a panic elsewhere cannot leave it inconsistent.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(n: usize) -> Caller {
        Caller {
            bus_name: format!(":1.{n}"),
            uid: 1000,
            pid: Some(7),
            groups: vec![1000],
            user: None,
        }
    }

    #[test]
    fn remembers_callers_and_forgets_the_oldest_beyond_its_bound() {
        let cache = CallerCache::default();
        assert_eq!(cache.get(":1.0"), None);
        for n in 0..CAPACITY + 3 {
            cache.put(caller(n));
        }
        for n in 0..3 {
            assert_eq!(cache.get(&format!(":1.{n}")), None);
        }
        for n in 3..CAPACITY + 3 {
            assert_eq!(cache.get(&format!(":1.{n}")), Some(caller(n)));
        }
        // A second put of a known name changes nothing (and does not evict).
        cache.put(caller(3));
        assert_eq!(cache.get(":1.3"), Some(caller(3)));
        assert_eq!(cache.lock().order.len(), CAPACITY);
        cache.forget(":1.3");
        assert_eq!(cache.get(":1.3"), None);
        assert_eq!(cache.lock().order.len(), CAPACITY - 1);
    }

    #[tokio::test]
    async fn concurrent_calls_of_one_client_share_one_lookup() {
        let cache = CallerCache::default();
        let lookups = std::sync::atomic::AtomicUsize::new(0);
        let one = || async {
            cache
                .identify_once(":1.1", || async {
                    lookups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Ok(caller(1))
                })
                .await
        };
        let (a, b, c) = tokio::join!(one(), one(), one());
        assert_eq!(
            (a.unwrap(), b.unwrap(), c.unwrap().uid),
            (caller(1), caller(1), 1000)
        );
        assert_eq!(lookups.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A failed lookup is not remembered.
        let failed = cache
            .identify_once(":1.2", || async { Err(ApiError::internal("no")) })
            .await;
        assert!(failed.is_err());
        assert_eq!(cache.get(":1.2"), None);
    }
}
