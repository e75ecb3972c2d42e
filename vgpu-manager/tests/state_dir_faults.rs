//! A careless environment under the state directory while vgpud runs: the disk full (a small tmpfs
//! mounted for the test), the filesystem read-only (a read-only bind mount), a record file replaced by
//! a directory. Each request that needs a write is refused with an error naming the path and the fix,
//! nothing is half-written or lost, and once the disk is usable again the same request succeeds with
//! no restart.
//!
//! Runs the real vgpud on a fake sysfs root whose `create` attributes are FUSE files; needs root (for
//! the mounts), /dev/fuse and mount(8), and fails without them (or prints SKIPPED under
//! `VGPU_TESTS_ALLOW_SKIP=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dbus_common::mdevctl::{FakeKernel, FakeRoot};
use dbus_common::{Daemon, assert_refused, ok, ok_json, vgpuctl};

const GPU: &str = "0000:00:04.0";
const UUID: &str = "5e0c9a7d-8b3f-4e21-9d6a-7c1b2f3e4d01";
const UUID2: &str = "5e0c9a7d-8b3f-4e21-9d6a-7c1b2f3e4d02";

fn run(cmd: &str, args: &[&str]) {
    let o = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        o.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Unmounts what the test mounted, whatever happens.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The fake root with one GPU and its kernel, and the state directory `dir/state` created.
fn host(dir: &Path) -> (FakeRoot, PathBuf) {
    let fake = FakeRoot::new(&dir.join("root"));
    fake.parent(GPU, "mtty-2", 4, "vfio-pci", "Dual port serial", None);
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    (fake, state)
}

fn define(uuid: &str) -> Vec<&str> {
    vec!["define", "--type", "mtty-2", "--gpu", GPU, "--uuid", uuid]
}

/// Files in `dir` (recursively) whose names start with `.tmp.` (half-written records).
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(temp_files(&p));
        } else if e.file_name().to_string_lossy().starts_with(".tmp.") {
            out.push(p);
        }
    }
    out
}

fn listed(j: &serde_json::Value) -> Vec<String> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|i| i["uuid"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_with_the_fix_and_resumes_once_there_is_room() {
    if !dbus_common::fuse_attr::require_fuse("state_dir_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (fake, state) = host(dir.path());
    run(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=512k",
            "tmpfs",
            state.to_str().unwrap(),
        ],
    );
    let _m = Mounted(state.clone());
    let kernel = FakeKernel::start(&fake.root);
    let mut d = Daemon::on_sysfs_root(dir.path(), &fake.root).await.unwrap();
    // Fill the filesystem (dd stops at ENOSPC).
    let filler = state.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4096", "count=1024"])
        .arg(format!("of={}", filler.display()))
        .output()
        .unwrap();
    for args in [
        define(UUID),
        vec!["create", "--type", "mtty-2", "--gpu", GPU, "--uuid", UUID],
    ] {
        let o = vgpuctl(&d.bus, &args).await;
        assert_refused(
            &o,
            &["the disk is full", state.to_str().unwrap(), "free space"],
        );
    }
    d.assert_running("after a full disk");
    assert_eq!(
        temp_files(&state),
        Vec::<PathBuf>::new(),
        "no half-written record"
    );
    assert!(listed(&ok_json(&vgpuctl(&d.bus, &["list", "--json"]).await)).is_empty());
    assert!(
        !fake.root.join("sys/bus/mdev/devices").join(UUID).exists(),
        "no device made without its ledger entry"
    );
    // Room again: the same requests succeed, with no restart.
    std::fs::remove_file(&filler).unwrap();
    ok(&vgpuctl(&d.bus, &define(UUID)).await);
    ok(&vgpuctl(
        &d.bus,
        &["create", "--type", "mtty-2", "--gpu", GPU, "--uuid", UUID2],
    )
    .await);
    let l = listed(&ok_json(&vgpuctl(&d.bus, &["list", "--json"]).await));
    assert!(
        l.contains(&UUID.to_string()) && l.contains(&UUID2.to_string()),
        "{l:?}"
    );
    assert!(
        state
            .join("definitions")
            .join(format!("{UUID}.toml"))
            .is_file()
    );
    drop(d);
    drop(kernel);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_state_directory_refuses_with_the_fix_and_resumes_when_writable() {
    if !dbus_common::fuse_attr::require_fuse("state_dir_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (fake, state) = host(dir.path());
    let kernel = FakeKernel::start(&fake.root);
    let mut d = Daemon::on_sysfs_root(dir.path(), &fake.root).await.unwrap();
    ok(&vgpuctl(&d.bus, &define(UUID)).await);
    let s = state.to_str().unwrap();
    run("mount", &["--bind", s, s]);
    let _m = Mounted(state.clone());
    run("mount", &["-o", "remount,ro,bind", s]);
    let o = vgpuctl(&d.bus, &define(UUID2)).await;
    assert_refused(&o, &["read-only", s, "remount it read-write"]);
    let o = vgpuctl(&d.bus, &["undefine", UUID]).await;
    assert_refused(&o, &["read-only", &format!("{UUID}.toml")]);
    d.assert_running("on a read-only state directory");
    let etc_file = fake.config_base().join(GPU).join(UUID);
    assert!(
        etc_file.is_file(),
        "the /etc/mdevctl.d file of a definition kept is kept"
    );
    // Nothing lost: the definition is still listed and still on disk.
    assert_eq!(
        listed(&ok_json(&vgpuctl(&d.bus, &["list", "--json"]).await)),
        [UUID]
    );
    run("mount", &["-o", "remount,rw,bind", s]);
    ok(&vgpuctl(&d.bus, &define(UUID2)).await);
    ok(&vgpuctl(&d.bus, &["undefine", UUID]).await);
    assert_eq!(
        listed(&ok_json(&vgpuctl(&d.bus, &["list", "--json"]).await)),
        [UUID2]
    );
    assert!(
        !state
            .join("definitions")
            .join(format!("{UUID}.toml"))
            .exists()
    );
    drop(d);
    drop(kernel);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_replaced_by_a_directory_is_named_and_written_again_once_moved_away() {
    if !dbus_common::fuse_attr::require_fuse("state_dir_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (fake, state) = host(dir.path());
    let kernel = FakeKernel::start(&fake.root);
    let d = Daemon::on_sysfs_root(dir.path(), &fake.root).await.unwrap();
    ok(&vgpuctl(&d.bus, &define(UUID)).await);
    let record = state.join("definitions").join(format!("{UUID}.toml"));
    std::fs::remove_file(&record).unwrap();
    std::fs::create_dir(&record).unwrap();
    std::fs::write(record.join("something"), "x").unwrap();
    let o = vgpuctl(&d.bus, &["autostart", UUID]).await;
    assert_refused(
        &o,
        &[
            record.to_str().unwrap(),
            "is a directory",
            "move the directory away",
        ],
    );
    let o = vgpuctl(&d.bus, &["undefine", UUID]).await;
    assert_refused(&o, &[record.to_str().unwrap(), "is a directory"]);
    assert!(
        fake.config_base().join(GPU).join(UUID).is_file(),
        "the /etc/mdevctl.d file of a definition kept is kept"
    );
    // The definition is unchanged in memory.
    let i = ok_json(&vgpuctl(&d.bus, &["status", UUID, "--json"]).await);
    assert_eq!(i["autostart"], false, "{i}");
    assert_eq!(i["defined"], true, "{i}");
    // Moved away: the next change writes the record again.
    std::fs::rename(&record, dir.path().join("moved")).unwrap();
    ok(&vgpuctl(&d.bus, &["autostart", UUID]).await);
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(text.contains("autostart = true"), "{text}");
    drop(d);
    drop(kernel);
}
