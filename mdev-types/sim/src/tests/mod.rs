//! SimHost tests: kernel semantics and errnos, shipped hosts, descriptions, materialization.

use std::path::{Path, PathBuf};

use nix::errno::Errno;

use super::SimHost;
use vgpu_host::{Host, HostError};

/// `p` as a path.
pub(super) fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

/// The errno of a failed operation (panics in tests when it succeeded).
pub(super) fn errno<T: std::fmt::Debug>(r: Result<T, HostError>) -> Errno {
    r.expect_err("operation should fail").errno
}

/// Reads and trims.
pub(super) fn rd(h: &SimHost, path: &str) -> String {
    h.read(Path::new(path))
        .unwrap_or_else(|e| panic!("{e}"))
        .trim_end()
        .to_string()
}

#[test]
fn builtins_load() {
    for name in SimHost::builtin_names() {
        let h = SimHost::builtin(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h.describe(), format!("simulated host '{name}'"));
        assert!(h.exists(&p("/sys/bus/pci/devices")));
    }
}

/// Writes, panicking with the error when it fails.
pub(super) fn wr(h: &SimHost, path: &str, value: &str) {
    h.write(Path::new(path), value)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The errno of a write.
pub(super) fn wr_err(h: &SimHost, path: &str, value: &str) -> Errno {
    errno(h.write(Path::new(path), value))
}

/// The last component of a link's target.
pub(super) fn link_name(h: &SimHost, path: &str) -> Option<String> {
    use vgpu_host::HostExt;
    h.link_name(Path::new(path))
        .unwrap_or_else(|e| panic!("{e}"))
}

mod access_tests;
mod guest_tests;
mod journal_tests;
mod materialize_tests;
mod mdev_tests;
mod nvidia_tests;
mod nvidia_vf_mdev_tests;
mod pci_tests;
mod spec_tests;
mod sriov_tests;
mod stale_tree_tests;
mod vendor_ext_tests;
mod xe_tests;
