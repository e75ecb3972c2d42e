//! `vgpuctl completions SHELL` and `vgpuctl manpage [--dir DIR]`: shell completion scripts and roff man
//! pages generated from the same command definitions the parser uses, so they cannot drift from it.
//! Packagers run them at build time (see data/README.md for where the results go).

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use super::{Cli, CliError};

/// The program name completions are generated for.
const BIN: &str = "vgpuctl";

/// Writes the completion script for `shell` to `out`.
pub fn completions(shell: Shell, out: &mut dyn Write) -> Result<(), CliError> {
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, BIN, out);
    Ok(())
}

/// Writes `vgpuctl.1` to `out`, or, with `dir`, that page and one per subcommand (`vgpuctl-list.1`, …)
/// into `dir`, listing the files written.
pub fn manpage(dir: Option<&Path>, out: &mut dyn Write) -> Result<(), CliError> {
    let cmd = Cli::command();
    match dir {
        None => clap_mangen::Man::new(cmd).render(out)?,
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                CliError::BadArgument(format!("cannot create {}: {e}", dir.display()))
            })?;
            clap_mangen::generate_to(cmd, dir).map_err(|e| {
                CliError::BadArgument(format!(
                    "cannot write man pages into {}: {e}",
                    dir.display()
                ))
            })?;
            let mut pages: Vec<String> = std::fs::read_dir(dir)?
                .filter_map(|e| e.ok())
                .map(|e| e.path().display().to_string())
                .filter(|p| p.ends_with(".1"))
                .collect();
            pages.sort();
            for p in pages {
                writeln!(out, "{p}")?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>) -> Result<(), CliError>) -> String {
        let mut v = Vec::new();
        f(&mut v).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&v).into_owned()
    }

    #[test]
    fn completions_know_every_subcommand() {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        assert!(
            names.iter().any(|n| n == "mdevctl") && names.iter().any(|n| n == "xml"),
            "{names:?}"
        );
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = text(|o| completions(shell, o));
            for n in &names {
                assert!(s.contains(n.as_str()), "{shell}: {n} missing");
            }
        }
    }

    #[test]
    fn man_page_has_title_synopsis_and_commands() {
        let m = text(|o| manpage(None, o));
        assert!(m.contains(".TH vgpuctl 1"), "{}", &m[..m.len().min(300)]);
        assert!(
            m.contains(".SH SYNOPSIS") && m.contains("mdevctl"),
            "no subcommands listed"
        );
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let list = text(|o| manpage(Some(dir.path()), o));
        for page in [
            "vgpuctl.1",
            "vgpuctl-xml.1",
            "vgpuctl-mdevctl.1",
            "vgpuctl-mdevctl-list.1",
        ] {
            assert!(list.contains(page), "{page} not in {list}");
        }
    }
}
