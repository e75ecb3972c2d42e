//! Fuzz target `sysfs_attr`: see `vgpu_manager_fuzz::sysfs_attr` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::sysfs_attr::check(data));
