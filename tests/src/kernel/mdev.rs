//! mdev tests against the kernel's sample drivers: discovery, create/remove, accounting, IOMMU groups
//! and every `create`/`remove` refusal with the kernel's exact errno.

use std::path::Path;

use vgpu_host::{Errno, Host, HostExt, paths};

use super::guest::{Guest, KernelKind};
use super::runner::{Outcome, Test, TestResult, ensure, ensure_eq, expect_errno};
use super::samples::{
    Mdevs, SAMPLE_PARENTS, SAMPLE_TYPES, available, create_path, sample, test_uuid, type_id,
};

/// The mdev tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("mdev_parents_registered", parents_registered),
        Test::new("mdev_type_attributes", type_attributes),
        Test::new("mdev_create_and_remove", create_and_remove),
        Test::new("mdev_available_instances_accounting", accounting),
        Test::new("mdev_own_iommu_group", own_iommu_group),
        Test::new("mdev_vfio_device_cdev", vfio_device_cdev),
        Test::new("mdev_error_duplicate_uuid", duplicate_uuid),
        Test::new("mdev_error_type_full_mtty", |g| type_full(g, "mtty-2")),
        Test::new("mdev_error_type_full_mdpy", |g| type_full(g, "mdpy-hd")),
        Test::new("mdev_error_type_full_mbochs", |g| {
            type_full(g, "mbochs-large")
        }),
        Test::new("mdev_error_unknown_type", unknown_type),
        Test::new("mdev_error_unknown_parent", unknown_parent),
        Test::new("mdev_error_double_remove", double_remove),
        Test::new("mdev_error_malformed_uuid", malformed_uuid),
    ]
}

/// /sys/class/mdev_bus lists exactly the three sample parents, each with its types.
fn parents_registered(g: &Guest) -> TestResult {
    let parents = g.host.list(Path::new(paths::MDEV_BUS_CLASS))?;
    ensure_eq(
        "parents in /sys/class/mdev_bus",
        parents,
        SAMPLE_PARENTS
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    )?;
    for parent in SAMPLE_PARENTS {
        let dir = paths::mdev_parent(parent).join("mdev_supported_types");
        let mut expected: Vec<&str> = SAMPLE_TYPES
            .iter()
            .filter(|t| t.parent == *parent)
            .map(|t| t.id)
            .collect();
        expected.sort_unstable();
        ensure_eq(
            format_args!("types of {parent}"),
            g.host.list(&dir)?,
            expected.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )?;
    }
    Ok(Outcome::Passed)
}

/// Each type's name, device_api, description and initial available_instances read as the driver
/// defines them; `create` exists and is write-only.
fn type_attributes(g: &Guest) -> TestResult {
    for t in SAMPLE_TYPES {
        let dir = paths::mdev_type_dir(t.parent, &type_id(t.id)?);
        ensure_eq(
            format_args!("{}/name", t.id),
            g.host.read_trimmed(&dir.join("name"))?,
            t.name.to_string(),
        )?;
        ensure_eq(
            format_args!("{}/device_api", t.id),
            g.host.read_trimmed(&dir.join("device_api"))?,
            "vfio-pci".to_string(),
        )?;
        ensure_eq(
            format_args!("{}/description", t.id),
            g.host.read_optional(&dir.join("description"))?,
            t.description.map(str::to_string),
        )?;
        ensure_eq(
            format_args!("{}/available_instances", t.id),
            available(&g.host, t.parent, t.id)?,
            t.initial,
        )?;
        // create is write-only (mdev_sysfs.c MDEV_TYPE_ATTR_WO): reading it fails, so an operator tool
        // must never "read back" a create attribute.
        ensure(g.host.exists(&dir.join("create")), || {
            format!("{}/create is missing", dir.display())
        })?;
        expect_errno(
            format_args!("reading {}/create", t.id),
            g.host.read(&dir.join("create")),
            Errno::EACCES,
        )?;
    }
    Ok(Outcome::Passed)
}

/// An mdev of each parent appears under /sys/bus/mdev/devices with the right type and parent, is listed
/// in its type's devices/, and disappears on remove.
fn create_and_remove(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    for (n, ty) in ["mtty-1", "mdpy-vga", "mbochs-medium"]
        .into_iter()
        .enumerate()
    {
        let t = sample(ty)?;
        let uuid = test_uuid("create_and_remove", n as u32);
        mdevs.create(t.parent, ty, uuid)?;
        let dev = paths::mdev_device(&uuid);
        g.wait_for(&dev, true)?;
        ensure_eq(
            format_args!("{uuid}/mdev_type"),
            g.host.link_name(&dev.join("mdev_type"))?,
            Some(ty.to_string()),
        )?;
        let canonical = g.host.canonicalize(&dev)?;
        let parent_dir = g.host.canonicalize(&paths::mdev_parent(t.parent))?;
        ensure(canonical.parent() == Some(parent_dir.as_path()), || {
            format!(
                "{uuid} lives at {}, not below its parent {}",
                canonical.display(),
                parent_dir.display()
            )
        })?;
        let listed = g
            .host
            .list(&paths::mdev_type_dir(t.parent, &type_id(ty)?).join("devices"))?;
        ensure_eq(format_args!("{ty}/devices"), listed, vec![uuid.to_string()])?;
        mdevs.remove(&uuid)?;
        g.wait_for(&dev, false)?;
    }
    Ok(Outcome::Passed)
}

/// available_instances goes down on create and back up on remove, across the types that share a pool.
fn accounting(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    // (type to create, [(type, expected available after the create)]) — pools per samples.rs docs.
    let cases: [(&str, [(&str, u32); 2]); 3] = [
        // mtty: one mtty-2 takes 2 of 24 ports.
        ("mtty-2", [("mtty-1", 22), ("mtty-2", 11)]),
        // mdpy: the mdev core's per-parent count of 4 is shared by all three types.
        ("mdpy-vga", [("mdpy-vga", 3), ("mdpy-hd", 3)]),
        // mbochs: 16 of 256 MB leave 240 MB: 60 small, 3 large.
        ("mbochs-medium", [("mbochs-small", 60), ("mbochs-large", 3)]),
    ];
    for (n, (ty, after)) in cases.into_iter().enumerate() {
        let t = sample(ty)?;
        let uuid = test_uuid("accounting", n as u32);
        mdevs.create(t.parent, ty, uuid)?;
        for (other, count) in after {
            ensure_eq(
                format_args!("{other}/available_instances after creating one {ty}"),
                available(&g.host, t.parent, other)?,
                count,
            )?;
        }
        mdevs.remove(&uuid)?;
        for (other, _) in after {
            ensure_eq(
                format_args!("{other}/available_instances after removing the {ty}"),
                available(&g.host, t.parent, other)?,
                sample(other)?.initial,
            )?;
        }
    }
    Ok(Outcome::Passed)
}

/// A sample mdev is an "emulated IOMMU" VFIO device (vfio_register_emulated_iommu_dev): it gets an
/// IOMMU group of its own, with a /dev/vfio/<group> node.
fn own_iommu_group(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid("own_iommu_group", 0);
    mdevs.create("mbochs", "mbochs-small", uuid)?;
    let dev = paths::mdev_device(&uuid);
    let group = g.iommu_group_of(&dev)?;
    ensure_eq(
        format_args!("members of {uuid}'s IOMMU group {group}"),
        g.iommu_group_members(group)?,
        vec![uuid.to_string()],
    )?;
    let node = format!("/dev/vfio/{group}");
    ensure(g.host.exists(Path::new(&node)), || {
        format!("{node} is missing for {uuid}'s group")
    })?;
    mdevs.remove_all()?;
    g.wait_for(Path::new(&node), false)?;
    Ok(Outcome::Passed)
}

/// With VFIO_DEVICE_CDEV (custom kernel), an mdev gets vfio-dev/vfioN and /dev/vfio/devices/vfioN.
fn vfio_device_cdev(g: &Guest) -> TestResult {
    if !g.has_iommufd() {
        if g.kernel == KernelKind::Custom {
            return Err(super::runner::TestError::Check(
                "the custom kernel is built with IOMMUFD but /dev/iommu is missing (iommufd not loaded?)"
                    .into(),
            ));
        }
        return Ok(Outcome::Skipped(
            "kernel has no IOMMUFD / VFIO device cdev (CONFIG_IOMMUFD, CONFIG_VFIO_DEVICE_CDEV)"
                .into(),
        ));
    }
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid("vfio_device_cdev", 0);
    mdevs.create("mbochs", "mbochs-medium", uuid)?;
    let vdir = paths::mdev_device(&uuid).join("vfio-dev");
    let names = g.host.list(&vdir)?;
    let [name] = names.as_slice() else {
        return Err(super::runner::TestError::Check(format!(
            "{} should hold one vfioN entry, holds {names:?}",
            vdir.display()
        )));
    };
    ensure(name.starts_with("vfio"), || {
        format!("{} holds {name}, not vfioN", vdir.display())
    })?;
    let node = format!("/dev/vfio/devices/{name}");
    ensure(g.host.exists(Path::new(&node)), || {
        format!("{node} is missing")
    })?;
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// The same UUID twice is EEXIST, on the same parent and on another one (mdev_core.c checks one global
/// list).
fn duplicate_uuid(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid("duplicate_uuid", 0);
    mdevs.create("mbochs", "mbochs-small", uuid)?;
    expect_errno(
        "creating the same UUID on mbochs-small again",
        mdevs.create("mbochs", "mbochs-small", uuid),
        Errno::EEXIST,
    )?;
    expect_errno(
        "creating the same UUID on mtty-1",
        mdevs.create("mtty", "mtty-1", uuid),
        Errno::EEXIST,
    )?;
    ensure_eq(
        "mbochs-small/available_instances with one instance",
        available(&g.host, "mbochs", "mbochs-small")?,
        63,
    )?;
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// Filling a type to available_instances 0, then one more create fails with the driver's errno.
fn type_full(g: &Guest, ty: &str) -> TestResult {
    let t = sample(ty)?;
    let mut mdevs = Mdevs::new(&g.host);
    for n in 0..t.initial {
        mdevs.create(t.parent, ty, test_uuid(ty, n))?;
    }
    ensure_eq(
        format_args!("{ty}/available_instances when full"),
        available(&g.host, t.parent, ty)?,
        0,
    )?;
    expect_errno(
        format_args!("creating one {ty} more than available"),
        mdevs.create(t.parent, ty, test_uuid(ty, t.initial)),
        t.full_errno,
    )?;
    mdevs.remove_all()?;
    ensure_eq(
        format_args!("{ty}/available_instances after removing all"),
        available(&g.host, t.parent, ty)?,
        t.initial,
    )?;
    Ok(Outcome::Passed)
}

/// `create` of a type the parent does not offer: the attribute does not exist (ENOENT).
fn unknown_type(g: &Guest) -> TestResult {
    let path = create_path("mbochs", "mbochs-huge")?;
    expect_errno(
        "writing create of mbochs-huge",
        g.host
            .write(&path, &test_uuid("unknown_type", 0).to_string()),
        Errno::ENOENT,
    )?;
    Ok(Outcome::Passed)
}

/// `create` below a parent that is not registered: ENOENT too.
fn unknown_parent(g: &Guest) -> TestResult {
    let path = create_path("0000:00:1f.7", "mbochs-small")?;
    expect_errno(
        "writing create below an unregistered parent",
        g.host
            .write(&path, &test_uuid("unknown_parent", 0).to_string()),
        Errno::ENOENT,
    )?;
    Ok(Outcome::Passed)
}

/// Removing an mdev twice: its directory is gone after the first, so the second is ENOENT.
fn double_remove(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid("double_remove", 0);
    mdevs.create("mtty", "mtty-1", uuid)?;
    mdevs.remove(&uuid)?;
    expect_errno(
        format_args!("removing {uuid} a second time"),
        mdevs.remove(&uuid),
        Errno::ENOENT,
    )?;
    Ok(Outcome::Passed)
}

/// `create` with text that is not a UUID: EINVAL (mdev_sysfs.c create_store checks the length, then
/// guid_parse).
fn malformed_uuid(g: &Guest) -> TestResult {
    let path = create_path("mtty", "mtty-1")?;
    expect_errno(
        "writing a short non-UUID to create",
        g.host.write(&path, "not-a-uuid"),
        Errno::EINVAL,
    )?;
    expect_errno(
        "writing a 36-character non-UUID to create",
        g.host.write(&path, "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"),
        Errno::EINVAL,
    )?;
    ensure_eq(
        "mtty-1/available_instances after refused creates",
        available(&g.host, "mtty", "mtty-1")?,
        24,
    )?;
    Ok(Outcome::Passed)
}
