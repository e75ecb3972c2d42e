//! The engine's events to its subscribers, counted: a subscriber that counts what it has handled
//! can tell, without asking anyone, whether it has caught up with every event sent before a given
//! moment (the D-Bus mirror answers a change only once its objects and signals show it).

use std::sync::Mutex;

use tokio::sync::broadcast;

use super::lock;
use crate::daemon::api::Event;

/// How many events a slow subscriber may fall behind before it loses the oldest ones.
const CAPACITY: usize = 4096;

/// The engine's event channel and the number of events sent on it.
#[derive(Debug)]
pub(crate) struct EventBus {
    tx: broadcast::Sender<Event>,
    /// Events sent so far; held while sending, so a subscriber's starting count is exact.
    sent: Mutex<u64>,
}

impl EventBus {
    /// A channel no one listens to yet.
    pub(crate) fn new() -> EventBus {
        EventBus {
            tx: broadcast::channel(CAPACITY).0,
            sent: Mutex::new(0),
        }
    }

    /// Sends `ev` to every subscriber (none is fine: nobody listens yet) and counts it.
    pub(crate) fn send(&self, ev: Event) {
        let mut sent = lock(&self.sent);
        let _ = self.tx.send(ev);
        *sent += 1;
    }

    /// A receiver of every event sent from now on, and the count of those sent before it: the
    /// receiver's n-th event is the `(count + n)`-th sent.
    pub(crate) fn subscribe(&self) -> (broadcast::Receiver<Event>, u64) {
        let sent = lock(&self.sent);
        (self.tx.subscribe(), *sent)
    }

    /// How many events have been sent so far.
    pub(crate) fn sent(&self) -> u64 {
        *lock(&self.sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscriber_learns_where_its_events_start() {
        let bus = EventBus::new();
        let uuid = "6d0c5a4e-7b1f-4c1e-9a55-766770757465".parse().unwrap();
        bus.send(Event::InstanceRemoved(uuid));
        assert_eq!(bus.sent(), 1);
        let (mut rx, base) = bus.subscribe();
        assert_eq!(base, 1);
        bus.send(Event::InstanceRemoved(uuid));
        bus.send(Event::InstanceRemoved(uuid));
        assert_eq!(bus.sent(), 3);
        // Exactly the events after the subscription: base + received = sent.
        let mut received = 0;
        while rx.try_recv().is_ok() {
            received += 1;
        }
        assert_eq!(base + received, bus.sent());
    }
}
