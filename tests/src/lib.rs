//! Shared helpers for vgpu-manager's cross-crate integration tests and the real-kernel suite.

pub mod kernel;
