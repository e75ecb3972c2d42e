//! A journal of the simulated kernel's state changes, so the simulated kernel outlives the daemon that
//! uses it, as a real kernel does: a `vgpud` killed with SIGKILL and started again finds the devices it
//! made. Every successful change is appended as one JSON line before the caller sees success; opening a
//! journal replays it. A torn last line (a writer killed mid-append) is a change that never completed.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One state change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(super) enum Entry {
    /// A successful sysfs write.
    Write {
        /// Kernel path.
        path: String,
        /// Value written.
        value: String,
    },
    /// A module loaded (`modprobe`).
    Load {
        /// Module (= class) name.
        module: String,
    },
    /// A module unloaded (`rmmod`).
    Unload {
        /// Module (= class) name.
        module: String,
    },
}

/// Reads every complete entry of the journal at `path` (none when it does not exist).
pub(super) fn read(path: &Path) -> io::Result<Vec<Entry>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        match serde_json::from_str(&line) {
            Ok(e) => out.push(e),
            // Only the last line can be torn; anything after it is ignored with it.
            Err(_) => break,
        }
    }
    Ok(out)
}

/// The UUID an mdev `create` entry creates, or the one a `remove` entry removes.
fn mdev_effect(entry: &Entry) -> Option<(&str, bool)> {
    let Entry::Write { path, value } = entry else {
        return None;
    };
    if path.ends_with("/create") && path.contains("/mdev_supported_types/") {
        return Some((value.trim(), true));
    }
    let uuid = path
        .strip_prefix("/sys/bus/mdev/devices/")?
        .strip_suffix("/remove")?;
    Some((uuid, false))
}

/// Drops the mdev history that no longer matters: every create and remove of a UUID except the last
/// create of a device that still exists (`alive`). Kept entries stay in their order, and dropping a
/// device's history only ever frees capacity for the entries after it, so the compacted journal
/// replays to the same state.
pub(super) fn compact(entries: Vec<Entry>, alive: &dyn Fn(&str) -> bool) -> Vec<Entry> {
    let mut last_create = std::collections::BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        if let Some((uuid, true)) = mdev_effect(e) {
            last_create.insert(uuid.to_string(), i);
        }
    }
    entries
        .into_iter()
        .enumerate()
        .filter(|(i, e)| match mdev_effect(e) {
            None => true,
            Some((uuid, true)) => alive(uuid) && last_create.get(uuid) == Some(i),
            Some((_, false)) => false,
        })
        .map(|(_, e)| e)
        .collect()
}

/// Replaces the journal with `entries` atomically (temp file, fsync, rename).
pub(super) fn rewrite(path: &Path, entries: &[Entry]) -> io::Result<()> {
    let tmp = path.with_extension("compacting");
    {
        let mut f = File::create(&tmp)?;
        for e in entries {
            append(&mut f, e)?;
        }
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Opens the journal for appending.
pub(super) fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Appends one entry in a single write(2), so concurrent readers never see half a line.
pub(super) fn append(file: &mut File, entry: &Entry) -> io::Result<()> {
    let mut line = serde_json::to_string(entry).map_err(io::Error::other)?;
    line.push('\n');
    file.write_all(line.as_bytes())
}
