//! mdev `create`/`remove` semantics and instance accounting on the kernel samples.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::errno::Errno;

use super::*;

const TYPES: &str = "/sys/class/mdev_bus";

fn ty(parent: &str, t: &str) -> String {
    format!("{TYPES}/{parent}/mdev_supported_types/{t}")
}

fn avail(h: &SimHost, parent: &str, t: &str) -> u32 {
    rd(h, &format!("{}/available_instances", ty(parent, t)))
        .parse()
        .unwrap()
}

/// A deterministic distinct UUID per `n`.
fn uuid(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-{n:012x}")
}

fn create(h: &SimHost, parent: &str, t: &str, u: &str) -> Result<(), Errno> {
    h.write(&p(&format!("{}/create", ty(parent, t))), u)
        .map_err(|e| e.errno)
}

#[test]
fn sample_types_show_the_kernels_names_and_counts() {
    let h = SimHost::builtin("samples").unwrap();
    assert_eq!(
        rd(&h, &format!("{}/name", ty("mtty", "mtty-1"))),
        "Single port serial"
    );
    assert_eq!(
        rd(&h, &format!("{}/name", ty("mtty", "mtty-2"))),
        "Dual port serial"
    );
    // mtty has no show_description: the attribute is hidden.
    assert!(!h.exists(&p(&format!("{}/description", ty("mtty", "mtty-1")))));
    assert_eq!(
        rd(
            &h,
            &format!("{}/description", ty("mbochs", "mbochs-medium"))
        ),
        "virtual display, 16 MB video memory"
    );
    assert_eq!(
        rd(&h, &format!("{}/description", ty("mdpy", "mdpy-xga"))),
        "virtual display, 1024x768 framebuffer"
    );
    for (parent, t, n) in [
        ("mtty", "mtty-1", 24),
        ("mtty", "mtty-2", 12),
        ("mdpy", "mdpy-vga", 4),
        ("mdpy", "mdpy-xga", 4),
        ("mdpy", "mdpy-hd", 4),
        ("mbochs", "mbochs-small", 64),
        ("mbochs", "mbochs-medium", 16),
        ("mbochs", "mbochs-large", 4),
    ] {
        assert_eq!(avail(&h, parent, t), n, "{t}");
        assert_eq!(rd(&h, &format!("{}/device_api", ty(parent, t))), "vfio-pci");
    }
}

#[test]
fn shared_port_pool_of_mtty() {
    let h = SimHost::builtin("samples").unwrap();
    create(&h, "mtty", "mtty-2", &uuid(1)).unwrap();
    assert_eq!(avail(&h, "mtty", "mtty-1"), 22);
    assert_eq!(avail(&h, "mtty", "mtty-2"), 11);
    create(&h, "mtty", "mtty-1", &uuid(2)).unwrap();
    assert_eq!(avail(&h, "mtty", "mtty-1"), 21);
    assert_eq!(avail(&h, "mtty", "mtty-2"), 10);
    for n in 3..24 {
        create(&h, "mtty", "mtty-1", &uuid(n)).unwrap();
    }
    // 2 + 1 + 21 = 24 ports used.
    assert_eq!(avail(&h, "mtty", "mtty-1"), 0);
    // mtty_init_dev: -ENOSPC.
    assert_eq!(create(&h, "mtty", "mtty-1", &uuid(99)), Err(Errno::ENOSPC));
    assert_eq!(create(&h, "mtty", "mtty-2", &uuid(99)), Err(Errno::ENOSPC));
}

#[test]
fn shared_megabytes_of_mbochs() {
    let h = SimHost::builtin("samples").unwrap();
    create(&h, "mbochs", "mbochs-large", &uuid(1)).unwrap();
    assert_eq!(avail(&h, "mbochs", "mbochs-small"), 48);
    assert_eq!(avail(&h, "mbochs", "mbochs-medium"), 12);
    assert_eq!(avail(&h, "mbochs", "mbochs-large"), 3);
    for n in 2..=4 {
        create(&h, "mbochs", "mbochs-large", &uuid(n)).unwrap();
    }
    assert_eq!(
        create(&h, "mbochs", "mbochs-small", &uuid(9)),
        Err(Errno::ENOSPC)
    );
    assert_eq!(avail(&h, "mbochs", "mbochs-small"), 0);
}

#[test]
fn core_counted_mdpy_fails_with_eusers() {
    let h = SimHost::builtin("samples").unwrap();
    create(&h, "mdpy", "mdpy-vga", &uuid(1)).unwrap();
    // One counter for the parent: every type shows it.
    for t in ["mdpy-vga", "mdpy-xga", "mdpy-hd"] {
        assert_eq!(avail(&h, "mdpy", t), 3);
    }
    create(&h, "mdpy", "mdpy-xga", &uuid(2)).unwrap();
    create(&h, "mdpy", "mdpy-hd", &uuid(3)).unwrap();
    create(&h, "mdpy", "mdpy-hd", &uuid(4)).unwrap();
    assert_eq!(avail(&h, "mdpy", "mdpy-vga"), 0);
    assert_eq!(create(&h, "mdpy", "mdpy-vga", &uuid(5)), Err(Errno::EUSERS));
    // Removing one gives the count back (mdev_device_release).
    wr(
        &h,
        &format!("/sys/bus/mdev/devices/{}/remove", uuid(4)),
        "1",
    );
    assert_eq!(avail(&h, "mdpy", "mdpy-xga"), 1);
}

#[test]
fn create_input_checks_follow_create_store() {
    let h = SimHost::builtin("samples").unwrap();
    let u = "4b20d080-1b54-4048-85b3-a6a62d165c01";
    // Length must be 36 or 37.
    assert_eq!(create(&h, "mtty", "mtty-1", "abc"), Err(Errno::EINVAL));
    assert_eq!(
        create(&h, "mtty", "mtty-1", &format!("{u}\n\n")),
        Err(Errno::EINVAL)
    );
    assert_eq!(create(&h, "mtty", "mtty-1", ""), Err(Errno::EINVAL));
    // Right length, not a UUID.
    assert_eq!(
        create(&h, "mtty", "mtty-1", "4b20d080x1b54-4048-85b3-a6a62d165c01"),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        create(&h, "mtty", "mtty-1", "4b20d080-1b54-4048-85b3-a6a62d165cZZ"),
        Err(Errno::EINVAL)
    );
    // With the newline echo adds; the device is named in lower case.
    create(&h, "mtty", "mtty-1", &format!("{}\n", u.to_uppercase())).unwrap();
    assert!(h.exists(&p(&format!("/sys/bus/mdev/devices/{u}"))));
    // guid_parse reads 36 characters: a 37th that is not a newline is ignored.
    create(
        &h,
        "mtty",
        "mtty-1",
        "5b20d080-1b54-4048-85b3-a6a62d165c01x",
    )
    .unwrap();
    // A duplicate on any parent, in any case.
    assert_eq!(create(&h, "mbochs", "mbochs-small", u), Err(Errno::EEXIST));
    assert_eq!(
        create(&h, "mtty", "mtty-1", &u.to_uppercase()),
        Err(Errno::EEXIST)
    );
    // Unknown type: the path does not exist.
    assert_eq!(create(&h, "mtty", "mtty-9", &uuid(7)), Err(Errno::ENOENT));
}

#[test]
fn instance_sysfs_and_its_own_iommu_group() {
    let h = SimHost::builtin("samples").unwrap();
    let before: BTreeSet<String> = h
        .list(&p("/sys/kernel/iommu_groups"))
        .unwrap()
        .into_iter()
        .collect();
    let (a, b) = (uuid(1), uuid(2));
    create(&h, "mbochs", "mbochs-medium", &a).unwrap();
    create(&h, "mbochs", "mbochs-medium", &b).unwrap();
    let dev = format!("/sys/bus/mdev/devices/{a}");
    assert_eq!(
        h.canonicalize(&p(&dev)).unwrap(),
        p(&format!("/sys/devices/virtual/mbochs/mbochs/{a}"))
    );
    assert_eq!(
        h.canonicalize(&p(&format!("{dev}/mdev_type"))).unwrap(),
        p("/sys/devices/virtual/mbochs/mbochs/mdev_supported_types/mbochs-medium")
    );
    assert_eq!(
        h.read_link(&p(&format!("{dev}/mdev_type"))).unwrap(),
        p("../mdev_supported_types/mbochs-medium")
    );
    assert_eq!(
        link_name(&h, &format!("{dev}/driver")).as_deref(),
        Some("mbochs")
    );
    assert_eq!(
        h.list(&p(&format!("{}/devices", ty("mbochs", "mbochs-medium"))))
            .unwrap(),
        {
            let mut v = vec![a.clone(), b.clone()];
            v.sort();
            v
        }
    );
    // Each mdev gets a new group (lowest free number), holding only itself.
    let ga = link_name(&h, &format!("{dev}/iommu_group")).unwrap();
    let gb = link_name(&h, &format!("/sys/bus/mdev/devices/{b}/iommu_group")).unwrap();
    assert_ne!(ga, gb);
    assert!(!before.contains(&ga) && !before.contains(&gb));
    assert_eq!(
        h.list(&p(&format!("/sys/kernel/iommu_groups/{ga}/devices")))
            .unwrap(),
        vec![a.clone()]
    );
    assert_eq!(
        rd(&h, &format!("/sys/kernel/iommu_groups/{ga}/name")),
        "vfio-noiommu"
    );
    let lowest_free = (0..)
        .find(|n: &u32| !before.contains(&n.to_string()))
        .unwrap();
    assert_eq!(ga, lowest_free.to_string());
    // Removing frees the number for the next one.
    wr(&h, &format!("{dev}/remove"), "1");
    assert!(!h.exists(&p(&format!("/sys/kernel/iommu_groups/{ga}"))));
    create(&h, "mtty", "mtty-1", &uuid(3)).unwrap();
    assert_eq!(
        link_name(
            &h,
            &format!("/sys/bus/mdev/devices/{}/iommu_group", uuid(3))
        ),
        Some(ga)
    );
}

#[test]
fn remove_follows_remove_store() {
    let h = SimHost::builtin("samples").unwrap();
    let u = uuid(1);
    create(&h, "mbochs", "mbochs-large", &u).unwrap();
    let rm = format!("/sys/bus/mdev/devices/{u}/remove");
    assert_eq!(errno(h.read(&p(&rm))), Errno::EACCES);
    assert_eq!(wr_err(&h, &rm, "yes"), Errno::EINVAL);
    assert_eq!(wr_err(&h, &rm, ""), Errno::EINVAL);
    // 0 is accepted and does nothing.
    wr(&h, &rm, "0");
    assert_eq!(avail(&h, "mbochs", "mbochs-large"), 3);
    wr(&h, &rm, "1\n");
    assert_eq!(avail(&h, "mbochs", "mbochs-large"), 4);
    assert!(!h.exists(&p(&format!("/sys/bus/mdev/devices/{u}"))));
    assert!(
        h.list(&p(&format!("{}/devices", ty("mbochs", "mbochs-large"))))
            .unwrap()
            .is_empty()
    );
    // The second remove finds the attribute gone.
    assert_eq!(wr_err(&h, &rm, "1"), Errno::ENOENT);
}

#[test]
fn concurrent_creates_never_exceed_capacity() {
    let h = SimHost::builtin("samples").unwrap();
    let ok = Arc::new(AtomicUsize::new(0));
    let full = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let (h, ok, full) = (h.clone(), ok.clone(), full.clone());
            std::thread::spawn(move || {
                for i in 0..10u32 {
                    for (parent, ty_) in [("mbochs", "mbochs-large"), ("mdpy", "mdpy-hd")] {
                        match create(
                            &h,
                            parent,
                            ty_,
                            &uuid(1000 * (t + 1) + i * 2 + u32::from(parent == "mdpy")),
                        ) {
                            Ok(()) => ok.fetch_add(1, Ordering::SeqCst),
                            Err(Errno::ENOSPC | Errno::EUSERS) => {
                                full.fetch_add(1, Ordering::SeqCst)
                            }
                            Err(e) => panic!("unexpected {e}"),
                        };
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // 4 large mbochs (256 MB / 64 MB) and 4 mdpy (max_instances), whatever the interleaving.
    assert_eq!(ok.load(Ordering::SeqCst), 8);
    assert_eq!(full.load(Ordering::SeqCst), 160 - 8);
    assert_eq!(h.list(&p("/sys/bus/mdev/devices")).unwrap().len(), 8);
    assert_eq!(avail(&h, "mbochs", "mbochs-large"), 0);
    assert_eq!(avail(&h, "mdpy", "mdpy-vga"), 0);
}
