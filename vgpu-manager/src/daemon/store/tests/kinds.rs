//! Applied pools and VF slot records: round trips, the files earlier vgpuds wrote, corruption,
//! unknown fields and invalid records.

use std::fs::File;
use std::time::{Duration, UNIX_EPOCH};

use super::*;

/// A VF slot record exactly as vgpud wrote it before the store owned `vf-slots/` (the text of
/// `toml::to_string` of its former `VfSlotRecord`): made, an xe VF with a saved `driver_override`.
const OLD_VF_MADE: &str = r#"schema = 1
uuid = "6c264794-831f-518a-9f46-aed451324919"
pool = "vdi-floor"
profile = "vdi-2g"
index = 3
gpu = "0000:03:00.0"
pf = "0000:03:00.0"
vf = "0000:03:00.1"
num_vfs = 8

[holds]
kind = "sriov-vf"

[created]
kind = "vf"
pf = "0000:03:00.0"
vf = "0000:03:00.1"

[created.bind]
addr = "0000:03:00.1"
previous_override = "vfio-pci"
"#;

/// The same, an NVIDIA vGPU slot.
const OLD_VF_NVIDIA: &str = r#"schema = 1
uuid = "588bcdf6-e86c-54d8-857d-6736ea67e662"
pool = "vdi-floor"
profile = "vdi-2g"
index = 4
gpu = "0000:85:00.0"
pf = "0000:03:00.0"
vf = "0000:03:00.1"
num_vfs = 0

[holds]
kind = "nvidia-vgpu"
type_id = 1155
type_name = "NVIDIA L40S-2B"

[created]
kind = "nvidia-vgpu"
pf = "0000:03:00.0"
vf = "0000:03:00.1"
type_id = 1155
"#;

/// `OLD_VF_MADE` while it was still being made (no `[created]`).
fn old_vf_pending() -> String {
    OLD_VF_MADE.split("\n[created]").next().unwrap().to_string()
}

fn old_made_record() -> VfSlotRecord {
    let pf = "0000:03:00.0".parse().unwrap();
    let vf = "0000:03:00.1".parse().unwrap();
    VfSlotRecord {
        uuid: "6c264794-831f-518a-9f46-aed451324919".parse().unwrap(),
        pool: "vdi-floor".into(),
        profile: "vdi-2g".into(),
        index: 3,
        gpu: "0000:03:00.0".into(),
        pf,
        vf,
        num_vfs: 8,
        holds: VfKind::SriovVf,
        created: Some(crate::backend::Created::Vf {
            pf,
            vf,
            bind: vgpu_host::ops::BindRecord {
                addr: vf,
                previous_driver: None,
                previous_override: Some("vfio-pci".into()),
            },
        }),
    }
}

fn old_nvidia_record() -> VfSlotRecord {
    let pf = "0000:03:00.0".parse().unwrap();
    let vf = "0000:03:00.1".parse().unwrap();
    VfSlotRecord {
        uuid: "588bcdf6-e86c-54d8-857d-6736ea67e662".parse().unwrap(),
        pool: "vdi-floor".into(),
        profile: "vdi-2g".into(),
        index: 4,
        gpu: "0000:85:00.0".into(),
        pf,
        vf,
        num_vfs: 0,
        holds: VfKind::NvidiaVgpu {
            type_id: 1155,
            type_name: "NVIDIA L40S-2B".into(),
        },
        created: Some(crate::backend::Created::NvidiaVgpu {
            pf,
            vf,
            type_id: 1155,
        }),
    }
}

#[test]
fn pools_and_vf_slots_round_trip_and_survive_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        for n in 1..4 {
            s.put_pool(&pool(n)).unwrap();
        }
        for n in 0..6 {
            s.put_vf_slot(&vf_slot(n)).unwrap();
        }
        // Replacing keeps one file.
        let mut renewed = vf_slot(2);
        renewed.created = None;
        s.put_vf_slot(&renewed).unwrap();
        s.put_vf_slot(&vf_slot(2)).unwrap();
        assert_eq!(s.remove_pool("pool-3").unwrap(), Some(pool(3)));
        assert_eq!(s.remove_pool("pool-3").unwrap(), None);
        assert_eq!(s.remove_pool("../definitions/x").unwrap(), None);
        assert_eq!(
            s.remove_vf_slot(&vf_slot(5).uuid).unwrap(),
            Some(vf_slot(5))
        );
        assert_eq!(s.remove_vf_slot(&vf_slot(5).uuid).unwrap(), None);
    }
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert!(report.set_aside.is_empty(), "{report:?}");
    assert_eq!((report.pools, report.vf_slots), (2, 5));
    assert_eq!(pools_of(&s), vec![pool(1), pool(2)]);
    let mut want: Vec<VfSlotRecord> = (0..5).map(vf_slot).collect();
    want.sort_by_key(|r| r.uuid);
    assert_eq!(vf_slots_of(&s), want);
    assert_eq!(s.get_pool("pool-2"), Some(&pool(2)));
    assert_eq!(s.get_pool("pool-3"), None);
    assert_eq!(s.get_vf_slot(&vf_slot(4).uuid), Some(&vf_slot(4)));
    assert_eq!(s.pool_file("pool-1"), tmp.path().join("pools/pool-1.toml"));
    // The pool file is the text as applied; its modification time is when.
    let file = tmp.path().join("pools/pool-1.toml");
    assert_eq!(fs::read_to_string(&file).unwrap(), pool(1).text);
    let mtime = fs::metadata(&file).unwrap().modified().unwrap();
    assert_eq!(
        mtime.duration_since(UNIX_EPOCH).unwrap().as_secs(),
        pool(1).applied_at
    );
    let text = fs::read_to_string(
        tmp.path()
            .join("vf-slots")
            .join(format!("{}.toml", vf_slot(1).uuid)),
    )
    .unwrap();
    assert!(text.starts_with("schema = 1\n"), "{text}");
    let mut names = names_in(&tmp.path().join("vf-slots"));
    names.retain(|n| n.starts_with(TEMP_PREFIX));
    assert!(names.is_empty(), "{names:?}");
}

#[test]
fn files_written_by_the_previous_daemon_still_load() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // The previous daemon made these directories itself, lazily and with the default mode.
    fs::create_dir_all(root.join("pools")).unwrap();
    fs::create_dir_all(root.join("vf-slots")).unwrap();
    let pending = VfSlotRecord {
        created: None,
        ..old_made_record()
    };
    plant(
        root,
        "vf-slots",
        "6c264794-831f-518a-9f46-aed451324919.toml",
        old_vf_pending().as_bytes(),
    );
    plant(
        root,
        "vf-slots",
        "588bcdf6-e86c-54d8-857d-6736ea67e662.toml",
        OLD_VF_NVIDIA.as_bytes(),
    );
    // Its writer used one fixed temporary name per file; a crash could leave one behind.
    plant(
        root,
        "vf-slots",
        ".tmp.6c264794-831f-518a-9f46-aed451324919.toml",
        OLD_VF_MADE.as_bytes(),
    );
    let floor = "name = \"vdi-floor\"\ndescription = \"the floor\"\n\n[profiles]\nvdi-2g = 40\n";
    plant(root, "pools", "vdi-floor.toml", floor.as_bytes());
    let applied = UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    File::options()
        .write(true)
        .open(root.join("pools/vdi-floor.toml"))
        .unwrap()
        .set_modified(applied)
        .unwrap();

    let (mut s, report) = StateDir::open(root).unwrap();
    assert!(report.set_aside.is_empty(), "{report:#?}");
    assert_eq!(
        report.temp_files_removed,
        vec![root.join("vf-slots/.tmp.6c264794-831f-518a-9f46-aed451324919.toml")]
    );
    assert_eq!(
        pools_of(&s),
        vec![AppliedPool {
            name: "vdi-floor".into(),
            text: floor.into(),
            applied_at: 1_767_225_600,
        }]
    );
    assert_eq!(vf_slots_of(&s), vec![old_nvidia_record(), pending]);
    // What this build writes is what the previous one wrote, byte for byte, so either reads the other.
    assert_eq!(old_made_record().encode().unwrap(), OLD_VF_MADE);
    assert_eq!(old_nvidia_record().encode().unwrap(), OLD_VF_NVIDIA);
    s.put_vf_slot(&old_made_record()).unwrap();
    assert_eq!(
        fs::read_to_string(root.join("vf-slots/6c264794-831f-518a-9f46-aed451324919.toml"))
            .unwrap(),
        OLD_VF_MADE
    );
}

#[test]
fn unusable_pool_and_vf_slot_files_are_moved_aside_and_the_rest_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    {
        let (mut s, _) = StateDir::open(root).unwrap();
        s.put_pool(&pool(1)).unwrap();
        s.put_vf_slot(&old_made_record()).unwrap();
    }
    let name_of = |r: &VfSlotRecord| format!("{}.toml", r.uuid);
    let nvidia = old_nvidia_record();
    let other = vf_slot(7);
    let cases: Vec<(&str, String, String, &str)> = vec![
        (
            "pools",
            "pool-2.toml".into(),
            pool(2)
                .text
                .replacen("[profiles]", "extra = 1\n\n[profiles]", 1),
            "unknown field",
        ),
        (
            "pools",
            "pool-3.toml".into(),
            pool(4).text,
            "is named after pool-3",
        ),
        ("pools", "pool-5.toml".into(), "name = [".into(), "pool:"),
        (
            "pools",
            "Pool 6.toml".into(),
            pool(6).text,
            "<pool name>.toml",
        ),
        (
            "pools",
            "pool-7.toml".into(),
            pool(7)
                .text
                .replace("name = \"pool-7\"", "name = \"Pool 7\""),
            "not a valid pool name",
        ),
        (
            "vf-slots",
            name_of(&nvidia),
            OLD_VF_NVIDIA.replacen("\n[holds]", "extra = 1\n\n[holds]", 1),
            "unknown field",
        ),
        (
            "vf-slots",
            name_of(&other),
            other.encode().unwrap().replace(
                "kind = \"nvidia-vgpu\"\ntype_id",
                "kind = \"nvidia-vgpu\"\nfoo = 2\ntype_id",
            ),
            "unknown field",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(1)),
            vf_slot(1)
                .encode()
                .unwrap()
                .replacen("[created]\n", "[created]\nwhen = 3\n", 1),
            "unknown field",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(2)),
            vf_slot(2)
                .encode()
                .unwrap()
                .replace("[created.bind]\n", "[created.bind]\nprevious_numa = 1\n"),
            "unknown field",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(4)),
            vf_slot(4)
                .encode()
                .unwrap()
                .replace("schema = 1", "schema = 2"),
            "schema = 2",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(5)),
            vf_slot(5)
                .encode()
                .unwrap()
                .replace("index = 5", "index = 6"),
            "is not the UUID of slot",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(8)),
            vf_slot(10).encode().unwrap(),
            "is named after",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(11)),
            vf_slot(11)
                .encode()
                .unwrap()
                .replace("kind = \"nvidia-vgpu\"", "kind = \"mig\""),
            "line",
        ),
        (
            "vf-slots",
            name_of(&vf_slot(13)),
            vf_slot(13).encode().unwrap().replace("schema = 1\n", ""),
            "no `schema`",
        ),
    ];
    for (sub, name, text, _) in &cases {
        plant(root, sub, name, text.as_bytes());
    }
    let (s, report) = StateDir::open(root).unwrap();
    assert_eq!(pools_of(&s), vec![pool(1)]);
    assert_eq!(vf_slots_of(&s), vec![old_made_record()]);
    assert_eq!(report.set_aside.len(), cases.len(), "{report:#?}");
    for (sub, name, text, needle) in &cases {
        let file = root.join(sub).join(name);
        let aside = report
            .set_aside
            .iter()
            .find(|a| a.file == file)
            .unwrap_or_else(|| panic!("{} not set aside: {report:#?}", file.display()));
        let why = aside.reason.to_string();
        assert!(why.contains(needle), "{name}: {why:?} lacks {needle:?}");
        assert!(!file.exists());
        assert_eq!(aside.moved_to.parent().unwrap(), root.join("corrupt"));
        assert_eq!(
            fs::read_to_string(&aside.moved_to).unwrap(),
            *text,
            "contents preserved"
        );
    }
    let future = report
        .set_aside
        .iter()
        .find(|a| a.file.ends_with(name_of(&vf_slot(4))))
        .unwrap();
    assert_eq!(future.reason, AsideReason::FutureSchema { found: 2 });
    drop(s);
    let (_s, report) = StateDir::open(root).unwrap();
    assert!(report.set_aside.is_empty());
}

#[test]
fn invalid_pools_and_vf_slots_are_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    let mut bad = pool(1);
    bad.name = "pool-9".into();
    let err = s.put_pool(&bad).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("pool-9.toml"), "{err}");
    let mut bad = pool(2);
    bad.text = bad
        .text
        .replacen("[profiles]", "colour = \"red\"\n\n[profiles]", 1);
    let err = s.put_pool(&bad).unwrap_err();
    assert!(err.to_string().contains("unknown field"), "{err}");
    let mut bad = pool(3);
    bad.applied_at = u64::MAX;
    assert!(matches!(s.put_pool(&bad), Err(StoreError::Invalid { .. })));
    let mut bad = vf_slot(1);
    bad.index = 2;
    let err = s.put_vf_slot(&bad).unwrap_err();
    assert!(err.to_string().contains("is not the UUID of slot"), "{err}");
    let mut bad = vf_slot(3);
    bad.gpu = " ".into();
    assert!(matches!(
        s.put_vf_slot(&bad),
        Err(StoreError::Invalid { .. })
    ));
    let mut bad = vf_slot(5);
    bad.holds = VfKind::NvidiaVgpu {
        type_id: 1,
        type_name: String::new(),
    };
    assert!(matches!(
        s.put_vf_slot(&bad),
        Err(StoreError::Invalid { .. })
    ));
    assert!(pools_of(&s).is_empty());
    assert!(vf_slots_of(&s).is_empty());
    assert!(names_in(&tmp.path().join("pools")).is_empty());
    assert!(names_in(&tmp.path().join("vf-slots")).is_empty());
}
