//! [`SysfsHost`]: the kernel's sysfs, below a root directory.

use std::fs;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use super::{Errno, Host, HostError, HostOp};

/// The real kernel interface: kernel paths mapped below `root` (`/` on a live host).
///
/// With another root, a fixture tree or a capture such as `tests/fixtures/h200-passthrough` is read
/// exactly like the kernel's sysfs; absolute symbolic links inside the tree are resolved below the root
/// too, so a capture never escapes into the machine's own `/sys`.
///
/// Captures that travelled through tools which drop symbolic links (archivers, git with
/// `core.symlinks=false`) hold each link as a small regular file whose text is the link target
/// (`../../../bus/pci/drivers/nvidia`). Such *link stubs* are followed like links: no real sysfs attribute
/// reads as a relative path starting with `../` or as an absolute `/sys/` path.
///
/// On the live host the kernel resolves paths itself: every operation is one system call on the path
/// as given. Below another root, paths are resolved here component by component (one `lstat`, and a
/// `readlink` for each link, per component), which a fixture tree needs and the live host does not.
#[derive(Debug, Clone)]
pub struct SysfsHost {
    root: PathBuf,
    /// The root is `/`: paths go to the kernel unchanged (no link stubs, no escape to guard against).
    live: bool,
}

impl SysfsHost {
    /// A host rooted at `root`. Fails with `ENOENT`/`ENOTDIR` when `root` is not a directory.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, HostError> {
        let root = root.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Self {
                live: root == Path::new("/"),
                root,
            }),
            Ok(_) => Err(HostError::new(HostOp::Read, root, Errno::ENOTDIR)),
            Err(e) => Err(HostError::new(HostOp::Read, root, errno_of(&e))),
        }
    }

    /// The live host (`/`).
    pub fn live() -> Self {
        Self {
            root: PathBuf::from("/"),
            live: true,
        }
    }

    /// The root directory kernel paths are mapped below.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Maps a kernel path below the root.
    fn real(&self, path: &Path) -> PathBuf {
        let rel = path.strip_prefix("/").unwrap_or(path);
        self.root.join(rel)
    }

    /// The file to operate on for the kernel path `path`: `path` itself on the live host, else its
    /// resolution below the root. Errors carry `op`.
    fn file(&self, path: &Path, op: HostOp) -> Result<PathBuf, HostError> {
        if self.live {
            return Ok(path.to_path_buf());
        }
        let resolved = self.resolve(path).map_err(|e| HostError { op, ..e })?;
        Ok(self.real(&resolved))
    }

    /// Resolves `path` component by component, following links inside the root (at most 40 hops, like
    /// the kernel's `ELOOP` limit). Returns the kernel path.
    fn resolve(&self, path: &Path) -> Result<PathBuf, HostError> {
        let mut hops = 0;
        let mut todo: Vec<PathBuf> = Vec::new();
        push_components(&mut todo, path);
        let mut out = PathBuf::from("/");
        while let Some(c) = todo.pop() {
            if c.as_os_str() == ".." {
                out.pop();
                continue;
            }
            let candidate = out.join(&c);
            let real = self.real(&candidate);
            match link_target(&real) {
                Ok(Some(target)) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(HostError::new(HostOp::Canonicalize, path, Errno::ELOOP));
                    }
                    if target.is_absolute() {
                        out = PathBuf::from("/");
                    }
                    push_components(&mut todo, &target);
                }
                Ok(None) => out = candidate,
                Err(e) => return Err(HostError::new(HostOp::Canonicalize, path, errno_of(&e))),
            }
        }
        Ok(out)
    }
}

/// Pushes the normal and `..` components of `p` onto `stack` so that popping yields them in order.
fn push_components(stack: &mut Vec<PathBuf>, p: &Path) {
    let parts: Vec<PathBuf> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    stack.extend(parts.into_iter().rev());
}

/// The target of a symbolic link or of a link stub (see [`SysfsHost`]); `None` for anything else.
fn link_target(real: &Path) -> std::io::Result<Option<PathBuf>> {
    let meta = fs::symlink_metadata(real)?;
    if meta.file_type().is_symlink() {
        return fs::read_link(real).map(Some);
    }
    if !meta.is_file() || meta.len() > 512 {
        return Ok(None);
    }
    let bytes = fs::read(real)?;
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return Ok(None);
    };
    let t = text.strip_suffix('\n').unwrap_or(text);
    let looks_like_link = (t.starts_with("../") || t.starts_with("/sys/"))
        && !t.chars().any(|c| c.is_whitespace() || c.is_control());
    Ok(looks_like_link.then(|| PathBuf::from(t)))
}

/// The bytes of the file `real` in as few system calls as a sysfs attribute allows: `open`, one
/// `read` and `close`. sysfs hands an attribute's whole text (at most a page, `show()` in the kernel's
/// Documentation/filesystems/sysfs.rst) to the first `read(2)`, so a read that leaves the buffer
/// short is the end; only a read that fills it is followed by more (binary attributes, and the
/// regular files of a fixture tree, are read to their end). `fs::read` would add an `fstat` for a
/// size hint and a second `read` that returns 0: on an emulated machine each is dearer than the
/// kernel's work.
fn read_attribute(real: &Path) -> std::io::Result<Vec<u8>> {
    /// One page and a byte: a whole attribute leaves the buffer short.
    const FIRST: usize = 4097;
    let mut f = fs::File::open(real)?;
    let mut buf = vec![0; FIRST];
    let n = loop {
        match f.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    buf.truncate(n);
    if n == FIRST {
        f.read_to_end(&mut buf)?;
    }
    Ok(buf)
}

/// A sysfs store is done in one `write(2)`: a count short of the value is an error, not a partial success.
fn whole_write(path: &Path, value: &str, written: usize) -> Result<(), HostError> {
    if written == value.len() {
        Ok(())
    } else {
        Err(HostError::write_cut_short(path, value, written))
    }
}

fn errno_of(e: &std::io::Error) -> Errno {
    e.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO)
}

impl Host for SysfsHost {
    fn read(&self, path: &Path) -> Result<String, HostError> {
        let real = self.file(path, HostOp::Read)?;
        let bytes =
            read_attribute(&real).map_err(|e| HostError::new(HostOp::Read, path, errno_of(&e)))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
        let real = self
            .file(path, HostOp::Write)
            .map_err(|e| HostError::write(path, value, e.errno))?;
        // sysfs attributes must be written without O_CREAT/O_TRUNC surprises and in a single write(2):
        // the kernel's store() sees exactly one buffer.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(&real)
            .map_err(|e| HostError::write(path, value, errno_of(&e)))?;
        let written = f
            .write(value.as_bytes())
            .map_err(|e| HostError::write(path, value, errno_of(&e)))?;
        whole_write(path, value, written)
    }

    fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
        let real = self.file(path, HostOp::List)?;
        let mut names = Vec::new();
        for entry in
            fs::read_dir(&real).map_err(|e| HostError::new(HostOp::List, path, errno_of(&e)))?
        {
            let entry = entry.map_err(|e| HostError::new(HostOp::List, path, errno_of(&e)))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
        if self.live {
            return fs::read_link(path)
                .map_err(|e| HostError::new(HostOp::ReadLink, path, errno_of(&e)));
        }
        let parent = path.parent().unwrap_or(Path::new("/"));
        let name = path
            .file_name()
            .ok_or_else(|| HostError::new(HostOp::ReadLink, path, Errno::EINVAL))?;
        let dir = self.resolve(parent).map_err(|e| HostError {
            op: HostOp::ReadLink,
            ..e
        })?;
        match link_target(&self.real(&dir.join(name))) {
            Ok(Some(target)) => Ok(target),
            Ok(None) => Err(HostError::new(HostOp::ReadLink, path, Errno::EINVAL)),
            Err(e) => Err(HostError::new(HostOp::ReadLink, path, errno_of(&e))),
        }
    }

    fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError> {
        if self.live {
            return fs::canonicalize(path)
                .map_err(|e| HostError::new(HostOp::Canonicalize, path, errno_of(&e)));
        }
        self.resolve(path)
    }

    fn exists(&self, path: &Path) -> bool {
        if self.live {
            // One stat(2), which follows links as the kernel resolves them.
            return fs::metadata(path).is_ok();
        }
        self.canonicalize(path).is_ok()
    }

    fn describe(&self) -> String {
        format!("sysfs at {}", self.root.display())
    }

    /// On the live host (root `/`), a thread reads the kernel's uevent socket; trees below another root
    /// are static captures and have no events.
    fn subscribe(&self) -> Option<std::sync::mpsc::Receiver<super::uevent::Uevent>> {
        if self.root != Path::new("/") {
            return None;
        }
        let mut socket = match super::uevent::UeventSocket::open() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the kernel uevent socket; changes made behind our back are noticed only on the next request");
                return None;
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("uevents".into())
            .spawn(move || {
                while let Ok(ev) = socket.next_event() {
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
            });
        match spawned {
            Ok(_) => Some(rx),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the uevent reader thread");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ShortWrite;
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn the_live_host_hands_paths_to_the_kernel() {
        let h = SysfsHost::live();
        let h2 = SysfsHost::new("/").unwrap();
        for h in [&h, &h2] {
            // /proc/self is a link the kernel resolves per process: only a kernel-side walk gets it
            // right, which is what the live host must do.
            let exe = h.read_link(Path::new("/proc/self/exe")).unwrap();
            assert_eq!(exe, std::env::current_exe().unwrap());
            assert_eq!(
                h.canonicalize(Path::new("/proc/self")).unwrap(),
                PathBuf::from(format!("/proc/{}", std::process::id()))
            );
            assert_eq!(
                h.read(Path::new("/proc/sys/kernel/ostype")).unwrap(),
                "Linux\n"
            );
            assert!(h.exists(Path::new("/proc/self/status")));
            assert!(!h.exists(Path::new("/proc/self/no-such-file")));
            assert!(
                h.list(Path::new("/proc/self"))
                    .unwrap()
                    .contains(&"status".to_string())
            );
            let e = h.read(Path::new("/proc/self/no-such-file")).unwrap_err();
            assert_eq!((e.op, e.errno), (HostOp::Read, Errno::ENOENT));
            let e = h.list(Path::new("/proc/self/status")).unwrap_err();
            assert_eq!((e.op, e.errno), (HostOp::List, Errno::ENOTDIR));
            let e = h.read_link(Path::new("/proc/self/status")).unwrap_err();
            assert_eq!((e.op, e.errno), (HostOp::ReadLink, Errno::EINVAL));
            let e = h
                .write(Path::new("/proc/self/no-such-file"), "1")
                .unwrap_err();
            assert_eq!(e.errno, Errno::ENOENT);
        }
    }

    #[test]
    fn reads_return_whole_files_of_every_size() {
        let dir = tempfile::tempdir().unwrap();
        let h = SysfsHost::new(dir.path()).unwrap();
        // Around the one-read buffer (a page and a byte), and far beyond it.
        for len in [0, 1, 4095, 4096, 4097, 4098, 8194, 100_000] {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            fs::write(dir.path().join("attr"), &text).unwrap();
            assert_eq!(h.read(Path::new("/attr")).unwrap(), text, "{len} bytes");
        }
        // A directory is not an attribute.
        fs::create_dir(dir.path().join("d")).unwrap();
        let e = h.read(Path::new("/d")).unwrap_err();
        assert_eq!((e.op, e.errno), (HostOp::Read, Errno::EISDIR));
        // The live kernel's own virtual files (procfs: one page per read) come whole too.
        let live = SysfsHost::live();
        let status = live.read(Path::new("/proc/self/status")).unwrap();
        assert!(
            status.ends_with('\n') && status.contains("VmRSS"),
            "{status}"
        );
    }

    #[test]
    fn links_resolve_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("sys/devices/pci0000:00/0000:00:06.0")).unwrap();
        fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        fs::create_dir_all(r.join("sys/bus/pci/drivers/nvidia")).unwrap();
        fs::write(
            r.join("sys/devices/pci0000:00/0000:00:06.0/vendor"),
            "0x10de\n",
        )
        .unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:00:06.0",
            r.join("sys/bus/pci/devices/0000:00:06.0"),
        )
        .unwrap();
        symlink(
            "/sys/bus/pci/drivers/nvidia",
            r.join("sys/devices/pci0000:00/0000:00:06.0/driver"),
        )
        .unwrap();
        let h = SysfsHost::new(r).unwrap();
        let dev = Path::new("/sys/bus/pci/devices/0000:00:06.0");
        assert_eq!(h.read(&dev.join("vendor")).unwrap(), "0x10de\n");
        assert_eq!(
            h.canonicalize(&dev.join("driver")).unwrap(),
            PathBuf::from("/sys/bus/pci/drivers/nvidia")
        );
        assert_eq!(
            h.canonicalize(dev).unwrap(),
            PathBuf::from("/sys/devices/pci0000:00/0000:00:06.0")
        );
        assert_eq!(h.list(dev).unwrap(), vec!["driver", "vendor"]);
        let e = h.read(&dev.join("nope")).unwrap_err();
        assert_eq!(e.errno, Errno::ENOENT);
        assert_eq!(e.path, dev.join("nope"));
        let e = h.write(&dev.join("missing"), "1").unwrap_err();
        assert_eq!(e.errno, Errno::ENOENT);
        assert!(e.to_string().contains("value \"1\""), "{e}");
    }

    #[test]
    fn link_stubs_are_followed_like_links() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("sys/devices/pci0000:00/0000:00:06.0")).unwrap();
        fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
        fs::create_dir_all(r.join("sys/bus/pci/drivers/nvidia")).unwrap();
        fs::write(
            r.join("sys/devices/pci0000:00/0000:00:06.0/class"),
            "0x030200\n",
        )
        .unwrap();
        fs::write(
            r.join("sys/devices/pci0000:00/0000:00:06.0/driver"),
            "../../../bus/pci/drivers/nvidia",
        )
        .unwrap();
        fs::write(
            r.join("sys/bus/pci/devices/0000:00:06.0"),
            "../../../devices/pci0000:00/0000:00:06.0",
        )
        .unwrap();
        let h = SysfsHost::new(r).unwrap();
        let dev = Path::new("/sys/bus/pci/devices/0000:00:06.0");
        assert_eq!(h.read(&dev.join("class")).unwrap(), "0x030200\n");
        assert_eq!(
            h.read_link(&dev.join("driver")).unwrap(),
            PathBuf::from("../../../bus/pci/drivers/nvidia")
        );
        // A link to a directory reads as a directory, as in sysfs.
        assert_eq!(
            h.read(&dev.join("driver")).unwrap_err().errno,
            Errno::EISDIR
        );
        assert_eq!(
            h.read_link(&dev.join("class")).unwrap_err().errno,
            Errno::EINVAL
        );
    }

    #[test]
    fn a_write_count_short_of_the_value_is_an_error() {
        let path =
            Path::new("/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-1/create");
        let value = "7b5c2e2a-0b8c-4b0f-9a3e-0c1d2e3f4a5b";
        assert_eq!(whole_write(path, value, value.len()), Ok(()));
        for written in [0, 1, value.len() - 1] {
            let e = whole_write(path, value, written).unwrap_err();
            assert_eq!((e.op, e.path.as_path()), (HostOp::Write, path));
            assert_eq!(e.value.as_deref(), Some(value));
            assert_eq!(
                e.short_write(),
                Some(ShortWrite {
                    written,
                    expected: value.len()
                })
            );
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(
                msg.contains(&format!("took {written} of 36 bytes")),
                "{msg}"
            );
        }
    }

    /// A FIFO whose reader takes one byte and leaves: `write(2)` returns the bytes the pipe took (its
    /// buffer, 64 KiB by default), fewer than the value, and the write must fail.
    #[test]
    fn a_store_that_takes_part_of_the_value_fails() {
        use nix::sys::stat::Mode;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("sys/devices/fake");
        fs::create_dir_all(&dir).unwrap();
        nix::unistd::mkfifo(&dir.join("attr"), Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
        fs::write(dir.join("plain"), "").unwrap();
        let fifo = dir.join("attr");
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut f = fs::File::open(fifo).unwrap();
            let mut one = [0u8; 1];
            f.read_exact(&mut one).unwrap();
        });
        let h = SysfsHost::new(t.path()).unwrap();
        let value = "1".repeat(1 << 20);
        let e = h
            .write(Path::new("/sys/devices/fake/attr"), &value)
            .unwrap_err();
        let short = e.short_write().expect("a short write, not another error");
        assert!(
            short.written > 0 && short.written < value.len(),
            "{short:?}"
        );
        assert_eq!(short.expected, value.len());
        assert_eq!(e.errno, Errno::EIO);
        reader.join().unwrap();
        // A regular file takes the whole value in one write.
        h.write(Path::new("/sys/devices/fake/plain"), "0x10de\n")
            .unwrap();
        assert_eq!(fs::read_to_string(dir.join("plain")).unwrap(), "0x10de\n");
    }

    #[test]
    fn missing_root_is_an_error() {
        let e = SysfsHost::new("/definitely/not/here").unwrap_err();
        assert_eq!(e.errno, Errno::ENOENT);
    }
}
