//! The client side of vgpud's D-Bus API: bus selection, typed proxies and wire types, so that clients
//! (`vgpuctl`, tests, orchestration tools) need not know the daemon's internals.
//!
//! The API: `/org/vgpumanager/Manager1` serves `org.vgpumanager.Manager1` and the standard ObjectManager;
//! one object per GPU (`org.vgpumanager.Gpu1`) and per instance (`org.vgpumanager.Instance1`) lives below
//! it (see [`gpu_path`], [`instance_path`]). `data/org.vgpumanager.Manager1.xml` is the introspection.

mod bus;
mod error;
mod handoff;
pub mod pools;
pub mod proxy;
pub mod wire;

pub use bus::{BusAddress, connect, connect_daemon, runtime};
pub use error::ClientError;
pub use handoff::open_device;
pub use pools::{PoolGpu, PoolStatus, PoolSummary, SchedulingView, SlotRow};
pub use proxy::{Gpu1Proxy, Instance1Proxy, Manager1Proxy};
pub use wire::{GpuInfo, InstanceInfo, TypeSlot};

use zbus::OwnedObjectPath;

/// The daemon's well-known bus name.
pub const SERVICE: &str = "org.vgpumanager.Manager1";
/// The path of the manager object (and of the ObjectManager for all objects below it).
pub const MANAGER_PATH: &str = "/org/vgpumanager/Manager1";
/// The manager interface.
pub const MANAGER_INTERFACE: &str = "org.vgpumanager.Manager1";
/// The per-GPU interface.
pub const GPU_INTERFACE: &str = "org.vgpumanager.Gpu1";
/// The per-instance interface.
pub const INSTANCE_INTERFACE: &str = "org.vgpumanager.Instance1";
/// Prefix of the daemon's D-Bus error names: `org.vgpumanager.Error.<Kind>`.
pub const ERROR_PREFIX: &str = "org.vgpumanager.Error";
/// The Unix group whose members may call mutating methods (besides root).
pub const ADMIN_GROUP: &str = "vgpu-admin";
/// The polkit action checked for mutating calls where polkit runs.
pub const POLKIT_ACTION: &str = "org.vgpumanager.manage";

/// Target kinds accepted by `Create`/`Define`.
pub const TARGET_PROFILE: &str = "profile";
/// See [`TARGET_PROFILE`].
pub const TARGET_TYPE: &str = "type";

/// The object path of the instance with this UUID: `/org/vgpumanager/Manager1/instance/<uuid>` with the
/// hyphens as underscores (object path elements allow only `[A-Za-z0-9_]`).
pub fn instance_path(uuid: &str) -> OwnedObjectPath {
    object_path("instance", &uuid.replace('-', "_"))
}

/// The object path of a GPU: `/org/vgpumanager/Manager1/gpu/<escaped id>`, where every byte of the id
/// outside `[A-Za-z0-9]` becomes `_xx` (its hex value), e.g. `0000:3b:00.0` → `0000_3a3b_3a00_2e0`.
/// This is the escaping systemd uses for unit object paths; it is unambiguous and reversible.
pub fn gpu_path(id: &str) -> OwnedObjectPath {
    object_path("gpu", &escape_path_element(id))
}

fn object_path(kind: &str, element: &str) -> OwnedObjectPath {
    let text = format!("{MANAGER_PATH}/{kind}/{element}");
    // Every element is escaped to [A-Za-z0-9_] and non-empty, so the path is always valid; the fallback
    // (the manager path) is unreachable but keeps this function total.
    OwnedObjectPath::try_from(text).unwrap_or_else(|_| manager_path())
}

/// The manager's object path as a typed path.
pub fn manager_path() -> OwnedObjectPath {
    OwnedObjectPath::try_from(MANAGER_PATH).unwrap_or_default()
}

/// Escapes `s` into one object path element (see [`gpu_path`]); the empty string becomes `_`.
pub fn escape_path_element(s: &str) -> String {
    if s.is_empty() {
        return "_".into();
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_paths_are_escaped_and_distinct() {
        assert_eq!(
            gpu_path("0000:3b:00.0").as_str(),
            "/org/vgpumanager/Manager1/gpu/0000_3a3b_3a00_2e0"
        );
        // Ids that a naive ':'/'.' → '_' mapping would merge stay distinct.
        assert_ne!(gpu_path("a_b"), gpu_path("a:b"));
        assert_eq!(gpu_path("").as_str(), "/org/vgpumanager/Manager1/gpu/_");
    }

    #[test]
    fn instance_paths_use_underscores() {
        assert_eq!(
            instance_path("4b20d080-1b54-4048-85b3-a6a62d165c01").as_str(),
            "/org/vgpumanager/Manager1/instance/4b20d080_1b54_4048_85b3_a6a62d165c01"
        );
    }
}
