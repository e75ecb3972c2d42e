//! vgpud's private socket: `org.vgpumanager.Manager1` served straight over a peer-to-peer D-Bus
//! connection, for root and vgpud's own user only.
//!
//! A one-shot client on the bus pays for more than its call: the connection handshake and `Hello`,
//! the broker's routing of the call and of the reply (four socket hops instead of two), the
//! `NameOwnerChanged` broadcasts of its arrival and departure, and vgpud's lookup of its credentials
//! through the bus. libvirt runs `mdevctl` (here `vgpuctl`) once per node-device operation, as root,
//! so root's one-shot calls are the hot path. systemd answers the same need with its private socket
//! (`/run/systemd/private`, served by `bus_init_private()` in systemd's src/core/dbus.c; `systemctl`
//! connects there when run as root, `bus_connect_system_systemd()` in src/shared/bus-util.c);
//! vgpud does as systemd does:
//!
//! - The socket file is created mode 0600, and every connection's peer credentials
//!   (`SO_PEERCRED`, unix(7)) are checked on accept: any uid but root's and vgpud's own is closed
//!   before a byte is read. Both users can already do whatever vgpud does, so their calls are
//!   authorized as root's are on the bus; nobody else can reach vgpud but through the bus and its
//!   policy.
//! - Only Manager1's methods and properties are served. Signals, the per-instance and per-GPU
//!   objects and the ObjectManager stay on the bus, which is where subscribers listen: a change
//!   made through the private socket is announced there as any other.
//! - Calls go through the same admission, logging and settling as bus calls (`Shared::run` of the D-Bus layer):
//!   each connection is its own share of the privileged workers, and its calls that have not started
//!   when it closes are dropped.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use std::os::fd::{BorrowedFd, OwnedFd};

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};
use zbus::connection::socket::{ReadHalf, Socket, Split, WriteHalf};
use zbus::export::async_trait::async_trait;

use super::Shared;
use super::auth::{Caller, is_privileged_uid};
use super::manager::Manager;
use super::strict::Strict;
use vgpu_client::MANAGER_PATH;

/// How long a peer has to finish the D-Bus handshake before its connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections served at once. Only root and vgpud's own user connect, and each `vgpuctl` holds one
/// for a single call; the cap only bounds what a runaway privileged script could hold.
pub const MAX_CONNECTIONS: usize = 256;

/// Why the private socket could not be opened.
#[derive(Debug, Error)]
pub enum PrivateSocketError {
    /// Its directory could not be created.
    #[error(
        "cannot create the directory of vgpud's private socket {dir}: {source} (create it, or pass another --private-socket)"
    )]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Something that is not a socket is in the way.
    #[error(
        "cannot put vgpud's private socket at {path}: a file that is not a socket is there (remove it, or pass another --private-socket)"
    )]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A socket there answers: another vgpud serves it.
    #[error(
        "cannot put vgpud's private socket at {path}: another process is listening there (is another vgpud running? stop it, or pass another --private-socket)"
    )]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// Binding or restricting it failed.
    #[error("cannot {op} vgpud's private socket {path}: {source}")]
    Io {
        /// What failed (`remove the stale`, `bind`, `restrict the mode of`).
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The listening private socket. Dropping it stops accepting, closes its connections' listener and
/// removes the socket file.
#[derive(Debug)]
pub struct PrivateSocket {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl PrivateSocket {
    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateSocket {
    fn drop(&mut self) {
        self.task.abort();
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            warn!(path = %self.path.display(), error = %e, "cannot remove the private socket");
        }
    }
}

/// Binds `path` (mode 0600), replacing a stale socket left by a vgpud that died; must run inside the
/// Tokio runtime.
fn bind(path: &Path) -> Result<UnixListener, PrivateSocketError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| PrivateSocketError::Dir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // Stale only if nothing answers: a live vgpud's socket is never taken over.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(PrivateSocketError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(|source| PrivateSocketError::Io {
                op: "remove the stale",
                path: path.to_path_buf(),
                source,
            })?;
        }
        Ok(_) => {
            return Err(PrivateSocketError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(_) => {}
    }
    let io = |op: &'static str| {
        move |source| PrivateSocketError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let listener = UnixListener::bind(path).map_err(io("bind"))?;
    // Between bind and chmod the file has the umask's mode; the credential check on accept refuses
    // whoever connects meanwhile.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("restrict the mode of"))?;
    Ok(listener)
}

/// Listens on `path` and serves Manager1 to each privileged peer that connects.
pub(super) fn listen(
    path: &Path,
    shared: Arc<Shared>,
) -> Result<PrivateSocket, PrivateSocketError> {
    let listener = bind(path)?;
    info!(path = %path.display(), "private socket for root and vgpud's user listening");
    let server = Arc::new(Server {
        shared,
        live: AtomicUsize::new(0),
        next: AtomicU64::new(1),
    });
    let task = tokio::spawn(accept_loop(listener, server));
    Ok(PrivateSocket {
        path: path.to_path_buf(),
        task,
    })
}

/// What every connection is served from.
struct Server {
    shared: Arc<Shared>,
    /// Connections being served.
    live: AtomicUsize,
    /// The number of the next connection (connections are named `private#N` in logs).
    next: AtomicU64,
}

async fn accept_loop(listener: UnixListener, server: Arc<Server>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and the like: the next accept may succeed once descriptors are closed.
                warn!(error = %e, "private socket: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let cred = match stream.peer_cred() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "private socket: cannot read a peer's credentials: connection closed");
                continue;
            }
        };
        let (uid, pid) = (cred.uid(), cred.pid());
        if !is_privileged_uid(uid) {
            warn!(
                uid,
                pid,
                "private socket: refused a connection of a user who is neither root nor vgpud's own (others use the system bus)"
            );
            continue;
        }
        if server.live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            server.live.fetch_sub(1, Ordering::SeqCst);
            warn!(
                uid,
                pid,
                max = MAX_CONNECTIONS,
                "private socket: too many connections: refused one"
            );
            continue;
        }
        let n = server.next.fetch_add(1, Ordering::Relaxed);
        let peer = Arc::new(PrivatePeer::new(n, uid, cred.gid(), pid));
        let server = Arc::clone(&server);
        let stream = PeerStream {
            stream,
            creds: PeerCreds {
                uid,
                gid: cred.gid(),
                pid: pid.and_then(|p| u32::try_from(p).ok()),
            },
        };
        tokio::spawn(async move {
            serve_one(stream, &server, peer).await;
            server.live.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Serves one connection until its peer closes it.
async fn serve_one(stream: PeerStream, server: &Server, peer: Arc<PrivatePeer>) {
    let manager = Manager {
        shared: Arc::clone(&server.shared),
        origin: super::Origin::Private(Arc::clone(&peer)),
    };
    let built = zbus::connection::Builder::socket(stream)
        .server(zbus::Guid::generate())
        .p2p()
        .serve_at(MANAGER_PATH, Strict::wrap(manager));
    let conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, built.build()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            debug!(peer = %peer.caller, error = %e, "private socket: handshake failed");
            return;
        }
        Err(_) => {
            debug!(peer = %peer.caller, "private socket: handshake timed out");
            return;
        }
    };
    conn.closed().await;
    // Calls of this connection that have not started are dropped.
    server.shared.admission.disconnected(&peer.name);
}

/// A peer of the private socket, as its credentials identify it.
#[derive(Debug)]
pub(super) struct PrivatePeer {
    /// Its connection's name in admission and logs (`private#N`).
    pub(super) name: String,
    /// Who it is.
    pub(super) caller: Caller,
}

impl PrivatePeer {
    fn new(n: u64, uid: u32, gid: u32, pid: Option<i32>) -> PrivatePeer {
        let name = format!("private#{n}");
        PrivatePeer {
            caller: Caller {
                bus_name: name.clone(),
                uid,
                pid: pid.and_then(|p| u32::try_from(p).ok()),
                groups: vec![gid],
                // No user-database lookup on the accept path: the uid is logged anyway.
                user: (uid == 0).then(|| "root".to_string()),
            },
            name,
        }
    }
}

/// A connection of the private socket as zbus runs it: the accepted stream, with the credentials
/// vgpud read on accept. zbus's own unix stream would read them again for its handshake and look the
/// user's name and groups up in the user database on a blocking thread (zbus 6.2.1,
/// `src/runtime/io/unix.rs`), for every connection of a one-shot client; the handshake needs only
/// the uid, which vgpud already has.
#[derive(Debug)]
struct PeerStream {
    stream: UnixStream,
    creds: PeerCreds,
}

/// What `SO_PEERCRED` said of a peer.
#[derive(Debug, Clone, Copy)]
struct PeerCreds {
    uid: u32,
    gid: u32,
    pid: Option<u32>,
}

impl PeerCreds {
    fn zbus(self) -> zbus::fdo::ConnectionCredentials {
        let c = zbus::fdo::ConnectionCredentials::default()
            .set_unix_user_id(self.uid)
            .add_unix_group_id(self.gid);
        match self.pid {
            Some(p) => c.set_process_id(p),
            None => c,
        }
    }
}

impl Socket for PeerStream {
    type ReadHalf = PeerReader;
    type WriteHalf = PeerWriter;

    fn split(self) -> Split<PeerReader, PeerWriter> {
        let (read, write) = self.stream.into_split();
        Split::new(
            PeerReader {
                read,
                creds: self.creds,
            },
            PeerWriter {
                write,
                creds: self.creds,
            },
        )
    }
}

/// The half of a [`PeerStream`] zbus receives through.
#[derive(Debug)]
struct PeerReader {
    read: tokio::net::unix::OwnedReadHalf,
    creds: PeerCreds,
}

#[async_trait]
impl ReadHalf for PeerReader {
    async fn recvmsg(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        // Read without a control buffer: descriptors a peer sends are closed by the kernel and
        // never reach vgpud's table. No Manager1 method takes any; a message that announces some
        // then lacks them, which zbus takes for a broken stream, and the connection is closed.
        let n = self.read.read(buf).await?;
        Ok((n, Vec::new()))
    }

    /// Agreed in the handshake (so that a client does not warn), though descriptors are dropped on
    /// receipt and never sent.
    fn can_pass_unix_fd(&self) -> bool {
        true
    }

    async fn peer_credentials(&mut self) -> io::Result<zbus::fdo::ConnectionCredentials> {
        Ok(self.creds.zbus())
    }
}

/// The half of a [`PeerStream`] zbus sends through.
#[derive(Debug)]
struct PeerWriter {
    write: tokio::net::unix::OwnedWriteHalf,
    creds: PeerCreds,
}

#[async_trait]
impl WriteHalf for PeerWriter {
    async fn sendmsg(&mut self, buffer: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
        if !fds.is_empty() {
            // Manager1's replies carry none; only Instance1.OpenDevice does, on the bus.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "vgpud's private socket sends no file descriptors",
            ));
        }
        self.write.write(buffer).await
    }

    async fn close(&mut self) -> io::Result<()> {
        self.write.shutdown().await
    }

    fn can_pass_unix_fd(&self) -> bool {
        true
    }

    async fn peer_credentials(&mut self) -> io::Result<zbus::fdo::ConnectionCredentials> {
        Ok(self.creds.zbus())
    }
}
