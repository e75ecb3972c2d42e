//! NVIDIA classic mdev (homogeneous rule) and vendor-specific VFIO, and GVT-g, on the demo host.

use nix::errno::Errno;

use super::*;

const T4: &str = "/sys/class/mdev_bus/0000:01:00.0/mdev_supported_types";
const T4B: &str = "/sys/class/mdev_bus/0000:83:00.0/mdev_supported_types";
const L40S: &str = "/sys/bus/pci/devices/0000:85:00.0";

fn avail(h: &SimHost, types: &str, t: &str) -> u32 {
    rd(h, &format!("{types}/{t}/available_instances"))
        .parse()
        .unwrap()
}

fn uuid(n: u32) -> String {
    format!("{n:08x}-1111-4000-8000-{n:012x}")
}

/// `key=value` fields of an NVIDIA description.
fn field(desc: &str, key: &str) -> String {
    desc.split(", ")
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} missing in {desc}"))
        .to_string()
}

#[test]
fn t4_types_count_from_their_framebuffer() {
    let h = SimHost::builtin("demo").unwrap();
    let types = h.list(&p(T4)).unwrap();
    for t in [
        "nvidia-222",
        "nvidia-231",
        "nvidia-234",
        "nvidia-319",
        "nvidia-321",
    ] {
        assert!(types.contains(&t.to_string()), "{t}");
    }
    assert_eq!(rd(&h, &format!("{T4}/nvidia-231/name")), "GRID T4-2Q");
    assert_eq!(
        rd(&h, &format!("{T4}/nvidia-231/description")),
        "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=8"
    );
    // On a fresh GPU every type offers max_instance = 16384 MiB / its framebuffer.
    for t in &types {
        let desc = rd(&h, &format!("{T4}/{t}/description"));
        let fb: u32 = field(&desc, "framebuffer")
            .trim_end_matches('M')
            .parse()
            .unwrap();
        let max: u32 = field(&desc, "max_instance").parse().unwrap();
        assert_eq!(max, 16384 / fb, "{t}");
        assert_eq!(avail(&h, T4, t), max, "{t}");
    }
}

#[test]
fn homogeneous_rule_on_a_t4() {
    let h = SimHost::builtin("demo").unwrap();
    wr(&h, &format!("{T4}/nvidia-231/create"), &uuid(1));
    assert_eq!(avail(&h, T4, "nvidia-231"), 7);
    for t in ["nvidia-230", "nvidia-222", "nvidia-223", "nvidia-319"] {
        assert_eq!(avail(&h, T4, t), 0, "{t}");
    }
    // Another type while a 2Q exists: the resource manager refuses (-EIO).
    assert_eq!(
        wr_err(&h, &format!("{T4}/nvidia-230/create"), &uuid(2)),
        Errno::EIO
    );
    // The other T4 is independent (apart from its own foreign instance).
    assert_eq!(avail(&h, T4B, "nvidia-231"), 7);
    for n in 2..=8 {
        wr(&h, &format!("{T4}/nvidia-231/create"), &uuid(n));
    }
    assert_eq!(avail(&h, T4, "nvidia-231"), 0);
    assert_eq!(
        wr_err(&h, &format!("{T4}/nvidia-231/create"), &uuid(9)),
        Errno::EIO
    );
    for n in 1..=8 {
        wr(
            &h,
            &format!("/sys/bus/mdev/devices/{}/remove", uuid(n)),
            "1",
        );
    }
    assert_eq!(avail(&h, T4, "nvidia-230"), 16);
    assert_eq!(avail(&h, T4, "nvidia-234"), 1);
}

#[test]
fn foreign_instance_on_the_second_t4() {
    let h = SimHost::builtin("demo").unwrap();
    let foreign = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";
    assert_eq!(
        h.list(&p(&format!("{T4B}/nvidia-231/devices"))).unwrap(),
        vec![foreign.to_string()]
    );
    assert_eq!(avail(&h, T4B, "nvidia-231"), 7);
    assert_eq!(avail(&h, T4B, "nvidia-232"), 0);
    assert_eq!(
        h.canonicalize(&p(&format!("/sys/bus/mdev/devices/{foreign}")))
            .unwrap(),
        p(&format!(
            "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:83:00.0/{foreign}"
        ))
    );
    assert_eq!(
        link_name(&h, &format!("/sys/bus/mdev/devices/{foreign}/driver")).as_deref(),
        Some("nvidia-vgpu-vfio")
    );
    // A duplicate of it on the other GPU.
    assert_eq!(
        wr_err(&h, &format!("{T4}/nvidia-231/create"), foreign),
        Errno::EEXIST
    );
}

#[test]
fn unbinding_the_gpu_unregisters_the_parent_and_its_instances() {
    let h = SimHost::builtin("demo").unwrap();
    wr(&h, "/sys/bus/pci/drivers/nvidia/unbind", "0000:83:00.0");
    assert!(!h.exists(&p("/sys/class/mdev_bus/0000:83:00.0")));
    assert!(!h.exists(&p(
        "/sys/bus/mdev/devices/8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61"
    )));
    wr(&h, "/sys/bus/pci/drivers/nvidia/bind", "0000:83:00.0");
    assert_eq!(avail(&h, T4B, "nvidia-232"), 4);
}

fn creatable(h: &SimHost, vf: u32) -> Vec<(u32, String)> {
    let text = h
        .read(&p(&format!(
            "{L40S}/virtfn{vf}/nvidia/creatable_vgpu_types"
        )))
        .unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("ID    : vGPU Name"));
    lines
        .map(|l| {
            let (id, name) = l.split_once(" : ").unwrap();
            (id.trim().parse().unwrap(), name.to_string())
        })
        .collect()
}

fn current(vf: u32) -> String {
    format!("{L40S}/virtfn{vf}/nvidia/current_vgpu_type")
}

#[test]
fn vendor_vfio_lists_shrink_as_framebuffer_is_used() {
    let h = SimHost::builtin("demo").unwrap();
    let all = creatable(&h, 0);
    assert_eq!(all.len(), 30);
    assert_eq!(all[0], (1145, "NVIDIA L40S-1B".to_string()));
    // The driver's row format: "%-5d : %s".
    let raw = rd(&h, &format!("{L40S}/virtfn0/nvidia/creatable_vgpu_types"));
    assert!(raw.contains("\n1147  : NVIDIA L40S-1Q\n"), "{raw}");
    assert_eq!(rd(&h, &current(0)), "0");
    // A 24 GB vGPU on VF 0.
    wr(&h, &current(0), "1155\n");
    assert_eq!(rd(&h, &current(0)), "1155");
    // VF 0 now offers nothing; the others offer only 24 GB types (equal-size mode).
    assert!(creatable(&h, 0).is_empty());
    let names: Vec<String> = creatable(&h, 1).into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        names,
        vec!["NVIDIA L40S-24Q", "NVIDIA L40S-24A", "NVIDIA L40S-24C"]
    );
    // A different size, on a free VF: the resource manager refuses (-EIO).
    assert_eq!(wr_err(&h, &current(1), "1147"), Errno::EIO);
    wr(&h, &current(1), "1165");
    // Full: only the header remains, everywhere.
    for vf in [2, 31] {
        assert!(creatable(&h, vf).is_empty());
        assert_eq!(
            rd(
                &h,
                &format!("{L40S}/virtfn{vf}/nvidia/creatable_vgpu_types")
            ),
            "ID    : vGPU Name"
        );
    }
    assert_eq!(wr_err(&h, &current(2), "1155"), Errno::EIO);
    // Clearing gives the framebuffer back.
    wr(&h, &current(1), "0");
    assert_eq!(creatable(&h, 2).len(), 3);
    wr(&h, &current(0), "0");
    assert_eq!(creatable(&h, 2).len(), 30);
}

#[test]
fn vendor_vfio_store_errnos() {
    let h = SimHost::builtin("demo").unwrap();
    // kstrtol(buf, 10) errors as is.
    assert_eq!(wr_err(&h, &current(3), "abc"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &current(3), "0x47b"), Errno::EINVAL);
    assert_eq!(
        wr_err(&h, &current(3), "99999999999999999999"),
        Errno::ERANGE
    );
    // Clearing a VF without a vGPU, creating on an occupied VF: -EPERM.
    assert_eq!(wr_err(&h, &current(3), "0"), Errno::EPERM);
    wr(&h, &current(3), "1152");
    assert_eq!(wr_err(&h, &current(3), "1152"), Errno::EPERM);
    // Unknown type ids fail in the resource manager.
    assert_eq!(wr_err(&h, &current(4), "4242"), Errno::EIO);
    assert_eq!(wr_err(&h, &current(4), "-5"), Errno::EIO);
    assert_eq!(
        errno(h.write(
            &p(&format!("{L40S}/virtfn3/nvidia/creatable_vgpu_types")),
            "1"
        )),
        Errno::EACCES
    );
    wr(
        &h,
        &format!("{L40S}/virtfn4/nvidia/vgpu_params"),
        "vgpu-placement-id=8\n",
    );
    assert_eq!(
        rd(&h, &format!("{L40S}/virtfn4/nvidia/vgpu_params")),
        "vgpu-placement-id=8"
    );
}

#[test]
fn vendor_vfio_state_goes_with_the_vf_binding() {
    let h = SimHost::builtin("demo").unwrap();
    wr(&h, &current(5), "1153");
    assert_eq!(creatable(&h, 6).len(), 3);
    wr(&h, "/sys/bus/pci/drivers/nvidia/unbind", "0000:85:01.1");
    assert!(!h.exists(&p(&format!("{L40S}/virtfn5/nvidia"))));
    // The vGPU was destroyed with the binding.
    assert_eq!(creatable(&h, 6).len(), 30);
    wr(&h, "/sys/bus/pci/drivers/nvidia/bind", "0000:85:01.1");
    assert_eq!(rd(&h, &current(5)), "0");
    // Disabling SR-IOV removes the VFs and their vGPUs.
    wr(&h, &current(7), "1153");
    wr(&h, &format!("{L40S}/sriov_numvfs"), "0");
    assert!(!h.exists(&p(&format!("{L40S}/virtfn7"))));
    wr(&h, &format!("{L40S}/sriov_numvfs"), "2");
    assert_eq!(creatable(&h, 1).len(), 30);
}

#[test]
fn gvt_g_types_and_resources() {
    let h = SimHost::builtin("demo").unwrap();
    let gvt = "/sys/bus/pci/devices/0000:00:02.0/mdev_supported_types";
    assert_eq!(rd(&h, &format!("{gvt}/i915-GVTg_V5_4/name")), "GVTg_V5_4");
    assert_eq!(
        h.read(&p(&format!("{gvt}/i915-GVTg_V5_8/description")))
            .unwrap(),
        "low_gm_size: 64MB\nhigh_gm_size: 384MB\nfence: 4\nresolution: 1024x768\nweight: 2\n"
    );
    let a = |t: &str| avail(&h, gvt, t);
    assert_eq!(
        (
            a("i915-GVTg_V5_8"),
            a("i915-GVTg_V5_4"),
            a("i915-GVTg_V5_2"),
            a("i915-GVTg_V5_1")
        ),
        (7, 5, 2, 1)
    );
    wr(&h, &format!("{gvt}/i915-GVTg_V5_2/create"), &uuid(1));
    // Low GM 896-256 = 640, high 2688-1024 = 1664, fences 24.
    assert_eq!(
        (
            a("i915-GVTg_V5_8"),
            a("i915-GVTg_V5_4"),
            a("i915-GVTg_V5_2"),
            a("i915-GVTg_V5_1")
        ),
        (4, 3, 1, 0)
    );
    assert_eq!(
        wr_err(&h, &format!("{gvt}/i915-GVTg_V5_1/create"), &uuid(2)),
        Errno::ENOSPC
    );
    for n in 3..7 {
        wr(&h, &format!("{gvt}/i915-GVTg_V5_8/create"), &uuid(n));
    }
    assert_eq!(a("i915-GVTg_V5_8"), 0);
    assert_eq!(
        wr_err(&h, &format!("{gvt}/i915-GVTg_V5_8/create"), &uuid(9)),
        Errno::ENOSPC
    );
}
