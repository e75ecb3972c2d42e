//! The D-Bus edge of incoming live-migration targets (`Manager1.PrepareIncoming`, `AbortIncoming`,
//! `CompleteIncoming`): the fingerprint and options decoded, the reply as JSON (docs/json.md).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use zbus::{OwnedVariant, Variant};

use super::errors::ApiError;
use crate::daemon::api::limits::{self, ClientText, clip};
use crate::daemon::api::{
    CoreError, DEFAULT_INCOMING_TIMEOUT, IncomingView, MAX_INCOMING_TIMEOUT, PrepareIncoming,
};
use crate::migration::Fingerprint;

/// Builds the request of `PrepareIncoming` from its arguments: the fingerprint (JSON of `vgpuctl
/// migration fingerprint`) and options `gpu` (s), `uuid` (s), `timeout` (u, seconds), `numa_node` (u).
pub(super) fn parse_prepare(
    fingerprint: &str,
    options: &HashMap<String, OwnedVariant>,
) -> Result<PrepareIncoming, ApiError> {
    limits::check_text(ClientText::Fingerprint, fingerprint).map_err(CoreError::from)?;
    let fingerprint: Fingerprint = serde_json::from_str(fingerprint).map_err(|e| {
        ApiError::invalid(format!(
            "PrepareIncoming: the fingerprint is not the JSON of `vgpuctl migration fingerprint`: {e}"
        ))
    })?;
    let mut req = PrepareIncoming {
        fingerprint,
        gpu: None,
        uuid: None,
        timeout: DEFAULT_INCOMING_TIMEOUT,
        numa_node: None,
    };
    const KNOWN: &str = "gpu (s), uuid (s), timeout (u, seconds), numa_node (u)";
    for (key, value) in options {
        match (key.as_str(), &**value) {
            ("gpu", Variant::Str(s)) => {
                limits::check_text(ClientText::Gpu, s.as_str()).map_err(CoreError::from)?;
                req.gpu = Some(s.as_str().trim().to_string()).filter(|s| !s.is_empty());
            }
            ("uuid", Variant::Str(s)) => req.uuid = Some(super::manager::parse_uuid(s.as_str())?),
            ("timeout", Variant::U32(n)) => {
                let t = Duration::from_secs(u64::from(*n));
                if t.is_zero() || t > MAX_INCOMING_TIMEOUT {
                    return Err(ApiError::invalid(format!(
                        "PrepareIncoming: timeout {n} s is outside 1..={} s",
                        MAX_INCOMING_TIMEOUT.as_secs()
                    )));
                }
                req.timeout = t;
            }
            ("numa_node", Variant::U32(n)) => req.numa_node = Some(*n),
            ("gpu" | "uuid" | "timeout" | "numa_node", v) => {
                return Err(ApiError::invalid(format!(
                    "PrepareIncoming: option '{key}' has type '{}'; known options: {KNOWN}",
                    v.value_signature()
                )));
            }
            _ => {
                return Err(ApiError::invalid(format!(
                    "PrepareIncoming: unknown option '{}'; known options: {KNOWN}",
                    clip(key)
                )));
            }
        }
    }
    Ok(req)
}

/// The JSON reply of `PrepareIncoming`.
#[derive(Serialize)]
pub(super) struct IncomingJson<'a> {
    uuid: String,
    source: String,
    parent: &'a str,
    gpu: &'a str,
    numa_node: Option<u32>,
    #[serde(rename = "type")]
    type_id: String,
    until: u64,
    hostdev_xml: &'a str,
    target_mdevs: &'a BTreeMap<String, String>,
    notes: &'a [String],
}

impl<'a> From<&'a IncomingView> for IncomingJson<'a> {
    fn from(v: &'a IncomingView) -> Self {
        IncomingJson {
            uuid: v.uuid.to_string(),
            source: v.source.to_string(),
            parent: &v.parent,
            gpu: &v.gpu,
            numa_node: v.numa_node,
            type_id: v.type_id.to_string(),
            until: v.until,
            hostdev_xml: &v.hostdev_xml,
            target_mdevs: &v.target_mdevs,
            notes: &v.notes,
        }
    }
}
