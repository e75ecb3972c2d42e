//! Host descriptions: schema errors with file, line and field; semantic checks; loading.

use nix::errno::Errno;

use super::*;
use crate::{SimError, SimSpec};

fn toml_err(text: &str) -> SimError {
    SimHost::from_toml("lab.toml", text).expect_err("description should be rejected")
}

const GOOD: &str = "\
[[driver]]
name = \"nvidia\"
match = [\"10de:*\"]

[[pci]]
address = \"0000:3b:00.0\"
vendor = \"10de\"
device = \"1eb8\"
class = 0x030200
driver = \"nvidia\"
iommu_group = 4
";

#[test]
fn a_small_description_loads() {
    let h = SimHost::from_toml("lab.toml", GOOD).unwrap();
    assert_eq!(h.describe(), "simulated host 'lab'");
    assert_eq!(rd(&h, "/sys/bus/pci/devices/0000:3b:00.0/numa_node"), "-1");
    assert_eq!(
        h.canonicalize(&p("/sys/bus/pci/devices/0000:3b:00.0"))
            .unwrap(),
        p("/sys/devices/pci0000:3b/0000:3b:00.0")
    );
}

#[test]
fn unknown_field_names_file_line_and_field() {
    let text = GOOD.replace("iommu_group = 4", "iommu_group = 4\nnuma = 1");
    let e = toml_err(&text);
    assert!(matches!(e, SimError::Toml { .. }), "{e:?}");
    assert_eq!(e.line(), Some(12));
    assert_eq!(e.field(), Some("pci[0].numa"));
    let msg = e.to_string();
    assert!(msg.starts_with("lab.toml:12:"), "{msg}");
    assert!(msg.contains("unknown field `numa`"), "{msg}");
}

#[test]
fn bad_address_names_file_line_and_field() {
    let text = GOOD.replace("0000:3b:00.0", "0000:3b:00.9");
    let e = toml_err(&text);
    assert_eq!(e.line(), Some(6));
    assert_eq!(e.field(), Some("pci[0].address"));
    let msg = e.to_string();
    assert!(msg.contains("lab.toml:6:"), "{msg}");
    assert!(msg.contains("0000:3b:00.9"), "{msg}");
    // Nested tables and arrays of tables get their indexes.
    let text = format!(
        "{GOOD}\n[[mdev_parent]]\ndevice = \"0000:3b:00.0\"\nmdev_driver = \"nvidia-vgpu-vfio\"\n\
         pools = {{ fb = 16 }}\n[[mdev_parent.type]]\nid = \"nvidia-1\"\nuses = {{ fb = 1 }}\n\
         [[mdev_parent.type]]\nid = \"bad id!\"\n"
    );
    let e = toml_err(&text);
    assert_eq!(e.field(), Some("mdev_parent[0].type[1].id"), "{e}");
}

#[test]
fn semantic_errors_point_at_the_field() {
    let text = GOOD.replace("driver = \"nvidia\"\niommu", "driver = \"nouveau\"\niommu");
    let e = toml_err(&text);
    assert!(matches!(e, SimError::Invalid { .. }), "{e:?}");
    assert_eq!(e.field(), Some("pci[0].driver"));
    assert_eq!(e.line(), Some(10));
    assert!(e.to_string().contains("'nouveau' is not declared"), "{e}");

    let e = toml_err(&GOOD.replace("iommu_group = 4", "boot_vga = true"));
    assert_eq!(e.field(), Some("pci[0].boot_vga"));
    assert_eq!(e.line(), Some(11));

    let e = toml_err(&GOOD.replace("match = [\"10de:*\"]", "match = [\"8086:*\"]"));
    assert!(e.to_string().contains("does not match 10de:1eb8"), "{e}");

    let parent = "\n[[mdev_parent]]\ndevice = \"0000:3b:00.0\"\nmdev_driver = \"x\"\n\
                  pools = { fb = 16 }\n[[mdev_parent.type]]\nid = \"nvidia-1\"\nuses = { fbx = 1 }\n";
    let e = toml_err(&format!("{GOOD}{parent}"));
    assert_eq!(e.field(), Some("mdev_parent[0].type[0].uses.fbx"));
    assert_eq!(e.line(), Some(19));

    let dup = "\n[[mdev]]\nuuid = \"8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61\"\nparent = \"mtty\"\ntype = \"mtty-1\"\n";
    let e = toml_err(&format!("{GOOD}{dup}"));
    assert_eq!(e.field(), Some("mdev[0].parent"));
}

#[test]
fn capacity_of_preexisting_instances_is_checked() {
    let text = "\
[[mdev_parent]]
device = \"mbochs\"
virtual_class = \"mbochs\"
mdev_driver = \"mbochs\"
pools = { mbytes = 64 }
[[mdev_parent.type]]
id = \"mbochs-large\"
uses = { mbytes = 64 }

[[mdev]]
uuid = \"00000001-0000-4000-8000-000000000001\"
parent = \"mbochs\"
type = \"mbochs-large\"

[[mdev]]
uuid = \"00000002-0000-4000-8000-000000000002\"
parent = \"mbochs\"
type = \"mbochs-large\"
";
    let e = toml_err(text);
    assert_eq!(e.field(), Some("mdev[1].uuid"));
    assert_eq!(e.line(), Some(16));
    assert!(e.to_string().contains("no instance left"), "{e}");
}

#[test]
fn full_errno_defaults_by_driver() {
    let parent = |driver: &str| {
        format!(
            "{GOOD}\n[[mdev_parent]]\ndevice = \"0000:3b:00.0\"\nmdev_driver = \"{driver}\"\n\
             pools = {{ fb = 2 }}\n[[mdev_parent.type]]\nid = \"nvidia-1\"\nuses = {{ fb = 2 }}\n"
        )
    };
    let create = "/sys/class/mdev_bus/0000:3b:00.0/mdev_supported_types/nvidia-1/create";
    for (driver, want) in [("nvidia-vgpu-vfio", Errno::EIO), ("other", Errno::ENOSPC)] {
        let h = SimHost::from_toml("lab.toml", &parent(driver)).unwrap();
        wr(&h, create, "00000001-0000-4000-8000-000000000001");
        assert_eq!(
            wr_err(&h, create, "00000002-0000-4000-8000-000000000002"),
            want
        );
    }
}

#[test]
fn builtin_and_load() {
    let e = SimHost::builtin("lab").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("'lab'") && msg.contains("demo") && msg.contains("samples"),
        "{msg}"
    );
    assert!(SimHost::load("nonsense").is_err());
    assert!(matches!(
        SimHost::load("/no/such/host.toml"),
        Err(SimError::Io { .. })
    ));
    assert_eq!(SimHost::load("demo").unwrap().name(), "demo");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lab.toml");
    std::fs::write(&file, GOOD).unwrap();
    let h = SimHost::load(file.to_str().unwrap()).unwrap();
    assert_eq!(h.describe(), "simulated host 'lab'");
    std::fs::write(&file, GOOD.replace("class = 0x030200", "class = \"3d\"")).unwrap();
    let e = SimHost::load(file.to_str().unwrap()).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!("{}:9:", file.display())),
        "{e}"
    );
    assert_eq!(e.field(), Some("pci[0].class"));
}

#[test]
fn from_spec_builds_the_same_host() {
    let text = include_str!("../../../sims/demo.toml");
    let spec = SimSpec::from_toml("demo.toml", text).unwrap();
    let a = SimHost::from_spec(spec.clone()).unwrap();
    let b = SimHost::builtin("demo").unwrap();
    for path in [
        "/sys/bus/pci/devices/0000:85:00.0/virtfn9/nvidia/creatable_vgpu_types",
        "/sys/class/mdev_bus/0000:83:00.0/mdev_supported_types/nvidia-231/available_instances",
    ] {
        assert_eq!(a.read(&p(path)).unwrap(), b.read(&p(path)).unwrap());
    }
    // Errors from a value carry the schema path but no line.
    let mut bad = spec;
    bad.pci[0].driver = Some("nouveau".into());
    let e = SimHost::from_spec(bad).unwrap_err();
    assert_eq!(e.field(), Some("pci[0].driver"));
    assert_eq!(e.line(), None);
}
