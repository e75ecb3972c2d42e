//! Helpers of the metrics tests: the listener's address from vgpud's log, a plain HTTP GET, and
//! the `prometheus`/`promtool` binaries (Debian package `prometheus`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{Daemon, PATIENCE};

/// The address `vgpud --metrics-listen 127.0.0.1:0` bound, from its log line "serving metrics at
/// http://ADDR/metrics".
pub fn listen_addr(d: &Daemon) -> SocketAddr {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let log = d.log();
        if let Some(addr) = log
            .split("serving metrics at http://")
            .nth(1)
            .and_then(|rest| rest.split("/metrics").next())
            .and_then(|a| a.parse().ok())
        {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "vgpud never said where it serves metrics:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `GET path` with optional extra header lines: (status line, headers, body).
pub fn get(addr: SocketAddr, path: &str, headers: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// A free loopback port (bound and released: another process could take it in between, which on a
/// test machine does not happen in practice).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `bin` when it runs (`bin --version`); else the test fails naming the Debian package, unless
/// `VGPU_TESTS_ALLOW_SKIP=1`: then `None` after a SKIPPED line on stderr.
pub fn require_binary(test: &str, bin: &'static str) -> Option<&'static str> {
    let runs = std::process::Command::new(bin)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if runs {
        return Some(bin);
    }
    let why = format!("{bin} is not installed (Debian package prometheus; .ci/run installs it)");
    if std::env::var("VGPU_TESTS_ALLOW_SKIP").as_deref() == Ok("1") {
        eprintln!("SKIPPED: {test}: {why}; VGPU_TESTS_ALLOW_SKIP=1 allowed the skip");
        return None;
    }
    panic!("{test}: {why}. Install it (apt-get install prometheus) or set VGPU_TESTS_ALLOW_SKIP=1");
}
