//! Kernel module parameters: `/sys/module/<module>/parameters/<name>` for parameters declared with read
//! permission (kernel/params.c `param_sysfs_setup`: a parameter with permission 0 gets no file), and a
//! driver's own parameter listing file where it has one (NVIDIA's `/proc/driver/nvidia/params`,
//! nv-procfs.c: one `Name: value` line per option, names without the `NVreg_` prefix, strings quoted).
//!
//! Parameters are read-only here: they change only when the module is loaded again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::build::Ctx;
use super::error::SimError;
use super::model::Model;
use super::vfs::Vfs;

/// A loaded module's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleSpec {
    /// The module name (`gim`, `nvidia`).
    pub name: String,
    /// Parameter values as the module was loaded with them.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Whether the parameters appear in `/sys/module/<name>/parameters/` (default true; false for
    /// `module_param(x, type, 0)`).
    #[serde(default = "yes")]
    pub sysfs: bool,
    /// A file listing the parameters (`/proc/driver/nvidia/params`).
    pub params_file: Option<String>,
    /// A prefix the listing file drops from parameter names (`NVreg_`).
    pub params_prefix: Option<String>,
}

fn yes() -> bool {
    true
}

/// A module's parameters in the simulated kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModuleParams {
    pub name: String,
    pub params: BTreeMap<String, String>,
    pub sysfs: bool,
    pub params_file: Option<String>,
    pub prefix: String,
}

/// Checks and records the `[[module]]` tables.
pub(crate) fn build(cx: &Ctx, specs: &[ModuleSpec], model: &mut Model) -> Result<(), SimError> {
    for (i, m) in specs.iter().enumerate() {
        if m.name.is_empty() || m.name.contains('/') {
            return Err(cx.err(
                format!("module[{i}].name"),
                "a module name must be non-empty without '/'",
            ));
        }
        if model.modules.iter().any(|x| x.name == m.name) {
            return Err(cx.err(
                format!("module[{i}].name"),
                format!("module '{}' is listed twice; keep one", m.name),
            ));
        }
        if let Some(bad) = m
            .parameters
            .keys()
            .find(|k| k.is_empty() || k.contains('/'))
        {
            return Err(cx.err(
                format!("module[{i}].parameters"),
                format!("parameter name {bad:?} must be non-empty without '/'"),
            ));
        }
        if let Some(f) = m.params_file.as_deref().filter(|f| !f.starts_with('/')) {
            return Err(cx.err(
                format!("module[{i}].params_file"),
                format!("{f:?} must be an absolute path such as /proc/driver/nvidia/params"),
            ));
        }
        model.modules.push(ModuleParams {
            name: m.name.clone(),
            params: m.parameters.clone(),
            sysfs: m.sysfs,
            params_file: m.params_file.clone(),
            prefix: m.params_prefix.clone().unwrap_or_default(),
        });
    }
    Ok(())
}

/// Renders the parameter files.
pub(crate) fn render(model: &Model, v: &mut Vfs) {
    for m in &model.modules {
        if m.sysfs {
            let dir = format!("/sys/module/{}/parameters", m.name);
            v.mkdir(&dir);
            for (k, val) in &m.params {
                v.ro(&format!("{dir}/{k}"), format!("{val}\n"));
            }
        }
        if let Some(file) = &m.params_file {
            let text: String = m
                .params
                .iter()
                .map(|(k, val)| {
                    let k = k.strip_prefix(m.prefix.as_str()).unwrap_or(k);
                    if !val.is_empty() && val.bytes().all(|b| b.is_ascii_digit()) {
                        format!("{k}: {val}\n")
                    } else {
                        format!("{k}: \"{val}\"\n")
                    }
                })
                .collect();
            v.ro(file, text);
        }
    }
}
