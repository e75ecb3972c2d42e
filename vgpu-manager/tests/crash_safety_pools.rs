//! Crash safety of pool apply: the real `vgpud` on `--sim demo` with a journaled simulated kernel
//! (which outlives the daemon, as a real kernel would) applies pools with SR-IOV VF slots (NVIDIA
//! vendor-VFIO vGPUs on the L40S, xe VFs of the Flex 170) of random sizes and autostart settings, and
//! is killed by SIGKILL at a random moment of each apply, then restarted.
//!
//! After every restart:
//! * nothing in the state directory was torn: `corrupt/` stays empty (every applied-pool and VF-slot
//!   file is in its old or its new state);
//! * no VF is leaked: every VF the host has given to a guest (bound to vfio-pci, or with a vGPU type
//!   set) is held by a VF slot record, so vgpud can still give it back.
//!
//! At the end an apply that is not interrupted brings the pool in sync, with one record per VF slot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use dbus_common::crash;
use dbus_common::{Daemon, client};
use vgpu_client::{Manager1Proxy, PoolStatus};
use vgpu_sim::SimHost;

const L40S: &str = "0000:85:00.0";
const FLEX: &str = "0000:03:00.0";
const ROUNDS: usize = 12;

/// A pool of `n` 2 GiB desktops on the L40S and the Flex 170 only, so every slot is a VF slot.
fn pool_text(n: u64, autostart: bool) -> String {
    format!(
        "name = \"crash-floor\"\npolicy = \"consolidate\"\nautostart = {autostart}\n\n[profiles]\nvdi-2g = {n}\n\n[select]\ngpus = [\"{L40S}\", \"{FLEX}\"]\n"
    )
}

async fn start(dir: &Path, state: &Path, journal: &Path) -> (Daemon, Manager1Proxy<'static>) {
    let journal = journal.to_str().unwrap();
    let daemon = Daemon::embedded_with(dir, state, &["--sim-journal", journal]).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    (daemon, m)
}

/// The VFs the recorded VF slots hold (read while the daemon is stopped or idle).
fn recorded_vfs(state: &Path) -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir(state.join("vf-slots")) else {
        return BTreeSet::new();
    };
    dir.filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let t: toml::Table = toml::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            t["vf"].as_str().unwrap().to_string()
        })
        .collect()
}

/// The VFs the simulated host has given away: bound to vfio-pci, or with an NVIDIA vGPU type set.
fn taken_vfs(journal: &Path) -> BTreeSet<String> {
    let host = SimHost::builtin("demo").unwrap().replayed(journal).unwrap();
    let inv = vgpu_host::discover::discover(&host).unwrap();
    inv.pci_devices
        .iter()
        .filter(|d| d.physfn.is_some())
        .filter(|d| {
            d.driver.as_deref() == Some("vfio-pci")
                || d.nvidia_vf
                    .as_ref()
                    .is_some_and(|n| n.current_type.is_some())
        })
        .map(|d| d.address.to_string())
        .collect()
}

/// Waits until the daemon has finished the apply a kill interrupted: vgpud finishes it in the
/// background once it serves (its `applying/` record goes when the apply is done or given up), and
/// reading the records and the host meanwhile would see a VF taken after its record was read.
async fn wait_until_idle(state: &Path, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pending: Vec<_> = std::fs::read_dir(state.join("applying"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                    .collect()
            })
            .unwrap_or_default();
        if pending.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{when}: the interrupted apply is still not finished after 60 s: {pending:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn check(state: &Path, journal: &Path, when: &str) {
    let corrupt: Vec<_> = std::fs::read_dir(state.join("corrupt"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(corrupt.is_empty(), "{when}: files set aside: {corrupt:?}");
    let recorded = recorded_vfs(state);
    let taken = taken_vfs(journal);
    let leaked: Vec<&String> = taken.difference(&recorded).collect();
    assert!(
        leaked.is_empty(),
        "{when}: VFs given away that no slot record holds: {leaked:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_pool_apply_tears_no_file_and_leaks_no_vf() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = crash::seeded("pool crash test", "the sizes and delays");
    let state = tmp.path().join("state");
    let journal = tmp.path().join("kernel.journal");

    // One uninterrupted apply first, to learn how long one takes.
    let (daemon, m) = start(tmp.path(), &state, &journal).await;
    let began = Instant::now();
    m.apply(&pool_text(32, true)).await.unwrap();
    let full = began.elapsed().max(Duration::from_millis(50));
    drop(daemon);
    check(&state, &journal, "after the first apply");

    let mut kills_mid_apply = 0;
    let mut size = 32;
    for round in 1..=ROUNDS {
        let (daemon, m) = start(tmp.path(), &state, &journal).await;
        let when = format!("round {round}, after the restart");
        wait_until_idle(&state, &when).await;
        check(&state, &journal, &when);
        let n = 8 + rng.below(25);
        let autostart = rng.below(3) != 0;
        // Within about as long as the slots to make or remove take (a full apply makes 32).
        let steps = n.abs_diff(size).max(1);
        let span = full.as_micros() as u64 * steps / 32;
        let delay = Duration::from_micros(rng.below(span + 1));
        size = n;
        let text = pool_text(n, autostart);
        tokio::select! {
            _ = m.apply(&text) => {}
            () = tokio::time::sleep(delay) => kills_mid_apply += 1,
        }
        // SIGKILL, mid-apply or just after it.
        drop(daemon);
    }
    eprintln!("{ROUNDS} rounds, {kills_mid_apply} killed mid-apply (a full apply takes {full:?})");

    let (daemon, m) = start(tmp.path(), &state, &journal).await;
    wait_until_idle(&state, "after the last restart").await;
    check(&state, &journal, "after the last restart");
    m.apply(&pool_text(20, true)).await.unwrap();
    let st: Vec<PoolStatus> = serde_json::from_str(&m.pool_status().await.unwrap()).unwrap();
    assert_eq!(st.len(), 1, "{st:?}");
    assert!(st[0].in_sync, "{:?}", st[0]);
    let vfs: BTreeSet<String> = st[0].slots.iter().filter_map(|s| s.vf.clone()).collect();
    assert_eq!(vfs.len(), 20, "{:?}", st[0]);
    assert!(daemon.terminate().success());
    assert_eq!(recorded_vfs(&state), vfs);
    assert_eq!(taken_vfs(&journal), vfs);
}
