//! NVIDIA classic vGPU (mdev) on the SR-IOV VFs of an Ampere GPU (vGPU software ≤ 16), on the `ampere`
//! host: every VF bound to `nvidia` is an mdev parent holding at most one vGPU, and the VFs of one GPU
//! share its framebuffer and the homogeneous rule.

use nix::errno::Errno;

use super::*;
use crate::SimError;

const A10: &str = "/sys/bus/pci/devices/0000:41:00.0";
const T4: &str = "/sys/class/mdev_bus/0000:5e:00.0/mdev_supported_types";

/// The A10 Q-series types of the `ampere` host, in its order: (id, name, framebuffer MiB, max per GPU).
const TYPES: [(&str, &str, u32, u32); 8] = [
    ("nvidia-590", "NVIDIA A10-1Q", 1024, 24),
    ("nvidia-591", "NVIDIA A10-2Q", 2048, 12),
    ("nvidia-592", "NVIDIA A10-3Q", 3072, 8),
    ("nvidia-593", "NVIDIA A10-4Q", 4096, 6),
    ("nvidia-594", "NVIDIA A10-6Q", 6144, 4),
    ("nvidia-595", "NVIDIA A10-8Q", 8192, 3),
    ("nvidia-596", "NVIDIA A10-12Q", 12288, 2),
    ("nvidia-597", "NVIDIA A10-24Q", 24576, 1),
];
const Q4: &str = "nvidia-593";

fn host() -> SimHost {
    SimHost::builtin("ampere").unwrap_or_else(|e| panic!("{e}"))
}

/// The address of the A10's VF `i` (offset 4, stride 1 from 41:00.0).
fn vf(i: u16) -> String {
    let devfn = 4 + i;
    format!("0000:41:{:02x}.{}", devfn >> 3, devfn & 7)
}

/// `mdev_supported_types` of VF `i`.
fn types_of(i: u16) -> String {
    format!("/sys/class/mdev_bus/{}/mdev_supported_types", vf(i))
}

fn avail(h: &SimHost, i: u16, t: &str) -> u32 {
    rd(h, &format!("{}/{t}/available_instances", types_of(i)))
        .parse()
        .unwrap()
}

fn create(h: &SimHost, i: u16, t: &str, n: u32) {
    wr(h, &format!("{}/{t}/create", types_of(i)), &uuid(n));
}

fn create_err(h: &SimHost, i: u16, t: &str, n: u32) -> Errno {
    wr_err(h, &format!("{}/{t}/create", types_of(i)), &uuid(n))
}

fn remove(h: &SimHost, n: u32) {
    wr(h, &format!("/sys/bus/mdev/devices/{}/remove", uuid(n)), "1");
}

fn uuid(n: u32) -> String {
    format!("{n:08x}-2222-4000-8000-{n:012x}")
}

/// Asserts every A10 type shows 1 on every VF.
fn all_free(h: &SimHost) {
    for i in 0..32 {
        for (t, ..) in TYPES {
            assert_eq!(avail(h, i, t), 1, "VF {i} type {t}");
        }
    }
}

#[test]
fn every_a10_vf_offers_every_type_once() {
    let h = host();
    assert_eq!(rd(&h, &format!("{A10}/sriov_numvfs")), "32");
    let bus = h.list(&p("/sys/class/mdev_bus")).unwrap();
    assert_eq!(bus.len(), 33, "32 VFs and the T4: {bus:?}");
    assert!(
        !bus.contains(&"0000:41:00.0".to_string()),
        "the PF is no parent"
    );
    assert_eq!(vf(31), "0000:41:04.3");
    for i in 0..32 {
        assert!(bus.contains(&vf(i)), "VF {i}");
        assert_eq!(
            link_name(&h, &format!("{A10}/virtfn{i}/driver")).as_deref(),
            Some("nvidia")
        );
        let ids: Vec<String> = TYPES.iter().map(|t| t.0.to_string()).collect();
        assert_eq!(h.list(&p(&types_of(i))).unwrap(), ids, "VF {i}");
    }
    assert_eq!(
        h.canonicalize(&p(&format!("/sys/class/mdev_bus/{}", vf(0))))
            .unwrap(),
        p("/sys/devices/pci0000:41/0000:41:00.4")
    );
    for (t, name, fb, max) in TYPES {
        assert_eq!(rd(&h, &format!("{}/{t}/name", types_of(5))), name);
        assert_eq!(
            rd(&h, &format!("{}/{t}/description", types_of(5))),
            format!(
                "num_heads=4, frl_config=60, framebuffer={fb}M, max_resolution=7680x4320, max_instance={max}"
            )
        );
        assert_eq!(max, 24576 / fb, "{t}");
        assert_eq!(
            rd(&h, &format!("{}/{t}/device_api", types_of(5))),
            "vfio-pci"
        );
    }
    all_free(&h);
    // The T4 beside it keeps classic mdev on its PF.
    assert_eq!(rd(&h, &format!("{T4}/nvidia-231/available_instances")), "8");
}

#[test]
fn a_vgpu_occupies_its_vf_and_fixes_the_gpus_type() {
    let h = host();
    create(&h, 0, Q4, 1);
    let dev = format!("/sys/bus/mdev/devices/{}", uuid(1));
    assert_eq!(
        h.canonicalize(&p(&dev)).unwrap(),
        p(&format!("/sys/devices/pci0000:41/0000:41:00.4/{}", uuid(1)))
    );
    assert_eq!(
        link_name(&h, &format!("{dev}/mdev_type")).as_deref(),
        Some(Q4)
    );
    assert_eq!(
        link_name(&h, &format!("{dev}/driver")).as_deref(),
        Some("nvidia-vgpu-vfio")
    );
    for (t, ..) in TYPES {
        assert_eq!(avail(&h, 0, t), 0, "occupied VF, {t}");
    }
    for i in 1..32 {
        for (t, ..) in TYPES {
            let want = u32::from(t == Q4);
            assert_eq!(avail(&h, i, t), want, "VF {i} type {t}");
        }
    }
    // Another type on another VF: the homogeneous rule holds across the GPU's VFs.
    assert_eq!(create_err(&h, 1, "nvidia-590", 2), Errno::EIO);
    // The T4 is another physical GPU.
    wr(&h, &format!("{T4}/nvidia-231/create"), &uuid(3));
    assert_eq!(avail(&h, 1, Q4), 1);
    assert_eq!(rd(&h, &format!("{T4}/nvidia-231/available_instances")), "7");
}

#[test]
fn six_a10_4q_fill_the_framebuffer() {
    let h = host();
    for i in 0..6 {
        assert_eq!(avail(&h, i, Q4), 1, "VF {i}");
        create(&h, i, Q4, u32::from(i) + 1);
    }
    for i in 6..32 {
        assert_eq!(avail(&h, i, Q4), 0, "VF {i}");
    }
    assert_eq!(create_err(&h, 6, Q4, 7), Errno::EIO);
    assert_eq!(create_err(&h, 31, Q4, 7), Errno::EIO);
    remove(&h, 3);
    assert_eq!(avail(&h, 2, Q4), 1, "the freed VF");
    assert_eq!(avail(&h, 6, Q4), 1);
    create(&h, 6, Q4, 7);
    assert_eq!(avail(&h, 2, Q4), 0);
}

#[test]
fn a_type_limit_counts_per_physical_gpu() {
    let h = host();
    // A10-24Q: one per GPU, so a single vGPU on any VF closes it everywhere.
    create(&h, 9, "nvidia-597", 1);
    for i in 0..32 {
        for (t, ..) in TYPES {
            assert_eq!(avail(&h, i, t), 0, "VF {i} type {t}");
        }
    }
    assert_eq!(create_err(&h, 10, "nvidia-597", 2), Errno::EIO);
    // A10-1Q: 24 VFs take one each, then the other 8 show 0.
    remove(&h, 1);
    for i in 0..24 {
        create(&h, i, "nvidia-590", 100 + u32::from(i));
    }
    for i in 24..32 {
        assert_eq!(avail(&h, i, "nvidia-590"), 0, "VF {i}");
    }
    assert_eq!(create_err(&h, 24, "nvidia-590", 200), Errno::EIO);
}

#[test]
fn a_second_vgpu_on_an_occupied_vf_fails_eio() {
    let h = host();
    create(&h, 4, "nvidia-590", 1);
    assert_eq!(create_err(&h, 4, "nvidia-590", 2), Errno::EIO);
    assert_eq!(create_err(&h, 4, Q4, 2), Errno::EIO);
    // The same UUID anywhere is EEXIST first (mdev_device_create checks it before the driver).
    assert_eq!(create_err(&h, 5, "nvidia-590", 1), Errno::EEXIST);
    assert_eq!(
        h.list(&p(&format!("{}/nvidia-590/devices", types_of(4))))
            .unwrap(),
        vec![uuid(1)]
    );
}

#[test]
fn removing_a_vgpu_frees_its_vf() {
    let h = host();
    create(&h, 0, Q4, 1);
    remove(&h, 1);
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{}", uuid(1)))));
    all_free(&h);
    create(&h, 0, "nvidia-596", 2);
    assert_eq!(avail(&h, 1, "nvidia-596"), 1);
}

#[test]
fn disabling_vfs_removes_their_parents_and_vgpus() {
    let h = host();
    create(&h, 0, Q4, 1);
    create(&h, 1, Q4, 2);
    wr(&h, &format!("{A10}/sriov_numvfs"), "0");
    let bus = h.list(&p("/sys/class/mdev_bus")).unwrap();
    assert_eq!(bus, vec!["0000:5e:00.0".to_string()]);
    assert!(h.list(&p("/sys/bus/mdev/devices")).unwrap().is_empty());
    // Enabling again (sriov-manage -e) shows every VF free.
    wr(&h, &format!("{A10}/sriov_numvfs"), "32");
    all_free(&h);
    // Fewer VFs, fewer parents.
    wr(&h, &format!("{A10}/sriov_numvfs"), "0");
    wr(&h, &format!("{A10}/sriov_numvfs"), "4");
    assert_eq!(h.list(&p("/sys/class/mdev_bus")).unwrap().len(), 5);
    assert!(!h.exists(&p(&types_of(4))));
    // Unbinding the PF from nvidia disables SR-IOV, and with it every VF parent.
    create(&h, 3, Q4, 3);
    wr(&h, "/sys/bus/pci/drivers/nvidia/unbind", "0000:41:00.0");
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{}", uuid(3)))));
    assert!(!h.exists(&p(&types_of(0))));
}

#[test]
fn unbinding_a_vf_from_nvidia_removes_its_vgpu() {
    let h = host();
    create(&h, 2, "nvidia-594", 1);
    wr(&h, "/sys/bus/pci/drivers/nvidia/unbind", &vf(2));
    assert!(!h.exists(&p(&types_of(2))), "no longer a parent");
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{}", uuid(1)))));
    // The GPU's types are free again on the other VFs.
    assert_eq!(avail(&h, 3, Q4), 1);
    // On vfio-pci the VF is no mdev parent.
    wr(&h, &format!("{A10}/virtfn2/driver_override"), "vfio-pci");
    wr(&h, "/sys/bus/pci/drivers_probe", &vf(2));
    assert!(!h.exists(&p(&types_of(2))));
    wr(&h, "/sys/bus/pci/drivers/vfio-pci/unbind", &vf(2));
    wr(&h, &format!("{A10}/virtfn2/driver_override"), "\n");
    wr(&h, "/sys/bus/pci/drivers/nvidia/bind", &vf(2));
    assert_eq!(avail(&h, 2, Q4), 1);
}

#[test]
fn uevents_name_the_vf_as_the_vgpus_parent() {
    let h = host();
    let rx = h.subscribe().unwrap();
    create(&h, 0, Q4, 1);
    let ev = rx.try_recv().unwrap();
    assert_eq!(ev.action, "add");
    assert_eq!(
        ev.devpath,
        format!("/devices/pci0000:41/0000:41:00.4/{}", uuid(1))
    );
}

/// The `ampere` host with `extra` appended.
fn ampere_with(extra: &str) -> Result<SimHost, SimError> {
    let text = include_str!("../../../sims/ampere.toml");
    SimHost::from_toml("lab.toml", &format!("{text}\n{extra}"))
}

#[test]
fn vgpus_at_start_may_sit_on_enabled_vfs() {
    let vgpu = |parent: &str| {
        format!(
            "[[mdev]]\nuuid = \"{}\"\nparent = \"{parent}\"\ntype = \"{Q4}\"\n",
            uuid(1)
        )
    };
    let h = ampere_with(&vgpu(&vf(7))).unwrap();
    assert_eq!(avail(&h, 7, Q4), 0);
    assert_eq!(avail(&h, 8, Q4), 1);
    assert_eq!(avail(&h, 8, "nvidia-590"), 0);
    // A VF the spec does not enable is no parent yet.
    let text = include_str!("../../../sims/ampere.toml").replace("num_vfs = 32", "num_vfs = 4");
    let e = SimHost::from_toml("lab.toml", &format!("{text}\n{}", vgpu(&vf(7)))).unwrap_err();
    assert_eq!(e.field(), Some("mdev[0].parent"), "{e}");
    assert!(e.to_string().contains("num_vfs"), "{e}");
    // Two vGPUs on one VF.
    let two = format!(
        "{}[[mdev]]\nuuid = \"{}\"\nparent = \"{}\"\ntype = \"{Q4}\"\n",
        vgpu(&vf(7)),
        uuid(2),
        vf(7)
    );
    let e = ampere_with(&two).unwrap_err();
    assert_eq!(e.field(), Some("mdev[1].uuid"), "{e}");
    assert!(e.to_string().contains("already holds a vGPU"), "{e}");
}

#[test]
fn on_vfs_needs_an_sriov_pf() {
    // The T4 has no [pci.sriov].
    let text = include_str!("../../../sims/ampere.toml").replacen(
        "device = \"0000:5e:00.0\"\nmdev_driver",
        "device = \"0000:5e:00.0\"\non_vfs = true\nmdev_driver",
        1,
    );
    let e = SimHost::from_toml("lab.toml", &text).unwrap_err();
    assert_eq!(e.field(), Some("mdev_parent[1].on_vfs"), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("0000:5e:00.0") && msg.contains("[pci.sriov]"),
        "{msg}"
    );
    assert!(e.line().is_some(), "{e}");
}

#[test]
fn on_vfs_refuses_virtual_class_and_core_counting() {
    let on_vfs = "device = \"0000:41:00.0\"\non_vfs = true\n";
    let text = include_str!("../../../sims/ampere.toml");
    let e = SimHost::from_toml(
        "lab.toml",
        &text.replacen(on_vfs, &format!("{on_vfs}virtual_class = \"a10\"\n"), 1),
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("mdev_parent[0].on_vfs"), "{e}");
    assert!(e.to_string().contains("remove virtual_class"), "{e}");
    let e = SimHost::from_toml(
        "lab.toml",
        &text.replacen(on_vfs, &format!("{on_vfs}counting = \"core\"\n"), 1),
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("mdev_parent[0].on_vfs"), "{e}");
    assert!(e.to_string().contains("counting"), "{e}");
}

#[test]
fn on_vfs_and_nvidia_vfio_exclude_each_other() {
    let vfio = "[[nvidia_vfio]]\npf = \"0000:41:00.0\"\nframebuffer_mib = 24576\n\
                [[nvidia_vfio.type]]\nid = 1\nname = \"NVIDIA A10-4Q\"\nframebuffer_mib = 4096\n";
    let e = ampere_with(vfio).unwrap_err();
    assert_eq!(e.field(), Some("mdev_parent[0].on_vfs"), "{e}");
    assert!(e.to_string().contains("[[nvidia_vfio]]"), "{e}");
}

#[test]
fn a_gpu_is_an_mdev_parent_once() {
    // A second on_vfs parent, or a classic parent on the same PF.
    for extra in ["on_vfs = true\n", ""] {
        let dup = format!(
            "[[mdev_parent]]\ndevice = \"0000:41:00.0\"\n{extra}mdev_driver = \"nvidia-vgpu-vfio\"\n\
             pools = {{ fb = 1 }}\n[[mdev_parent.type]]\nid = \"nvidia-1\"\nuses = {{ fb = 1 }}\n"
        );
        let e = ampere_with(&dup).unwrap_err();
        assert_eq!(e.field(), Some("mdev_parent[2].device"), "{e}");
        assert!(e.to_string().contains("listed twice"), "{e}");
    }
}

#[test]
fn the_journal_replays_vgpus_on_vfs() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("kernel.journal");
    {
        let h = host().with_journal(&j).unwrap();
        create(&h, 0, Q4, 1);
        wr(&h, &format!("{A10}/sriov_numvfs"), "0");
        wr(&h, &format!("{A10}/sriov_numvfs"), "32");
        create(&h, 1, "nvidia-595", 2);
    }
    let h = host().with_journal(&j).unwrap();
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{}", uuid(1)))));
    assert_eq!(
        h.canonicalize(&p(&format!("/sys/bus/mdev/devices/{}", uuid(2))))
            .unwrap(),
        p(&format!("/sys/devices/pci0000:41/0000:41:00.5/{}", uuid(2)))
    );
    assert_eq!(avail(&h, 0, "nvidia-595"), 1);
    assert_eq!(avail(&h, 0, Q4), 0);
}
