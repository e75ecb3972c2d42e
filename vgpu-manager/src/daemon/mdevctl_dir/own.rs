//! vgpud's own changes to the definition directory, announced before they are made, so that the
//! watcher ([`super::watch`]) can tell the inotify(7) events they cause from changes others make.
//!
//! Without this, every file vgpud writes or removes sends the watcher back to re-read the whole
//! directory — every definition file of every parent — after the burst: a pool apply of 48 slots
//! was followed by a read of all 49 files, under the store's lock.
//!
//! The rule that keeps a change of someone else from being taken for one of vgpud's: an expected
//! event is counted once for each change announced, and each event matching one uses it up. An
//! announced change that will cause no event (its system call failed, or its file was already gone)
//! is withdrawn; so is every announcement the watcher cannot vouch for once it re-reads the
//! directory anyway ([`OwnChanges::forget_all`]: a parent's directory it was not watching yet
//! causes no events). A change of someone else that coincides with one of vgpud's on the same name
//! causes one event more than was announced, and that one sends the watcher to read the directory.
//! Announcements count only while a watcher runs (after its watches are in place).

use std::collections::HashMap;
use std::sync::Mutex;

/// Of one file of the directory, a change vgpud makes and the event it causes there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OwnChange {
    /// A new version renamed into place from vgpud's temporary file (`IN_MOVED_TO`).
    Placed,
    /// The file unlinked (`IN_DELETE`).
    Removed,
}

/// More announcements than this pending means events are not being read (a watcher stuck or
/// gone): they are all dropped, and the events that do come are taken for someone else's.
const MAX_PENDING: usize = 1 << 16;

/// The changes vgpud announced and the watcher has not seen yet. Shared by every clone of one
/// [`super::MdevctlDir`].
#[derive(Debug, Default)]
pub struct OwnChanges {
    inner: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    /// Whether a watcher reads the events (announcements are not kept otherwise).
    watching: bool,
    /// Announced events not yet seen: (parent, file name, change) → how many.
    expected: HashMap<(String, String, OwnChange), u32>,
}

impl OwnChanges {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A panic elsewhere while holding it leaves only counts, which stay usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// vgpud is about to make `change` to `parent/name`.
    pub fn expect(&self, parent: &str, name: &str, change: OwnChange) {
        let mut p = self.pending();
        if !p.watching {
            return;
        }
        if p.expected.len() >= MAX_PENDING {
            p.expected.clear();
        }
        *p.expected
            .entry((parent.to_string(), name.to_string(), change))
            .or_default() += 1;
    }

    /// `change` to `parent/name` was announced but will cause no event (it failed, or found
    /// nothing to remove).
    pub fn withdraw(&self, parent: &str, name: &str, change: OwnChange) {
        use_up(&mut self.pending().expected, parent, name, change);
    }

    /// The watcher saw `change` of `parent/name`: whether it was one vgpud announced (which it
    /// then uses up).
    pub fn take(&self, parent: &str, name: &str, change: OwnChange) -> bool {
        use_up(&mut self.pending().expected, parent, name, change)
    }

    /// A watcher has its watches in place: announcements count from now on.
    pub fn start_watching(&self) {
        let mut p = self.pending();
        p.watching = true;
        p.expected.clear();
    }

    /// The watcher stopped: nothing is kept any more.
    pub fn stop_watching(&self) {
        let mut p = self.pending();
        p.watching = false;
        p.expected.clear();
    }

    /// The watcher reads the whole directory now: every announcement made so far is dropped (a
    /// change in a directory that was not watched yet causes no event, and must not stay expected).
    pub fn forget_all(&self) {
        self.pending().expected.clear();
    }

    /// How many announced events are pending (for tests).
    #[cfg(test)]
    pub(crate) fn pending_count(&self) -> u32 {
        self.pending().expected.values().sum()
    }
}

/// Uses up one expected `change` of `parent/name`; whether there was one.
fn use_up(
    expected: &mut HashMap<(String, String, OwnChange), u32>,
    parent: &str,
    name: &str,
    change: OwnChange,
) -> bool {
    let key = (parent.to_string(), name.to_string(), change);
    let Some(n) = expected.get_mut(&key) else {
        return false;
    };
    *n -= 1;
    if *n == 0 {
        expected.remove(&key);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "0000:01:00.0";
    const U: &str = "6c1a2f0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn nothing_is_kept_until_a_watcher_runs() {
        let own = OwnChanges::default();
        own.expect(P, U, OwnChange::Placed);
        assert!(!own.take(P, U, OwnChange::Placed));
        own.start_watching();
        own.expect(P, U, OwnChange::Placed);
        assert!(own.take(P, U, OwnChange::Placed));
        own.stop_watching();
        own.expect(P, U, OwnChange::Placed);
        assert_eq!(own.pending_count(), 0);
    }

    #[test]
    fn each_announcement_matches_one_event_of_its_kind() {
        let own = OwnChanges::default();
        own.start_watching();
        own.expect(P, U, OwnChange::Placed);
        own.expect(P, U, OwnChange::Placed);
        // Another kind, name or parent is not what was announced.
        assert!(!own.take(P, U, OwnChange::Removed));
        assert!(!own.take("other", U, OwnChange::Placed));
        assert!(!own.take(P, "other", OwnChange::Placed));
        assert!(own.take(P, U, OwnChange::Placed));
        assert!(own.take(P, U, OwnChange::Placed));
        // A third event on the name is someone else's.
        assert!(!own.take(P, U, OwnChange::Placed));
    }

    #[test]
    fn a_withdrawn_or_forgotten_announcement_matches_nothing() {
        let own = OwnChanges::default();
        own.start_watching();
        own.expect(P, U, OwnChange::Removed);
        own.withdraw(P, U, OwnChange::Removed);
        assert!(!own.take(P, U, OwnChange::Removed));
        // Withdrawing what was never announced changes nothing.
        own.withdraw(P, U, OwnChange::Removed);
        own.expect(P, U, OwnChange::Removed);
        own.expect(P, U, OwnChange::Placed);
        own.forget_all();
        assert_eq!(own.pending_count(), 0);
        assert!(!own.take(P, U, OwnChange::Removed));
    }
}
