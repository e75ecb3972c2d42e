//! A one-shot client's connection to vgpud's private socket that does not wait for the
//! authentication exchange before its first call.
//!
//! A D-Bus client authenticates before its first message (D-Bus specification, "Authentication
//! Protocol"): a NUL byte, `AUTH EXTERNAL` with its uid, the server's `OK <guid>`, then `BEGIN`.
//! zbus's own client writes its lines in one go but reads the server's `OK` before it sends its
//! first message: a round trip between the two processes that a one-shot `vgpuctl` pays on every
//! run, before the round trip of the call itself. This connection sends the lines, `BEGIN` and its
//! first message in one write, and takes the server's answer out of the first bytes it reads.
//!
//! The server at the other end is vgpud's private socket, whose handshake is zbus's server side: it
//! answers `AUTH` with one line and keeps the bytes that follow `BEGIN` in the same read for the
//! first message (zbus 6.2.1, `src/connection/handshake/server.rs`).
//!
//! What this gives up against [`crate::private::connect_private`]:
//! - a refusal shows at the first call instead of at connect: vgpud closes the connection of a
//!   user it does not serve without answering, and answers a failed authentication with
//!   `REJECTED`; either is an error of the call naming the private socket;
//! - no file descriptors pass (`NEGOTIATE_UNIX_FD` is not sent): no Manager1 method takes or
//!   returns any on the private socket;
//! - the connection's server GUID is one made up locally, since vgpud's is only learnt from its
//!   answer, after the connection is built.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use zbus::Connection;
use zbus::connection::socket::{ReadHalf, Socket, Split, WriteHalf};

use crate::{BusAddress, ClientError};

/// The longest answer line vgpud's handshake sends (`OK` and a 32-digit GUID, or `REJECTED` and
/// the mechanisms it offers), with room to spare; anything longer is not a D-Bus server.
const MAX_ANSWER: usize = 256;

/// Connects to vgpud's private socket at `path` for calls, authenticating as this process's
/// effective uid without waiting for the answer (see the module's documentation). Must run inside
/// a Tokio runtime. A socket nobody listens on fails here; a refusal by vgpud fails the first call.
pub async fn connect(path: &Path) -> Result<Connection, ClientError> {
    let failed = |source| ClientError::Connect {
        bus: BusAddress::Private(path.to_path_buf()).to_string(),
        source,
    };
    let io_failed = |e: io::Error| failed(zbus::Error::InputOutput(e.into()));
    let stream = std::os::unix::net::UnixStream::connect(path).map_err(io_failed)?;
    stream.set_nonblocking(true).map_err(io_failed)?;
    let stream = UnixStream::from_std(stream).map_err(io_failed)?;
    let uid = nix::unistd::geteuid().as_raw();
    let socket = Pipelined {
        stream,
        lines: auth_lines(uid),
    };
    zbus::connection::Builder::authenticated_socket(socket, zbus::Guid::generate())
        .p2p()
        .build()
        .await
        .map_err(failed)
}

/// What the client says before its first message: the NUL byte, `AUTH EXTERNAL` with `uid` in
/// decimal digits, hex-encoded (D-Bus specification, "EXTERNAL"), and `BEGIN`.
fn auth_lines(uid: u32) -> Vec<u8> {
    let hex: String = uid
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\0AUTH EXTERNAL {hex}\r\nBEGIN\r\n").into_bytes()
}

/// What the server's answer line says, once it is whole.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// More bytes are needed.
    Incomplete,
    /// `OK <guid>`: the bytes after the line belong to the first messages.
    Accepted {
        /// What was read past the line.
        rest: Vec<u8>,
    },
}

/// Reads the server's answer line from the start of `read`.
fn answer(read: &[u8]) -> io::Result<Answer> {
    let Some(end) = read.windows(2).position(|w| w == b"\r\n") else {
        if read.len() > MAX_ANSWER {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "vgpud's private socket answered the authentication with {} bytes without a line end: not a D-Bus server",
                    read.len()
                ),
            ));
        }
        return Ok(Answer::Incomplete);
    };
    let line = &read[..end];
    let guid_ok = |g: &[u8]| g.len() == 32 && g.iter().all(u8::is_ascii_hexdigit);
    match line.strip_prefix(b"OK ") {
        Some(guid) if guid_ok(guid) => Ok(Answer::Accepted {
            rest: read[end + 2..].to_vec(),
        }),
        _ => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "vgpud's private socket refused the authentication: it answered {:?} (set {}= to use the bus instead)",
                String::from_utf8_lossy(line),
                crate::private::PRIVATE_SOCKET_ENV
            ),
        )),
    }
}

/// The stream of a [`connect`]ed connection, with the lines still to send before the first message.
#[derive(Debug)]
struct Pipelined {
    stream: UnixStream,
    lines: Vec<u8>,
}

impl Socket for Pipelined {
    type ReadHalf = Reader;
    type WriteHalf = Writer;

    fn split(self) -> Split<Reader, Writer> {
        let (read, write) = self.stream.into_split();
        Split::new(
            Reader {
                read,
                answer: Some(Vec::new()),
                ahead: Vec::new(),
            },
            Writer {
                write,
                lines: Some(self.lines),
            },
        )
    }
}

/// The half zbus receives through: the server's answer line is taken out of what it reads first.
#[derive(Debug)]
struct Reader {
    read: OwnedReadHalf,
    /// Until the answer line is whole: what was read of it.
    answer: Option<Vec<u8>>,
    /// What was read past the answer line and not handed to zbus yet.
    ahead: Vec<u8>,
}

impl Reader {
    /// Reads until the answer line is whole and keeps what follows it.
    async fn read_answer(&mut self, mut read: Vec<u8>) -> io::Result<()> {
        let mut chunk = [0u8; MAX_ANSWER];
        loop {
            match answer(&read)? {
                Answer::Accepted { rest } => {
                    self.ahead = rest;
                    return Ok(());
                }
                Answer::Incomplete => {
                    let n = self.read.read(&mut chunk).await?;
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            format!(
                                "vgpud's private socket closed the connection without answering the authentication: it serves root and vgpud's own user only (set {}= to use the bus instead)",
                                crate::private::PRIVATE_SOCKET_ENV
                            ),
                        ));
                    }
                    read.extend_from_slice(&chunk[..n]);
                }
            }
        }
    }
}

#[async_trait]
impl ReadHalf for Reader {
    async fn recvmsg(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        if let Some(read) = self.answer.take() {
            self.read_answer(read).await?;
        }
        if !self.ahead.is_empty() {
            let n = buf.len().min(self.ahead.len());
            buf[..n].copy_from_slice(&self.ahead[..n]);
            self.ahead.drain(..n);
            return Ok((n, Vec::new()));
        }
        let n = self.read.read(buf).await?;
        Ok((n, Vec::new()))
    }

    fn can_pass_unix_fd(&self) -> bool {
        false
    }
}

/// The half zbus sends through: the authentication lines go out with the first message.
#[derive(Debug)]
struct Writer {
    write: OwnedWriteHalf,
    /// The lines not sent yet.
    lines: Option<Vec<u8>>,
}

#[async_trait]
impl WriteHalf for Writer {
    async fn sendmsg(&mut self, buffer: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
        if !fds.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a connection to vgpud's private socket passes no file descriptors",
            ));
        }
        if let Some(mut first) = self.lines.take() {
            first.extend_from_slice(buffer);
            self.write.write_all(&first).await?;
            return Ok(buffer.len());
        }
        self.write.write(buffer).await
    }

    async fn close(&mut self) -> io::Result<()> {
        self.write.shutdown().await
    }

    fn can_pass_unix_fd(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_name_the_uid_in_hex_digits_and_begin() {
        assert_eq!(auth_lines(0), b"\0AUTH EXTERNAL 30\r\nBEGIN\r\n");
        assert_eq!(auth_lines(1000), b"\0AUTH EXTERNAL 31303030\r\nBEGIN\r\n");
    }

    #[test]
    fn an_ok_line_is_taken_out_and_what_follows_kept() {
        let guid = "0123456789abcdef0123456789abcdef";
        assert_eq!(answer(b"").unwrap(), Answer::Incomplete);
        assert_eq!(answer(b"OK 0123").unwrap(), Answer::Incomplete);
        assert_eq!(
            answer(format!("OK {guid}\r\n").as_bytes()).unwrap(),
            Answer::Accepted { rest: Vec::new() }
        );
        assert_eq!(
            answer(format!("OK {guid}\r\nl\x02\0\x01").as_bytes()).unwrap(),
            Answer::Accepted {
                rest: b"l\x02\0\x01".to_vec()
            }
        );
    }

    #[test]
    fn a_refusal_or_garbage_is_an_error_that_names_the_way_out() {
        let e = answer(b"REJECTED EXTERNAL\r\n").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("REJECTED EXTERNAL"), "{e}");
        assert!(e.to_string().contains("VGPU_PRIVATE_SOCKET="), "{e}");
        // An OK without a well-formed GUID is no OK.
        assert!(answer(b"OK 12\r\n").is_err());
        let long = vec![b'x'; MAX_ANSWER + 1];
        assert_eq!(
            answer(&long).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
