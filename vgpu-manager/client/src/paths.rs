//! Object paths of the daemon's objects, both ways: a GPU id or instance UUID to its object path, and an
//! object path back to the id or UUID. The daemon names its objects with the first half, clients read
//! replies (`Create`, `Define`, the Gpu1 `Instances` property, signals) with the second; nothing else
//! takes paths apart.

use mdev_types::ids::MdevUuid;
use zbus::{ObjectPath, OwnedObjectPath};

use crate::MANAGER_PATH;

/// The path element below the manager under which instances live.
const INSTANCE_KIND: &str = "instance";
/// The path element below the manager under which GPUs live.
const GPU_KIND: &str = "gpu";

/// The object path of the instance with this UUID: `/org/vgpumanager/Manager1/instance/<uuid>` with the
/// hyphens as underscores (object path elements allow only `[A-Za-z0-9_]`). [`instance_uuid`] is the
/// inverse.
pub fn instance_path(uuid: &str) -> OwnedObjectPath {
    object_path(INSTANCE_KIND, &uuid.replace('-', "_"))
}

/// The UUID of the instance whose object path is `path` (see [`instance_path`]); `None` when `path` is
/// not an instance's path.
pub fn instance_uuid(path: &ObjectPath<'_>) -> Option<MdevUuid> {
    element(path, INSTANCE_KIND)?.replace('_', "-").parse().ok()
}

/// The object path of a GPU: `/org/vgpumanager/Manager1/gpu/<escaped id>`, where every byte of the id
/// outside `[A-Za-z0-9]` becomes `_xx` (its hex value), e.g. `0000:3b:00.0` → `0000_3a3b_3a00_2e0`.
/// This is the escaping systemd uses for unit object paths; it is unambiguous and reversible
/// ([`gpu_id`]).
pub fn gpu_path(id: &str) -> OwnedObjectPath {
    object_path(GPU_KIND, &escape_path_element(id))
}

/// The id of the GPU whose object path is `path` (see [`gpu_path`]); `None` when `path` is not a GPU's
/// path or its last element is not an escaping [`escape_path_element`] produces.
pub fn gpu_id(path: &ObjectPath<'_>) -> Option<String> {
    unescape_path_element(element(path, GPU_KIND)?)
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

/// The inverse of [`escape_path_element`].
fn unescape_path_element(e: &str) -> Option<String> {
    if e == "_" {
        return Some(String::new());
    }
    let mut bytes = Vec::with_capacity(e.len());
    let mut rest = e.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'_' {
            let hex = tail.get(..2)?;
            let hex = std::str::from_utf8(hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// `/org/vgpumanager/Manager1/<kind>/<element>`.
fn object_path(kind: &str, element: &str) -> OwnedObjectPath {
    let text = format!("{MANAGER_PATH}/{kind}/{element}");
    // Every element is escaped to [A-Za-z0-9_] and non-empty, so the path is always valid; the fallback
    // (the manager path) is unreachable but keeps this function total.
    OwnedObjectPath::try_from(text).unwrap_or_else(|_| manager_path())
}

/// The `<element>` of `/org/vgpumanager/Manager1/<kind>/<element>`.
fn element<'p>(path: &'p ObjectPath<'_>, kind: &str) -> Option<&'p str> {
    let e = path
        .as_str()
        .strip_prefix(MANAGER_PATH)?
        .strip_prefix('/')?
        .strip_prefix(kind)?
        .strip_prefix('/')?;
    (!e.is_empty() && !e.contains('/')).then_some(e)
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

    #[test]
    fn paths_turn_back_into_their_ids() {
        let uuid = "4b20d080-1b54-4048-85b3-a6a62d165c01";
        let back = instance_uuid(&instance_path(uuid)).map(|u| u.to_string());
        assert_eq!(back.as_deref(), Some(uuid));
        for id in ["0000:3b:00.0", "a_b", "a:b", "", "ünï"] {
            assert_eq!(gpu_id(&gpu_path(id)).as_deref(), Some(id), "{id}");
        }
        // Other objects' paths are not mistaken for these.
        let gpu = gpu_path("0000:3b:00.0");
        assert_eq!(instance_uuid(&gpu), None);
        assert_eq!(gpu_id(&instance_path(uuid)), None);
        assert_eq!(instance_uuid(&manager_path()), None);
        let nested = ObjectPath::try_from("/org/vgpumanager/Manager1/gpu/a/b").unwrap();
        assert_eq!(gpu_id(&nested), None);
        let truncated = ObjectPath::try_from("/org/vgpumanager/Manager1/gpu/0000_3").unwrap();
        assert_eq!(gpu_id(&truncated), None);
        let not_uuid = ObjectPath::try_from("/org/vgpumanager/Manager1/instance/abc").unwrap();
        assert_eq!(instance_uuid(&not_uuid), None);
    }
}
