//! Fuzz target `pool_toml`: see `vgpu_manager_fuzz::pool_toml` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::pool_toml::check(data));
