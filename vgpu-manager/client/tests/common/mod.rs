//! What the client crate's tests that serve a scripted Manager1 share.

/// The daemon's refusals, named as the daemon names them (`org.vgpumanager.Error.<Kind>`).
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.vgpumanager.Error")]
pub enum Refusal {
    #[zbus(error)]
    ZBus(zbus::Error),
    NotFound(String),
}
