//! The daemon `vgpud`: one internal command type ([`api::Command`]) executed by [`engine::Core`] over the
//! hardware boundary, with persistent desired state ([`store`]) and a reconcile planner ([`reconcile`]).
//! Transports (D-Bus) are thin adapters in [`dbus`].

pub mod api;
pub mod dbus;
pub mod engine;
pub mod exec;
pub mod fd_budget;
pub mod log_filter;
pub mod mdevctl_dir;
pub mod metrics;
pub mod pool_files;
pub mod reconcile;
pub mod store;
