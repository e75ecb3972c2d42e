//! The argument decoding of every D-Bus method with arguments, without a bus: the [`Command`] each
//! method builds from its wire values, or the `Error.Invalid` reply it sends instead.
//!
//! vgpud does not go through [`decode`]: each method of `Manager1` and `Instance1` calls the same
//! helpers itself, in the same order (see the method bodies). This entry point exists so that those
//! helpers can be driven with arbitrary wire values — by the coverage-guided fuzz targets in the
//! repository's `fuzz/` directory — and it adds nothing of its own beyond the pairing of method and
//! command. Methods without arguments (`ListGpus`, `ListInstances`, `Reconcile`, `PoolStatus`,
//! `Instance1.Preflight`, `Instance1.MigrationInfo`, properties) decode nothing and are not listed.

use std::collections::HashMap;

use mdev_types::ids::MdevUuid;
use zbus::OwnedVariant;

use super::errors::ApiError;
use super::{instance, manager, pools};
use crate::daemon::api::*;

/// One method call's arguments as they arrive on the bus (the method's D-Bus signature in brackets).
#[derive(Debug, Clone, PartialEq)]
pub enum WireCall {
    /// `Manager1.GetInstance(s uuid)`.
    GetInstance {
        /// The UUID text.
        uuid: String,
    },
    /// `Manager1.Create(s target_kind, s target, s gpu, s uuid, a{sv} options)`, or `Define` with
    /// the same signature when `define` is true.
    CreateOrDefine {
        /// `Define` rather than `Create`.
        define: bool,
        /// `profile` or `type`.
        target_kind: String,
        /// The profile name or mdev type id.
        target: String,
        /// The GPU id, or empty.
        gpu: String,
        /// The UUID, or empty.
        uuid: String,
        /// The options dictionary.
        options: HashMap<String, OwnedVariant>,
    },
    /// `Manager1.Destroy(s uuid)`.
    Destroy {
        /// The UUID text.
        uuid: String,
    },
    /// `Manager1.Start(s uuid)`.
    Start {
        /// The UUID text.
        uuid: String,
    },
    /// `Manager1.Stop(s uuid)`.
    Stop {
        /// The UUID text.
        uuid: String,
    },
    /// `Manager1.Undefine(s uuid)`.
    Undefine {
        /// The UUID text.
        uuid: String,
    },
    /// `Manager1.SetAutostart(s uuid, b autostart)`.
    SetAutostart {
        /// The UUID text.
        uuid: String,
        /// The new value.
        autostart: bool,
    },
    /// `Manager1.Plan(s pool_toml)`.
    Plan {
        /// The pool file text.
        pool_toml: String,
    },
    /// `Manager1.Apply(s pool_toml)`.
    Apply {
        /// The pool file text.
        pool_toml: String,
    },
    /// `Manager1.PlanScheduling(s gpu, s requests)`, or `ApplyScheduling` with the same signature
    /// when `apply` is true.
    Scheduling {
        /// `ApplyScheduling` rather than `PlanScheduling`.
        apply: bool,
        /// The GPU id.
        gpu: String,
        /// The requests' JSON text.
        requests: String,
    },
    /// `Instance1.OpenDevice(a{sv} options)` on the object of instance `uuid` (the object, not the
    /// caller, supplies the UUID).
    OpenDevice {
        /// The instance the object stands for.
        uuid: MdevUuid,
        /// The options dictionary.
        options: HashMap<String, OwnedVariant>,
    },
}

/// The command a method call decodes to.
#[derive(Debug, Clone)]
pub enum DecodedCall {
    /// From `GetInstance`.
    GetInstance(GetInstance),
    /// From `Create`.
    Create(CreateInstance),
    /// From `Define`.
    Define(DefineInstance),
    /// From `Destroy`.
    Destroy(DestroyInstance),
    /// From `Start`.
    Start(StartInstance),
    /// From `Stop`.
    Stop(StopInstance),
    /// From `Undefine`.
    Undefine(UndefineInstance),
    /// From `SetAutostart`.
    SetAutostart(SetAutostart),
    /// From `Plan`.
    Plan(PlanPool),
    /// From `Apply`.
    Apply(ApplyPool),
    /// From `PlanScheduling`.
    PlanScheduling(PlanScheduling),
    /// From `ApplyScheduling`.
    ApplyScheduling(ApplyScheduling),
    /// From `OpenDevice`.
    OpenDevice(OpenDevice),
}

/// Decodes `call` as its method does: the command it runs, or the error it answers without running
/// anything.
pub fn decode(call: &WireCall) -> Result<DecodedCall, ApiError> {
    use manager::{parse_request, parse_uuid};
    Ok(match call {
        WireCall::GetInstance { uuid } => DecodedCall::GetInstance(GetInstance {
            uuid: parse_uuid(uuid)?,
        }),
        WireCall::CreateOrDefine {
            define,
            target_kind,
            target,
            gpu,
            uuid,
            options,
        } => {
            let method = if *define { "Define" } else { "Create" };
            let spec = parse_request(method, target_kind, target, gpu, uuid, options)?;
            if *define {
                DecodedCall::Define(DefineInstance(spec))
            } else {
                DecodedCall::Create(CreateInstance(spec))
            }
        }
        WireCall::Destroy { uuid } => DecodedCall::Destroy(DestroyInstance {
            uuid: parse_uuid(uuid)?,
        }),
        WireCall::Start { uuid } => DecodedCall::Start(StartInstance {
            uuid: parse_uuid(uuid)?,
        }),
        WireCall::Stop { uuid } => DecodedCall::Stop(StopInstance {
            uuid: parse_uuid(uuid)?,
        }),
        WireCall::Undefine { uuid } => DecodedCall::Undefine(UndefineInstance {
            uuid: parse_uuid(uuid)?,
        }),
        WireCall::SetAutostart { uuid, autostart } => DecodedCall::SetAutostart(SetAutostart {
            uuid: parse_uuid(uuid)?,
            autostart: *autostart,
        }),
        WireCall::Plan { pool_toml } => DecodedCall::Plan(pools::plan_command(pool_toml)?),
        WireCall::Apply { pool_toml } => DecodedCall::Apply(pools::apply_command(pool_toml)?),
        WireCall::Scheduling {
            apply,
            gpu,
            requests,
        } => {
            let method = if *apply {
                "ApplyScheduling"
            } else {
                "PlanScheduling"
            };
            let requests = pools::sched_requests(method, requests)?;
            let gpu = pools::sched_gpu(gpu)?;
            if *apply {
                DecodedCall::ApplyScheduling(ApplyScheduling { gpu, requests })
            } else {
                DecodedCall::PlanScheduling(PlanScheduling { gpu, requests })
            }
        }
        WireCall::OpenDevice { uuid, options } => {
            let (backend, bind) = instance::parse_open_options(options)?;
            DecodedCall::OpenDevice(OpenDevice {
                uuid: *uuid,
                backend,
                bind,
            })
        }
    })
}
