//! `vgpuctl viability ADDR`: may this PCI device be handed to a guest through VFIO? Reads only.

use std::io::Write;

use mdev_types::ids::PciAddress;
use serde::Serialize;
use vgpu_host::viability::{Viability, check};

use super::{CliError, HostArgs, Table, write_json};

/// The `--json` document (docs/json.md, "vgpuctl viability").
#[derive(Serialize)]
struct Doc<'a> {
    viable: bool,
    /// The one-sentence verdict, the same text a refusal prints.
    message: String,
    #[serde(flatten)]
    report: &'a Viability,
}

pub(super) fn viability(
    host: &HostArgs,
    addr: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let addr: PciAddress = addr.parse().map_err(|e| {
        CliError::BadArgument(format!(
            "{addr:?} is not a PCI address ({e}); give it as 0000:01:00.0 or 01:00.0"
        ))
    })?;
    let host = host.open()?;
    let report = check(host.as_ref(), &addr).map_err(|e| CliError::Host(e.to_string()))?;
    if json {
        return write_json(
            out,
            &Doc {
                viable: report.is_viable(),
                message: report.to_string(),
                report: &report,
            },
        );
    }
    writeln!(
        out,
        "{}: {}",
        report.device,
        if report.is_viable() {
            "viable"
        } else {
            "NOT viable"
        }
    )?;
    writeln!(
        out,
        "driver: {}",
        report.driver.as_deref().unwrap_or("none")
    )?;
    match report.iommu_group {
        Some(g) => writeln!(out, "IOMMU group: {g}")?,
        None => writeln!(out, "IOMMU group: none")?,
    }
    if !report.members.is_empty() {
        let mut t = Table::new(&["MEMBER", "DRIVER", "CLASS", "STATE"]);
        for m in &report.members {
            t.row(vec![
                m.address.to_string(),
                m.driver.clone().unwrap_or_else(|| "-".into()),
                format!("{:06x}", m.class),
                serde_json::to_value(m.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            ]);
        }
        write!(out, "\n{}", t.render())?;
    }
    for p in &report.problems {
        writeln!(out, "- {p}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::run_for_test as run;

    #[test]
    fn shared_group_report_names_the_blocker() {
        let (code, out, err) = run(&["--sim", "demo", "viability", "83:00.0"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("NOT viable"), "{out}");
        assert!(out.contains("IOMMU group: 11"), "{out}");
        assert!(out.contains("0000:84:00.0") && out.contains("igb"), "{out}");
        assert!(out.contains("host-driver"), "{out}");
    }

    #[test]
    fn json_has_verdict_members_and_problems() {
        let (code, out, err) = run(&["--sim", "demo", "viability", "0000:00:02.0", "--json"]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["viable"], false);
        assert_eq!(v["problems"][0]["kind"], "boot-vga");
        assert_eq!(v["iommu_group"], 3);
        let (_, out, _) = run(&["--sim", "demo", "viability", "01:00.0", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["viable"], true);
        assert_eq!(v["members"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn bad_and_unknown_addresses_are_one_line_errors() {
        let (code, _, err) = run(&["--sim", "demo", "viability", "nope"]);
        assert_eq!(code, 2);
        assert!(err.contains("not a PCI address"), "{err}");
        let (code, _, err) = run(&["--sim", "demo", "viability", "ee:00.0"]);
        assert_eq!(code, 2);
        assert!(
            err.contains("0000:ee:00.0") && err.contains("does not exist"),
            "{err}"
        );
    }
}
