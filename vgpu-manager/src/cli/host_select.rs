//! Choosing the host a command reads: `--sim NAME|FILE`, `--sysfs-root DIR` (or `VGPU_SYSFS_ROOT`), or the
//! live kernel.

use std::path::PathBuf;
use std::sync::Arc;

use vgpu_host::{Host, SysfsHost};

use super::CliError;

/// Where the host comes from.
#[derive(Debug, Clone, clap::Args)]
pub struct HostArgs {
    /// Use a simulated host: a built-in name (e.g. `demo`, `samples`) or a TOML description file.
    #[arg(
        long,
        value_name = "NAME|FILE",
        global = true,
        conflicts_with = "sysfs_root"
    )]
    pub sim: Option<String>,
    /// With --sim: keep the simulated kernel's state in this journal file, so it outlives the process the
    /// way a real kernel outlives the daemon (created if missing; replayed when present).
    #[arg(
        long,
        value_name = "FILE",
        env = "VGPU_SIM_JOURNAL",
        global = true,
        requires = "sim"
    )]
    pub sim_journal: Option<PathBuf>,
    /// Read the kernel's sysfs below DIR instead of `/` (a fixture tree or a capture).
    #[arg(long, value_name = "DIR", env = "VGPU_SYSFS_ROOT", global = true)]
    pub sysfs_root: Option<PathBuf>,
}

impl HostArgs {
    /// Opens the selected host.
    pub fn open(&self) -> Result<Arc<dyn Host>, CliError> {
        if let Some(sim) = &self.sim {
            return self.open_sim(sim);
        }
        match &self.sysfs_root {
            Some(root) => {
                let host = SysfsHost::new(root).map_err(|e| {
                    CliError::Host(format!(
                        "--sysfs-root {}: {} (give a directory that contains sys/)",
                        root.display(),
                        e.errno.desc()
                    ))
                })?;
                if !host.exists(std::path::Path::new("/sys")) {
                    return Err(CliError::Host(format!(
                        "--sysfs-root {}: no sys/ directory below it (give the directory that contains sys/, not sys/ itself)",
                        root.display()
                    )));
                }
                Ok(Arc::new(host))
            }
            None => Ok(Arc::new(SysfsHost::live())),
        }
    }

    #[cfg(feature = "sim")]
    fn open_sim(&self, sim: &str) -> Result<Arc<dyn Host>, CliError> {
        let mut host = vgpu_sim::SimHost::load(sim).map_err(|e| CliError::Host(e.to_string()))?;
        if let Some(journal) = &self.sim_journal {
            host = host
                .with_journal(journal)
                .map_err(|e| CliError::Host(e.to_string()))?;
        }
        Ok(Arc::new(host))
    }

    #[cfg(not(feature = "sim"))]
    fn open_sim(&self, sim: &str) -> Result<Arc<dyn Host>, CliError> {
        Err(CliError::Host(format!(
            "--sim {sim}: this build has no simulated host (rebuild with the `sim` feature, on by default)"
        )))
    }
}
