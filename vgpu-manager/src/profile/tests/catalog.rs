//! The shipped set, directories, single files and name resolution.

use std::path::{Path, PathBuf};

use crate::profile::{Catalog, ProfileError, WorkloadClass, check_files};

fn repo_profiles() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles")
}

const MIN: &str = "description = \"d\"\nclass = \"compute\"\nweight = 5\n";

fn write(dir: &Path, file: &str, name: &str) -> PathBuf {
    let p = dir.join(file);
    std::fs::write(&p, format!("name = \"{name}\"\n{MIN}")).unwrap();
    p
}

#[test]
fn builtin_has_the_shipped_profiles() {
    let c = Catalog::builtin().unwrap();
    assert_eq!(
        c.names(),
        [
            "compute-8g",
            "passthrough",
            "sample-display-1080p",
            "sample-display-16m",
            "sample-display-4m",
            "vdi-1g",
            "vdi-2g",
            "workstation-4g"
        ]
    );
    let s = c.get("sample-display-16m").unwrap();
    assert_eq!(s.description, "virtual display, 16 MB video memory");
    assert_eq!(s.framebuffer_mib, 16);
    assert_eq!(
        c.get("sample-display-1080p").unwrap().description,
        "virtual display, 1920x1080 framebuffer"
    );
    assert_eq!(
        c.get("passthrough").unwrap().class,
        WorkloadClass::Passthrough
    );
    assert!(
        c.profiles()
            .iter()
            .all(|p| p.origin.starts_with("builtin:"))
    );
}

/// Every file in profiles/ is embedded, and the embedded text is the file's.
#[test]
fn builtin_equals_the_profiles_directory() {
    let from_dir = Catalog::load_dir(&repo_profiles()).unwrap();
    let builtin = Catalog::builtin().unwrap();
    assert_eq!(from_dir.names(), builtin.names());
    for (a, b) in from_dir.profiles().iter().zip(builtin.profiles()) {
        let mut a = a.clone();
        a.origin = b.origin.clone();
        assert_eq!(&a, b);
    }
}

#[test]
fn load_dir_reads_toml_files_only_and_reports_every_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.toml", "alpha");
    write(dir.path(), "b.toml", "beta");
    std::fs::write(dir.path().join("README"), "not a profile").unwrap();
    std::fs::write(dir.path().join("c.toml.bak"), "junk").unwrap();
    let c = Catalog::load_dir(dir.path()).unwrap();
    assert_eq!(c.names(), ["alpha", "beta"]);

    std::fs::write(dir.path().join("x.toml"), "name = \"x\"\nweight = 0\n").unwrap();
    std::fs::write(dir.path().join("y.toml"), "name = ").unwrap();
    let e = Catalog::load_dir(dir.path()).unwrap_err();
    assert_eq!(e.0.len(), 2, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("x.toml") && msg.contains("y.toml:1"), "{msg}");
}

#[test]
fn duplicates_name_both_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.toml", "same");
    write(dir.path(), "b.toml", "same");
    let e = Catalog::load_dir(dir.path()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e.0[0], ProfileError::Duplicate { .. }), "{msg}");
    assert!(
        msg.contains("a.toml") && msg.contains("b.toml") && msg.contains("'same'"),
        "{msg}"
    );
}

#[test]
fn missing_dir_and_file_name_the_path() {
    let e = Catalog::load_dir(Path::new("/nonexistent/profiles.d")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/profiles.d"), "{e}");
    let e = Catalog::load_file(Path::new("/nonexistent/p.toml")).unwrap_err();
    assert!(matches!(e, ProfileError::Read { .. }));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/p.toml: cannot read"),
        "{e}"
    );
}

#[test]
fn overlay_replaces_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vdi-2g.toml");
    std::fs::write(
        &p,
        "name = \"vdi-2g\"\ndescription = \"mine\"\nclass = \"vdi\"\nweight = 7\n",
    )
    .unwrap();
    write(dir.path(), "extra.toml", "extra");
    let c = Catalog::builtin()
        .unwrap()
        .overlay(Catalog::load_dir(dir.path()).unwrap());
    assert_eq!(c.get("vdi-2g").unwrap().description, "mine");
    assert_eq!(c.get("vdi-2g").unwrap().weight, 7);
    assert!(c.get("extra").is_some() && c.get("vdi-1g").is_some());
    assert_eq!(c.names().len(), 9);
}

#[test]
fn resolve_takes_a_name_or_a_path() {
    let c = Catalog::builtin().unwrap();
    assert_eq!(c.resolve("vdi-1g").unwrap().name, "vdi-1g");
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "mine.toml", "mine");
    assert_eq!(c.resolve(p.to_str().unwrap()).unwrap().name, "mine");
    let e = c.resolve("vdi-3g").unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ProfileError::Unknown { .. }));
    assert!(
        msg.contains("'vdi-3g'") && msg.contains("vdi-1g, vdi-2g"),
        "{msg}"
    );
    assert!(matches!(
        c.resolve("missing.toml").unwrap_err(),
        ProfileError::Read { .. }
    ));
}

#[test]
fn check_files_answers_each_file_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.toml", "good");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "name = \"bad\"\ndescription = \"d\"\nclass = \"gaming\"\nweight = 5\n",
    )
    .unwrap();
    let r = check_files(&[good, bad, dir.path().join("none.toml")]);
    assert_eq!(r.len(), 3);
    assert_eq!(r[0].as_ref().unwrap().name, "good");
    let e = r[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("bad.toml:3: field `class`") && e.contains("gaming"),
        "{e}"
    );
    assert!(matches!(r[2], Err(ProfileError::Read { .. })));
}

#[test]
fn catalog_serializes_its_profiles() {
    let v = serde_json::to_value(Catalog::builtin().unwrap()).unwrap();
    assert_eq!(v["profiles"].as_array().unwrap().len(), 8);
    assert_eq!(v["profiles"][0]["name"], "compute-8g");
}
