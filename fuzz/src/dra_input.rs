//! What the DRA kubelet plugin (`vgpu-dra`) reads from outside: allocated device names (from the API
//! server's ResourceClaims), ResourceClaim objects, API-proxy addresses (a flag or the environment)
//! and its checkpoint file. Byte 0 picks the parser. Beyond "no panic": a device name that parses is
//! written back as the same name, fits a DNS label and is what `DeviceName::new` makes of its parts;
//! a claim that decodes yields only results of the driver asked for; an address reads back from its
//! own text; a checkpoint that loads is written as text that loads as the same checkpoint.

use std::path::Path;

use vgpu_dra::checkpoint::Checkpoint;
use vgpu_dra::claim::{ProxyEndpoint, ResourceClaim};
use vgpu_dra::device_name::{DeviceName, MAX_LEN};

const DRIVER: &str = "vgpu.vgpu-manager.io";

/// Parses `data` with the parser its first byte picks and checks what must hold.
pub fn check(data: &[u8]) {
    let Some((k, text)) = crate::selector_and_text(data, 4) else {
        return;
    };
    match k {
        0 => device_name(text),
        1 => claim(text),
        2 => endpoint(text),
        _ => checkpoint(text),
    }
}

fn device_name(text: &str) {
    let Ok(d) = text.parse::<DeviceName>() else {
        return;
    };
    let name = d.to_string();
    assert_eq!(name, text, "a device name reads back as itself");
    assert!(name.len() <= MAX_LEN, "{name} is a DNS label");
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "{name} is a DNS label"
    );
    assert_eq!(
        DeviceName::new(&d.gpu, &d.profile, d.index).as_ref(),
        Ok(&d)
    );
}

fn claim(text: &str) {
    let Ok(c) = serde_json::from_str::<ResourceClaim>(text) else {
        return;
    };
    assert!(c.results_of(DRIVER).all(|r| r.driver == DRIVER));
    if c.results_of(DRIVER).next().is_some() {
        assert!(c.is_allocated(), "results come from an allocation");
    }
}

fn endpoint(text: &str) {
    let Ok(e) = text.parse::<ProxyEndpoint>() else {
        return;
    };
    assert_eq!(e.to_string().parse::<ProxyEndpoint>(), Ok(e));
}

fn checkpoint(text: &str) {
    let path = Path::new("/fuzz/checkpoint.json");
    let Ok(c) = Checkpoint::parse(text.as_bytes(), path, DRIVER) else {
        return;
    };
    let again = Checkpoint::parse(&c.to_json(), path, DRIVER).expect("its own text loads");
    assert_eq!(again.to_json(), c.to_json());
}
