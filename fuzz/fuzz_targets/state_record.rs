//! Fuzz target `state_record`: see `vgpu_manager_fuzz::state_record` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::state_record::check(data));
