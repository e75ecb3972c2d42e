//! MIG geometry: the A100-40GB table and the H200 table NVML reported on real hardware
//! (tests/fixtures/h200-passthrough/nvml-mig-*.json, driver 580.159.04).

use super::super::mig::{MigError, MigGeometry, MigInstance, place_instances};
use super::super::model::{Choice, Demand, GpuCap, Problem};
use super::super::{Policy, plan};
use super::target;

const PLACEMENTS: &str =
    include_str!("../../../../tests/fixtures/h200-passthrough/nvml-mig-placements.json");
const PROFILES: &str =
    include_str!("../../../../tests/fixtures/h200-passthrough/nvml-mig-profiles.json");

fn h200() -> MigGeometry {
    MigGeometry::from_nvml_json("NVIDIA H200", PLACEMENTS, Some(PROFILES)).unwrap()
}

fn at(profile: &str, start: u32) -> MigInstance {
    MigInstance {
        profile: profile.into(),
        start,
    }
}

#[test]
fn h200_table_reads_as_nvml_reported_it() {
    let g = h200();
    assert_eq!(g.slices, 8);
    let p = g.profile("MIG 3g.71gb").unwrap();
    assert_eq!(
        (p.id, p.size, p.starts.clone(), p.max_instances),
        (9, 4, vec![0, 4], 2)
    );
    let p = g.profile("1g.18gb+me").unwrap();
    // Seven legal starts, but NVML's instanceCount is 1 (one media-extension instance per GPU).
    assert_eq!((p.starts.len(), p.max_instances), (7, 1));
    assert_eq!(g.profile("1g.35gb").unwrap().starts, vec![0, 2, 4, 6]);
    assert_eq!(g.profile("7g.141gb").unwrap().memory_mib, Some(143_360));
    assert_eq!(g.smallest_with_memory(20_000).unwrap().name, "1g.35gb");
    assert!(matches!(
        g.profile("9g.1tb"),
        Err(MigError::UnknownProfile { .. })
    ));
}

#[test]
fn legal_sets_are_found_and_impossible_ones_refused() {
    for g in [h200(), MigGeometry::a100_40gb()] {
        let n = |s: &str| {
            g.profiles
                .iter()
                .find(|p| p.name.starts_with(s) && !p.name.ends_with("+me"))
                .unwrap()
                .name
                .clone()
        };
        let (g1, g2, g3, g4, g7) = (n("1g."), n("2g."), n("3g."), n("4g."), n("7g."));
        let (g1, g2, g3, g4, g7) = (
            g1.as_str(),
            g2.as_str(),
            g3.as_str(),
            g4.as_str(),
            g7.as_str(),
        );
        // The double-memory 1g profile (size 2).
        let g1d = g
            .profiles
            .iter()
            .find(|p| p.name.starts_with("1g.") && p.size == 2)
            .unwrap()
            .name
            .clone();
        let g1d = g1d.as_str();
        let ok = |want: &[&str]| place_instances(&g, &[], want);
        assert_eq!(ok(&[g1; 7]).unwrap().len(), 7, "{}", g.gpu);
        assert!(matches!(ok(&[g1; 8]), Err(MigError::TooMany { .. })));
        // 4g + 3g: 4g must take 0-3, so 3g goes to 4-7.
        let r = ok(&[g3, g4]).unwrap();
        assert_eq!((r[0].start, r[1].start), (4, 0));
        // 2g × 3 + 1g: the 1g goes to slice 6, the only one the 2g placements leave.
        let r = ok(&[g1, g2, g2, g2]).unwrap();
        assert_eq!(r[0].start, 6);
        // Four double-memory 1g fill 0-7, so nothing else fits.
        assert!(ok(&[g1d, g1d, g1d, g1d]).is_ok());
        let e = ok(&[g1d, g1d, g1d, g1d, g1]).unwrap_err();
        assert!(matches!(e, MigError::NoLegalPlacement { .. }), "{e}");
        assert!(matches!(
            ok(&[g7, g1]),
            Err(MigError::NoLegalPlacement { .. })
        ));
        // With a 1g at slice 0, a 4g (start 0 only) cannot be placed; a 3g at 4 can.
        let e = place_instances(&g, &[at(g1, 0)], &[g4]).unwrap_err();
        assert!(e.to_string().contains("slices 0 taken"), "{e}");
        assert_eq!(
            place_instances(&g, &[at(g1, 0)], &[g3]).unwrap()[0].start,
            4
        );
        // An existing instance at an illegal start is reported, not trusted.
        assert!(matches!(
            place_instances(&g, &[at(g3, 2)], &[]),
            Err(MigError::BadExisting { .. })
        ));
    }
}

#[test]
fn media_extension_profile_allows_one_instance_on_h200() {
    let g = h200();
    assert!(place_instances(&g, &[], &["1g.18gb+me"]).is_ok());
    let e = place_instances(&g, &[at("1g.18gb+me", 3)], &["1g.18gb+me"]).unwrap_err();
    assert!(matches!(e, MigError::TooMany { max: 1, .. }), "{e}");
}

#[test]
fn planner_places_mig_backed_vgpus_on_two_h200s() {
    let g = h200();
    let choice = |name: &str| {
        let p = g.profile(name).unwrap();
        Choice {
            key: p.name.clone(),
            cost: MigGeometry::cost(p),
            target: target(&p.name),
        }
    };
    // One H200 already holds a 3g at 0-3. Asked: 3 × 3g.71gb and 4 × 2g.35gb.
    let p = Problem {
        gpus: vec![
            GpuCap {
                id: "a".into(),
                numa_node: Some(0),
                rule: g.rule(&[at("3g.71gb", 0)]),
            },
            GpuCap {
                id: "b".into(),
                numa_node: Some(1),
                rule: g.rule(&[]),
            },
        ],
        demands: vec![
            Demand {
                profile: "c-71g".into(),
                count: 3,
                numa: None,
                choices: vec![vec![choice("3g.71gb")]; 2],
            },
            Demand {
                profile: "c-35g".into(),
                count: 4,
                numa: None,
                choices: vec![vec![choice("2g.35gb")]; 2],
            },
        ],
    };
    let s = plan(&p, Policy::Consolidate).unwrap();
    // Free: a 4-7, b 0-7. 3g@a4, 3g@b0, 2g@b4 = 3; or 3g@a4 + 2g@b0, b2, b4 = 4 (2g starts are 0, 2, 4).
    assert_eq!(s.placed, 4);
    let best = super::random::exhaustive(&p);
    assert_eq!(s.placed as usize, best);
    for a in &s.assignments {
        assert!(a.start.is_some());
    }
}

#[test]
fn malformed_nvml_json_is_an_error() {
    for (pl, what) in [
        ("[]", "not an object"),
        (r#"{"MIG x": {"placements": [[0,1]]}}"#, "no profile_id"),
        (
            r#"{"MIG x": {"profile_id": 1, "placements": [[0]]}}"#,
            "is not [start, size]",
        ),
        (
            r#"{"MIG x": {"profile_id": 1, "placements": [[0,1],[1,2]]}}"#,
            "different sizes",
        ),
        (
            r#"{"MIG x": {"profile_id": 1, "placements": [[63,4]]}}"#,
            "outside 64 slices",
        ),
    ] {
        let e = MigGeometry::from_nvml_json("gpu", pl, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(what), "{e}");
    }
}
