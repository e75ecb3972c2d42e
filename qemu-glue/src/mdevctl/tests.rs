//! Shapes checked against what mdevctl prints and libvirt sends (see the module docs for the sources).

use super::*;
use mdev_types::ids::MdevUuid;

fn u(s: &str) -> MdevUuid {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

fn cfg(t: &str, start: StartMode, attrs: &[(&str, &str)]) -> MdevctlConfig {
    MdevctlConfig {
        mdev_type: t.parse().unwrap_or_else(|e| panic!("{e}")),
        start,
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn config_keys_in_mdevctl_order_with_ordered_attrs() {
    let c = cfg(
        "vfio_ap-passthrough",
        StartMode::Manual,
        &[("assign_domain", "0xab"), ("assign_adapter", "5")],
    );
    assert_eq!(
        c.to_json_pretty(),
        "{\n  \"mdev_type\": \"vfio_ap-passthrough\",\n  \"start\": \"manual\",\n  \"attrs\": [\n    {\n      \"assign_domain\": \"0xab\"\n    },\n    {\n      \"assign_adapter\": \"5\"\n    }\n  ]\n}"
    );
    let back = MdevctlConfig::from_json(&c.to_json_pretty(), "t").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, c);
}

#[test]
fn libvirt_stdin_config_parses() {
    // libvirt writes the config compactly, `attrs` only when there are some
    // (node_device_driver.c nodeDeviceDefToMdevctlConfig).
    let c = MdevctlConfig::from_json(r#"{"mdev_type":"nvidia-231","start":"auto"}"#, "stdin")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c, cfg("nvidia-231", StartMode::Auto, &[]));
    let c = MdevctlConfig::from_json(
        r#"{"mdev_type":"i915-GVTg_V5_4","start":"manual","attrs":[{"x":"1"},{"y":"2"},{"x":"3"}]}"#,
        "stdin",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let keys: Vec<&str> = c.attrs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["x", "y", "x"], "order and repeats are kept");
}

#[test]
fn config_errors_name_the_field_and_the_fix() {
    let cases = [
        ("[]", "(top)"),
        (r#"{"start":"auto"}"#, "mdev_type"),
        (
            r#"{"mdev_type":"a b","start":"auto"}"#,
            "not an mdev type id",
        ),
        (r#"{"mdev_type":"t"}"#, "must be \"auto\" or \"manual\""),
        (r#"{"mdev_type":"t","start":"sometimes"}"#, "\"sometimes\""),
        (
            r#"{"mdev_type":"t","start":"auto","attrs":[{"a":"1","b":"2"}]}"#,
            "attrs[0]",
        ),
        (
            r#"{"mdev_type":"t","start":"auto","attrs":[{"a":1}]}"#,
            "must be a string",
        ),
        (
            r#"{"mdev_type":"t","start":"auto","attrs":{}}"#,
            "list of single-key",
        ),
        ("{", "not JSON"),
    ];
    for (text, needle) in cases {
        let e = MdevctlConfig::from_json(text, "/etc/mdevctl.d/p/x")
            .expect_err(text)
            .to_string();
        assert!(e.starts_with("/etc/mdevctl.d/p/x"), "{e}");
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
}

#[test]
fn list_groups_by_parent_sorted_and_round_trips() {
    let devs = vec![
        MdevctlDevice {
            parent: "0000:b1:00.0".into(),
            uuid: u("ffffffff-0000-4000-8000-000000000001"),
            config: cfg("nvidia-232", StartMode::Manual, &[]),
        },
        MdevctlDevice {
            parent: "0000:3b:00.0".into(),
            uuid: u("bbbbbbbb-0000-4000-8000-000000000002"),
            config: cfg("nvidia-231", StartMode::Auto, &[]),
        },
        MdevctlDevice {
            parent: "0000:3b:00.0".into(),
            uuid: u("aaaaaaaa-0000-4000-8000-000000000003"),
            config: cfg("nvidia-231", StartMode::Manual, &[("k", "v")]),
        },
    ];
    let text = list_json(&devs);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let top = v.as_array().unwrap_or_else(|| panic!("{text}"));
    assert_eq!(top.len(), 1, "one object holding every parent: {text}");
    // Parents in name order; UUIDs sorted within a parent.
    let a = text.find("0000:3b:00.0").unwrap_or(usize::MAX);
    let b = text.find("0000:b1:00.0").unwrap_or(0);
    assert!(a < b, "{text}");
    let x = text.find("aaaaaaaa").unwrap_or(usize::MAX);
    let y = text.find("bbbbbbbb").unwrap_or(0);
    assert!(x < y, "{text}");
    let mut back = parse_list_json(&text, "t").unwrap_or_else(|e| panic!("{e}"));
    let mut want = devs.clone();
    back.sort_by_key(|d| d.uuid);
    want.sort_by_key(|d| d.uuid);
    assert_eq!(back, want);
}

#[test]
fn empty_list_is_an_empty_array_and_empty_text_is_no_devices() {
    assert_eq!(list_json(&[]), "[]");
    assert_eq!(parse_list_json("[]", "t").map(|v| v.len()).ok(), Some(0));
    assert_eq!(parse_list_json("  \n", "t").map(|v| v.len()).ok(), Some(0));
}

#[test]
fn list_parse_errors_name_the_path() {
    let e = parse_list_json(r#"[{"p":[{"not-a-uuid":{}}]}]"#, "mdevctl")
        .unwrap_err()
        .to_string();
    assert!(e.contains("[0].p[0]") && e.contains("not-a-uuid"), "{e}");
    let e = parse_list_json(r#"[{"../x":[]}]"#, "mdevctl")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an mdev parent name"), "{e}");
}

#[test]
fn types_leave_out_empty_name_and_description() {
    let t = vec![(
        "0000:3b:00.0".to_string(),
        vec![
            MdevctlType {
                type_id: "nvidia-231".into(),
                available_instances: 4,
                device_api: "vfio-pci".into(),
                name: Some("GRID T4-4Q".into()),
                description: None,
            },
            MdevctlType {
                type_id: "nvidia-222".into(),
                available_instances: 16,
                device_api: "vfio-pci".into(),
                name: None,
                description: None,
            },
        ],
    )];
    let text = types_json(&t);
    assert!(text.contains("\"name\": \"GRID T4-4Q\""), "{text}");
    assert!(!text.contains("description"), "{text}");
    assert_eq!(parse_types_json(&text, "t").ok(), Some(t));
    assert_eq!(types_json(&[]), "[]");
}

#[test]
fn files_round_trip_and_skip_what_mdevctl_skips() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = MdevctlDevice {
        parent: "0000:3b:00.0".into(),
        uuid: u("4b20d080-1b54-4048-85b3-a6a62d165c01"),
        config: cfg("nvidia-231", StartMode::Auto, &[("a", "1")]),
    };
    let path = write_config(dir.path(), &d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        path,
        dir.path()
            .join("0000:3b:00.0/4b20d080-1b54-4048-85b3-a6a62d165c01")
    );
    std::fs::create_dir_all(dir.path().join("scripts.d/callouts"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("0000:3b:00.0/README"), "x").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("stray-file"), "x").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read_config_dir(dir.path()).ok(), Some(vec![d.clone()]));
    assert!(remove_config(dir.path(), &d.parent, &d.uuid).unwrap_or(false));
    assert!(!remove_config(dir.path(), &d.parent, &d.uuid).unwrap_or(true));
    assert_eq!(read_config_dir(dir.path()).map(|v| v.len()).ok(), Some(0));
    assert_eq!(
        read_config_dir(&dir.path().join("missing"))
            .map(|v| v.len())
            .ok(),
        Some(0)
    );
}

#[test]
fn a_broken_definition_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let p = dir.path().join("0000:3b:00.0");
    std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        p.join("4b20d080-1b54-4048-85b3-a6a62d165c01"),
        "{\"start\":\"auto\"}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let e = read_config_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("4b20d080-1b54-4048-85b3-a6a62d165c01") && e.contains("mdev_type"),
        "{e}"
    );
}

#[test]
fn bad_parent_names_are_refused() {
    let d = MdevctlDevice {
        parent: "../etc".into(),
        uuid: u("4b20d080-1b54-4048-85b3-a6a62d165c01"),
        config: cfg("t", StartMode::Auto, &[]),
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        write_config(dir.path(), &d),
        Err(MdevctlError::BadParent(_))
    ));
}
