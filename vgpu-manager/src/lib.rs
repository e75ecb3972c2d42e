//! vgpu-manager: profiles, matching and the admin CLI over the hardware boundary of `mdev-types`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backend;
pub mod cli;
pub mod daemon;
pub mod hook;
pub mod migration;
pub mod placement;
pub mod pool;
pub mod profile;
pub mod sched;
pub mod spelling;
mod toml_file;
