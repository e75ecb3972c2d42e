//! The listener of `vgpud --metrics-listen ADDR:PORT`: HTTP/1.x, `GET /metrics` only, one request
//! per connection, every resource a client can hold bounded ([`Limits`]). Any local user (or, on a
//! non-loopback address, anyone who reaches it) may connect, so nothing a client sends or fails to
//! read can hold more than its connection's slot and its time limits; the renders run on at most
//! [`Limits::max_rendering`] blocking threads, so scrapes never take the blocking pool the D-Bus
//! service's commands run on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::Format;

/// What bounds the listener's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are closed as they are accepted.
    pub max_connections: usize,
    /// The most bytes of a request's line and headers; a longer request is answered 431.
    pub max_request_bytes: usize,
    /// The time a client has to send its request line and headers, from connecting.
    pub request_timeout: Duration,
    /// The time a client has to read its response.
    pub response_timeout: Duration,
    /// Renders running at once (each on a blocking thread).
    pub max_rendering: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            max_request_bytes: 8 * 1024,
            request_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            max_rendering: 2,
        }
    }
}

/// Renders the exposition in a format (blocking: may read the host).
pub type Render = Arc<dyn Fn(Format) -> String + Send + Sync>;

/// Why the listener could not start.
#[derive(Debug, Error)]
pub enum HttpError {
    /// The address could not be bound.
    #[error(
        "cannot listen for metrics on {addr}: {source}; pick a free port or an address of this host for --metrics-listen"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

/// A bound listener, not yet serving.
#[derive(Debug)]
pub struct MetricsListener {
    listener: TcpListener,
}

impl MetricsListener {
    /// Binds `addr` (call inside the runtime).
    pub async fn bind(addr: SocketAddr) -> Result<MetricsListener, HttpError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind { addr, source })?;
        Ok(MetricsListener { listener })
    }

    /// The address it listens on (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves scrapes until the task is aborted.
    pub fn serve(self, render: Render, limits: Limits) -> tokio::task::JoinHandle<()> {
        tokio::spawn(accept_loop(self.listener, render, limits))
    }
}

async fn accept_loop(listener: TcpListener, render: Render, limits: Limits) {
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let rendering = Arc::new(Semaphore::new(limits.max_rendering));
    let mut last_warning: Option<tokio::time::Instant> = None;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: say so at most once a second and try again shortly.
                if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    warn!(error = %e, "metrics listener: accept failed; retrying");
                    last_warning = Some(tokio::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = connections.clone().try_acquire_owned() else {
            debug!(%peer, "metrics listener: connection limit reached; closed");
            drop(stream);
            continue;
        };
        let (render, rendering) = (render.clone(), rendering.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = serve_one(stream, &render, &rendering, &limits).await {
                debug!(%peer, error = %e, "metrics listener: connection ended");
            }
        });
    }
}

/// A request as far as the listener reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET /metrics` (a query string is ignored), with the `Accept` header's value.
    Metrics {
        /// The `Accept` header, if any.
        accept: Option<String>,
    },
    /// Another method: 405.
    WrongMethod,
    /// Another path: 404.
    NotFound,
    /// Not an HTTP/1.x request: 400.
    Malformed,
}

/// Parses a request's line and headers (everything before the blank line).
pub fn parse_request(head: &[u8]) -> Request {
    let Ok(text) = std::str::from_utf8(head) else {
        return Request::Malformed;
    };
    let mut lines = text.split("\r\n");
    let mut line = lines.next().unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (line.next(), line.next(), line.next(), line.next())
    else {
        return Request::Malformed;
    };
    if !version.starts_with("HTTP/1.") {
        return Request::Malformed;
    }
    if method != "GET" {
        return Request::WrongMethod;
    }
    if target.split('?').next() != Some("/metrics") {
        return Request::NotFound;
    }
    let accept = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("accept"))
        .map(|(_, v)| v.trim().to_string());
    Request::Metrics { accept }
}

/// Where a request's head ends (after its blank line), if it has.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

async fn serve_one(
    mut stream: TcpStream,
    render: &Render,
    rendering: &Arc<Semaphore>,
    limits: &Limits,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; limits.max_request_bytes];
    let mut have = 0;
    let read = tokio::time::timeout(limits.request_timeout, async {
        loop {
            if have == buf.len() {
                return Ok(None);
            }
            let n = stream.read(&mut buf[have..]).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed before the end of the request",
                ));
            }
            have += n;
            if let Some(end) = head_end(&buf[..have]) {
                return Ok(Some(end));
            }
        }
    })
    .await;
    let response = match read {
        Err(_) => simple(408, "Request Timeout", "the request took too long\n"),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(None)) => simple(
            431,
            "Request Header Fields Too Large",
            "the request is too large\n",
        ),
        Ok(Ok(Some(end))) => match parse_request(&buf[..end]) {
            Request::Metrics { accept } => {
                let format = Format::from_accept(accept.as_deref());
                let permit = rendering.clone().acquire_owned().await;
                let render = render.clone();
                let body = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    render(format)
                })
                .await;
                match body {
                    Ok(body) => {
                        let mut r = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            format.content_type(),
                            body.len()
                        )
                        .into_bytes();
                        r.extend_from_slice(body.as_bytes());
                        r
                    }
                    Err(e) => {
                        warn!(error = %e, "metrics render failed");
                        simple(
                            500,
                            "Internal Server Error",
                            "the metrics could not be rendered\n",
                        )
                    }
                }
            }
            Request::WrongMethod => {
                simple(405, "Method Not Allowed", "only GET /metrics is served\n")
            }
            Request::NotFound => simple(404, "Not Found", "only GET /metrics is served\n"),
            Request::Malformed => simple(400, "Bad Request", "not an HTTP/1.x request\n"),
        },
    };
    drop(buf);
    match tokio::time::timeout(limits.response_timeout, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await
    {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client did not read its response in time",
        )),
    }
}

/// A short plain-text response with `status`.
fn simple(status: u16, reason: &str, body: &str) -> Vec<u8> {
    let allow = if status == 405 { "Allow: GET\r\n" } else { "" };
    format!(
        "HTTP/1.1 {status} {reason}\r\n{allow}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_a_scrape() {
        assert_eq!(
            parse_request(
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nACCEPT: application/openmetrics-text\r\n\r\n"
            ),
            Request::Metrics {
                accept: Some("application/openmetrics-text".into())
            }
        );
        assert_eq!(
            parse_request(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Request::Metrics { accept: None }
        );
        assert_eq!(
            parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Request::WrongMethod
        );
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(
            parse_request(b"GET /metrics/x HTTP/1.1\r\n\r\n"),
            Request::NotFound
        );
        assert_eq!(parse_request(b"GET /metrics\r\n\r\n"), Request::Malformed);
        assert_eq!(
            parse_request(b"GET /metrics SPDY/3\r\n\r\n"),
            Request::Malformed
        );
        assert_eq!(parse_request(b"\xff\xfe"), Request::Malformed);
    }

    fn start(limits: Limits) -> (tokio::runtime::Runtime, SocketAddr) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let addr = rt.block_on(async {
            let l = MetricsListener::bind("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
            let addr = l.local_addr().unwrap();
            let render: Render = Arc::new(|f: Format| format!("up 1 {f}\n"));
            l.serve(render, limits);
            addr
        });
        (rt, addr)
    }

    fn exchange(addr: SocketAddr, req: &[u8]) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn scrapes_are_answered_and_everything_else_refused() {
        let (_rt, addr) = start(Limits::default());
        let ok = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.ends_with("\r\n\r\nup 1 prometheus\n"), "{ok}");
        let om = exchange(
            addr,
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
        );
        assert!(
            om.contains("application/openmetrics-text; version=1.0.0"),
            "{om}"
        );
        assert!(om.ends_with("up 1 openmetrics\n"), "{om}");
        let post = exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(
            post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET"),
            "{post}"
        );
        assert!(exchange(addr, b"GET /debug HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        let big = [b"GET /metrics HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 9000]].concat();
        assert!(exchange(addr, &big).starts_with("HTTP/1.1 431 "));
    }

    #[test]
    fn slow_and_silent_clients_are_cut_off_and_others_still_served() {
        let limits = Limits {
            max_connections: 4,
            request_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (_rt, addr) = start(limits);
        // Four connections that never send a request hold every slot for the request timeout.
        let idle: Vec<_> = (0..4)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        // A fifth is closed at once, without an answer.
        assert_eq!(exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n"), "");
        // The idle ones are answered 408 and closed; then scrapes work again.
        for s in idle {
            let mut s = s;
            let mut out = String::new();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let _ = std::io::Read::read_to_string(&mut s, &mut out);
            assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let r = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            if r.starts_with("HTTP/1.1 200 ") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never served again: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
