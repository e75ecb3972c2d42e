//! Fuzz target `domain_xml`: see `vgpu_manager_fuzz::domain_xml` for the input and what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_manager_fuzz::domain_xml::check(data));
