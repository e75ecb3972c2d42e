//! The socket of each client of the embedded bus, as zbus reads and writes it.
//!
//! busd (0.6) enforces no policy and reads with zbus's own socket, which allocates — and zeroes — a
//! message's whole announced length (up to the D-Bus specification's 128 MiB) before its first
//! body byte arrives. So the embedded bus hands zbus this socket instead, which:
//! - refuses a message longer than [`MAX_MESSAGE_BYTES`] as soon as its primary header is in, and
//!   holds the bytes of a message only as they arrive, never by its announced length;
//! - answers itself ([`super::screen`]) a call to a name nobody owns with
//!   `org.freedesktop.DBus.Error.ServiceUnknown`, as dbus-daemon does, where busd drops it and
//!   leaves the caller waiting;
//! - refuses `RequestName` of the daemon's name (and polkit's) and `BecomeMonitor` from a connection
//!   of another user than root or vgpud's own (`org.freedesktop.DBus.Error.AccessDenied`), the
//!   embedded bus's ownership policy;
//! - takes no file descriptors from a client other than root or vgpud's own user (vgpud's API takes
//!   none; the kernel never installs them in vgpud's table), and closes such a client's connection;
//! - answers a call past the connection's [`MAX_PENDING_REPLIES`](super::replies::MAX_PENDING_REPLIES)
//!   calls waiting for replies with `org.freedesktop.DBus.Error.LimitsExceeded`, and a call whose
//!   reply has not come within its reply timeout ([`REPLY_TIMEOUT`](super::replies::REPLY_TIMEOUT) unless
//!   the bus was started with another) with `org.freedesktop.DBus.Error.NoReply`
//!   ([`super::replies`]);
//! - closes a connection that has not sent `Hello` within [`AUTH_TIMEOUT`] of connecting, as
//!   dbus-daemon closes a connection still "incomplete" at its `auth_timeout`;
//! - frees the connection's slot in the bus's connection limits once zbus drops it.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use busd::peers::Peers;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};
use zbus::Message;
use zbus::connection::socket::{ReadHalf, WriteHalf};
use zbus::fdo::ConnectionCredentials;
use zbus::message::Type;
use zruntime::{AsyncIo, Shared, SharedRuntime};

use super::limits::{AUTH_TIMEOUT, ConnectionSlot};
use super::replies::{self, PendingReplies};
use super::screen;

/// The longest message a client may send on the embedded bus: 1 MiB. Every call of vgpud's API
/// fits in a few KiB (the longest inputs are pool and scheduling TOML texts); the D-Bus
/// specification allows 128 MiB ("Message Format"), dbus-daemon's system bus 32 MiB
/// (`max_message_size`).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// How many file descriptors one read may bring along (Linux's `SCM_MAX_FD`).
const MAX_FDS_PER_READ: usize = 253;

/// How many bytes one read takes at most.
const READ_CHUNK: usize = 64 * 1024;

/// The length of a message's primary header.
const PRIMARY_HEADER: usize = 16;

/// The credentials the kernel gives for a client (`SO_PEERCRED`), read once when it connects.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    /// Its user.
    pub uid: u32,
    /// Its primary group.
    pub gid: u32,
    /// Its process.
    pub pid: u32,
}

/// A client of the bus, as it connects.
#[derive(Clone, Copy, Debug)]
pub struct NewClient {
    /// Its credentials.
    pub cred: PeerCred,
    /// busd's number of the client (its unique name is `:busd.ID`), which busd's records of the
    /// client's calls name it by.
    pub id: usize,
    /// How long the client may take to read what the bus sends it, before the bus closes its
    /// connection: what busd gives it, for the bus's own answers too.
    pub send_timeout: std::time::Duration,
    /// How long its calls wait for their replies before the bus answers `NoReply` itself.
    pub reply_timeout: std::time::Duration,
}

/// What both halves of a client's socket share: the socket, the lock that keeps messages whole on
/// it, the client's slot in the bus's limits, and its calls that wait for replies.
struct Conn {
    io: AsyncIo<UnixStream, Shared>,
    write: tokio::sync::Mutex<()>,
    cred: PeerCred,
    /// Its groups, read from the user database once per connection (as dbus-daemon does) although
    /// both halves of the socket ask for its credentials.
    groups: tokio::sync::OnceCell<Option<Vec<u32>>>,
    /// busd's number of the client (its unique name is `:busd.ID`), which busd's records of the
    /// client's calls name it by.
    id: usize,
    send_timeout: std::time::Duration,
    /// The client's calls that wait for replies, if they are counted: they are for every client but
    /// vgpud's own connection, whose calls (to polkit, where it runs) are made for its callers, whom
    /// their own connections' limits hold; refusing them would refuse those callers.
    replies: Option<Mutex<PendingReplies>>,
    _slot: ConnectionSlot,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn").field("cred", &self.cred).finish()
    }
}

impl Conn {
    /// Writes the bus's own answer `msg` (a refusal, a `NoReply`) within the time busd gives the
    /// client, or shuts the socket down: a client that does not read must not hold the socket's
    /// lock, which busd's own sends to it wait for.
    async fn answer(&self, runtime: &SharedRuntime, msg: &Message) -> zbus::Result<()> {
        match runtime.timeout(self.send_timeout, self.send(msg)).await {
            Ok(sent) => sent,
            Err(_) => {
                tracing::info!(
                    uid = self.cred.uid,
                    pid = self.cred.pid,
                    "closed a connection that did not take the bus's answer within {:?}",
                    self.send_timeout
                );
                let _ = self.io.get_ref().shutdown(std::net::Shutdown::Both);
                Err(zbus::Error::InputOutput(Arc::new(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client did not read the bus's answer in time",
                ))))
            }
        }
    }

    /// Writes all of `msg`, its descriptors with its first byte, with no other message between.
    async fn send(&self, msg: &Message) -> zbus::Result<()> {
        let _whole = self.write.lock().await;
        let data = msg.data();
        let fds: Vec<BorrowedFd<'_>> = data.fds().iter().map(|f| f.as_fd()).collect();
        let mut pos = 0;
        while pos < data.len() {
            let with = if pos == 0 { &fds[..] } else { &[] };
            pos += self
                .io
                .write_with(|s| send_some(s.as_fd(), &data[pos..], with))
                .await?;
        }
        Ok(())
    }
}

/// One `sendmsg` of `bytes` with `fds`.
fn send_some(fd: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many file descriptors for one message",
        ));
    }
    let sent = sendmsg(
        fd,
        &[IoSlice::new(bytes)],
        &mut ancillary,
        SendFlags::NOSIGNAL,
    )?;
    if sent == 0 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "the client's socket took nothing",
        ));
    }
    Ok(sent)
}

/// One `recvmsg` into `buf`: the bytes and the descriptors that came along.
///
/// Unless `take_fds`, it gives the kernel no room for descriptors, so none sent along is ever
/// installed in vgpud's table (the kernel closes them), and a client that sent some is refused.
fn recv_some(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    take_fds: bool,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_READ))];
    let room = if take_fds { &mut space[..] } else { &mut [] };
    let mut ancillary = RecvAncillaryBuffer::new(room);
    let msg = recvmsg(fd, &mut iov, &mut ancillary, RecvFlags::CMSG_CLOEXEC)?;
    if !take_fds && msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "an unprivileged client sent file descriptors, which vgpud's API takes none of",
        ));
    }
    if msg.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the client closed its connection",
        ));
    }
    let mut fds = Vec::new();
    for m in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    Ok((msg.bytes, fds))
}

/// The whole length of the message whose primary header `h` is (D-Bus specification, "Message
/// Format": 16 bytes, then the header fields' array padded to 8, then the body), refused past
/// [`MAX_MESSAGE_BYTES`].
pub fn message_len(h: &[u8; PRIMARY_HEADER]) -> io::Result<usize> {
    let word = |at: usize| {
        let b = [h[at], h[at + 1], h[at + 2], h[at + 3]];
        match h[0] {
            b'l' => Ok(u32::from_le_bytes(b) as usize),
            b'B' => Ok(u32::from_be_bytes(b) as usize),
            e => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a message with the unknown byte order mark {e:#04x}"),
            )),
        }
    };
    let body = word(4)?;
    let fields = word(12)?;
    let len = (PRIMARY_HEADER + fields)
        .next_multiple_of(8)
        .saturating_add(body);
    if len > MAX_MESSAGE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a message of {len} bytes, more than the embedded bus's limit of {MAX_MESSAGE_BYTES}"
            ),
        ));
    }
    Ok(len)
}

/// Builds both halves of the socket of a client that has just connected, busd's peer number `id`,
/// as zbus takes them.
pub fn split(
    stream: UnixStream,
    client: NewClient,
    slot: ConnectionSlot,
    peers: Arc<Peers>,
    runtime: &SharedRuntime,
) -> io::Result<zbus::connection::socket::BoxedSplit> {
    let NewClient {
        cred,
        id,
        send_timeout,
        reply_timeout,
    } = client;
    let counted = cred.pid != std::process::id();
    let conn = Arc::new(Conn {
        io: AsyncIo::new(runtime, stream)?,
        write: tokio::sync::Mutex::new(()),
        cred,
        groups: tokio::sync::OnceCell::new(),
        id,
        send_timeout,
        replies: counted.then(|| {
            Mutex::new(match slot.user_replies() {
                Some(user) => PendingReplies::of_user(user, reply_timeout),
                None => PendingReplies::new(reply_timeout),
            })
        }),
        _slot: slot,
    });
    let reader = Reader {
        conn: conn.clone(),
        peers,
        runtime: runtime.clone(),
        hello_by: Some(Instant::now() + AUTH_TIMEOUT),
        pending: Vec::new(),
        fds: std::collections::VecDeque::new(),
    };
    let writer = Writer { conn };
    Ok(zbus::connection::socket::Split::new(
        Box::new(reader) as Box<dyn ReadHalf>,
        Box::new(writer) as Box<dyn WriteHalf>,
    ))
}

/// The read half: whole messages, each screened before busd sees it.
struct Reader {
    conn: Arc<Conn>,
    peers: Arc<Peers>,
    runtime: SharedRuntime,
    /// When the client must have sent `Hello` by, until it has.
    hello_by: Option<Instant>,
    /// Bytes received and not yet handed out, never more than a message and one read beyond it.
    pending: Vec<u8>,
    /// Descriptors received and not yet handed out, in the order they came. They belong to the
    /// messages, in order, whose headers ask for descriptors (`UNIX_FDS`): one read may bring the end
    /// of a message without descriptors together with the next message and its descriptors (the
    /// kernel glues a write to a following one that carries descriptors, net/unix/af_unix.c
    /// `unix_stream_read_generic`), so where they arrived says nothing.
    fds: std::collections::VecDeque<OwnedFd>,
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").field("conn", &self.conn).finish()
    }
}

impl Reader {
    /// Reads once more from the socket, appending what came.
    async fn fill(&mut self) -> io::Result<()> {
        let mut chunk = vec![0u8; READ_CHUNK];
        let take_fds = screen::may_own_daemon_name(self.conn.cred.uid);
        let (n, fds) = self
            .conn
            .io
            .read_with(|s| recv_some(s.as_fd(), &mut chunk, take_fds))
            .await?;
        self.pending.extend_from_slice(&chunk[..n]);
        self.fds.extend(fds);
        Ok(())
    }

    /// The next whole message of the client. While it waits, the bus keeps its deadlines: the
    /// client's `Hello`, and the replies to its calls.
    async fn next_message(&mut self, seq: u64) -> zbus::Result<Message> {
        loop {
            self.keep_deadlines().await?;
            if let Some(head) = self.pending.first_chunk::<PRIMARY_HEADER>() {
                let len = message_len(head)?;
                if self.pending.len() >= len {
                    let rest = self.pending.split_off(len);
                    let bytes = std::mem::replace(&mut self.pending, rest);
                    return self.parse(bytes, seq).await;
                }
            }
            // A read ends at its first await if the deadline comes first, so no byte is lost.
            match self.next_deadline() {
                None => self.fill().await?,
                Some(at) => {
                    let runtime = self.runtime.clone();
                    if let Ok(read) = runtime.timeout_at(at, self.fill()).await {
                        read?;
                    }
                }
            }
        }
    }

    /// The first of the client's deadlines: for its `Hello`, and for the oldest reply it waits for.
    fn next_deadline(&self) -> Option<Instant> {
        let reply = self
            .conn
            .replies
            .as_ref()
            .and_then(|r| screen::lock(r).next_deadline());
        match (self.hello_by, reply) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Closes the connection if the client has not sent `Hello` in time, and answers its calls
    /// whose replies have not come in time with `NoReply`, taking away busd's records of them, so
    /// that a reply that comes later goes nowhere (dbus-daemon's `reply_timeout`).
    async fn keep_deadlines(&mut self) -> zbus::Result<()> {
        let now = Instant::now();
        if self.hello_by.is_some_and(|by| now >= by) {
            tracing::info!(
                uid = self.conn.cred.uid,
                pid = self.conn.cred.pid,
                "closed a connection that did not authenticate and send Hello within {} s",
                AUTH_TIMEOUT.as_secs()
            );
            return Err(zbus::Error::InputOutput(Arc::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not send Hello in time",
            ))));
        }
        let Some(replies) = &self.conn.replies else {
            return Ok(());
        };
        let (late, timeout) = {
            let mut r = screen::lock(replies);
            (r.expire(now), r.timeout())
        };
        for call in late {
            let taken = self
                .peers
                .peers()
                .await
                .get(call.callee.as_str())
                .is_some_and(|callee| callee.pending_calls().remove(self.conn.id, call.serial));
            // Not taken: the reply is on its way to the client, or the callee has gone and busd
            // answers the call itself.
            if taken {
                tracing::debug!(
                    uid = self.conn.cred.uid,
                    callee = %call.callee,
                    "a call got no reply within {} s",
                    timeout.as_secs()
                );
                let no_reply = replies::no_reply(call.serial, call.callee.as_str(), timeout)?;
                self.conn.answer(&self.runtime, &no_reply).await?;
            }
        }
        Ok(())
    }

    /// Parses `bytes`, one whole message, with as many of the pending descriptors as its header asks
    /// for. zbus refuses a message given fewer descriptors than its header names and accepts more, so
    /// the first count it accepts, trying 0, 1, … with duplicates, is exactly the header's; the
    /// message keeps those duplicates and the originals are closed.
    async fn parse(&mut self, bytes: Vec<u8>, seq: u64) -> zbus::Result<Message> {
        for k in 0..=self.fds.len() {
            let trial = self
                .fds
                .iter()
                .take(k)
                .map(|fd| fd.try_clone())
                .collect::<io::Result<Vec<OwnedFd>>>()?;
            match Replay::parse(bytes.clone(), trial, seq).await {
                Err(zbus::Error::MissingParameter(_)) if k < self.fds.len() => continue,
                Ok(msg) => {
                    self.fds.drain(..k);
                    return Ok(msg);
                }
                Err(e) => return Err(e),
            }
        }
        // Not reached: the last count tried (all pending descriptors) returns either way.
        Err(zbus::Error::MissingParameter("Missing file descriptors"))
    }
}

#[async_trait::async_trait]
impl ReadHalf for Reader {
    async fn receive_message(
        &mut self,
        seq: u64,
        already_received_bytes: &mut Vec<u8>,
        already_received_fds: &mut Vec<OwnedFd>,
    ) -> zbus::Result<Message> {
        // What the handshake read past its end belongs to the first messages.
        if !already_received_bytes.is_empty() {
            let mut first = std::mem::take(already_received_bytes);
            first.append(&mut self.pending);
            self.pending = first;
        }
        // Descriptors the handshake read belong to the first messages.
        for fd in std::mem::take(already_received_fds).into_iter().rev() {
            self.fds.push_front(fd);
        }
        loop {
            let msg = self.next_message(seq).await?;
            if self.hello_by.is_some() && screen::is_hello(&msg) {
                self.hello_by = None;
            }
            match screen::refusal(
                &msg,
                self.conn.cred,
                &self.peers,
                self.conn.replies.as_ref(),
            )
            .await?
            {
                None => return Ok(msg),
                Some(error) => {
                    self.conn.answer(&self.runtime, &error).await?;
                    // A client past its limit is read no faster than one refused call per
                    // REFUSAL_PACE: its refusals then come no faster than it can be expected to
                    // read them beside its replies, and refusing costs the bus little.
                    let over = error.header().error_name().map(|e| e.as_str())
                        == Some(replies::LIMITS_EXCEEDED);
                    if over {
                        self.runtime.sleep(replies::REFUSAL_PACE).await;
                    }
                }
            }
        }
    }

    async fn recvmsg(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        // Only the handshake reads through here, before any message.
        let take_fds = screen::may_own_daemon_name(self.conn.cred.uid);
        self.conn
            .io
            .read_with(|s| recv_some(s.as_fd(), buf, take_fds))
            .await
    }

    fn can_pass_unix_fd(&self) -> bool {
        true
    }

    async fn peer_credentials(&mut self) -> io::Result<ConnectionCredentials> {
        credentials(&self.conn).await
    }
}

/// The write half: whole messages under the connection's lock.
struct Writer {
    conn: Arc<Conn>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer").field("conn", &self.conn).finish()
    }
}

#[async_trait::async_trait]
impl WriteHalf for Writer {
    async fn send_message(&mut self, msg: &Message) -> zbus::Result<()> {
        self.conn.send(msg).await?;
        if let Some(replies) = &self.conn.replies
            && matches!(msg.message_type(), Type::MethodReturn | Type::Error)
        {
            screen::lock(replies).answered(msg);
        }
        Ok(())
    }

    async fn sendmsg(&mut self, buffer: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
        // The handshake's lines; messages go through `send_message`.
        let _whole = self.conn.write.lock().await;
        self.conn
            .io
            .write_with(|s| send_some(s.as_fd(), buffer, fds))
            .await
    }

    async fn close(&mut self) -> io::Result<()> {
        self.conn.io.get_ref().shutdown(std::net::Shutdown::Both)
    }

    fn can_pass_unix_fd(&self) -> bool {
        true
    }

    async fn peer_credentials(&mut self) -> io::Result<ConnectionCredentials> {
        credentials(&self.conn).await
    }
}

/// The credentials busd reports for a client (`GetConnectionCredentials`): its user and process,
/// and its groups, complete or absent as the D-Bus specification asks.
async fn credentials(conn: &Conn) -> io::Result<ConnectionCredentials> {
    let cred = conn.cred;
    let mut c = ConnectionCredentials::default()
        .set_unix_user_id(cred.uid)
        .set_process_id(cred.pid);
    // NSS may block (a file, a daemon, the network), so the lookup runs on a blocking thread.
    let groups = conn
        .groups
        .get_or_init(|| zruntime::unblock(move || groups_of(cred.uid, cred.gid)))
        .await;
    for g in groups.iter().flatten() {
        c = c.add_unix_group_id(*g);
    }
    Ok(c)
}

/// The primary and supplementary groups of `uid`, if its user is known.
fn groups_of(uid: u32, gid: u32) -> Option<Vec<u32>> {
    use nix::unistd::{Gid, Uid, User, getgrouplist};
    let user = User::from_uid(Uid::from_raw(uid)).ok().flatten()?;
    let name = std::ffi::CString::new(user.name).ok()?;
    let groups = getgrouplist(&name, Gid::from_raw(gid)).ok()?;
    Some(groups.into_iter().map(|g| g.as_raw()).collect())
}

/// A read half over the bytes of one message already in, so zbus's own message parsing (with its
/// checks of the header) builds the [`Message`].
#[derive(Debug)]
struct Replay {
    bytes: Vec<u8>,
    at: usize,
    fds: Vec<OwnedFd>,
}

impl Replay {
    /// The message in `bytes`, carrying `fds`.
    async fn parse(bytes: Vec<u8>, fds: Vec<OwnedFd>, seq: u64) -> zbus::Result<Message> {
        let mut replay = Replay { bytes, at: 0, fds };
        replay
            .receive_message(seq, &mut Vec::new(), &mut Vec::new())
            .await
    }
}

#[async_trait::async_trait]
impl ReadHalf for Replay {
    async fn recvmsg(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        let n = buf.len().min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok((n, std::mem::take(&mut self.fds)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(endian: u8, body: u32, fields: u32) -> [u8; PRIMARY_HEADER] {
        let mut h = [0u8; PRIMARY_HEADER];
        h[0] = endian;
        let (b, f) = if endian == b'l' {
            (body.to_le_bytes(), fields.to_le_bytes())
        } else {
            (body.to_be_bytes(), fields.to_be_bytes())
        };
        h[4..8].copy_from_slice(&b);
        h[12..16].copy_from_slice(&f);
        h
    }

    #[test]
    fn message_lengths_follow_the_primary_header() {
        assert_eq!(message_len(&head(b'l', 4, 5)).unwrap(), 24 + 4);
        assert_eq!(message_len(&head(b'B', 0, 8)).unwrap(), 24);
    }

    #[test]
    fn a_huge_announced_body_is_refused_before_it_arrives() {
        let e = message_len(&head(b'l', 120 << 20, 8)).unwrap_err();
        assert!(e.to_string().contains("limit of 1048576"), "{e}");
        assert!(message_len(&head(b'x', 0, 0)).is_err());
    }
}
