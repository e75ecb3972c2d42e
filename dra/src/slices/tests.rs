//! The slice builder on hand-made offers.
#![allow(clippy::unwrap_used)]

use super::*;

fn offer(profile: &str, type_id: &str, fb: Option<u64>, avail: u32, max: u32) -> ProfileOffer {
    ProfileOffer {
        profile: profile.to_string(),
        backend: "mdev".to_string(),
        type_id: type_id.to_string(),
        type_name: Some(format!("GRID T4-{type_id}")),
        framebuffer_mib: fb,
        available: avail,
        in_use: max - avail,
        max_instances: max,
    }
}

fn t4(options: Vec<ProfileOffer>) -> GpuOffers {
    GpuOffers {
        vfs: None,
        gpu: "0000:3b:00.0".to_string(),
        pci: Some("0000:3b:00.0".to_string()),
        vendor: "nvidia".to_string(),
        model: "NVIDIA T4".to_string(),
        numa_node: Some(1),
        health: "ok".to_string(),
        homogeneous: true,
        options,
    }
}

fn instance(uuid: &str, type_id: &str) -> InstanceInfo {
    InstanceInfo {
        uuid: uuid.to_string(),
        gpu: "0000:3b:00.0".to_string(),
        parent: "0000:3b:00.0".to_string(),
        type_id: type_id.to_string(),
        profile: String::new(),
        state: "running".to_string(),
        defined: false,
        autostart: false,
        owner: String::new(),
        label: String::new(),
        iommu_group: 1,
        created_at: 0,
    }
}

fn slices(offers: &[GpuOffers], instances: &[InstanceInfo], ours: &[&str]) -> Vec<ResourceSlice> {
    let ours: HashSet<String> = ours.iter().map(|s| s.to_string()).collect();
    build(
        Inputs {
            driver: "vgpu.vgpu-manager.io",
            node: "node-1",
            offers,
            instances,
            ours: &ours,
            pools: &[],
            our_pools: &HashSet::new(),
        },
        7,
    )
}

fn counters(s: &[ResourceSlice]) -> BTreeMap<String, Quantity> {
    s[0].spec.shared_counters[0].counters.clone()
}

#[test]
fn an_empty_gpu_offers_every_size_drawing_from_one_counter_set() {
    let g = t4(vec![
        offer("vdi-1g", "nvidia-222", Some(1024), 16, 16),
        offer("vdi-2g", "nvidia-223", Some(2048), 8, 8),
        offer("vdi-4g", "nvidia-224", Some(4096), 4, 4),
    ]);
    let s = slices(&[g], &[], &[]);
    assert_eq!(s.len(), 2, "a counters slice and a devices slice");
    assert!(s[0].spec.devices.is_empty());
    assert!(s[1].spec.shared_counters.is_empty());
    assert_eq!(s[0].metadata.name, "node-1-vgpu-counters-0");
    assert_eq!(s[1].metadata.name, "node-1-vgpu-devices-0");
    for x in &s {
        assert_eq!(x.spec.pool.generation, 7);
        assert_eq!(x.spec.pool.resource_slice_count, 2);
    }
    let c = counters(&s);
    assert_eq!(c["share"].value, "16");
    assert_eq!(c["framebuffer"].value, "16384Mi");
    assert_eq!(s[1].spec.devices.len(), 16 + 8 + 4);
    let d = s[1]
        .spec
        .devices
        .iter()
        .find(|d| d.name == "gpu-0000-3b-00-0-vdi-4g-3")
        .unwrap();
    let draw = &d.consumes_counters[0];
    assert_eq!(draw.counter_set, "gpu-0000-3b-00-0");
    assert_eq!(draw.counters["share"].value, "4");
    assert_eq!(draw.counters["framebuffer"].value, "4096Mi");
    assert_eq!(d.attributes["profile"], Attribute::String("vdi-4g".into()));
    assert_eq!(d.attributes["numaNode"], Attribute::Int(1));
    assert_eq!(d.capacity["framebuffer"].value, "4096Mi");
}

#[test]
fn a_homogeneous_gpu_holding_vgpus_offers_only_their_type() {
    let g = t4(vec![
        offer("vdi-1g", "nvidia-222", Some(1024), 0, 16),
        offer("vdi-2g", "nvidia-223", Some(2048), 5, 8),
    ]);
    // Three nvidia-223 exist, one made by this driver.
    let inst = [
        instance("a", "nvidia-223"),
        instance("b", "nvidia-223"),
        instance("c", "nvidia-223"),
    ];
    let s = slices(&[g], &inst, &["a"]);
    let names: Vec<&str> = s[1].spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names.len(), 8);
    assert!(names.iter().all(|n| n.contains("-vdi-2g-")), "{names:?}");
    // L = 8 over the one published type: 5 free + our 1 = 6 of 8 units, the two made by others
    // are gone.
    let c = counters(&s);
    assert_eq!(c["share"].value, "6");
    assert_eq!(c["framebuffer"].value, "12288Mi");
}

#[test]
fn a_faulted_gpu_is_tainted_and_no_gpu_means_no_slices() {
    let mut g = t4(vec![offer("vdi-2g", "nvidia-223", Some(2048), 8, 8)]);
    g.health = "faulted: /sys/…/mdev_supported_types: Input/output error".to_string();
    let s = slices(&[g], &[], &[]);
    let d = &s[1].spec.devices[0];
    assert_eq!(d.taints[0].key, FAULTED_TAINT);
    assert_eq!(d.taints[0].effect, "NoSchedule");
    assert!(slices(&[], &[], &[]).is_empty());
    let bad_name = GpuOffers {
        gpu: "Bad_Parent".to_string(),
        pci: None,
        ..t4(vec![offer("vdi-2g", "nvidia-223", Some(2048), 8, 8)])
    };
    assert!(slices(&[bad_name], &[], &[]).is_empty());
}

#[test]
fn a_virtual_parent_is_published_by_its_name() {
    let mbochs = GpuOffers {
        gpu: "mbochs".to_string(),
        pci: None,
        vendor: "virtual".to_string(),
        homogeneous: false,
        ..t4(vec![offer("sample-display-4m", "mbochs-1", Some(4), 2, 2)])
    };
    let s = slices(&[mbochs], &[], &[]);
    assert_eq!(s[0].spec.shared_counters[0].name, "parent-mbochs");
    let names: Vec<&str> = s[1].spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "parent-mbochs-sample-display-4m-0",
            "parent-mbochs-sample-display-4m-1"
        ]
    );
    assert_eq!(
        s[1].spec.devices[0].attributes["gpu"],
        Attribute::String("mbochs".into())
    );
}

#[test]
fn many_gpus_are_cut_within_the_per_slice_limits() {
    let gpus: Vec<GpuOffers> = (0..20u32)
        .map(|i| GpuOffers {
            gpu: format!("0000:{i:02x}:00.0"),
            pci: Some(format!("0000:{i:02x}:00.0")),
            ..t4(vec![
                offer("vdi-1g", "nvidia-222", Some(1024), 16, 16),
                offer("vdi-2g", "nvidia-223", Some(2048), 8, 8),
            ])
        })
        .collect();
    let s = slices(&gpus, &[], &[]);
    let sets: usize = s.iter().map(|x| x.spec.shared_counters.len()).sum();
    let devices: usize = s.iter().map(|x| x.spec.devices.len()).sum();
    assert_eq!(sets, 20);
    assert_eq!(devices, 20 * 24);
    for x in &s {
        assert!(x.spec.shared_counters.len() <= MAX_COUNTER_SETS_PER_SLICE);
        assert!(
            x.spec.devices.len() <= 64,
            "devices drawing from counters: 64 per slice"
        );
        assert!(x.spec.devices.is_empty() || x.spec.shared_counters.is_empty());
        assert_eq!(x.spec.pool.resource_slice_count, s.len() as i64);
    }
    let mut names: Vec<&str> = s.iter().map(|x| x.metadata.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), s.len());
}

#[test]
fn types_of_unknown_framebuffer_draw_only_share() {
    let g = GpuOffers {
        homogeneous: false,
        ..t4(vec![
            offer("sample-1", "mtty-1", None, 24, 24),
            offer("sample-2", "mtty-2", None, 12, 12),
        ])
    };
    let s = slices(&[g], &[], &[]);
    let c = counters(&s);
    assert_eq!(c.len(), 1);
    assert_eq!(c["share"].value, "24");
    let two = s[1]
        .spec
        .devices
        .iter()
        .find(|d| d.name.contains("-sample-2-"))
        .unwrap();
    assert_eq!(two.consumes_counters[0].counters["share"].value, "2");
    assert!(two.capacity.is_empty());
}

#[test]
fn long_node_names_still_make_valid_slice_names() {
    let node = "n".repeat(300);
    let name = slice_name(&node, "vgpu.vgpu-manager.io", "devices", 3);
    assert!(name.len() <= 253);
    assert!(name.ends_with("-vgpu-devices-3"));
}

fn vf_offer(profile: &str, fb: u64, avail: u32, max: u32) -> ProfileOffer {
    ProfileOffer {
        profile: profile.to_string(),
        backend: "sriov-vf".to_string(),
        type_id: format!("vf-{max}"),
        type_name: None,
        framebuffer_mib: Some(fb),
        available: avail,
        in_use: max - avail,
        max_instances: max,
    }
}

fn flex(options: Vec<ProfileOffer>, enabled: u32, free: u32) -> GpuOffers {
    GpuOffers {
        gpu: "0000:03:00.0".to_string(),
        pci: Some("0000:03:00.0".to_string()),
        vendor: "intel".to_string(),
        model: "Intel Data Center GPU Flex 170".to_string(),
        homogeneous: false,
        vfs: Some(vgpu_client::VfOffers {
            enabled,
            total: 31,
            free,
        }),
        ..t4(options)
    }
}

fn slot_pool(name: &str, profile: &str, state: &str) -> PoolStatus {
    PoolStatus {
        pool: name.to_string(),
        description: String::new(),
        policy: "consolidate".to_string(),
        autostart: false,
        applied_at: 0,
        wanted: BTreeMap::from([(profile.to_string(), 1)]),
        in_sync: state == "running",
        slots: vec![vgpu_client::SlotRow {
            profile: profile.to_string(),
            index: 0,
            uuid: "u".to_string(),
            gpu: Some("0000:03:00.0".to_string()),
            numa_node: None,
            type_id: None,
            parent: None,
            type_name: None,
            state: state.to_string(),
            vf: Some("0000:03:00.1".to_string()),
            pci_id: None,
            iommu_group: Some(9),
            fault: None,
        }],
        gpus: Vec::new(),
    }
}

#[test]
fn a_pf_without_vfs_counts_the_vfs_of_each_split() {
    let g = flex(
        vec![
            vf_offer("vdi-1g", 1024, 16, 16),
            vf_offer("vdi-2g", 2048, 8, 8),
        ],
        0,
        16,
    );
    let s = slices(&[g], &[], &[]);
    let c = counters(&s);
    assert_eq!(c[VFS].value, "16");
    assert_eq!(c["share"].value, "16");
    assert_eq!(c["framebuffer"].value, "16384Mi");
    assert_eq!(s[1].spec.devices.len(), 24);
    let d = s[1]
        .spec
        .devices
        .iter()
        .find(|d| d.name == "gpu-0000-03-00-0-vdi-2g-7")
        .unwrap();
    let draw = &d.consumes_counters[0].counters;
    assert_eq!(draw[VFS].value, "1");
    assert_eq!(draw["share"].value, "2");
    assert_eq!(
        d.attributes["backend"],
        Attribute::String("sriov-vf".into())
    );
}

#[test]
fn the_vfs_counter_is_the_free_vfs_plus_the_slots_of_this_driver() {
    // 8 VFs enabled; 2 taken: one by this driver's pool, one by someone else.
    let g = flex(vec![vf_offer("vdi-2g", 2048, 6, 8)], 8, 6);
    let pools = [
        slot_pool("dra-ours", "vdi-2g", "running"),
        slot_pool("floor", "vdi-2g", "running"),
    ];
    let ours = HashSet::from(["dra-ours".to_string()]);
    let none = HashSet::new();
    let build_with = |our_pools: &HashSet<String>| {
        build(
            Inputs {
                driver: "vgpu.vgpu-manager.io",
                node: "node-1",
                offers: std::slice::from_ref(&g),
                instances: &[],
                ours: &none,
                pools: &pools,
                our_pools,
            },
            1,
        )
    };
    let s = build_with(&ours);
    let c = counters(&s);
    assert_eq!(c[VFS].value, "7", "6 free + ours");
    assert_eq!(c["share"].value, "7");
    assert_eq!(c["framebuffer"].value, "14336Mi");
    let s = build_with(&none);
    assert_eq!(counters(&s)[VFS].value, "6");
    // An mdev GPU has no vfs counter.
    let m = slices(
        &[t4(vec![offer("vdi-2g", "nvidia-223", Some(2048), 8, 8)])],
        &[],
        &[],
    );
    assert!(!counters(&m).contains_key(VFS));
}
