//! The floor under `ListInstances`: what the same reply costs on the same bus with no daemon behind
//! it. The bench starts itself again as a bare zbus server (its own process, like vgpud) that fetched
//! the daemon's 1,000 rows once and answers:
//! - `Rows`: those rows, serialized by zbus on every call, as any zbus service would;
//! - `Blob`: a byte array as long as the serialized rows, so only the bytes travel (no row encoding,
//!   and nothing for a bus to check inside).
//!
//! and on the client side the rows are also decoded borrowed (`&str` into the reply) next to owned.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use vgpu_client::InstanceInfo;
use zbus::Type;
use zbus::wire::{Endian, serialized::Context, to_bytes};

use super::{ms, percentile};

const BUS_ENV: &str = "VGPU_BENCH_FLOOR_BUS";
const NAME: &str = "org.vgpumanager.BenchFloor";
const PATH: &str = "/org/vgpumanager/BenchFloor";
const ROUNDS: usize = 300;

struct Floor {
    rows: Arc<Vec<InstanceInfo>>,
    blob: Vec<u8>,
}

#[zbus::interface(name = "org.vgpumanager.BenchFloor")]
impl Floor {
    fn rows(&self) -> Arc<Vec<InstanceInfo>> {
        Arc::clone(&self.rows)
    }

    fn blob(&self) -> Vec<u8> {
        self.blob.clone()
    }
}

/// A row decoded without copying its strings out of the reply.
#[derive(Deserialize, Type)]
struct BorrowedRow<'a> {
    uuid: &'a str,
    gpu: &'a str,
    parent: &'a str,
    type_id: &'a str,
    profile: &'a str,
    state: &'a str,
    defined: bool,
    autostart: bool,
    owner: &'a str,
    label: &'a str,
    iommu_group: i32,
    created_at: u64,
}

impl BorrowedRow<'_> {
    /// Same content as the owned decoding of the same row.
    fn matches(&self, o: &InstanceInfo) -> bool {
        (
            self.uuid,
            self.gpu,
            self.parent,
            self.type_id,
            self.profile,
            self.state,
            self.owner,
            self.label,
        ) == (
            o.uuid.as_str(),
            o.gpu.as_str(),
            o.parent.as_str(),
            o.type_id.as_str(),
            o.profile.as_str(),
            o.state.as_str(),
            o.owner.as_str(),
            o.label.as_str(),
        ) && (
            self.defined,
            self.autostart,
            self.iommu_group,
            self.created_at,
        ) == (o.defined, o.autostart, o.iommu_group, o.created_at)
    }
}

/// When started as the floor server (by [`compare`]), serves until killed and returns true.
pub fn serve_if_asked() -> bool {
    let Ok(bus) = std::env::var(BUS_ENV) else {
        return false;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = zbus::connection::Builder::address(bus.as_str())
            .build()
            .await
            .unwrap();
        let rows = vgpu_client::Manager1Proxy::new(&conn)
            .await
            .unwrap()
            .list_instances()
            .await
            .unwrap();
        let len = to_bytes(Context::new(Endian::native(), 0), &rows)
            .unwrap()
            .len();
        let floor = Floor {
            rows: Arc::new(rows),
            blob: vec![7; len],
        };
        conn.object_server().at(PATH, floor).await.unwrap();
        conn.request_name(NAME).await.unwrap();
        std::future::pending::<()>().await;
    });
    true
}

async fn call(conn: &zbus::Connection, method: &str) -> zbus::message::Message {
    conn.call_method(
        Some(NAME),
        PATH,
        Some("org.vgpumanager.BenchFloor"),
        method,
        &(),
    )
    .await
    .unwrap()
}

/// Starts the floor server on the bus `conn` is on and prints its numbers.
pub async fn compare(conn: &zbus::Connection, bus: &str) {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(BUS_ENV, bus)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _server = super::Vgpud(child);
    let dbus = zbus::fdo::DBusProxy::new(conn).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while dbus.name_has_owner(NAME.try_into().unwrap()).await != Ok(true) {
        assert!(Instant::now() < deadline, "the floor server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let peer = zbus::fdo::PeerProxy::builder(conn)
        .destination(NAME)
        .path(PATH)
        .build()
        .await
        .unwrap();
    let (mut ping, mut blob, mut rows, mut owned, mut borrowed) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        peer.ping().await.unwrap();
        ping.push(t.elapsed());
        let t = Instant::now();
        let _ = call(conn, "Blob").await;
        blob.push(t.elapsed());
        let t = Instant::now();
        let reply = call(conn, "Rows").await;
        rows.push(t.elapsed());
        let t = Instant::now();
        let list: Vec<InstanceInfo> = reply.body().deserialize().unwrap();
        owned.push(t.elapsed());
        assert_eq!(list.len(), super::N);
        let t = Instant::now();
        let body = reply.body();
        let rows: Vec<BorrowedRow<'_>> = body.deserialize().unwrap();
        borrowed.push(t.elapsed());
        assert!(rows.len() == list.len() && rows.iter().zip(&list).all(|(b, o)| b.matches(o)));
    }
    for v in [&mut ping, &mut blob, &mut rows, &mut owned, &mut borrowed] {
        v.sort();
    }
    let p = |v: &[Duration]| (ms(percentile(v, 0.5)), ms(percentile(v, 0.99)));
    let ((p50, p99), (b50, b99), (r50, r99)) = (p(&ping), p(&blob), p(&rows));
    println!("  floor: a bare zbus server in its own process, same bus, same rows");
    println!("    Peer.Ping               p50 {p50:>7.3} ms  p99 {p99:>7.3} ms");
    println!(
        "    same bytes as one ay    p50 {b50:>7.3} ms  p99 {b99:>7.3} ms  = p99 {:.2}x Ping",
        b99 / p99
    );
    println!(
        "    same rows, reply in     p50 {r50:>7.3} ms  p99 {r99:>7.3} ms  = p99 {:.2}x Ping",
        r99 / p99
    );
    println!(
        "    decoding them: owned p50 {:.3} ms, borrowed p50 {:.3} ms",
        p(&owned).0,
        p(&borrowed).0
    );
}
