//! Attackers of the system-bus suite that a zbus connection cannot play: connections that never
//! authenticate or announce bodies they never send, and method calls carrying file descriptors that
//! their body does not mention (the D-Bus specification's `UNIX_FDS` header field counts the
//! descriptors that come with a message; nothing makes the body refer to them).
//!
//! Like [`super::flood`], an attacker is the test binary run again as uid 65534 ([`spawn`]); its test
//! named `attacker` calls [`attacker_main`], which does nothing without [`ROLE_VAR`]. Each prints one
//! `TALLY <json>` line that [`super::flood::tally`] reads.

use std::collections::BTreeMap;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
use serde::{Deserialize, Serialize};
use zbus::message::Message;

use super::PATIENCE;
use super::system_bus::NOBODY;

/// The environment variable that makes a test binary one of these attackers.
pub const ROLE_VAR: &str = "VGPU_SYSBUS_ROLE";
/// The bus socket the attacker connects to.
const SOCKET_VAR: &str = "VGPU_SYSBUS_SOCKET";

/// What an attacker does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Raw {
    /// Opens `connections` connections and holds them for `hold` seconds, never authenticating
    /// (`authenticate` false) or authenticated with SASL EXTERNAL and `Hello` (true), then counts
    /// how many the bus closed meanwhile: `held`, `closed` and `refused` (the connect itself failed).
    Idle {
        /// How many connections.
        connections: usize,
        /// Whether each completes the handshake and says Hello.
        authenticate: bool,
        /// Seconds to hold them.
        hold: u64,
    },
    /// On each of `connections` authenticated connections, sends the primary header of a message
    /// announcing a body of `announced` bytes and 4 KiB of it, holds them for `hold` seconds, then
    /// counts `held` and `closed`.
    Announce {
        /// How many connections.
        connections: usize,
        /// The announced body length.
        announced: u32,
        /// Seconds to hold them.
        hold: u64,
    },
    /// On each of `connections` connections, `count` pipelined calls of `interface.member` on `path`
    /// at `destination` with the string argument `arg` (or none), each carrying `fds` descriptors of
    /// /dev/null that the body does not mention; the answers of all are tallied by error name (`ok`
    /// for a reply, `unanswered`, and `disconnected` for those still due when the bus closed the
    /// connection).
    Calls {
        /// How many connections.
        connections: usize,
        /// The called object.
        path: String,
        /// The called interface.
        interface: String,
        /// The called method.
        member: String,
        /// The bus name called.
        destination: String,
        /// The one string argument, if any.
        arg: Option<String>,
        /// How many calls.
        count: usize,
        /// Descriptors per call.
        fds: usize,
    },
}

impl Raw {
    /// `count` calls of vgpud's `Manager1.member` on one connection, each carrying `fds` descriptors.
    pub fn manager_fds(member: &str, arg: Option<&str>, count: usize, fds: usize) -> Raw {
        Raw::Calls {
            connections: 1,
            path: vgpu_client::MANAGER_PATH.into(),
            interface: "org.vgpumanager.Manager1".into(),
            member: member.into(),
            destination: vgpu_client::SERVICE.into(),
            arg: arg.map(str::to_string),
            count,
            fds,
        }
    }
}

impl Raw {
    /// The same calls on each of `n` connections.
    pub fn on_connections(mut self, n: usize) -> Raw {
        if let Raw::Calls { connections, .. } = &mut self {
            *connections = n;
        }
        self
    }
}

/// Starts this test binary as uid 65534 running `attack` against the bus socket `socket`.
pub fn spawn(socket: &str, attack: &Raw) -> Child {
    super::flood::spawn_attacker(
        (ROLE_VAR, &serde_json::to_string(attack).unwrap()),
        (SOCKET_VAR, socket),
    )
}

/// The socket file of a `unix:path=` bus address.
pub fn socket_of(bus: &str) -> String {
    bus.split(',')
        .next()
        .and_then(|a| a.strip_prefix("unix:path="))
        .expect("a unix:path= bus address")
        .to_string()
}

/// The body of the test named `attacker` (with [`super::flood::attacker_main`]): without
/// [`ROLE_VAR`] it has nothing to do.
pub fn attacker_main() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    assert_eq!(nix::unistd::getuid().as_raw(), NOBODY);
    let attack: Raw = serde_json::from_str(&role).unwrap();
    let socket = std::env::var(SOCKET_VAR).unwrap();
    let tally = match attack {
        Raw::Idle {
            connections,
            authenticate,
            hold,
        } => idle(&socket, connections, authenticate, hold),
        Raw::Announce {
            connections,
            announced,
            hold,
        } => announce(&socket, connections, announced, hold),
        Raw::Calls { connections, .. } => {
            // Connected one after the other (the bus closes the oldest of more than
            // max_incomplete_connections still authenticating), then all sending at once.
            let attack = std::sync::Arc::new(attack);
            let socks: Vec<std::io::Result<UnixStream>> =
                (0..connections).map(|_| connect(&socket)).collect();
            let each: Vec<_> = socks
                .into_iter()
                .map(|s| {
                    let attack = attack.clone();
                    std::thread::spawn(move || calls(s, &attack))
                })
                .collect();
            let mut tally = BTreeMap::new();
            for t in each {
                for (k, v) in t.join().unwrap() {
                    *tally.entry(k).or_default() += v;
                }
            }
            tally
        }
    };
    println!("TALLY {}", serde_json::to_string(&tally).unwrap());
}

/// SASL EXTERNAL as our own uid, with descriptor passing, then `BEGIN` (D-Bus specification,
/// "Authentication Protocol").
fn authenticate(s: &mut UnixStream) -> std::io::Result<()> {
    let uid: String = nix::unistd::getuid()
        .as_raw()
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    s.write_all(format!("\0AUTH EXTERNAL {uid}\r\n").as_bytes())?;
    expect_line(s, "OK ")?;
    s.write_all(b"NEGOTIATE_UNIX_FD\r\n")?;
    expect_line(s, "AGREE_UNIX_FD")?;
    s.write_all(b"BEGIN\r\n")
}

fn expect_line(s: &mut UnixStream, want: &str) -> std::io::Result<()> {
    let mut line = Vec::new();
    let mut b = [0u8];
    while !line.ends_with(b"\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        line.push(b[0]);
    }
    let line = String::from_utf8_lossy(&line);
    if line.starts_with(want) {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("expected {want}: {line}")))
    }
}

/// `Hello`, the first message of every bus connection.
fn hello() -> Message {
    Message::method_call("/org/freedesktop/DBus", "Hello")
        .destination("org.freedesktop.DBus")
        .interface("org.freedesktop.DBus")
        .build(&())
        .unwrap()
}

/// Holds `socks` for `hold` seconds, then counts those the bus closed.
fn hold_and_count(socks: Vec<UnixStream>, refused: usize, hold: u64) -> BTreeMap<String, usize> {
    std::thread::sleep(Duration::from_secs(hold));
    let mut t = BTreeMap::from([
        ("held".to_string(), 0),
        ("closed".to_string(), 0),
        ("refused".to_string(), refused),
    ]);
    for mut s in socks {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        *t.entry(if closed { "closed" } else { "held" }.into())
            .or_default() += 1;
    }
    t
}

fn idle(
    socket: &str,
    connections: usize,
    authenticated: bool,
    hold: u64,
) -> BTreeMap<String, usize> {
    let (mut socks, mut refused) = (Vec::new(), 0);
    for _ in 0..connections {
        let s = UnixStream::connect(socket).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            if authenticated {
                authenticate(&mut s)?;
                s.write_all(&hello().data()[..])?;
            }
            Ok(s)
        });
        match s {
            Ok(s) => socks.push(s),
            Err(_) => refused += 1,
        }
    }
    hold_and_count(socks, refused, hold)
}

fn announce(
    socket: &str,
    connections: usize,
    announced: u32,
    hold: u64,
) -> BTreeMap<String, usize> {
    let (mut socks, mut refused) = (Vec::new(), 0);
    for i in 0..connections {
        let s = UnixStream::connect(socket).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            authenticate(&mut s)?;
            s.write_all(&hello().data()[..])?;
            // A method call's primary header (D-Bus specification, "Message Format"): endianness,
            // type 1, no flags, version 1, the body length, a serial, an empty header-field array.
            let mut header = vec![b'l', 1, 0, 1];
            header.extend_from_slice(&announced.to_le_bytes());
            header.extend_from_slice(&(i as u32 + 2).to_le_bytes());
            header.extend_from_slice(&0u32.to_le_bytes());
            s.write_all(&header)?;
            s.write_all(&[0u8; 4096])?;
            Ok(s)
        });
        match s {
            Ok(s) => socks.push(s),
            Err(_) => refused += 1,
        }
    }
    hold_and_count(socks, refused, hold)
}

/// `msg`'s bytes with a `UNIX_FDS` header field of `n` added (header field 9, type `u`; D-Bus
/// specification, "Message Format"). zbus writes the fields first and pads them to 8 bytes before
/// the body, and a field is an 8-aligned structure: the new one goes where the padding began.
fn with_unix_fds(msg: &Message, n: u32) -> Vec<u8> {
    let mut bytes = msg.data()[..].to_vec();
    assert_eq!(bytes[0], b'l', "zbus writes little-endian here");
    let fields_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let body_start = (16 + fields_len).div_ceil(8) * 8;
    let mut field = vec![9u8, 1, b'u', 0];
    field.extend_from_slice(&n.to_le_bytes());
    bytes.splice(body_start..body_start, field);
    let new_len = (body_start + 8 - 16) as u32;
    bytes[12..16].copy_from_slice(&new_len.to_le_bytes());
    bytes
}

/// An authenticated connection that has said Hello.
fn connect(socket: &str) -> std::io::Result<UnixStream> {
    let mut s = UnixStream::connect(socket)?;
    authenticate(&mut s)?;
    s.write_all(&hello().data()[..])?;
    Ok(s)
}

/// One message of a byte stream: its reply serial and error name, if any.
struct Answer {
    reply_serial: Option<u32>,
    error: Option<String>,
}

/// Reads one little- or big-endian message from `s` and picks the two header fields a tally needs.
fn read_answer(s: &mut UnixStream) -> std::io::Result<Answer> {
    let mut primary = [0u8; 16];
    s.read_exact(&mut primary)?;
    let le = primary[0] == b'l';
    let u32_at = |b: &[u8], at: usize| {
        let a: [u8; 4] = b[at..at + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let body_len = u32_at(&primary, 4) as usize;
    let fields_len = u32_at(&primary, 12) as usize;
    let total = (16 + fields_len).div_ceil(8) * 8 + body_len;
    let mut msg = primary.to_vec();
    msg.resize(total, 0);
    s.read_exact(&mut msg[16..])?;
    let (mut reply_serial, mut error) = (None, None);
    let mut at = 16;
    let end = 16 + fields_len;
    while at < end {
        at = at.div_ceil(8) * 8;
        let code = msg[at];
        let sig_len = msg[at + 1] as usize;
        let sig = msg[at + 2];
        at += 2 + sig_len + 1;
        match sig {
            b'u' => {
                at = at.div_ceil(4) * 4;
                if code == 5 {
                    reply_serial = Some(u32_at(&msg, at));
                }
                at += 4;
            }
            b's' | b'o' => {
                at = at.div_ceil(4) * 4;
                let len = u32_at(&msg, at) as usize;
                if code == 4 {
                    error = Some(String::from_utf8_lossy(&msg[at + 4..at + 4 + len]).into_owned());
                }
                at += 4 + len + 1;
            }
            b'g' => {
                let len = msg[at] as usize;
                at += 1 + len + 1;
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "unexpected header field type {other}"
                )));
            }
        }
    }
    Ok(Answer {
        reply_serial,
        error,
    })
}

/// One connection's part of [`Raw::Calls`].
fn calls(s: std::io::Result<UnixStream>, attack: &Raw) -> BTreeMap<String, usize> {
    let Raw::Calls {
        path,
        interface,
        member,
        destination,
        arg,
        count,
        fds,
        ..
    } = attack
    else {
        unreachable!()
    };
    let Ok(mut s) = s else {
        return BTreeMap::from([("refused".to_string(), *count)]);
    };
    let nulls: Vec<OwnedFd> = (0..*fds)
        .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
        .collect();
    let raw: Vec<RawFd> = nulls.iter().map(|f| f.as_raw_fd()).collect();
    let calls: Vec<(u32, Vec<u8>)> = (0..*count)
        .map(|_| {
            let b = Message::method_call(path.as_str(), member.as_str())
                .interface(interface.as_str())
                .destination(destination.as_str());
            let msg = match arg {
                Some(a) => b.build(&(a.as_str(),)),
                None => b.build(&()),
            }
            .unwrap();
            let bytes = match *fds {
                0 => msg.data()[..].to_vec(),
                n => with_unix_fds(&msg, n as u32),
            };
            (msg.primary_header().serial_num().get(), bytes)
        })
        .collect();
    let expected: std::collections::HashSet<u32> = calls.iter().map(|(s, _)| *s).collect();
    let count = *count;
    // Answers are read on a thread of their own while the calls go out.
    let mut reader = s.try_clone().unwrap();
    let read = std::thread::spawn(move || {
        let deadline = Instant::now() + PATIENCE;
        let mut tally: BTreeMap<String, usize> = BTreeMap::new();
        let mut answered = 0;
        let mut disconnected = false;
        while answered < count {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            reader.set_read_timeout(Some(left)).unwrap();
            let a = match read_answer(&mut reader) {
                Ok(a) => a,
                Err(e) => {
                    use std::io::ErrorKind::{ConnectionReset, UnexpectedEof};
                    disconnected = matches!(e.kind(), UnexpectedEof | ConnectionReset);
                    if !disconnected {
                        eprintln!("the attacker stops reading: {e}");
                    }
                    break;
                }
            };
            if !a.reply_serial.is_some_and(|s| expected.contains(&s)) {
                continue;
            }
            *tally
                .entry(a.error.unwrap_or_else(|| "ok".into()))
                .or_default() += 1;
            answered += 1;
        }
        if answered < count {
            let key = if disconnected {
                "disconnected"
            } else {
                "unanswered"
            };
            tally.insert(key.into(), count - answered);
        }
        tally
    });
    let sock = s.as_raw_fd();
    for (_, bytes) in &calls {
        let with_fds = [ControlMessage::ScmRights(&raw)];
        let cmsg: &[ControlMessage] = if raw.is_empty() { &[] } else { &with_fds };
        let sent = match sendmsg::<UnixAddr>(
            sock,
            &[IoSlice::new(bytes)],
            cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => n,
            // The bus closed the connection: what is still due is counted by the reader.
            Err(_) => break,
        };
        if sent < bytes.len() && s.write_all(&bytes[sent..]).is_err() {
            break;
        }
    }
    read.join().unwrap()
}

/// Samples a process's descriptor count every 2 ms on a thread of its own, to catch the peaks that
/// the slower sampling of [`super::flood::observe`] misses.
pub struct FdSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl FdSampler {
    /// Starts sampling process `pid`.
    pub fn start(pid: nix::unistd::Pid) -> FdSampler {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !stopped.load(Ordering::Relaxed) {
                if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                    most = most.max(d.count());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        });
        FdSampler { stop, thread }
    }

    /// Stops and returns the most descriptors seen.
    pub fn most(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Sets process `pid`'s open-file limit to `n` (soft and hard) with util-linux's `prlimit`.
pub fn set_nofile(pid: nix::unistd::Pid, n: u64) {
    let status = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={n}:{n}"))
        .status()
        .expect("prlimit (Debian package util-linux) must be installed");
    assert!(
        status.success(),
        "prlimit --pid={pid} --nofile={n}:{n} failed: {status}"
    );
}
