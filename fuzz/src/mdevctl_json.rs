//! mdevctl's JSON (`qemu_glue::mdevctl`): a definition file of `/etc/mdevctl.d/<parent>/<uuid>`, `list
//! --dumpjson` and `types --dumpjson` output, chosen by the first byte. Beyond "no panic": what reads
//! writes back (as mdevctl would) to JSON that reads as the same thing, and every parent read names a
//! directory directly under `/etc/mdevctl.d`.

use std::collections::BTreeSet;
use std::path::{Component, Path};

use qemu_glue::mdevctl::{
    CONFIG_DIR, MdevctlConfig, MdevctlDevice, config_path, list_json, parse_list_json,
    parse_types_json, types_json,
};

/// The documents, chosen by the first byte (see [`crate::selector_and_text`]).
pub const DOCUMENTS: &[&str] = &["definition-file", "list", "types"];

const ORIGIN: &str = "fuzz";

fn sorted(mut devices: Vec<MdevctlDevice>) -> Vec<MdevctlDevice> {
    devices.sort_by_cached_key(|d| (d.parent.clone(), d.uuid, d.config.to_json_pretty()));
    devices
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Some((k, text)) = crate::selector_and_text(data, DOCUMENTS.len() as u8) else {
        return;
    };
    match k {
        0 => {
            let Ok(c) = MdevctlConfig::from_json(text, ORIGIN) else {
                return;
            };
            let written = c.to_json_pretty();
            match MdevctlConfig::from_json(&written, ORIGIN) {
                Ok(again) => assert_eq!(again, c, "written as {written}"),
                Err(e) => panic!("{c:?} written as {written} does not read back: {e}"),
            }
        }
        1 => {
            let Ok(devices) = parse_list_json(text, ORIGIN) else {
                return;
            };
            for d in &devices {
                let path = config_path(Path::new(CONFIG_DIR), &d.parent, &d.uuid)
                    .unwrap_or_else(|e| panic!("a listed parent has no file path: {e}"));
                let rest = path
                    .strip_prefix(CONFIG_DIR)
                    .unwrap_or_else(|_| panic!("{} is outside {CONFIG_DIR}", path.display()));
                let parts: Vec<Component<'_>> = rest.components().collect();
                assert!(
                    parts.len() == 2 && parts.iter().all(|c| matches!(c, Component::Normal(_))),
                    "{} is not <parent>/<uuid> below {CONFIG_DIR}",
                    path.display()
                );
            }
            let written = list_json(&devices);
            match parse_list_json(&written, ORIGIN) {
                Ok(again) => assert_eq!(sorted(again), sorted(devices), "written as {written}"),
                Err(e) => panic!("{devices:?} written as {written} does not read back: {e}"),
            }
        }
        _ => {
            let Ok(mut parents) = parse_types_json(text, ORIGIN) else {
                return;
            };
            // `types --dumpjson` lists each parent once; a document naming one twice has no
            // single rendering to compare with.
            let names: BTreeSet<&str> = parents.iter().map(|(p, _)| p.as_str()).collect();
            if names.len() != parents.len() {
                return;
            }
            let written = types_json(&parents);
            match parse_types_json(&written, ORIGIN) {
                Ok(mut again) => {
                    parents.sort_by(|a, b| a.0.cmp(&b.0));
                    again.sort_by(|a, b| a.0.cmp(&b.0));
                    assert_eq!(again, parents, "written as {written}");
                }
                Err(e) => panic!("{parents:?} written as {written} does not read back: {e}"),
            }
        }
    }
}
