//! The reaper of incoming migration targets and a target being made: on a host whose mdev creates
//! take longer than the reaper's period, the record written before the create must survive it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;

use std::sync::Arc;
use std::time::Duration;

use core_common::{SlowWrites, source_fingerprint};
use vgpu_host::Host;
use vgpu_manager::daemon::api::{CompleteIncoming, PrepareIncoming};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

#[test]
fn a_target_whose_create_outlasts_a_reaper_round_is_still_incoming() {
    let sim = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    // Every create takes longer than a reaper round (the reaper looks every second).
    let slow = SlowWrites {
        sim,
        file: "create",
        before: Duration::from_millis(2500),
        after: Duration::ZERO,
    };
    let core = Core::open(
        Arc::new(slow) as Arc<dyn Host>,
        dir.path(),
        Catalog::builtin().unwrap(),
    )
    .unwrap();
    let made = core
        .execute(PrepareIncoming {
            fingerprint: source_fingerprint(),
            gpu: None,
            uuid: None,
            timeout: Duration::from_secs(600),
            numa_node: None,
        })
        .unwrap();
    // A reaper round after the create, too.
    std::thread::sleep(Duration::from_millis(1500));
    core.execute(CompleteIncoming { uuid: made.uuid })
        .expect("the target is still an incoming migration target");
}
