//! Fuzz target `uevent`: see `vgpu_manager_fuzz::uevent` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::uevent::check(data));
