//! The simulated sysfs tree: directories, attribute files with kernfs access modes, and symbolic links
//! stored the way kernfs stores them (relative to the link's directory).
//!
//! The tree is a rendering of the typed kernel state ([`super::model::Model`]); it never holds state of
//! its own. Each writable file carries the [`Attr`] that says which store handler a write reaches.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;

use super::attr::Attr;

/// Symbolic-link hops allowed during one resolution, like the VFS's `MAXSYMLINKS` (40).
const MAX_HOPS: usize = 40;

/// How a kernfs attribute may be opened. kernfs refuses `open(O_RDONLY)` of a file without read bits
/// and `open(O_WRONLY)` of a file without write bits with `EACCES`, even for root
/// (fs/kernfs/file.c `kernfs_fop_open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `0444`: `show` only.
    ReadOnly,
    /// `0200`: `store` only.
    WriteOnly,
    /// `0644`: `show` and `store`.
    ReadWrite,
}

impl Mode {
    /// The file can be read.
    pub(crate) fn readable(self) -> bool {
        !matches!(self, Mode::WriteOnly)
    }

    /// The file can be written.
    pub(crate) fn writable(self) -> bool {
        !matches!(self, Mode::ReadOnly)
    }

    /// The permission bits sysfs shows for this mode.
    pub(crate) fn bits(self) -> u32 {
        match self {
            Mode::ReadOnly => 0o444,
            Mode::WriteOnly => 0o200,
            Mode::ReadWrite => 0o644,
        }
    }
}

/// One attribute file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    /// Access mode.
    pub mode: Mode,
    /// What `show` prints (empty for write-only files).
    pub content: String,
    /// The store handler a write reaches (`None` for read-only files).
    pub attr: Option<Attr>,
}

/// A node of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// A directory (a kobject or an attribute group).
    Dir(BTreeMap<String, Node>),
    /// An attribute.
    File(File),
    /// A symbolic link; the target as stored (relative, like kernfs).
    Link(String),
}

/// The whole simulated tree, rooted at `/`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Vfs {
    root: BTreeMap<String, Node>,
}

/// Splits an absolute kernel path into its normal components.
fn components(path: &str) -> Vec<&str> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

/// The path of `target` relative to the directory `from_dir` (both absolute), as kernfs writes link
/// targets (fs/kernfs/symlink.c `kernfs_get_target_path`): up with `..` until reaching an ancestor of
/// the target's *parent*, then down to the target. So a link to an ancestor directory still names it
/// (`sriov_admin/pf/device -> ../../../0000:03:00.0`), never `../..`.
pub(crate) fn relative(from_dir: &str, target: &str) -> String {
    let from = components(from_dir);
    let to = components(target);
    let to_parent = &to[..to.len().saturating_sub(1)];
    let common = from
        .iter()
        .zip(to_parent)
        .take_while(|(a, b)| a == b)
        .count();
    let mut parts: Vec<&str> = vec![".."; from.len() - common];
    parts.extend(&to[common..]);
    parts.join("/")
}

/// The directory part of an absolute path (`/` for top-level entries).
pub(crate) fn dirname(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl Vfs {
    /// Creates the directory `path` and its missing ancestors.
    pub(crate) fn mkdir(&mut self, path: &str) {
        let mut dir = &mut self.root;
        for c in components(path) {
            let node = dir
                .entry(c.to_string())
                .or_insert_with(|| Node::Dir(BTreeMap::new()));
            if !matches!(node, Node::Dir(_)) {
                // Rendering bug, not outside data: a directory where a file or link was rendered.
                // Replace it so the tree stays well-formed; the renderer's tests catch the overlap.
                *node = Node::Dir(BTreeMap::new());
            }
            let Node::Dir(d) = node else { return };
            dir = d;
        }
    }

    /// Inserts `node` at `path`, creating ancestors.
    fn insert(&mut self, path: &str, node: Node) {
        let parent = dirname(path);
        self.mkdir(parent);
        let name = components(path).last().map(|s| s.to_string());
        let Some(name) = name else { return };
        let mut dir = &mut self.root;
        for c in components(parent) {
            dir = match dir.get_mut(c) {
                Some(Node::Dir(d)) => d,
                _ => return,
            };
        }
        dir.insert(name, node);
    }

    /// A read-only attribute (`0444`).
    pub(crate) fn ro(&mut self, path: &str, content: impl Into<String>) {
        self.insert(
            path,
            Node::File(File {
                mode: Mode::ReadOnly,
                content: content.into(),
                attr: None,
            }),
        );
    }

    /// A write-only attribute (`0200`) whose writes reach `attr`.
    pub(crate) fn wo(&mut self, path: &str, attr: Attr) {
        self.insert(
            path,
            Node::File(File {
                mode: Mode::WriteOnly,
                content: String::new(),
                attr: Some(attr),
            }),
        );
    }

    /// A read-write attribute (`0644`) showing `content` whose writes reach `attr`.
    pub(crate) fn rw(&mut self, path: &str, content: impl Into<String>, attr: Attr) {
        self.insert(
            path,
            Node::File(File {
                mode: Mode::ReadWrite,
                content: content.into(),
                attr: Some(attr),
            }),
        );
    }

    /// A symbolic link at `path` pointing to the absolute kernel path `target`, stored relative to the
    /// link's directory like kernfs does.
    pub(crate) fn link(&mut self, path: &str, target: &str) {
        let rel = relative(dirname(path), target);
        self.insert(path, Node::Link(rel));
    }

    /// The node at a canonical path (no links followed).
    fn lookup(&self, comps: &[String]) -> Option<&Node> {
        let (last, parents) = comps.split_last()?;
        let mut dir = &self.root;
        for c in parents {
            dir = match dir.get(c.as_str()) {
                Some(Node::Dir(d)) => d,
                _ => return None,
            };
        }
        dir.get(last.as_str())
    }

    /// The root directory's entries.
    pub(crate) fn root(&self) -> &BTreeMap<String, Node> {
        &self.root
    }

    /// Resolves `path` following every link (the last one too when `follow_last`), returning the
    /// canonical components. Errors are the VFS's: `ENOENT` for a missing component, `ENOTDIR` when a
    /// file is used as a directory, `ELOOP` after too many links.
    pub(crate) fn resolve(&self, path: &Path, follow_last: bool) -> Result<Vec<String>, Errno> {
        let mut todo: Vec<String> = Vec::new();
        push_components(&mut todo, path);
        let mut out: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(c) = todo.pop() {
            if c == ".." {
                out.pop();
                continue;
            }
            let is_last = todo.is_empty();
            out.push(c);
            match self.lookup(&out) {
                None => return Err(Errno::ENOENT),
                Some(Node::Link(target)) if !is_last || follow_last => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(Errno::ELOOP);
                    }
                    out.pop();
                    if target.starts_with('/') {
                        out.clear();
                    }
                    push_components(&mut todo, Path::new(target));
                }
                Some(Node::File(_)) if !is_last => return Err(Errno::ENOTDIR),
                Some(_) => {}
            }
        }
        Ok(out)
    }

    /// The node at `path` after resolving every link.
    pub(crate) fn node(&self, path: &Path) -> Result<(PathBuf, &Node), Errno> {
        let comps = self.resolve(path, true)?;
        let canonical = canonical_path(&comps);
        match self.lookup(&comps) {
            Some(n) => Ok((canonical, n)),
            // The root itself.
            None if comps.is_empty() => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// The entry names of the directory at `path`, sorted.
    pub(crate) fn list(&self, path: &Path) -> Result<Vec<String>, Errno> {
        let comps = self.resolve(path, true)?;
        if comps.is_empty() {
            return Ok(self.root.keys().cloned().collect());
        }
        match self.lookup(&comps) {
            Some(Node::Dir(d)) => Ok(d.keys().cloned().collect()),
            Some(_) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// The stored target of the link at `path` (`EINVAL` when it is not a link, like readlink(2)).
    pub(crate) fn read_link(&self, path: &Path) -> Result<String, Errno> {
        let comps = self.resolve(path, false)?;
        match self.lookup(&comps) {
            Some(Node::Link(t)) => Ok(t.clone()),
            Some(_) => Err(Errno::EINVAL),
            None if comps.is_empty() => Err(Errno::EINVAL),
            None => Err(Errno::ENOENT),
        }
    }

    /// The canonical form of `path`.
    pub(crate) fn canonicalize(&self, path: &Path) -> Result<PathBuf, Errno> {
        self.resolve(path, true).map(|c| canonical_path(&c))
    }
}

/// `/a/b/c` from `["a", "b", "c"]`.
fn canonical_path(comps: &[String]) -> PathBuf {
    let mut p = PathBuf::from("/");
    for c in comps {
        p.push(c);
    }
    p
}

/// Pushes the normal and `..` components of `p` onto `stack` so that popping yields them in order.
fn push_components(stack: &mut Vec<String>, p: &Path) {
    let parts: Vec<String> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".to_string()),
            _ => None,
        })
        .collect();
    stack.extend(parts.into_iter().rev());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_targets_match_kernfs() {
        assert_eq!(
            relative(
                "/sys/devices/pci0000:00/0000:00:02.0",
                "/sys/bus/pci/drivers/i915"
            ),
            "../../../bus/pci/drivers/i915"
        );
        assert_eq!(
            relative(
                "/sys/bus/pci/devices",
                "/sys/devices/pci0000:00/0000:00:02.0"
            ),
            "../../../devices/pci0000:00/0000:00:02.0"
        );
        assert_eq!(relative("/a/b", "/a/b/c"), "c");
        // A link to an ancestor goes above it and names it.
        assert_eq!(relative("/d/x/admin/pf", "/d/x"), "../../../x");
        assert_eq!(relative("/d/x", "/d/x"), "../x");
    }

    #[test]
    fn resolution_follows_links_and_reports_vfs_errnos() {
        let mut v = Vfs::default();
        v.ro("/sys/devices/x/vendor", "0x10de\n");
        v.link("/sys/bus/pci/devices/x", "/sys/devices/x");
        v.link("/loop/a", "/loop/b");
        v.link("/loop/b", "/loop/a");
        let (canon, node) = v.node(Path::new("/sys/bus/pci/devices/x/vendor")).unwrap();
        assert_eq!(canon, PathBuf::from("/sys/devices/x/vendor"));
        assert!(matches!(node, Node::File(f) if f.content == "0x10de\n"));
        assert_eq!(
            v.read_link(Path::new("/sys/bus/pci/devices/x")).unwrap(),
            "../../../devices/x"
        );
        assert_eq!(
            v.list(Path::new("/sys/bus/pci/devices/x")).unwrap(),
            vec!["vendor"]
        );
        assert_eq!(
            v.list(Path::new("/sys/devices/x/vendor")),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(
            v.node(Path::new("/sys/devices/x/vendor/y")).map(|_| ()),
            Err(Errno::ENOTDIR)
        );
        assert_eq!(
            v.node(Path::new("/sys/nope")).map(|_| ()),
            Err(Errno::ENOENT)
        );
        assert_eq!(
            v.read_link(Path::new("/sys/devices/x/vendor")),
            Err(Errno::EINVAL)
        );
        assert_eq!(v.canonicalize(Path::new("/loop/a")), Err(Errno::ELOOP));
    }
}
