//! Callers already identified, by unique bus name.
//!
//! A bus never reuses a unique name (`:1.42`) for another connection (D-Bus specification, "Message
//! Bus: Unique Connection Names"), and a connection's uid and pid do not change, so the answer of
//! `GetConnectionCredentials` for a name holds for the connection's whole life. Caching it saves a bus
//! round trip and a user-database lookup on every mutating call of a client that makes many (a
//! provisioning tool, the libvirt hook). Group membership is read once per connection, as the bus's
//! own policy does: a user added to the admin group reconnects, as the refusal message says.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::auth::Caller;

/// Names remembered at most; the oldest is forgotten first. Names of closed connections are never
/// asked about again, so a bound is all the cleanup needed.
const CAPACITY: usize = 512;

/// A bounded map from unique bus name to the identified caller.
#[derive(Debug, Default)]
pub(super) struct CallerCache {
    inner: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    by_name: HashMap<String, Caller>,
    order: VecDeque<String>,
}

impl CallerCache {
    /// The caller on `bus_name`, if identified before.
    pub(super) fn get(&self, bus_name: &str) -> Option<Caller> {
        self.lock().by_name.get(bus_name).cloned()
    }

    /// Remembers an identified caller.
    pub(super) fn put(&self, caller: Caller) {
        let mut e = self.lock();
        if e.by_name.contains_key(&caller.bus_name) {
            return;
        }
        while e.order.len() >= CAPACITY {
            if let Some(old) = e.order.pop_front() {
                e.by_name.remove(&old);
            }
        }
        e.order.push_back(caller.bus_name.clone());
        e.by_name.insert(caller.bus_name.clone(), caller);
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
    }
}
