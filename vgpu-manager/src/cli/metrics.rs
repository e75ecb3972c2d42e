//! `vgpuctl metrics`: every metric family vgpud exports, printed once (D-Bus `Metrics`), for
//! node_exporter's textfile collector or a look without an HTTP listener. With `--output FILE` the
//! text is written to a temporary file beside FILE and renamed over it, so the collector never reads a
//! half-written file (node_exporter's README, "Textfile Collector", asks for exactly that).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;

use super::CliError;
use super::daemon_cmds::BusArgs;
use vgpu_client::{BusAddress, Client};

/// The arguments of `vgpuctl metrics`.
#[derive(Debug, Args)]
pub(super) struct MetricsArgs {
    /// `prometheus` (the text format 0.0.4, what the textfile collector reads) or `openmetrics`.
    #[arg(long, value_name = "FORMAT", default_value = "prometheus")]
    format: String,
    /// Write the text to FILE (atomically: a temporary file beside it, then a rename) instead of
    /// standard output, e.g. /var/lib/prometheus/node-exporter/vgpu.prom.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub(super) fn run(args: &MetricsArgs, bus: &BusArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if !matches!(args.format.as_str(), "prometheus" | "openmetrics") {
        return Err(CliError::BadArgument(format!(
            "--format {:?}: expected prometheus or openmetrics",
            args.format
        )));
    }
    let addr: BusAddress = bus.bus.parse()?;
    let rt = vgpu_client::runtime()?;
    let text = rt.block_on(async {
        Client::connect_unchecked(&addr)
            .await?
            .metrics(&args.format)
            .await
    })?;
    match &args.output {
        None => out.write_all(text.as_bytes())?,
        Some(file) => write_atomically(file, &text)?,
    }
    Ok(())
}

/// Writes `text` to a temporary file in `file`'s directory, then renames it to `file`.
fn write_atomically(file: &Path, text: &str) -> Result<(), CliError> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = file.file_name().ok_or_else(|| {
        CliError::BadArgument(format!("--output {}: not a file name", file.display()))
    })?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = dir.join(temp_name);
    let written = std::fs::write(&temp, text).and_then(|()| std::fs::rename(&temp, file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(CliError::BadArgument(format!(
            "cannot write {}: {e}; check that its directory exists and is writable",
            file.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("vgpu.prom");
        std::fs::write(&f, "old\n").unwrap();
        write_atomically(&f, "new 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "new 1\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = write_atomically(&dir.path().join("no/such/x.prom"), "x").unwrap_err();
        assert!(e.to_string().contains("no/such/x.prom"), "{e}");
    }

    #[test]
    fn an_unknown_format_is_refused_before_connecting() {
        let (code, _, err) = crate::cli::run_for_test(&["metrics", "--format", "json"]);
        assert_eq!(code, 2);
        assert!(err.contains("expected prometheus or openmetrics"), "{err}");
    }
}
