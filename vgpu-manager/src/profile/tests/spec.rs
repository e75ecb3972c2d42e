//! The profile format: what is accepted, defaults, and that every rejection names file, line, field
//! and what is allowed.

use mdev_types::model::Vendor;
use mdev_types::parse::Resolution;

use crate::profile::{Delivery, Priority, Profile, ProfileError, WorkloadClass};

const GOOD: &str = r#"name = "vdi-2g"
description = "desktop"
class = "vdi"
framebuffer = "2G"
heads = 1
max_resolution = "1920x1200"
weight = 10
priority = "high"
vendors = ["nvidia", "intel"]
backends = ["mdev", "sriov-vf"]
device_api = "vfio-pci"
prefer = ["sriov-vf"]
"#;

/// `GOOD` with line `line` (1-based) replaced by `with`.
fn edit(line: usize, with: &str) -> String {
    GOOD.lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line { with } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

fn err(text: &str) -> ProfileError {
    Profile::from_toml("dir/p.toml", text).unwrap_err()
}

#[test]
fn full_profile_parses() {
    let p = Profile::from_toml("dir/p.toml", GOOD).unwrap();
    assert_eq!(p.name, "vdi-2g");
    assert_eq!(p.class, WorkloadClass::Vdi);
    assert_eq!(p.framebuffer_mib, 2048);
    assert_eq!(p.heads, 1);
    assert_eq!(
        p.max_resolution,
        Some(Resolution {
            width: 1920,
            height: 1200
        })
    );
    assert_eq!(p.weight, 10);
    assert_eq!(p.priority, Some(Priority::High));
    assert_eq!(p.vendors, [Vendor::Nvidia, Vendor::Intel]);
    assert_eq!(p.backends, [Delivery::Mdev, Delivery::SriovVf]);
    assert_eq!(p.prefer, [Delivery::SriovVf]);
    assert_eq!(p.origin, "dir/p.toml");
    assert_eq!(p.preference_rank(Delivery::SriovVf), 0);
    assert_eq!(p.preference_rank(Delivery::Mdev), 1);
}

#[test]
fn defaults() {
    let p = Profile::from_toml(
        "x",
        "name = \"c\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\n",
    )
    .unwrap();
    assert_eq!(p.framebuffer_mib, 0);
    assert_eq!(p.heads, 0);
    assert_eq!(p.max_resolution, None);
    assert_eq!(p.priority, None);
    assert_eq!(p.vendors, [Vendor::Nvidia, Vendor::Intel, Vendor::Amd]);
    assert_eq!(
        p.backends,
        [
            Delivery::Mdev,
            Delivery::SriovVf,
            Delivery::NvidiaVendorVfio
        ]
    );
    assert_eq!(p.device_api, "vfio-pci");
    assert!(p.prefer.is_empty());
    let p = Profile::from_toml(
        "x",
        "name = \"p\"\ndescription = \"d\"\nclass = \"passthrough\"\nweight = 100\n",
    )
    .unwrap();
    assert_eq!(p.backends, [Delivery::Passthrough]);
}

#[test]
fn sizes_are_binary() {
    for (text, mib) in [("512M", 512), ("16M", 16), ("2G", 2048), ("1T", 1 << 20)] {
        let p = Profile::from_toml("x", &edit(4, &format!("framebuffer = \"{text}\""))).unwrap();
        assert_eq!(p.framebuffer_mib, mib, "{text}");
    }
}

/// Asserts `e` is a field error at `line` on `field`, and its message shows all of `needles`.
fn assert_field(e: &ProfileError, line: usize, field: &str, needles: &[&str]) {
    let msg = e.to_string();
    match e {
        ProfileError::Field {
            origin,
            line: l,
            field: f,
            ..
        } => {
            assert_eq!(origin, "dir/p.toml", "{msg}");
            assert_eq!(*l, line, "{msg}");
            assert_eq!(*f, field, "{msg}");
        }
        other => panic!("expected a field error, got {other:?}"),
    }
    assert!(
        msg.starts_with(&format!("dir/p.toml:{line}: field `{field}`")),
        "{msg}"
    );
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
}

#[test]
fn field_errors_name_line_field_and_allowed_values() {
    let cases: &[(usize, &str, &str, &[&str])] = &[
        (1, "name = \"VDI 2G\"", "name", &["VDI 2G", "lower-case"]),
        (2, "description = \"  \"", "description", &["empty"]),
        (
            3,
            "class = \"desktop\"",
            "class",
            &[
                "desktop",
                "vdi, workstation, compute, passthrough, display-test",
            ],
        ),
        (
            4,
            "framebuffer = \"2 gigs\"",
            "framebuffer",
            &["2 gigs", "\"512M\""],
        ),
        (4, "framebuffer = \"1.5G\"", "framebuffer", &["1.5G"]),
        (5, "heads = 40", "heads", &["40", "0 to 16"]),
        (5, "heads = -1", "heads", &["-1"]),
        (
            6,
            "max_resolution = \"1920*1200\"",
            "max_resolution",
            &["1920*1200", "WIDTHxHEIGHT"],
        ),
        (7, "weight = 0", "weight", &["is 0", "1 to 100"]),
        (7, "weight = 101", "weight", &["101", "1 to 100"]),
        (
            8,
            "priority = \"urgent\"",
            "priority",
            &["urgent", "low, normal, high"],
        ),
        (
            9,
            "vendors = [\"nvidia\", \"matrox\"]",
            "vendors",
            &["matrox", "nvidia, intel, amd, virtual"],
        ),
        (9, "vendors = [\"other\"]", "vendors", &["other"]),
        (9, "vendors = [\"intel\", \"intel\"]", "vendors", &["twice"]),
        (9, "vendors = []", "vendors", &["empty"]),
        (
            10,
            "backends = [\"mdev\", \"vgpu\"]",
            "backends",
            &["vgpu", "mdev, sriov-vf, nvidia-vendor-vfio, passthrough"],
        ),
        (10, "backends = []", "backends", &["empty"]),
        (
            11,
            "device_api = \"vfio-usb\"",
            "device_api",
            &["vfio-usb", "vfio-pci", "vfio-ccw"],
        ),
        (
            12,
            "prefer = [\"passthrough\"]",
            "prefer",
            &["passthrough", "backends"],
        ),
    ];
    for (line, text, field, needles) in cases {
        let e = err(&edit(*line, text));
        assert_field(&e, *line, field, needles);
    }
}

#[test]
fn resolution_without_heads_is_rejected() {
    let e = err(&edit(5, "heads = 0"));
    assert_field(&e, 6, "max_resolution", &["heads is 0"]);
}

#[test]
fn toml_errors_carry_line_and_column() {
    // Unknown field on line 3: the reader lists the known fields.
    let text = GOOD.replace("class = \"vdi\"", "colour = \"vdi\"");
    let e = err(&text);
    let msg = e.to_string();
    assert!(
        matches!(
            e,
            ProfileError::Toml {
                line: 3,
                column: 1,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains("colour") && msg.contains("class"), "{msg}");
    // Wrong type on line 7.
    let e = err(&edit(7, "weight = \"ten\""));
    assert!(matches!(e, ProfileError::Toml { line: 7, .. }), "{e}");
    // Not TOML at all.
    let e = err(&edit(5, "heads = "));
    assert!(matches!(e, ProfileError::Toml { line: 5, .. }), "{e}");
    // A required field missing.
    let e = err(&GOOD.replace("weight = 10\n", ""));
    assert!(e.to_string().contains("weight"), "{e}");
}

#[test]
fn never_matching_profiles_are_rejected_with_the_reason() {
    let cases: &[(&str, &[&str])] = &[
        (
            "class = \"passthrough\"\nbackends = [\"mdev\"]\n",
            &["class passthrough", "backends = [\"passthrough\"]"],
        ),
        (
            "class = \"passthrough\"\nbackends = [\"passthrough\", \"mdev\"]\n",
            &["class passthrough"],
        ),
        (
            "class = \"compute\"\nvendors = [\"virtual\"]\nbackends = [\"sriov-vf\"]\n",
            &["virtual offers mdev", "backends is [sriov-vf]"],
        ),
        (
            "class = \"compute\"\nvendors = [\"amd\"]\nbackends = [\"mdev\", \"nvidia-vendor-vfio\"]\n",
            &["amd offers sriov-vf, passthrough"],
        ),
        (
            "class = \"compute\"\nvendors = [\"nvidia\"]\nbackends = [\"sriov-vf\"]\n",
            &["nvidia offers mdev, nvidia-vendor-vfio, passthrough"],
        ),
        (
            "class = \"compute\"\ndevice_api = \"vfio-ccw\"\nbackends = [\"sriov-vf\", \"passthrough\"]\n",
            &["device_api vfio-ccw exists only on mdev types"],
        ),
        (
            "class = \"vdi\"\nvendors = [\"virtual\"]\nbackends = [\"mdev\"]\n",
            &["graphics engine", "display-test"],
        ),
    ];
    for (body, needles) in cases {
        let text = format!("name = \"x\"\ndescription = \"d\"\nweight = 5\n{body}");
        let e = err(&text);
        let msg = e.to_string();
        assert!(
            matches!(e, ProfileError::NeverMatches { ref name, .. } if name == "x"),
            "{body}: {msg}"
        );
        assert!(msg.starts_with("dir/p.toml:"), "{msg}");
        assert!(msg.contains("can never match"), "{msg}");
        for n in *needles {
            assert!(msg.contains(n), "{msg:?} lacks {n:?}");
        }
    }
    // The line points at `backends` when given (line 5 here).
    let e = err(
        "name = \"x\"\ndescription = \"d\"\nweight = 5\nclass = \"passthrough\"\nbackends = [\"mdev\"]\n",
    );
    assert!(
        matches!(e, ProfileError::NeverMatches { line: 5, .. }),
        "{e}"
    );
}

#[test]
fn a_profile_of_mdev_only_api_is_fine_when_mdev_is_allowed() {
    let p = Profile::from_toml(
        "x",
        "name = \"ccw\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 5\nvendors = [\"virtual\"]\nbackends = [\"mdev\"]\ndevice_api = \"vfio-ccw\"\n",
    )
    .unwrap();
    assert_eq!(p.device_api, "vfio-ccw");
}

#[test]
fn serializes_with_stable_names() {
    let p = Profile::from_toml("dir/p.toml", GOOD).unwrap();
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["name"], "vdi-2g");
    assert_eq!(v["class"], "vdi");
    assert_eq!(v["framebuffer_mib"], 2048);
    assert_eq!(v["max_resolution"]["width"], 1920);
    assert_eq!(v["vendors"], serde_json::json!(["nvidia", "intel"]));
    assert_eq!(v["backends"], serde_json::json!(["mdev", "sriov-vf"]));
    assert_eq!(v["priority"], "high");
    assert_eq!(v["origin"], "dir/p.toml");
}
