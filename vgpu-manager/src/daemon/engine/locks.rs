//! Serialization: operations on one mdev parent run one at a time (so two creates can never both take
//! the last instance), while reconcile, which needs one consistent snapshot, excludes everything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One lock per parent plus a gate that reconcile holds exclusively.
#[derive(Debug, Default)]
pub(super) struct Locks {
    gate: RwLock<()>,
    parents: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

/// Held while one operation on one parent runs.
pub(super) struct ParentGuard<'a> {
    _gate: RwLockReadGuard<'a, ()>,
    _parent: MutexGuard<'a, ()>,
}

impl Locks {
    fn parent_lock(&self, parent: &str) -> Arc<Mutex<()>> {
        let mut map = self.parents.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(parent.to_string()).or_default().clone()
    }

    /// Runs `f` with `parent` locked (and reconcile kept out).
    pub(super) fn with_parent<T>(&self, parent: &str, f: impl FnOnce() -> T) -> T {
        let lock = self.parent_lock(parent);
        let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let _held = ParentGuard {
            _gate: gate,
            _parent: guard,
        };
        f()
    }

    /// Excludes every other operation.
    pub(super) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(PoisonError::into_inner)
    }
}
