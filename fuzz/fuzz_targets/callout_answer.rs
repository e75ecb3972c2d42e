//! Fuzz target `callout_answer`: see `vgpu_manager_fuzz::callout_answer` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::callout_answer::check(data));
