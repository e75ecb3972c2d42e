//! Vendor-neutral pieces every backend uses: matching requests to slots, building slot plans,
//! applying sysfs settings with read-back, and detection and error helpers. The mdev and VF
//! lifecycle lives in the two bases, [`super::mdev_parent`] and [`super::sriov_pf`].

use std::path::Path;

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory, PciDevice};
use vgpu_host::{Errno, Host};

use super::{Backend, BackendError};
use crate::profile::Priority;
use crate::sched::{
    ApplyReport, SchedPlan, SchedRefusal, SchedRequest, SettingTarget, SlotPlan, TakesEffect,
    share::requested_shares,
};

/// A slot a backend has (or can make).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Its name (`vf1`, an mdev UUID, `vgpu3`).
    pub name: String,
    /// The device behind it, when it exists.
    pub device: Option<String>,
}

impl Slot {
    pub(crate) fn new(name: impl Into<String>, device: Option<String>) -> Self {
        Self {
            name: name.into(),
            device,
        }
    }
}

/// Matches requests to slots: a request naming a slot (by name or device) takes it; the others take
/// the remaining slots in order. Refuses unknown or doubly requested slots and requests beyond the
/// slots there are. Returns the pairs in request order.
pub(crate) fn assign<'r>(
    requests: &'r [SchedRequest],
    slots: &[Slot],
    what: &str,
) -> (Vec<(Slot, &'r SchedRequest)>, Vec<SchedRefusal>) {
    let mut taken = vec![false; slots.len()];
    let mut chosen: Vec<Option<usize>> = vec![None; requests.len()];
    let mut refusals = Vec::new();
    for (r, req) in requests.iter().enumerate() {
        let Some(want) = &req.slot else { continue };
        match slots
            .iter()
            .position(|s| &s.name == want || s.device.as_deref() == Some(want.as_str()))
        {
            Some(i) if taken[i] => refusals.push(SchedRefusal::slot(
                want,
                "slot-twice",
                format!("{want} is requested twice: give each {what} one weight"),
            )),
            Some(i) => {
                taken[i] = true;
                chosen[r] = Some(i);
            }
            None => refusals.push(SchedRefusal::slot(
                want,
                "unknown-slot",
                format!(
                    "there is no {what} {want}; known: {}",
                    slots
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        }
    }
    let mut next = 0;
    for (r, req) in requests.iter().enumerate() {
        if req.slot.is_some() {
            continue;
        }
        while next < slots.len() && taken[next] {
            next += 1;
        }
        if next < slots.len() {
            taken[next] = true;
            chosen[r] = Some(next);
        }
    }
    let unplaced = requests
        .iter()
        .zip(&chosen)
        .filter(|(r, c)| c.is_none() && r.slot.is_none())
        .count();
    if unplaced > 0 {
        refusals.push(SchedRefusal::gpu(
            "too-many-requests",
            format!(
                "{} requests but only {} {what}s: drop {unplaced} or use another GPU",
                requests.len(),
                slots.len()
            ),
        ));
    }
    let pairs = requests
        .iter()
        .zip(chosen)
        .filter_map(|(r, c)| c.and_then(|i| slots.get(i)).map(|s| (s.clone(), r)))
        .collect();
    (pairs, refusals)
}

/// Slot plans with requested shares filled in and no effective share yet.
pub(crate) fn slot_plans(pairs: &[(Slot, &SchedRequest)]) -> Vec<SlotPlan> {
    let weights: Vec<u32> = pairs.iter().map(|(_, r)| r.weight).collect();
    pairs
        .iter()
        .zip(requested_shares(&weights))
        .map(|((slot, req), share)| SlotPlan {
            slot: slot.name.clone(),
            device: slot.device.clone(),
            label: req.label.clone(),
            weight: req.weight,
            priority: req.priority,
            requested_share: share,
            effective_share: None,
            error: None,
            quantum_ms: None,
            preempt_timeout_us: None,
            mdev_type: None,
        })
        .collect()
}

/// Sets each slot's effective share and error.
pub(crate) fn set_effective(slots: &mut [SlotPlan], effective: &[f64]) {
    for (s, e) in slots.iter_mut().zip(effective) {
        s.effective_share = Some(*e);
        s.error = Some(e - s.requested_share);
    }
}

/// Refusals for every slot that asks for a priority other than normal, on schedulers without one.
pub(crate) fn refuse_priorities(slots: &[SlotPlan], backend: &str) -> Vec<SchedRefusal> {
    slots
        .iter()
        .filter_map(|s| {
            let p = s.priority.filter(|p| *p != Priority::Normal)?;
            Some(SchedRefusal::slot(
                &s.slot,
                "priority-unsupported",
                format!(
                    "{} asks for priority {}, but {backend} has no priority knob: drop `priority` or use normal",
                    s.slot,
                    p.as_str()
                ),
            ))
        })
        .collect()
}

/// Refuses unequal weights on a scheduler that gives every slot the same share.
pub(crate) fn refuse_unequal(slots: &[SlotPlan], why: &str) -> Option<SchedRefusal> {
    let first = slots.first()?.weight;
    let unequal = slots.iter().any(|s| s.weight != first);
    unequal.then(|| {
        let ws: Vec<String> = slots.iter().map(|s| s.weight.to_string()).collect();
        SchedRefusal::gpu(
            "unequal-weights",
            format!("weights {} differ, but {why}", ws.join(", ")),
        )
    })
}

/// A choice attribute (`[low] normal high`): the selected word; other text as is.
pub(crate) fn selected_choice(text: &str) -> String {
    let t = text.trim();
    match (t.find('['), t.find(']')) {
        (Some(a), Some(b)) if a < b => t[a + 1..b].to_string(),
        _ => t.to_string(),
    }
}

/// [`Backend::apply`] for every backend: checks the plan, writes its `Now` settings in order, reads
/// each back, and returns the rest as pending.
pub(crate) fn apply_settings<B: Backend + ?Sized>(
    b: &B,
    host: &dyn Host,
    plan: &SchedPlan,
) -> Result<ApplyReport, BackendError> {
    if plan.gpu != b.gpu() || plan.backend != b.kind().as_str() {
        return Err(BackendError::WrongGpu {
            plan_gpu: plan.gpu.clone(),
            plan_backend: plan.backend.clone(),
            gpu: b.gpu().to_string(),
            backend: b.kind().to_string(),
        });
    }
    if !plan.honoured() {
        return Err(BackendError::Refused {
            gpu: plan.gpu.clone(),
            reasons: plan
                .refusals
                .iter()
                .map(|r| r.reason.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    let mut written = Vec::new();
    let mut pending = Vec::new();
    for s in &plan.settings {
        match (&s.target, s.takes_effect) {
            (SettingTarget::Sysfs { path }, TakesEffect::Now) => {
                let p = Path::new(path);
                host.write(p, &s.value)
                    .map_err(|e| BackendError::host(&plan.gpu, e))?;
                // Write-only attributes (xe `.bulk_profile/*`) cannot be read back here; the
                // backend's read-back shows their effect.
                let back = match host.read(p) {
                    Ok(t) => Some(t),
                    Err(e) if e.errno == Errno::EACCES => None,
                    Err(e) => return Err(BackendError::host(&plan.gpu, e)),
                };
                let actual = back.as_deref().map(selected_choice);
                if let Some(actual) = actual.filter(|a| *a != s.value) {
                    return Err(BackendError::NotApplied {
                        path: path.clone(),
                        expected: s.value.clone(),
                        actual,
                    });
                }
                written.push(s.clone());
            }
            _ => pending.push(s.clone()),
        }
    }
    Ok(ApplyReport {
        gpu: plan.gpu.clone(),
        written,
        pending,
        state: b.read_back(host)?,
        notes: plan.notes.clone(),
    })
}

/// The PCI address of `gpu` when it is bound to `driver`: what every PCI detector checks first.
pub(crate) fn pci_on(gpu: &Gpu, driver: &str) -> Option<PciAddress> {
    gpu.pci.filter(|_| gpu.driver.as_deref() == Some(driver))
}

/// The PCI device at `addr` in the inventory.
pub(crate) fn device<'a>(inv: &'a Inventory, addr: &PciAddress) -> Option<&'a PciDevice> {
    inv.pci_devices.iter().find(|d| d.address == *addr)
}

/// An "unsupported" error for backend `b`.
pub(crate) fn unsupported(b: &dyn Backend, what: &str, why: &str) -> BackendError {
    BackendError::Unsupported {
        gpu: b.gpu().to_string(),
        backend: b.kind().to_string(),
        what: what.to_string(),
        why: why.to_string(),
    }
}
