//! The command lines of the commands vgpud serves, parsed without the rest of vgpuctl.
//!
//! clap builds a command's whole tree before it parses: every subcommand, option and help text of
//! vgpuctl, about two thirds of the instructions of a one-shot `vgpuctl create …` (callgrind, static
//! release build: 0.65M of 1.08M). libvirt's hook and scripts start one process per operation, so a
//! command line that names one of vgpud's commands ([`DaemonCommand`]) after global options only, or
//! asks for `--version` alone, is parsed against [`DaemonCli`]: vgpuctl's global options and those
//! commands, the very definitions [`super::Cli`] holds, so the parse, its errors and its help are the
//! same. Everything else (the top-level `--help`, a misspelt command, the offline commands) goes
//! through the whole tree.

use std::ffi::OsString;

use clap::Parser;

use super::HostArgs;
use super::daemon_cmds::{BusArgs, DaemonCommand};

/// vgpuctl's global options and the commands vgpud serves.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version, propagate_version = true)]
pub(super) struct DaemonCli {
    #[command(flatten)]
    pub(super) host: HostArgs,
    #[command(flatten)]
    pub(super) bus: BusArgs,
    #[command(subcommand)]
    pub(super) command: DaemonCommand,
}

/// The long names of vgpuctl's global options that take a value (given as `--name VALUE` or
/// `--name=VALUE`); a test checks this list against the whole tree.
const GLOBAL_VALUE_OPTIONS: [&str; 4] = ["bus", "sim", "sim-journal", "sysfs-root"];

/// Whether `args` (the program's name first) can be parsed by [`DaemonCli`] exactly as by the whole
/// tree: a daemon command named after global options only, or `--version` (`-V`) alone. Anything it
/// does not recognise says no, and the whole tree parses it.
pub(super) fn is_daemon_line(args: &[OsString]) -> bool {
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        let Some(arg) = arg.to_str() else {
            return false;
        };
        if arg == "--version" || arg == "-V" {
            return args.len() == 2;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline_value) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            if !GLOBAL_VALUE_OPTIONS.contains(&name) {
                return false;
            }
            if !inline_value && rest.next().is_none() {
                return false;
            }
            continue;
        }
        if arg.starts_with('-') {
            return false;
        }
        return <DaemonCommand as clap::Subcommand>::has_subcommand(arg);
    }
    false
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::super::{Cli, Command, Teardown, parse_args};
    use super::*;

    fn line(args: &[&str]) -> Vec<OsString> {
        std::iter::once("vgpuctl")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    /// What a parse came to, in a form both parsers share: the parsed options, or the rendered
    /// error with its kind.
    fn outcome_full(args: &[&str]) -> String {
        match parse_args::<Cli>(line(args), Teardown::Drop) {
            Ok(cli) => match cli.command {
                Command::Daemon(c) => format!("{:?} {:?} {c:?}", cli.host, cli.bus),
                other => format!("not a daemon command: {other:?}"),
            },
            Err(e) => format!("{:?}: {}", e.kind(), e.render()),
        }
    }

    fn outcome_narrow(args: &[&str]) -> String {
        match parse_args::<DaemonCli>(line(args), Teardown::Drop) {
            Ok(cli) => format!("{:?} {:?} {:?}", cli.host, cli.bus, cli.command),
            Err(e) => format!("{:?}: {}", e.kind(), e.render()),
        }
    }

    /// Lines the narrow tree takes, each parsed by both trees: the same options, the same errors,
    /// the same help and version text.
    #[test]
    fn daemon_lines_parse_as_the_whole_tree_parses_them() {
        let lines: &[&[&str]] = &[
            &["--version"],
            &["-V"],
            &["list"],
            &["list", "--json"],
            &["--bus", "unix:path=/run/x.sock", "list"],
            &["--bus=session", "status", "--json"],
            &[
                "create",
                "--type",
                "mbochs-small",
                "--gpu",
                "mbochs",
                "--uuid",
                "u",
            ],
            &[
                "create",
                "--profile",
                "vdi-2g",
                "--label",
                "desk 1",
                "--attr",
                "a=b=c",
            ],
            &["create", "--type", "t", "--profile", "p"],
            &["create"],
            &["create", "--bogus"],
            &["create", "--attr", "novalue", "--type", "t"],
            &["create", "--help"],
            &["create", "-h"],
            &["create", "--version"],
            &[
                "define",
                "--type",
                "t",
                "--gpu",
                "g",
                "--autostart",
                "--json",
            ],
            &["destroy", "6a2f6c5e-2b5f-4f7e-9a57-1f0c3a6d9b01"],
            &["destroy"],
            &["destroy", "a", "b"],
            &["start", "u", "--bus", "system"],
            &["stop", "u"],
            &["undefine", "u"],
            &["autostart", "u", "--disable"],
            &["offers", "--json"],
            &["status", "u"],
            &["--sim", "demo", "list"],
            &["--sim-journal", "j", "list"],
            &["--sysfs-root", "/tmp", "--sim", "demo", "list"],
            &["list", "--", "x"],
        ];
        for args in lines {
            assert!(
                is_daemon_line(&line(args)),
                "{args:?} takes the narrow tree"
            );
            assert_eq!(outcome_narrow(args), outcome_full(args), "{args:?}");
        }
    }

    #[test]
    fn other_lines_take_the_whole_tree() {
        let lines: &[&[&str]] = &[
            &[],
            &["--help"],
            &["-h"],
            &["help", "create"],
            &["--version", "list"],
            &["discover"],
            &["pool", "status"],
            &["craete", "--type", "t"],
            &["--bus"],
            &["--json", "list"],
            &["-x", "list"],
            &["--", "list"],
            &["--unknown=1", "list"],
        ];
        for args in lines {
            assert!(
                !is_daemon_line(&line(args)),
                "{args:?} takes the whole tree"
            );
        }
    }

    /// The global options that take a value are those [`GLOBAL_VALUE_OPTIONS`] lists, so a value is
    /// never taken for a command's name.
    #[test]
    fn the_global_value_options_are_those_of_the_whole_tree() {
        let cmd = Cli::command();
        let mut global: Vec<String> = cmd
            .get_arguments()
            .filter(|a| a.is_global_set() && a.get_action().takes_values())
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        global.sort();
        let mut listed: Vec<String> = GLOBAL_VALUE_OPTIONS.map(str::to_string).to_vec();
        listed.sort();
        assert_eq!(global, listed);
        // And the narrow tree has no global option the whole one lacks (the same flattened args).
        let narrow: Vec<String> = DaemonCli::command()
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        for n in narrow {
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_long() == Some(n.as_str())),
                "{n}"
            );
        }
    }

    /// Every command of the narrow tree is one of the whole tree's, with the same help.
    #[test]
    fn each_daemon_command_has_the_same_help_in_both_trees() {
        let narrow = DaemonCli::command();
        let names: Vec<String> = narrow
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        assert!(names.len() >= 10, "{names:?}");
        for name in names {
            assert_eq!(
                outcome_narrow(&[&name, "--help"]),
                outcome_full(&[&name, "--help"]),
                "{name}"
            );
        }
    }
}
