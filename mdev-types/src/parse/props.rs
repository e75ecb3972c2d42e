//! Property tests across all parsers: no input panics; formatters and parsers round-trip.

use proptest::prelude::*;

use super::*;
use crate::model::NvidiaVgpuType;

fn resolution() -> impl Strategy<Value = Resolution> {
    (1..=u32::MAX, 1..=u32::MAX).prop_map(|(width, height)| Resolution { width, height })
}

fn series() -> impl Strategy<Value = NvidiaSeries> {
    prop_oneof![
        Just(NvidiaSeries::A),
        Just(NvidiaSeries::B),
        Just(NvidiaSeries::C),
        Just(NvidiaSeries::Q),
    ]
}

proptest! {
    #[test]
    fn no_input_panics(s in any::<String>()) {
        let _ = parse_u32(&s);
        let _ = parse_u64(&s);
        let _ = parse_i64(&s);
        let _ = parse_bool01(&s);
        let _ = parse_class(&s);
        let _ = parse_resolution(&s);
        let _ = parse_size_mib(&s);
        let _ = parse_nvidia_description(&s);
        let _ = parse_gvt_description(&s);
        let _ = parse_creatable_vgpu_types(&s);
        let _ = parse_nvidia_vgpu_name(&s);
        let _ = parse_mbochs_description(&s);
        let _ = parse_mdpy_description(&s);
        let _ = parse_type_description(Some(&s));
    }

    // Inputs built from the formats' own alphabet reach deeper than random unicode.
    #[test]
    fn no_format_like_input_panics(s in "[0-9a-zA-Z_=:,x \\n-]{0,120}") {
        let _ = parse_nvidia_description(&s);
        let _ = parse_gvt_description(&s);
        let _ = parse_creatable_vgpu_types(&s);
        let _ = parse_nvidia_vgpu_name(&s);
        let _ = parse_size_mib(&s);
        let _ = parse_type_description(Some(&s));
    }

    #[test]
    fn numbers_round_trip(n in any::<u64>(), i in any::<i64>(), c in 0u32..=0xff_ffff) {
        prop_assert_eq!(parse_u64(&format!("{n}\n")), Ok(n));
        prop_assert_eq!(parse_u32(&format!("{}\n", n as u32)), Ok(n as u32));
        prop_assert_eq!(parse_i64(&format!("{i}\n")), Ok(i));
        // The kernel's `0x%06x` (drivers/pci/pci-sysfs.c).
        prop_assert_eq!(parse_class(&format!("0x{c:06x}\n")), Ok(c));
    }

    #[test]
    fn sizes_round_trip(mib in 0u64..=u64::MAX >> 10, unit in prop_oneof![Just("M"), Just("MB"), Just(" MB"), Just("MiB")]) {
        prop_assert_eq!(parse_size_mib(&format!("{mib}{unit}")), Ok(mib));
        prop_assert_eq!(parse_size_mib(&format!("{mib}G")), Ok(mib << 10));
    }

    #[test]
    fn resolution_round_trips(r in resolution()) {
        prop_assert_eq!(parse_resolution(&r.to_string()), Ok(r));
    }

    #[test]
    fn nvidia_description_round_trips(
        num_heads in any::<u32>(),
        frl_config in any::<u32>(),
        framebuffer_mib in any::<u64>(),
        max_resolution in resolution(),
        max_instance in any::<u32>(),
    ) {
        let d = NvidiaMdevDescription { num_heads, frl_config, framebuffer_mib, max_resolution, max_instance };
        let text = format!("{d}\n");
        prop_assert_eq!(parse_nvidia_description(&text), Ok(d.clone()));
        prop_assert_eq!(parse_type_description(Some(&text)), TypeDescription::Nvidia(d));
    }

    #[test]
    fn gvt_description_round_trips(
        low_gm_mib in any::<u64>(),
        high_gm_mib in any::<u64>(),
        fence in any::<u32>(),
        resolution in resolution(),
        weight in any::<u32>(),
    ) {
        let d = GvtDescription { low_gm_mib, high_gm_mib, fence, resolution, weight };
        let text = d.to_string();
        prop_assert_eq!(parse_gvt_description(&text), Ok(d.clone()));
        prop_assert_eq!(parse_type_description(Some(&text)), TypeDescription::Gvt(d));
    }

    #[test]
    fn samples_round_trip(mib in any::<u64>(), r in resolution()) {
        prop_assert_eq!(
            parse_type_description(Some(&format_mbochs_description(mib))),
            TypeDescription::SampleVideoMemory { mib }
        );
        prop_assert_eq!(
            parse_type_description(Some(&format_mdpy_description(r))),
            TypeDescription::SampleFramebuffer { resolution: r }
        );
    }

    #[test]
    fn creatable_types_round_trip(rows in prop::collection::vec((any::<u32>(), "[A-Za-z0-9][A-Za-z0-9 -]{0,30}[A-Za-z0-9]"), 0..12)) {
        let rows: Vec<NvidiaVgpuType> = rows.into_iter().map(|(id, name)| NvidiaVgpuType { id, name }).collect();
        prop_assert_eq!(parse_creatable_vgpu_types(&format_creatable_vgpu_types(&rows)), Ok(rows));
    }

    #[test]
    fn vgpu_names_round_trip(
        prefix in prop_oneof![Just(""), Just("GRID "), Just("NVIDIA ")],
        board in "[A-Z][A-Z0-9]{0,9}",
        framebuffer_gib in any::<u32>(),
        series in series(),
        heads in proptest::option::of(any::<u32>()),
        mig_slices in proptest::option::of(1u32..8),
    ) {
        let slices = mig_slices.map(|s| format!("{s}-")).unwrap_or_default();
        let head_suffix = heads.map(|h| h.to_string()).unwrap_or_default();
        let text = format!("{prefix}{board}-{slices}{framebuffer_gib}{}{head_suffix}", series.letter());
        let want = NvidiaVgpuName { board, framebuffer_gib, series, heads, mig_slices };
        prop_assert_eq!(parse_nvidia_vgpu_name(&text), Ok(want));
    }
}
