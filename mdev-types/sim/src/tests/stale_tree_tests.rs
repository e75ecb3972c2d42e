//! Writes resolved through the last rendered tree (after changes that only added nodes) behave
//! exactly like writes resolved through a freshly rendered one.

use proptest::prelude::*;

use super::*;

const TYPES: &[(&str, &str)] = &[
    ("mtty", "mtty-1"),
    ("mtty", "mtty-2"),
    ("mdpy", "mdpy-vga"),
    ("mdpy", "mdpy-hd"),
    ("mbochs", "mbochs-medium"),
    ("mbochs", "mbochs-large"),
];
const MODULES: &[&str] = &["mtty", "mdpy", "mbochs"];

#[derive(Debug, Clone)]
enum Op {
    Create(usize, u32),
    Remove(u32),
    Module(usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..TYPES.len(), 0u32..12).prop_map(|(t, u)| Op::Create(t, u)),
        3 => (0u32..12).prop_map(Op::Remove),
        1 => (0..MODULES.len(), any::<bool>()).prop_map(|(m, l)| Op::Module(m, l)),
    ]
}

fn uuid(n: u32) -> String {
    format!("{n:08x}-0000-4000-8000-{n:012x}")
}

fn run(h: &SimHost, op: &Op) -> Result<(), Errno> {
    match op {
        Op::Create(t, u) => {
            let (parent, ty) = TYPES[*t];
            h.write(
                &p(&format!(
                    "/sys/class/mdev_bus/{parent}/mdev_supported_types/{ty}/create"
                )),
                &uuid(*u),
            )
            .map_err(|e| e.errno)
        }
        Op::Remove(u) => h
            .write(
                &p(&format!("/sys/bus/mdev/devices/{}/remove", uuid(*u))),
                "1",
            )
            .map_err(|e| e.errno),
        Op::Module(m, true) => h.load_module(MODULES[*m]),
        Op::Module(m, false) => h.unload_module(MODULES[*m]),
    }
}

/// What a reader sees of the mdev world.
fn observed(h: &SimHost) -> Vec<String> {
    let mut seen = h.list(&p("/sys/bus/mdev/devices")).unwrap_or_default();
    for (parent, ty) in TYPES {
        let a = h
            .read(&p(&format!(
                "/sys/class/mdev_bus/{parent}/mdev_supported_types/{ty}/available_instances"
            )))
            .map_err(|e| e.errno);
        seen.push(format!("{parent}/{ty}: {a:?}"));
    }
    seen
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn writes_through_a_stale_tree_match_writes_through_a_fresh_one(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        // `fresh` re-renders before every write (a read in between); `lazy` renders only when a
        // write cannot be resolved in the stale tree.
        let fresh = SimHost::builtin("samples").unwrap();
        let lazy = SimHost::builtin("samples").unwrap();
        let _ = lazy.exists(&p("/sys/bus/mdev/devices"));
        for op in &ops {
            let _ = fresh.exists(&p("/sys/bus/mdev/devices"));
            prop_assert_eq!(run(&fresh, op), run(&lazy, op), "{:?}", op);
        }
        prop_assert_eq!(observed(&fresh), observed(&lazy));
    }
}

#[test]
fn a_removed_device_is_gone_for_writes_at_once() {
    let h = SimHost::builtin("samples").unwrap();
    let create = "/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/create";
    wr(&h, create, &uuid(1));
    let _ = h.exists(&p("/sys/bus/mdev/devices"));
    wr(&h, create, &uuid(2));
    let remove = format!("/sys/bus/mdev/devices/{}/remove", uuid(2));
    wr(&h, &remove, "1");
    assert_eq!(wr_err(&h, &remove, "1"), Errno::ENOENT);
    h.unload_module("mdpy").unwrap();
    assert_eq!(
        wr_err(
            &h,
            "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-vga/create",
            &uuid(3)
        ),
        Errno::ENOENT
    );
}
