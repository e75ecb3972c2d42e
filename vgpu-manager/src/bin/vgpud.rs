//! `vgpud`: the vgpu-manager daemon (being built).
fn main() {}
