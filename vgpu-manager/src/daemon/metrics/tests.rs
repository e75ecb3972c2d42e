//! The registry's snapshot cache and the exposition of a whole engine.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

#[test]
fn a_snapshot_is_rebuilt_only_when_its_key_changes() {
    let r = Registry::default();
    let builds = AtomicU32::new(0);
    let build = || {
        builds.fetch_add(1, Ordering::SeqCst);
        Snapshot::default()
    };
    r.snapshot((1, 1), Freshness::Current, build);
    r.snapshot((1, 1), Freshness::Current, build);
    r.snapshot((1, 1), Freshness::Throttled, build);
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    r.snapshot((2, 1), Freshness::Current, build);
    assert_eq!(builds.load(Ordering::SeqCst), 2);
}

#[test]
fn a_throttled_scrape_after_a_change_waits_for_a_few_build_times() {
    let r = Registry::default();
    let builds = AtomicU32::new(0);
    let slow = || {
        builds.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        Snapshot::default()
    };
    r.snapshot((1, 1), Freshness::Current, slow);
    // Changed at once: the 100 ms build is not repeated within 400 ms for a throttled scrape...
    r.snapshot((1, 2), Freshness::Throttled, slow);
    assert_eq!(builds.load(Ordering::SeqCst), 1);
    // ...but is for one that wants the current state.
    r.snapshot((1, 2), Freshness::Current, slow);
    assert_eq!(builds.load(Ordering::SeqCst), 2);
}
