//! What an mdevctl call-out script prints (`vgpu_manager::cli`): byte 0 picks the answer read — `get
//! capabilities` ([`Capabilities::from_answer`]) or `get attributes` ([`attributes_from_answer`]) — the
//! rest is the script's standard output, any bytes. Beyond "no panic": trailing NUL bytes never change
//! the reading (both readers ignore them, as mdevctl does); a capabilities answer that is read lists
//! what it handles consistently ([`Capabilities::handles`] holds for each listed event and action); an
//! attributes answer that is read, written back as `[{"NAME": "VALUE"}, …]`, reads as the same list
//! in the same order.

use vgpu_manager::cli::{Capabilities, attributes_from_answer};

/// The check: see the module docs.
pub fn check(data: &[u8]) {
    let Some((&first, stdout)) = data.split_first() else {
        return;
    };
    let mut padded = stdout.to_vec();
    padded.extend_from_slice(b"\0\0");
    if first % 2 == 0 {
        let caps = Capabilities::from_answer(stdout);
        assert_eq!(caps, Capabilities::from_answer(&padded), "trailing NULs");
        if let Some(caps) = caps {
            for &event in &caps.events {
                for &action in &caps.actions {
                    assert!(caps.handles(event, action), "{event} {action:?} listed");
                }
            }
        }
    } else {
        let read = attributes_from_answer(stdout);
        let again = attributes_from_answer(&padded);
        assert_eq!(read.as_ref().ok(), again.as_ref().ok(), "trailing NULs");
        if let Ok(Some(attrs)) = read {
            let list: Vec<serde_json::Value> = attrs
                .iter()
                .map(|(k, v)| serde_json::json!({ k.as_str(): v.as_str() }))
                .collect();
            let text = serde_json::Value::Array(list).to_string();
            let back = attributes_from_answer(text.as_bytes())
                .unwrap_or_else(|e| panic!("{text:?} written back does not read: {e}"));
            assert_eq!(back, Some(attrs), "{text:?} written back");
        }
    }
}
