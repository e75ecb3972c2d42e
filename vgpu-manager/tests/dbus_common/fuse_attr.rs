//! One writable kernel attribute served through FUSE, so that a write to it acts before it returns, as
//! a sysfs `store()` does: a regular file (`create`, `remove`) becomes the root of a one-file FUSE mount
//! (`rootmode=100644`) whose writes a callback handles synchronously. The protocol subset is the one a
//! single file needs (include/uapi/linux/fuse.h: INIT, GETATTR, OPEN, READ, WRITE, FLUSH, RELEASE); the
//! mount is made with mount(8) `-i -t fuse -o fd=N,…` (the kernel's fuse(4) mount options). Needs root.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::JoinHandle;

/// What a write to the attribute does: `Ok(())` takes the whole write, `Err(errno)` fails it.
pub type OnWrite = Box<dyn FnMut(&str) -> Result<(), i32> + Send>;

/// A FUSE-served attribute; unmounted (lazily) when dropped.
pub struct FuseAttr {
    path: PathBuf,
    thread: Option<JoinHandle<()>>,
}

const FUSE_LOOKUP: u32 = 1;
const FUSE_FORGET: u32 = 2;
const FUSE_GETATTR: u32 = 3;
const FUSE_SETATTR: u32 = 4;
const FUSE_OPEN: u32 = 14;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_RELEASE: u32 = 18;
const FUSE_FLUSH: u32 = 25;
const FUSE_INIT: u32 = 26;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_DESTROY: u32 = 38;
const FUSE_BATCH_FORGET: u32 = 42;
const ENOSYS: i32 = 38;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

fn reply(dev: &mut File, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    let len = if error == 0 { 16 + body.len() } else { 16 };
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&(-error).to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    if error == 0 {
        out.extend_from_slice(body);
    }
    // The kernel refuses a reply to a request it gave up on (ENOENT); nothing to do then.
    let _ = dev.write_all(&out);
}

/// `struct fuse_attr_out` of the one regular file (inode 1).
fn attr_out() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0u64.to_ne_bytes()); // attr_valid: do not cache
    b.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
    b.extend_from_slice(&0u32.to_ne_bytes()); // dummy
    b.extend_from_slice(&1u64.to_ne_bytes()); // ino
    b.extend_from_slice(&0u64.to_ne_bytes()); // size
    b.extend_from_slice(&0u64.to_ne_bytes()); // blocks
    for _ in 0..3 {
        b.extend_from_slice(&0u64.to_ne_bytes()); // atime, mtime, ctime
    }
    for _ in 0..3 {
        b.extend_from_slice(&0u32.to_ne_bytes()); // their nanoseconds
    }
    b.extend_from_slice(&0o100_200u32.to_ne_bytes()); // mode: regular, write-only like create/remove
    b.extend_from_slice(&1u32.to_ne_bytes()); // nlink
    b.extend_from_slice(&0u32.to_ne_bytes()); // uid
    b.extend_from_slice(&0u32.to_ne_bytes()); // gid
    b.extend_from_slice(&0u32.to_ne_bytes()); // rdev
    b.extend_from_slice(&4096u32.to_ne_bytes()); // blksize
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags
    b
}

fn init_out(max_readahead: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&7u32.to_ne_bytes()); // major
    b.extend_from_slice(&31u32.to_ne_bytes()); // minor
    b.extend_from_slice(&max_readahead.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags
    b.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    b.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    b.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
    b.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    b.extend_from_slice(&0u16.to_ne_bytes()); // max_pages
    b.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    b.extend_from_slice(&0u32.to_ne_bytes()); // flags2
    b.extend_from_slice(&[0u8; 28]); // unused[7]
    b
}

fn serve(mut dev: File, mut on_write: OnWrite) {
    let mut buf = vec![0u8; 1 << 17];
    loop {
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            // ENODEV: unmounted. EINTR/EAGAIN: try again.
            Err(e) if e.raw_os_error() == Some(19) => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if n < 40 {
            continue;
        }
        let req = &buf[..n];
        let opcode = u32_at(req, 4);
        let unique = u64_at(req, 8);
        let body = &req[40..];
        match opcode {
            FUSE_INIT => reply(&mut dev, unique, 0, &init_out(u32_at(body, 8))),
            FUSE_GETATTR | FUSE_SETATTR => reply(&mut dev, unique, 0, &attr_out()),
            FUSE_OPEN => {
                let mut o = Vec::new();
                o.extend_from_slice(&0u64.to_ne_bytes()); // fh
                o.extend_from_slice(&1u32.to_ne_bytes()); // FOPEN_DIRECT_IO
                o.extend_from_slice(&0u32.to_ne_bytes());
                reply(&mut dev, unique, 0, &o);
            }
            FUSE_READ => reply(&mut dev, unique, 0, &[]),
            FUSE_WRITE => {
                let size = u32_at(body, 16) as usize;
                let data = body.get(40..40 + size).unwrap_or_default();
                match on_write(&String::from_utf8_lossy(data)) {
                    Ok(()) => {
                        let mut o = Vec::new();
                        o.extend_from_slice(&(size as u32).to_ne_bytes());
                        o.extend_from_slice(&0u32.to_ne_bytes());
                        reply(&mut dev, unique, 0, &o);
                    }
                    Err(errno) => reply(&mut dev, unique, errno, &[]),
                }
            }
            FUSE_FLUSH | FUSE_RELEASE => reply(&mut dev, unique, 0, &[]),
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {}
            FUSE_DESTROY => {
                reply(&mut dev, unique, 0, &[]);
                return;
            }
            FUSE_LOOKUP => reply(&mut dev, unique, 2, &[]), // ENOENT: a file has no children
            _ => reply(&mut dev, unique, ENOSYS, &[]),
        }
    }
}

impl FuseAttr {
    /// Mounts a FUSE attribute over the regular file `path` (created if missing), calling `on_write` for
    /// every write before the write returns.
    pub fn mount(path: &Path, on_write: OnWrite) -> FuseAttr {
        if !path.exists() {
            std::fs::write(path, "").unwrap();
        }
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("open /dev/fuse (the mdevctl conformance test needs FUSE and root)");
        let fd = dev.as_raw_fd();
        // mount(8) opens nothing itself: the kernel takes the descriptor number in the options from the
        // mounting process, so the child must inherit it.
        nix::fcntl::fcntl(
            &dev,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .unwrap();
        let status = Command::new("mount")
            .args(["-i", "-t", "fuse", "-o"])
            .arg(format!(
                "fd={fd},rootmode=100644,user_id=0,group_id=0,allow_other"
            ))
            .arg("vgpu-test-attr")
            .arg(path)
            .status()
            .expect("run mount(8)");
        nix::fcntl::fcntl(
            &dev,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
        assert!(
            status.success(),
            "mount -t fuse on {}: {status}",
            path.display()
        );
        let thread = std::thread::spawn(move || serve(dev, on_write));
        FuseAttr {
            path: path.to_path_buf(),
            thread: Some(thread),
        }
    }
}

/// Lazily unmounts whatever is mounted on `path` (the attribute's server thread then ends).
pub fn unmount(path: &Path) {
    let _ = Command::new("umount").arg("-l").arg(path).status();
}

impl Drop for FuseAttr {
    fn drop(&mut self) {
        // The server thread ends when the kernel closes the connection (its read fails with ENODEV).
        unmount(&self.path);
        drop(self.thread.take());
    }
}

/// True when FUSE attributes can be served here (root, `/dev/fuse`). Otherwise the test fails, so that it
/// never passes without having run — unless `VGPU_TESTS_ALLOW_SKIP=1` is set: then this returns false
/// after printing `SKIPPED: <reason>` to stderr, and the caller returns.
pub fn require_fuse(test: &str) -> bool {
    let why = if !nix::unistd::geteuid().is_root() {
        Some("mounting FUSE attributes needs root".to_string())
    } else {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .err()
            .map(|e| format!("cannot open /dev/fuse ({e})"))
    };
    let Some(why) = why else { return true };
    let var = super::system_bus::ALLOW_SKIP_VAR;
    if std::env::var(var).as_deref() == Ok("1") {
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: {test}: {why}; {var}=1 allowed the skip"
        );
        return false;
    }
    panic!(
        "{test}: {why}. Run the tests as root on a kernel with FUSE, as CI does (scripts/test under \
         .ci/run), or set {var}=1 to skip with a SKIPPED line on stderr"
    );
}
