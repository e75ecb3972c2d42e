//! Fuzz target `dbus_args`: see `vgpu_manager_fuzz::dbus_args` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::dbus_args::check(data));
