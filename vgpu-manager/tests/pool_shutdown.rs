//! SIGTERM while vgpud applies a pool: the apply stops at a step boundary, vgpud exits 0, and the next
//! start finishes the apply, with nothing leaked: every mdev on the (journaled, simulated) kernel is a
//! slot of the pool, every ledger entry and /etc/mdevctl.d file belongs to an instance that exists, and
//! every VF given away is held by a VF slot record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use dbus_common::{Daemon, client};
use futures_util::StreamExt;
use nix::sys::signal::{Signal, kill};
use vgpu_client::{Manager1Proxy, PoolStatus};
use vgpu_sim::SimHost;

const SLOTS: usize = 30;

fn pool_text() -> String {
    format!(
        "name = \"shutdown-floor\"\npolicy = \"consolidate\"\nautostart = true\n\n[profiles]\nvdi-2g = {SLOTS}\n\n[select]\nvendors = [\"nvidia\"]\n"
    )
}

async fn start(dir: &Path) -> Daemon {
    let bus = format!("unix:path={}", dir.join("bus.sock").display());
    let (journal, state, etc) = (
        dir.join("kernel.journal"),
        dir.join("state"),
        dir.join("mdevctl.d"),
    );
    let args: Vec<&OsStr> = vec![
        OsStr::new("--listen"),
        OsStr::new(&bus),
        OsStr::new("--sim"),
        OsStr::new("demo"),
        OsStr::new("--sim-journal"),
        journal.as_os_str(),
        OsStr::new("--state-dir"),
        state.as_os_str(),
        OsStr::new("--mdevctl-dir"),
        etc.as_os_str(),
        OsStr::new("--pools-dir"),
        dir.join("pools.d").into_os_string().leak(),
    ];
    Daemon::try_start(&args, &bus, dir)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// What the simulated kernel holds now: its mdev UUIDs and the VFs it gave away.
fn kernel(journal: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let host = SimHost::builtin("demo").unwrap().replayed(journal).unwrap();
    let inv = vgpu_host::discover::discover(&host).unwrap();
    let mdevs = inv
        .mdev_instances
        .iter()
        .map(|m| m.uuid.to_string())
        .collect();
    let vfs = inv
        .pci_devices
        .iter()
        .filter(|d| d.physfn.is_some())
        .filter(|d| {
            d.driver.as_deref() == Some("vfio-pci")
                || d.nvidia_vf
                    .as_ref()
                    .is_some_and(|n| n.current_type.is_some())
        })
        .map(|d| d.address.to_string())
        .collect();
    (mdevs, vfs)
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_pool_apply_stops_at_a_step_and_the_next_start_finishes_it() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("pools.d")).unwrap();
    let state = tmp.path().join("state");
    let d = start(tmp.path()).await;
    let conn = client(&d.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    let mut progress = m.receive_pool_progress().await.unwrap();
    let apply = {
        let m = m.clone();
        tokio::spawn(async move { m.apply(&pool_text()).await })
    };
    // SIGTERM once the first step is done.
    let first = tokio::time::timeout(Duration::from_secs(60), progress.next())
        .await
        .expect("a PoolProgress signal")
        .unwrap();
    let args = first.args().unwrap();
    assert_eq!(*args.done(), 1);
    let total = *args.total();
    kill(d.pid(), Signal::SIGTERM).unwrap();
    let status = d.wait();
    assert!(
        status.success(),
        "vgpud exits cleanly on SIGTERM: {status:?}"
    );
    // The caller is told (or loses the connection as vgpud goes): the apply did not complete.
    let answer = apply.await.unwrap();
    if let Ok(json) = &answer {
        panic!("the apply completed despite SIGTERM after step 1 of {total}: {json}");
    }
    let log = std::fs::read_to_string(tmp.path().join("vgpud-0.log")).unwrap();
    assert!(
        log.contains("the pool apply stops here"),
        "stopped at a step boundary:\n{log}"
    );
    assert_eq!(
        names(&state.join("applying")),
        BTreeSet::from(["shutdown-floor.toml".to_string()]),
        "the stopped apply is recorded"
    );
    let (made, _) = kernel(&tmp.path().join("kernel.journal"));
    assert!(
        !made.is_empty() && made.len() < SLOTS,
        "stopped part-way: {} of {SLOTS} slots made",
        made.len()
    );

    // The next start finishes it.
    let d = start(tmp.path()).await;
    let conn = client(&d.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status: Vec<PoolStatus> =
            serde_json::from_str(&m.pool_status().await.unwrap()).unwrap();
        if status
            .iter()
            .any(|p| p.pool == "shutdown-floor" && p.in_sync)
            && names(&state.join("applying")).is_empty()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stopped apply was never finished:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(d.log().contains("is finished"), "{}", d.log());
    drop(d);

    // Nothing leaked.
    let (mut mdevs, vfs) = kernel(&tmp.path().join("kernel.journal"));
    // The demo host's own (foreign) devices are not the pool's.
    let before = vgpu_host::discover::discover(&SimHost::builtin("demo").unwrap()).unwrap();
    for m in &before.mdev_instances {
        mdevs.remove(&m.uuid.to_string());
    }
    let status_slots: BTreeSet<String> = {
        let d = start(tmp.path()).await;
        let conn = client(&d.bus).await;
        let m = Manager1Proxy::new(&conn).await.unwrap();
        let status: Vec<PoolStatus> =
            serde_json::from_str(&m.pool_status().await.unwrap()).unwrap();
        status[0].slots.iter().map(|s| s.uuid.clone()).collect()
    };
    assert_eq!(status_slots.len(), SLOTS);
    let vf_slots: BTreeSet<String> = names(&state.join("vf-slots"))
        .into_iter()
        .filter_map(|n| n.strip_suffix(".toml").map(str::to_string))
        .collect();
    let slot_mdevs: BTreeSet<String> = status_slots.difference(&vf_slots).cloned().collect();
    assert_eq!(
        mdevs, slot_mdevs,
        "every mdev is a slot of the pool, and every mdev slot exists"
    );
    assert_eq!(
        vfs.len(),
        vf_slots.len(),
        "every VF given away is held by a slot record"
    );
    let ledger: BTreeSet<String> = names(&state.join("ledger"))
        .into_iter()
        .filter_map(|n| n.strip_suffix(".toml").map(str::to_string))
        .filter(|n| !n.starts_with("batch-"))
        .collect();
    assert!(
        ledger.is_subset(&mdevs),
        "ledger entries without a device: {:?}",
        ledger.difference(&mdevs).collect::<Vec<_>>()
    );
    let mut etc = BTreeSet::new();
    for p in names(&tmp.path().join("mdevctl.d")) {
        etc.extend(names(&tmp.path().join("mdevctl.d").join(p)));
    }
    assert_eq!(etc, slot_mdevs, "one /etc/mdevctl.d file per mdev slot");
}
