//! The argument and reply handling of Manager1's pool and scheduling methods (`Plan`, `Apply`,
//! `PoolStatus`, `PlanScheduling`, `ApplyScheduling`). Their reports travel as JSON strings (see
//! [`vgpu_client::pools`]); the methods themselves are declared in [`super::manager`], as zbus wants
//! one `impl` block per interface.

use serde::Serialize;

use super::errors::ApiError;
use crate::daemon::api::limits::{self, ClientList, ClientText, clip_to};
use crate::daemon::api::{ApplyPool, CoreError, PlanPool};
use crate::sched::SchedRequest;

/// The JSON text of a reply (a report in the shape docs/json.md documents). It goes through
/// `serde_json::Value`, whose objects keep their keys sorted, so the text is the same whatever the
/// field order of the Rust type.
pub(super) fn json_value<T: Serialize>(reply: &T) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(reply)
        .map_err(|e| ApiError::internal(format!("cannot encode the reply as JSON: {e}")))
}

/// [`json_value`] as text.
pub(super) fn json_text<T: Serialize>(reply: &T) -> Result<String, ApiError> {
    json_value(reply).map(|v| v.to_string())
}

/// Refuses an empty pool text with the format to send, and one past [`limits::MAX_TEXT_BYTES`].
fn pool_text(method: &str, toml: &str) -> Result<String, ApiError> {
    limits::check_text(ClientText::PoolToml, toml).map_err(CoreError::from)?;
    if toml.trim().is_empty() {
        return Err(ApiError::invalid(format!(
            "{method}: the pool text is empty: send a pool file's contents (name = \"…\", [profiles] name = count)"
        )));
    }
    Ok(toml.to_string())
}

/// `Plan(s pool_toml)`.
pub(super) fn plan_command(toml: &str) -> Result<PlanPool, ApiError> {
    Ok(PlanPool {
        toml: pool_text("Plan", toml)?,
    })
}

/// `Apply(s pool_toml)`.
pub(super) fn apply_command(toml: &str) -> Result<ApplyPool, ApiError> {
    Ok(ApplyPool {
        toml: pool_text("Apply", toml)?,
    })
}

/// The GPU of `PlanScheduling`/`ApplyScheduling`, refused past [`limits::MAX_NAME_BYTES`].
pub(super) fn sched_gpu(gpu: &str) -> Result<String, ApiError> {
    limits::check_text(ClientText::Gpu, gpu).map_err(CoreError::from)?;
    Ok(gpu.to_string())
}

/// The requests of `PlanScheduling`/`ApplyScheduling` (at most [`limits::MAX_SCHED_REQUESTS`]): a JSON array of
/// `{"weight": W, "slot"?: S, "priority"?: "low"|"normal"|"high", "framebuffer_mib"?: N, "label"?: L}`,
/// or `""` / `[]` for weight 1 on every vGPU that exists.
pub(super) fn sched_requests(method: &str, json: &str) -> Result<Vec<SchedRequest>, ApiError> {
    limits::check_text(ClientText::SchedulingRequests, json).map_err(CoreError::from)?;
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wire {
        weight: u32,
        slot: Option<String>,
        priority: Option<crate::profile::Priority>,
        framebuffer_mib: Option<u64>,
        label: Option<String>,
    }
    let wire: Vec<Wire> = serde_json::from_str(json).map_err(|e| {
        // serde's message quotes what it met (an unknown field's name): shown bounded.
        ApiError::invalid(format!(
            "{method}: requests are not a JSON array of {{\"weight\": W, \"slot\"?, \"priority\"?, \"framebuffer_mib\"?, \"label\"?}}: {}",
            clip_to(&e.to_string(), 4 * limits::ECHO_BYTES)
        ))
    })?;
    limits::check_count(ClientList::SchedulingRequests, wire.len()).map_err(CoreError::from)?;
    for w in &wire {
        if let Some(label) = &w.label {
            limits::check_label(ClientText::SchedulingLabel, label).map_err(CoreError::from)?;
        }
        if let Some(slot) = &w.slot {
            limits::check_text(ClientText::SchedulingSlot, slot).map_err(CoreError::from)?;
        }
    }
    Ok(wire
        .into_iter()
        .map(|w| SchedRequest {
            slot: w.slot,
            weight: w.weight,
            priority: w.priority,
            framebuffer_mib: w.framebuffer_mib,
            label: w.label,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_or_name_the_shape() {
        assert!(sched_requests("PlanScheduling", " ").unwrap().is_empty());
        let r = sched_requests(
            "PlanScheduling",
            r#"[{"weight":10},{"weight":30,"slot":"vf2","priority":"high"}]"#,
        )
        .unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[1].weight, r[1].slot.as_deref()), (30, Some("vf2")));
        let e = sched_requests("PlanScheduling", r#"[{"wieght":1}]"#).unwrap_err();
        assert_eq!(e.error_name(), "org.vgpumanager.Error.Invalid");
        assert!(e.message().contains("wieght"), "{}", e.message());
        let many = format!("[{}]", vec![r#"{"weight":1}"#; 257].join(","));
        let e = sched_requests("ApplyScheduling", &many).unwrap_err();
        assert_eq!(e.error_name(), "org.vgpumanager.Error.Invalid");
        assert!(e.message().contains("limit of 256"), "{}", e.message());
        let long_slot = format!(r#"[{{"weight":1,"slot":"{}"}}]"#, "v".repeat(300));
        let e = sched_requests("ApplyScheduling", &long_slot).unwrap_err();
        assert!(e.message().contains("slot is 300 bytes"), "{}", e.message());
        assert!(sched_gpu(&"g".repeat(256)).is_err() && sched_gpu("0000:03:00.0").is_ok());
        let e = apply_command("  ").unwrap_err();
        assert!(e.message().starts_with("Apply: the pool text is empty"));
    }
}
