//! The pipelined connection to vgpud's private socket (`vgpu_client::private::connect_pipelined`)
//! against servers on a real unix socket: zbus's own server handshake, which vgpud's private socket
//! runs, serves its calls; a raw server sees the first call arrive before it has answered the
//! authentication; a refused or unanswered authentication fails the first call with an error that
//! says how to take the bus instead. vgpud itself is tested through vgpu-manager's
//! `tests/private_socket.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use common::Refusal;
use vgpu_client::{BusAddress, Client, ClientError, MANAGER_PATH, private};
use zbus::{connection, interface};

const KNOWN: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";

/// A Manager1 that knows one UUID and has a Version.
struct Scripted;

#[interface(name = "org.vgpumanager.Manager1")]
impl Scripted {
    #[zbus(property)]
    async fn version(&self) -> String {
        "scripted 1".into()
    }

    async fn destroy(&self, uuid: &str) -> Result<(), Refusal> {
        if uuid == KNOWN {
            Ok(())
        } else {
            Err(Refusal::NotFound(format!("no instance {uuid}")))
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A client of the pipelined connection to `path`.
async fn pipelined_client(path: &Path) -> Result<Client, ClientError> {
    let conn = private::connect_pipelined(path).await?;
    Client::with_connection(conn, &BusAddress::Private(path.to_path_buf())).await
}

#[test]
fn zbus_server_handshake_serves_pipelined_calls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("private");
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let rt = runtime();
        rt.block_on(async {
            // Two clients in turn, each with several calls.
            for _ in 0..2 {
                let (stream, _) = listener.accept().unwrap();
                let conn = connection::Builder::unix_stream(stream)
                    .server(zbus::Guid::generate())
                    .p2p()
                    .serve_at(MANAGER_PATH, Scripted)
                    .build()
                    .await
                    .unwrap();
                conn.closed().await;
            }
        })
    });
    let rt = runtime();
    rt.block_on(async {
        for _ in 0..2 {
            let client = pipelined_client(&path).await.unwrap();
            assert_eq!(client.version().await.unwrap(), "scripted 1");
            client.destroy(KNOWN).await.unwrap();
            match client.destroy("00000000-0000-0000-0000-000000000001").await {
                Err(ClientError::Daemon { kind, message }) => {
                    assert_eq!(kind, "NotFound");
                    assert!(message.contains("no instance"), "{message}");
                }
                other => panic!("a refusal of the daemon's, not {other:?}"),
            }
            assert_eq!(client.version().await.unwrap(), "scripted 1");
        }
    });
    server.join().unwrap();
}

/// A raw server on `path`: reads until `done` says what it read is enough (or 10 s pass), then
/// writes `answer` and closes. Returns what it read.
fn raw_server(
    path: &Path,
    done: fn(&[u8]) -> bool,
    answer: &'static [u8],
) -> std::thread::JoinHandle<Vec<u8>> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut read = Vec::new();
        let mut buf = [0u8; 4096];
        while !done(&read) && Instant::now() < deadline {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => read.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("raw server read: {e}"),
            }
        }
        let _ = s.write_all(answer);
        read
    })
}

/// Where `BEGIN` ends in `read`, if it is there.
fn after_begin(read: &[u8]) -> Option<usize> {
    read.windows(7)
        .position(|w| w == b"BEGIN\r\n")
        .map(|i| i + 7)
}

/// The D-Bus specification's fixed message header is 16 bytes.
fn holds_a_message_header(read: &[u8]) -> bool {
    after_begin(read).is_some_and(|end| read.len() >= end + 16)
}

#[test]
fn the_first_call_leaves_before_the_server_answers_the_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("private");
    // The server answers nothing until a whole message header has followed BEGIN: a client that
    // waited for the answer before its first call would never send it.
    let server = raw_server(&path, holds_a_message_header, b"");
    let rt = runtime();
    let result = rt.block_on(async {
        let client = pipelined_client(&path).await?;
        client.version().await
    });
    assert!(result.is_err(), "the raw server answers no call");
    let read = server.join().unwrap();
    assert!(
        read.starts_with(b"\0AUTH EXTERNAL "),
        "the connection starts with the authentication: {:?}",
        String::from_utf8_lossy(&read)
    );
    assert!(
        holds_a_message_header(&read),
        "the call followed BEGIN without waiting for the server: {:?}",
        String::from_utf8_lossy(&read)
    );
    let end = after_begin(&read).unwrap();
    assert_eq!(
        read[end], b'l',
        "a little-endian D-Bus message follows BEGIN"
    );
    assert_eq!(read[end + 1], 1, "and it is a method call");
}

/// The error of the first call on a pipelined connection to a server answering `answer`.
fn first_call_error(answer: &'static [u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("private");
    let server = raw_server(&path, holds_a_message_header, answer);
    let rt = runtime();
    let result = rt.block_on(async {
        let client = pipelined_client(&path).await?;
        client.version().await
    });
    server.join().unwrap();
    match result {
        Ok(v) => panic!("a server answering {answer:?} served a call: {v}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_refused_authentication_fails_the_first_call_naming_the_way_to_the_bus() {
    let e = first_call_error(b"REJECTED EXTERNAL\r\n");
    assert!(e.contains("refused the authentication"), "{e}");
    assert!(e.contains("REJECTED EXTERNAL"), "{e}");
    assert!(e.contains("VGPU_PRIVATE_SOCKET="), "{e}");
}

#[test]
fn a_connection_closed_without_an_answer_fails_the_first_call_naming_why() {
    let e = first_call_error(b"");
    assert!(e.contains("without answering the authentication"), "{e}");
    assert!(e.contains("VGPU_PRIVATE_SOCKET="), "{e}");
}

#[test]
fn a_socket_nobody_listens_on_fails_at_connect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("private");
    drop(UnixListener::bind(&path).unwrap());
    let rt = runtime();
    match rt.block_on(private::connect_pipelined(&path)) {
        Err(ClientError::Connect { bus, .. }) => assert!(bus.contains("private"), "{bus}"),
        other => panic!("a connect error, not {other:?}"),
    }
}
