//! Fuzz target `libvirt_hook`: see `vgpu_manager_fuzz::libvirt_hook` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::libvirt_hook::check(data));
