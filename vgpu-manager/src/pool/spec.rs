//! The pool file format: TOML read with spans, validated into a [`Pool`]. Every error names the
//! origin, the line and the field, and says what is allowed.
//!
//! ```toml
//! name = "vdi-floor"                 # 1-64 of a-z, 0-9, '-'
//! description = "Office desktops"    # optional
//! policy = "consolidate"             # consolidate | spread (default consolidate)
//! autostart = true                   # create the slots when the daemon starts (default true)
//!
//! [profiles]                         # profile name = number of slots (1 to 1024)
//! vdi-2g = 40
//! workstation-4g = 4
//!
//! [select]                           # every key optional; a GPU must pass all that are given
//! vendors = ["nvidia", "intel"]      # nvidia | intel | amd | virtual
//! models = ["NVIDIA T4"]             # exact model names as `vgpuctl discover` prints them
//! gpus = ["0000:01:00.0", "83:00.0"] # PCI addresses (or virtual parent names)
//! numa_node = 1                      # preferred NUMA node
//! strict_numa = false                # true: only GPUs on numa_node
//! ```

use std::collections::BTreeMap;
use std::ops::Range;

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Vendor};
use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::error::PoolError;
use crate::placement::Policy;
use crate::profile::Catalog;
use crate::profile::spec::nameable_vendors;
use crate::toml_file::{self, Source};

/// Most slots one profile may have in a pool (slot UUIDs are looked for up to this index).
pub const MAX_SLOTS: u32 = 1024;

/// Which GPUs a pool may use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Selector {
    /// Allowed vendors (empty: any).
    pub vendors: Vec<Vendor>,
    /// Allowed model names (empty: any).
    pub models: Vec<String>,
    /// Allowed GPU ids, canonical (empty: any).
    pub gpus: Vec<String>,
    /// Preferred NUMA node.
    pub numa_node: Option<u32>,
    /// Only GPUs on `numa_node`.
    pub strict_numa: bool,
}

impl Selector {
    /// Whether `gpu` passes every given condition.
    pub fn accepts(&self, gpu: &Gpu) -> bool {
        (self.vendors.is_empty() || self.vendors.contains(&gpu.vendor))
            && (self.models.is_empty() || self.models.contains(&gpu.model))
            && (self.gpus.is_empty() || self.gpus.contains(&gpu.id))
            && (!self.strict_numa || gpu.numa_node == self.numa_node)
    }
}

/// A validated pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pool {
    /// Unique name; part of every slot's UUID.
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// Placement policy.
    pub policy: Policy,
    /// Whether the daemon creates the slots at start.
    pub autostart: bool,
    /// Slots per profile, by profile name.
    pub profiles: BTreeMap<String, u32>,
    /// Which GPUs it may use.
    pub select: Selector,
    /// Where it was read from (a path, or `dbus` / another label for strings).
    pub origin: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    name: Spanned<String>,
    description: Option<Spanned<String>>,
    policy: Option<Spanned<String>>,
    autostart: Option<bool>,
    profiles: Spanned<BTreeMap<Spanned<String>, Spanned<i64>>>,
    select: Option<RawSelect>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelect {
    vendors: Option<Vec<Spanned<String>>>,
    models: Option<Vec<Spanned<String>>>,
    gpus: Option<Vec<Spanned<String>>>,
    numa_node: Option<Spanned<i64>>,
    strict_numa: Option<Spanned<bool>>,
}

/// The pool's name, when it is valid.
fn check_name<'a>(src: &Source<'_>, raw: &'a RawPool) -> Result<&'a String, PoolError> {
    let name = raw.name.get_ref();
    if toml_file::valid_name(name) {
        Ok(name)
    } else {
        Err(src.field(
            raw.name.span(),
            "name",
            format!("\"{name}\" is not a valid pool name"),
            "1-64 lower-case letters, digits and '-', starting with a letter or digit, e.g. vdi-floor",
        ))
    }
}

impl Pool {
    /// Parses and validates a pool; `origin` names the source in errors. Profile names are checked
    /// against `catalog`.
    pub fn from_toml(origin: &str, text: &str, catalog: &Catalog) -> Result<Pool, PoolError> {
        let raw: RawPool = toml_file::parse(origin, text)?;
        let src = Source { origin, text };
        let field = |span: Range<usize>, field: &'static str, problem: String, allowed: &str| {
            src.field::<PoolError>(span, field, problem, allowed)
        };
        let name = check_name(&src, &raw)?.clone();
        let policy = match &raw.policy {
            None => Policy::Consolidate,
            Some(p) => p.get_ref().parse::<Policy>().map_err(|e| {
                field(
                    p.span(),
                    "policy",
                    format!("has unknown value \"{}\"", e.value),
                    &e.allowed,
                )
            })?,
        };
        if raw.profiles.get_ref().is_empty() {
            return Err(field(
                raw.profiles.span(),
                "profiles",
                "is empty, so the pool has no slots".into(),
                "one or more `profile-name = count` lines, e.g. vdi-2g = 40",
            ));
        }
        let mut profiles = BTreeMap::new();
        for (k, v) in raw.profiles.get_ref() {
            if catalog.get(k.get_ref()).is_none() {
                return Err(field(
                    k.span(),
                    "profiles",
                    format!("names unknown profile \"{}\"", k.get_ref()),
                    &catalog.names().join(", "),
                ));
            }
            let n = u32::try_from(*v.get_ref())
                .ok()
                .filter(|n| (1..=MAX_SLOTS).contains(n))
                .ok_or_else(|| {
                    field(
                        v.span(),
                        "profiles",
                        format!("gives {} = {}", k.get_ref(), v.get_ref()),
                        &format!("a count from 1 to {MAX_SLOTS} (remove the line for none)"),
                    )
                })?;
            profiles.insert(k.get_ref().clone(), n);
        }
        let mut select = Selector::default();
        if let Some(s) = raw.select {
            let vendors = nameable_vendors();
            for v in s.vendors.iter().flatten() {
                let vendor = vendors
                    .iter()
                    .find(|(_, n)| *n == v.get_ref())
                    .map(|(x, _)| *x)
                    .ok_or_else(|| {
                        field(
                            v.span(),
                            "select.vendors",
                            format!("has unknown vendor \"{}\"", v.get_ref()),
                            &vendors
                                .iter()
                                .map(|(_, n)| *n)
                                .collect::<Vec<_>>()
                                .join(", "),
                        )
                    })?;
                select.vendors.push(vendor);
            }
            for m in s.models.iter().flatten() {
                if m.get_ref().trim().is_empty() {
                    return Err(field(
                        m.span(),
                        "select.models",
                        "has an empty model name".into(),
                        "model names as `vgpuctl discover` prints them, e.g. \"NVIDIA T4\"",
                    ));
                }
                select.models.push(m.get_ref().clone());
            }
            for g in s.gpus.iter().flatten() {
                let id = match g.get_ref().parse::<PciAddress>() {
                    Ok(a) => a.to_string(),
                    Err(_) if valid_parent_name(g.get_ref()) => g.get_ref().clone(),
                    Err(_) => {
                        return Err(field(
                            g.span(),
                            "select.gpus",
                            format!("\"{}\" is not a PCI address", g.get_ref()),
                            "PCI addresses such as 0000:3b:00.0 or 3b:00.0, or a virtual parent name such as mbochs",
                        ));
                    }
                };
                select.gpus.push(id);
            }
            if let Some(n) = &s.numa_node {
                select.numa_node = Some(
                    u32::try_from(*n.get_ref())
                        .ok()
                        .filter(|x| *x < 1024)
                        .ok_or_else(|| {
                            field(
                                n.span(),
                                "select.numa_node",
                                format!("is {}", n.get_ref()),
                                "a NUMA node number from 0 to 1023",
                            )
                        })?,
                );
            }
            if let Some(strict) = &s.strict_numa {
                if *strict.get_ref() && select.numa_node.is_none() {
                    return Err(field(
                        strict.span(),
                        "select.strict_numa",
                        "is true but numa_node is not set".into(),
                        "strict_numa = true together with numa_node = N",
                    ));
                }
                select.strict_numa = *strict.get_ref();
            }
        }
        Ok(Pool {
            name,
            description: raw
                .description
                .map(|d| d.get_ref().trim().to_string())
                .unwrap_or_default(),
            policy,
            autostart: raw.autostart.unwrap_or(true),
            profiles,
            select,
            origin: origin.to_string(),
        })
    }

    /// Reads as much of a pool as needs no profile catalog (TOML syntax, known fields and their
    /// types, a valid name) and returns its name; [`Pool::from_toml`] checks the rest.
    pub fn name_in(origin: &str, text: &str) -> Result<String, PoolError> {
        let raw: RawPool = toml_file::parse(origin, text)?;
        check_name(&Source { origin, text }, &raw).cloned()
    }

    /// Whether `name` is a valid pool name: 1-64 lower-case letters, digits and '-', starting with a
    /// letter or digit.
    pub fn is_valid_name(name: &str) -> bool {
        toml_file::valid_name(name)
    }

    /// Slots in all.
    pub fn slots(&self) -> u64 {
        self.profiles.values().map(|n| u64::from(*n)).sum()
    }
}

/// Virtual mdev parents are named like `mbochs`, `mtty`.
fn valid_parent_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
