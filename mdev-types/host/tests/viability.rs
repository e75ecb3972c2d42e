//! The IOMMU-group viability tests, on the simulated host (an integration test: `vgpu-sim` builds on this crate).
#![allow(clippy::unwrap_used)]
use mdev_types::ids::IommuGroup;
use mdev_types::ids::PciAddress;
use vgpu_host::discover::discover;
use vgpu_host::viability::*;
use vgpu_host::{Host, paths};
use vgpu_sim::SimHost;

fn demo() -> SimHost {
    SimHost::builtin("demo").unwrap()
}

fn a(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn isolated_gpu_is_viable() {
    let v = check(&demo(), &a("0000:01:00.0")).unwrap();
    assert!(v.is_viable(), "{v}");
    assert_eq!(v.iommu_group, Some(IommuGroup(2)));
    assert!(v.members.is_empty());
    assert!(v.to_string().contains("can be handed to a guest"));
}

#[test]
fn boot_vga_is_refused() {
    let v = check(&demo(), &a("0000:00:02.0")).unwrap();
    assert_eq!(v.problems, vec![Problem::BootVga]);
    let e = ensure_viable(&demo(), &a("0000:00:02.0")).unwrap_err();
    assert!(e.to_string().contains("boot VGA"), "{e}");
}

#[test]
fn shared_group_names_the_host_nic_and_tolerates_bridges() {
    let h = demo();
    let v = check(&h, &a("0000:83:00.0")).unwrap();
    assert_eq!(v.iommu_group, Some(IommuGroup(11)));
    assert_eq!(
        v.problems,
        vec![Problem::MemberInUse {
            address: a("0000:84:00.0"),
            driver: "igb".into()
        }]
    );
    let bridges = v
        .members
        .iter()
        .filter(|m| m.state == MemberState::Bridge)
        .count();
    assert_eq!(bridges, 3, "{:?}", v.members);
    let msg = v.refusal().unwrap().to_string();
    assert!(msg.contains("0000:84:00.0") && msg.contains("igb"), "{msg}");
    assert!(msg.contains("IOMMU group 11"), "{msg}");
    assert!(msg.contains("vfio-pci"), "{msg}");
}

#[test]
fn unbinding_the_blocker_makes_the_group_viable() {
    let h = demo();
    let nic = a("0000:84:00.0");
    h.write(&paths::pci_driver("igb").join("unbind"), &nic.to_string())
        .unwrap();
    let v = check(&h, &a("0000:83:00.0")).unwrap();
    assert!(v.is_viable(), "{v}");
    let nic_member = v.members.iter().find(|m| m.address == nic).unwrap();
    assert_eq!(nic_member.state, MemberState::Unbound);
}

#[test]
fn pf_with_vfs_and_bridges_are_refused() {
    let h = demo();
    let v = check(&h, &a("0000:85:00.0")).unwrap();
    assert_eq!(v.problems, vec![Problem::PfWithVfs { num_vfs: 32 }]);
    let v = check(&h, &a("0000:00:01.0")).unwrap();
    assert!(v.problems.contains(&Problem::Bridge));
}

#[test]
fn unknown_device_is_an_error_naming_it() {
    let e = check(&demo(), &a("0000:ee:00.0")).unwrap_err();
    assert_eq!(e, ViabilityError::NoSuchDevice(a("0000:ee:00.0")));
    assert!(e.to_string().contains("0000:ee:00.0"));
}

#[test]
fn no_iommu_group_is_refused() {
    let mut inv = discover(&demo()).unwrap();
    for d in &mut inv.pci_devices {
        d.iommu_group = None;
    }
    inv.iommu_groups.clear();
    let v = evaluate(&inv, &a("0000:01:00.0")).unwrap();
    assert_eq!(v.problems, vec![Problem::NoIommuGroup]);
}

#[test]
fn report_round_trips_through_json() {
    let v = check(&demo(), &a("0000:83:00.0")).unwrap();
    let json = serde_json::to_string(&v).unwrap();
    assert!(json.contains("\"kind\":\"member-in-use\""), "{json}");
    assert!(json.contains("\"state\":\"host-driver\""), "{json}");
    let back: Viability = serde_json::from_str(&json).unwrap();
    assert_eq!(back, v);
}
