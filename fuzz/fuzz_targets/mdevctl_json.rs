//! Fuzz target `mdevctl_json`: see `vgpu_manager_fuzz::mdevctl_json` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::mdevctl_json::check(data));
