//! `vgpuctl offers`: what each GPU can give each profile of vgpud's catalog when it has room, and
//! its occupancy now (`Manager1.ListOffers`) — the shape of the host that placement engines above
//! vgpud (the DRA plugin's ResourceSlices) publish.

use std::io::Write;

use vgpu_client::{Client, GpuOffers};

use super::{CliError, Table, write_json};

/// Prints the offers as a table (one row per GPU and profile) or as JSON.
pub(super) async fn run(client: &Client, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let offers = client.list_offers().await?;
    if json {
        return write_json(out, &offers);
    }
    if offers.iter().all(|g| g.options.is_empty()) {
        writeln!(
            out,
            "no GPU offers a profile (vgpuctl match PROFILE says why, GPU by GPU)"
        )?;
        return Ok(());
    }
    write!(out, "{}", table(&offers).render())?;
    Ok(())
}

fn table(offers: &[GpuOffers]) -> Table {
    let mut t = Table::new(&[
        "GPU",
        "PROFILE",
        "TYPE",
        "FRAMEBUFFER",
        "AVAILABLE",
        "IN USE",
        "ALONE",
        "HEALTH",
    ]);
    for g in offers {
        for o in &g.options {
            t.row(vec![
                g.gpu.clone(),
                o.profile.clone(),
                match &o.type_name {
                    Some(n) if !o.type_id.ends_with(n.as_str()) => format!("{} ({n})", o.type_id),
                    _ => o.type_id.clone(),
                },
                o.framebuffer_mib
                    .map_or_else(|| "-".to_string(), |fb| format!("{fb} MiB")),
                o.available.to_string(),
                o.in_use.to_string(),
                o.max_instances.to_string(),
                g.health.clone(),
            ]);
        }
    }
    t
}
