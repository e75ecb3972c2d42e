//! Durable file replacement: every file the plugin writes (checkpoint, CDI specs, device metadata)
//! goes through [`write_durably`], so a crash leaves either the old or the new content, never a torn
//! file; [`remove_durably`] makes a removal survive a crash the same way.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A file operation that failed, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Creating a directory failed.
    #[error("cannot create directory {}: check that its parent exists and is writable by the plugin", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Writing, syncing or renaming into place failed.
    #[error("cannot write {}: check free space and permissions of its directory", path.display())]
    Write {
        /// The file being replaced.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Removing a file failed for a reason other than its absence.
    #[error("cannot remove {}: check the permissions of its directory", path.display())]
    Remove {
        /// The file.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The path has no parent directory or no file name.
    #[error("{} is not a file path inside a directory", path.display())]
    NotAFilePath {
        /// The path.
        path: PathBuf,
    },
}

/// Creates `dir` and its parents (mode 0755 by the umask) if missing.
pub fn ensure_dir(dir: &Path) -> Result<(), FsError> {
    fs::create_dir_all(dir).map_err(|source| FsError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })
}

/// Replaces `path` with `contents`: written to a temporary file in the same directory, synced,
/// renamed over `path`, then the directory synced, so the new name and content survive a crash.
pub fn write_durably(path: &Path, contents: &[u8]) -> Result<(), FsError> {
    let (dir, name) = split(path)?;
    ensure_dir(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    let err = |source| FsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(contents).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    fs::rename(&tmp, path).map_err(err)?;
    sync_dir(dir).map_err(err)
}

/// Removes `path` and syncs its directory; a file already gone is not an error.
pub fn remove_durably(path: &Path) -> Result<(), FsError> {
    let (dir, _) = split(path)?;
    match fs::remove_file(path) {
        Ok(()) => sync_dir(dir).map_err(|source| FsError::Remove {
            path: path.to_path_buf(),
            source,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FsError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Removes the directories from `dir` up to (not including) `stop` while they are empty.
pub fn remove_empty_dirs(dir: &Path, stop: &Path) {
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d == stop || !d.starts_with(stop) || fs::remove_dir(d).is_err() {
            break;
        }
        cur = d.parent();
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn split(path: &Path) -> Result<(&Path, &str), FsError> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => Ok((dir, name)),
        _ => Err(FsError::NotAFilePath {
            path: path.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn replaces_and_removes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/x.json");
        write_durably(&p, b"one").unwrap();
        write_durably(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        remove_durably(&p).unwrap();
        remove_durably(&p).unwrap();
        assert!(!p.exists());
        remove_empty_dirs(p.parent().unwrap(), d.path());
        assert!(!d.path().join("sub").exists());
        assert!(d.path().exists());
    }

    #[test]
    fn refuses_a_bare_name() {
        assert!(matches!(
            write_durably(Path::new("x"), b""),
            Err(FsError::NotAFilePath { .. })
        ));
    }
}
