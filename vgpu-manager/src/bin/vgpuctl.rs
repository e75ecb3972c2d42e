//! `vgpuctl`: the admin CLI.
fn main() {}
