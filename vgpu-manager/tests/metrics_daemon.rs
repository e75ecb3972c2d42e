//! `vgpud --metrics-listen` and `vgpuctl metrics` on `--sim demo`, and a real Prometheus server
//! (Debian package `prometheus`: loopback only, a temporary data directory, a 1 s scrape interval)
//! scraping vgpud while a pool is applied, checked through Prometheus' HTTP API (`/api/v1/query`).
//! Without `prometheus` the test fails, unless `VGPU_TESTS_ALLOW_SKIP=1`: then it prints
//! `SKIPPED: <reason>`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbus_common::metrics::{free_port, get, listen_addr, require_binary};
use dbus_common::{Daemon, PATIENCE, ok, vgpuctl};

/// The lines of an exposition that two renders of one state share (not the process, the
/// durations, the reconcile time or the operations, which the calls in between may change).
fn host_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| {
            !["process_", "vgpu_operation", "vgpu_reconcile_last"]
                .iter()
                .any(|v| l.starts_with(v) || l.contains(&format!(" {v}")))
        })
        .collect()
}

async fn daemon_with_metrics(dir: &std::path::Path) -> (Daemon, SocketAddr) {
    let d = Daemon::embedded_with(
        dir,
        &dir.join("state"),
        &["--metrics-listen", "127.0.0.1:0"],
    )
    .await;
    let addr = listen_addr(&d);
    (d, addr)
}

#[tokio::test]
async fn vgpuctl_metrics_prints_what_the_listener_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (d, addr) = daemon_with_metrics(dir.path()).await;
    assert!(d.log().contains("serving metrics at http://127.0.0.1:"));
    let (status, headers, body) = tokio::task::spawn_blocking(move || get(addr, "/metrics", ""))
        .await
        .unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("Content-Type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert!(
        body.contains("vgpu_gpu_info{gpu=\"0000:01:00.0\""),
        "{body}"
    );
    let printed = ok(&vgpuctl(&d.bus, &["metrics"]).await);
    assert_eq!(host_lines(&printed), host_lines(&body));
    let om = ok(&vgpuctl(&d.bus, &["metrics", "--format", "openmetrics"]).await);
    assert!(om.ends_with("# EOF\n"), "{om}");
    let (_, headers, body) = tokio::task::spawn_blocking(move || {
        get(
            addr,
            "/metrics",
            "Accept: application/openmetrics-text; version=1.0.0\r\n",
        )
    })
    .await
    .unwrap();
    assert!(
        headers.contains("application/openmetrics-text"),
        "{headers}"
    );
    assert!(body.ends_with("# EOF\n"));
    let file = dir.path().join("vgpu.prom");
    ok(&vgpuctl(&d.bus, &["metrics", "--output", file.to_str().unwrap()]).await);
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("vgpu_type_available_instances{")
    );
    let (status, _, _) = tokio::task::spawn_blocking(move || get(addr, "/", ""))
        .await
        .unwrap();
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
}

#[tokio::test]
async fn without_metrics_listen_nothing_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::embedded(dir.path(), &dir.path().join("state")).await;
    assert!(!d.log().contains("serving metrics"), "{}", d.log());
    // Still readable over D-Bus.
    assert!(ok(&vgpuctl(&d.bus, &["metrics"]).await).contains("vgpud_build_info{version="));
}

/// A Prometheus server, killed (by pid) when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _data: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts `prometheus` scraping `target` every second, on a loopback port of its own.
    fn start(bin: &str, target: SocketAddr) -> Prometheus {
        let data = tempfile::tempdir().unwrap();
        let config = data.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: vgpud\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = std::fs::File::create(data.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus {
            child,
            addr,
            _data: data,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._data.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The value of instant query `q` (one series), or `None` while it has none.
    fn query(&self, q: &str) -> Option<f64> {
        let v = self.api(q)?;
        let result = v["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{q}: more than one series: {v}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// The JSON answer of instant query `q`, or `None` when Prometheus did not answer.
    fn api(&self, q: &str) -> Option<serde_json::Value> {
        let encoded: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect();
        let std::result::Result::Ok(mut s) = std::net::TcpStream::connect(self.addr) else {
            return None;
        };
        use std::io::{Read, Write};
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(
            s,
            "GET /api/v1/query?query={encoded} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        let body = raw.split_once("\r\n\r\n")?.1;
        // Go's server may answer chunked; the JSON object is between the first '{' and last '}'.
        let json = &body[body.find('{')?..=body.rfind('}')?];
        serde_json::from_str(json).ok()
    }

    /// Waits until `q` satisfies `pred`, returning its value; fails after a generous time.
    fn wait_for(&self, q: &str, pred: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self.query(q);
            if let Some(v) = v
                && pred(v)
            {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{q} is {v:?}, never what was expected; prometheus log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_vgpud_during_a_pool_apply() {
    let Some(bin) = require_binary("prometheus_scrapes_vgpud_during_a_pool_apply", "prometheus")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (d, addr) = daemon_with_metrics(dir.path()).await;
    let prom = Prometheus::start(bin, addr);
    let available = "sum(vgpu_type_available_instances)";
    let (prom, before) = tokio::task::spawn_blocking(move || {
        prom.wait_for("up{job=\"vgpud\"}", |v| v == 1.0);
        let before = prom.wait_for(available, |_| true);
        (prom, before)
    })
    .await
    .unwrap();
    let pool = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pools/vdi-mixed.toml"
    );
    ok(&vgpuctl(&d.bus, &["pool", "apply", pool]).await);
    tokio::task::spawn_blocking(move || {
        // The pool file asks for 8 + 4 slots.
        prom.wait_for("sum(vgpu_pool_slots_wanted)", |v| v == 12.0);
        prom.wait_for(
            "sum(vgpu_pool_slots{state=\"running\"}) - sum(vgpu_pool_slots_wanted)",
            |v| v == 0.0,
        );
        let after = prom.wait_for(available, |v| v < before);
        assert!(after < before, "available instances {before} → {after}");
        prom.wait_for("count(vgpu_instance_info{pool=\"vdi-mixed\"})", |v| {
            v == 12.0
        });
        prom.wait_for(
            "sum(vgpu_operations_total{op=\"pool_apply\",result=\"ok\"})",
            |v| v == 1.0,
        );
        // Prometheus read every sample it scraped (no parse error, none dropped).
        prom.wait_for("max(scrape_samples_scraped{job=\"vgpud\"})", |v| v > 100.0);
        assert_eq!(
            prom.query(
                "max_over_time(up{job=\"vgpud\"}[10m]) - min_over_time(up{job=\"vgpud\"}[10m])"
            ),
            Some(0.0)
        );
        // Every query of the shipped Grafana dashboard is valid PromQL with data behind it.
        let dash: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../data/grafana-vgpu.json"
            ))
            .unwrap(),
        )
        .unwrap();
        for panel in dash["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$job", ".*")
                    .replace("$__rate_interval", "1m");
                let v = prom.api(&expr).unwrap();
                assert_eq!(v["status"], "success", "{}: {expr}: {v}", panel["title"]);
                assert!(
                    !v["data"]["result"].as_array().unwrap().is_empty()
                        || expr.contains("result!=\"ok\"")
                        || expr.contains("scheduling_share")
                        || expr.contains("histogram_quantile"),
                    "{}: {expr} has no data: {v}",
                    panel["title"]
                );
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_non_loopback_address_is_served_and_logged_as_the_administrators_choice() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::embedded_with(
        dir.path(),
        &dir.path().join("state"),
        &["--metrics-listen", "0.0.0.0:0"],
    )
    .await;
    let addr = listen_addr(&d);
    assert!(addr.ip().is_unspecified(), "{addr}");
    let log = d.log();
    assert!(log.contains("non-loopback address"), "{log}");
    let local: SocketAddr = format!("127.0.0.1:{}", addr.port()).parse().unwrap();
    let (status, _, _) = tokio::task::spawn_blocking(move || get(local, "/metrics", ""))
        .await
        .unwrap();
    assert_eq!(status, "HTTP/1.1 200 OK");
}
