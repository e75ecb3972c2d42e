//! Fuzz target `dra_input`: see `vgpu_manager_fuzz::dra_input` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::dra_input::check(data));
