//! Writes a rendered simulated tree to a real directory (files with sysfs modes, directories, relative
//! symbolic links), so [`vgpu_host::SysfsHost`] rooted there reads what the simulated host shows.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use super::vfs::{Node, Vfs};

/// Writes `tree` below `dir` (created if missing). Existing entries with the same names are replaced.
pub(crate) fn materialize(tree: &Vfs, dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    write_dir(tree.root(), dir)
}

fn write_dir(entries: &BTreeMap<String, Node>, dir: &Path) -> io::Result<()> {
    for (name, node) in entries {
        let path = dir.join(name);
        match node {
            Node::Dir(children) => {
                fs::create_dir_all(&path)?;
                write_dir(children, &path)?;
            }
            Node::File(f) => {
                if fs::symlink_metadata(&path).is_ok() {
                    fs::remove_file(&path)?;
                }
                fs::write(&path, &f.content)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(f.mode.bits()))?;
            }
            Node::Link(target) => {
                if fs::symlink_metadata(&path).is_ok() {
                    fs::remove_file(&path)?;
                }
                symlink(target, &path)?;
            }
        }
    }
    Ok(())
}
