//! The watcher on a real directory: vgpud's own writes and removals send it to read nothing;
//! anyone else's change, a change of someone else on the same name as one of vgpud's, and a new
//! parent's directory send it to read the directory.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::super::tests::{def, uuid};
use super::*;
use crate::daemon::store::Definition;

const P: &str = "0000:00:03.0";

/// Long enough for a burst's events to be read and its quiet spell to pass.
const SETTLE: Duration = Duration::from_millis(5 * DEBOUNCE.as_millis() as u64);

/// A watcher of `root/mdevctl.d` (with `P`'s directory made first) and how often it asked for a
/// read of the directory.
fn watched(root: &Path) -> (MdevctlDir, Arc<AtomicUsize>) {
    let dir = MdevctlDir::new(root.join("mdevctl.d"));
    fs::create_dir_all(dir.path().join(P)).unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&reads);
    watch(&dir, move || {
        counted.fetch_add(1, Ordering::SeqCst);
        true
    })
    .unwrap();
    (dir, reads)
}

/// Waits until `reads` is past `before` (failing after 10 s); returns its value.
fn read_again(reads: &AtomicUsize, before: usize, what: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = reads.load(Ordering::SeqCst);
        if n > before {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the directory was not read again"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn vgpuds_own_writes_and_removals_send_it_to_read_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, reads) = watched(tmp.path());
    let defs: Vec<Definition> = (1..=8).map(|n| def(n, true)).collect();
    dir.write(&defs[0]).unwrap();
    assert!(dir.write_all(&defs[1..]).is_empty());
    let mut modified = defs[0].clone();
    modified.autostart = false;
    dir.write(&modified).unwrap();
    assert!(dir.remove(P, &uuid(1)).unwrap());
    // Nothing there: no event, nothing left expected.
    assert!(!dir.remove(P, &uuid(99)).unwrap());
    let all: Vec<(MdevUuid, String)> = (2..=9).map(|n| (uuid(n), P.to_string())).collect();
    assert_eq!(dir.remove_all(&all).unwrap().len(), 7);
    std::thread::sleep(SETTLE);
    assert_eq!(reads.load(Ordering::SeqCst), 0, "own changes made it read");
    assert_eq!(
        dir.own_changes().pending_count(),
        0,
        "every event was used up"
    );

    // Someone else's file, and then an edit of a file of vgpud's: each is read.
    fs::write(dir.file(P, &uuid(20)), "{}").unwrap();
    let n = read_again(&reads, 0, "a file written by someone else");
    dir.write(&defs[2]).unwrap();
    std::thread::sleep(SETTLE);
    assert_eq!(reads.load(Ordering::SeqCst), n);
    fs::write(dir.file(P, &uuid(3)), "{\"mdev_type\": \"x\"}").unwrap();
    read_again(&reads, n, "an edit of one of vgpud's files");
}

#[test]
fn a_change_of_someone_else_on_the_name_vgpud_writes_is_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, reads) = watched(tmp.path());
    // Another writer renames its version into place right after vgpud's: two events on the name,
    // one of them announced.
    let theirs = dir.path().join(P).join(".theirs");
    fs::write(&theirs, "{}").unwrap();
    std::thread::sleep(SETTLE);
    let n = reads.load(Ordering::SeqCst);
    dir.write(&def(1, true)).unwrap();
    fs::rename(&theirs, dir.file(P, &uuid(1))).unwrap();
    read_again(&reads, n, "a rename onto vgpud's file");
    // And a removal of someone else after vgpud's own write.
    std::thread::sleep(SETTLE);
    let n = reads.load(Ordering::SeqCst);
    dir.write(&def(2, true)).unwrap();
    fs::remove_file(dir.file(P, &uuid(2))).unwrap();
    read_again(&reads, n, "a removal of vgpud's file by someone else");
}

#[test]
fn a_new_parents_directory_is_read_and_then_watched() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, reads) = watched(tmp.path());
    let mut other = def(1, true);
    other.parent = "0000:00:04.0".into();
    other.gpu = other.parent.clone();
    dir.write(&other).unwrap();
    let n = read_again(&reads, 0, "a parent's directory made by vgpud's write");
    // Now watched: vgpud's next write there is its own, and someone else's is read.
    other.uuid = uuid(2);
    dir.write(&other).unwrap();
    std::thread::sleep(SETTLE);
    assert_eq!(reads.load(Ordering::SeqCst), n);
    fs::write(dir.file(&other.parent, &uuid(3)), "{}").unwrap();
    read_again(
        &reads,
        n,
        "a file of someone else in the new parent's directory",
    );
}
