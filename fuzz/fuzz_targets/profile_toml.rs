//! Fuzz target `profile_toml`: see `vgpu_manager_fuzz::profile_toml` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::profile_toml::check(data));
