//! The checks behind the fuzz targets in `fuzz_targets/`: one module per target, each with a `check`
//! that takes libFuzzer's input and panics (the only way libFuzzer learns of a failure) when a parser
//! panics or breaks what must hold of its output. They are plain functions so that `cargo test` here
//! replays every seed through them without libFuzzer (`tests` below).
#![forbid(unsafe_code)]

pub mod callout_answer;
pub mod dbus_args;
pub mod domain_xml;
pub mod dra_input;
pub mod libvirt_hook;
pub mod mdevctl_json;
pub mod pool_toml;
pub mod profile_toml;
pub mod state_record;
pub mod sysfs_attr;
pub mod uevent;

/// Every target: its name (the fuzz target's and its seed directory's) and its check.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("sysfs_attr", sysfs_attr::check),
    ("uevent", uevent::check),
    ("profile_toml", profile_toml::check),
    ("pool_toml", pool_toml::check),
    ("state_record", state_record::check),
    ("mdevctl_json", mdevctl_json::check),
    ("domain_xml", domain_xml::check),
    ("libvirt_hook", libvirt_hook::check),
    ("dbus_args", dbus_args::check),
    ("callout_answer", callout_answer::check),
    ("dra_input", dra_input::check),
];

/// The first byte of `data` chooses among `n` parsers (modulo `n`); the rest is their text, when it is
/// UTF-8 (every caller reads text with `read_to_string` or gets a D-Bus string, so other bytes never
/// reach a parser).
pub fn selector_and_text(data: &[u8], n: u8) -> Option<(u8, &str)> {
    let (&first, rest) = data.split_first()?;
    Some((first % n, std::str::from_utf8(rest).ok()?))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every seed in `seeds/<target>/` passes its target's check (a crash found by fuzzing is kept
    /// there as a seed once fixed, so this is also the regression replay without libFuzzer).
    #[test]
    fn every_seed_passes_its_check() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        for (name, check) in super::TARGETS {
            let dir = root.join(name);
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("{}: {e} (run the seeds tool)", dir.display()));
            let mut n = 0;
            for entry in entries {
                let path = entry.unwrap().path();
                check(&std::fs::read(&path).unwrap());
                n += 1;
            }
            assert!(n > 0, "{}: no seeds", dir.display());
        }
    }
}
