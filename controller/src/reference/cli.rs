//! `cli.md`: every command and flag of `duet`, walked from clap's command tree.

use clap::{Arg, ArgAction, Command, CommandFactory};

use super::{code, head, table};
use crate::config::{Cli, ENVIRONMENT};

pub(super) fn page() -> String {
    let cli = Cli::command();
    let mut out = head(
        "Command line",
        "`duet` runs as `duet serve` (the controller and proxy) or `duet migrate check` (an \
         offline report on ingress-nginx annotations). An invalid flag or value prints one line \
         and exits with code 64. Every command also takes `--help` (`-h`) and `--version` (`-V`).",
    );
    for sub in visible(&cli) {
        section(sub, "duet", &mut out);
    }
    out.push_str("## Environment\n\n");
    let rows = ENVIRONMENT
        .iter()
        .map(|(name, what)| vec![code(name), (*what).to_owned()]);
    out.push_str(&table(&["Variable", "Description"], rows));
    out
}

fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|c| !c.is_hide_set())
}

/// A command's section (when it takes arguments), then its subcommands'.
fn section(cmd: &Command, parent: &str, out: &mut String) {
    let path = format!("{parent} {}", cmd.get_name());
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| shown(a)).collect();
    if !args.is_empty() {
        out.push_str(&format!("## `{path}`\n\n"));
        let about = cmd.get_long_about().or(cmd.get_about());
        if let Some(about) = about {
            out.push_str(&format!("{about}\n\n"));
        }
        let with_env = args.iter().any(|a| a.get_env().is_some());
        let mut header = vec!["Flag", "Value", "Default"];
        header.extend(with_env.then_some("Environment"));
        header.push("Description");
        let rows = args.iter().map(|a| row(a, with_env));
        out.push_str(&table(&header, rows));
        out.push('\n');
    }
    for sub in visible(cmd) {
        section(sub, &path, out);
    }
}

fn shown(arg: &Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn row(arg: &Arg, with_env: bool) -> Vec<String> {
    let mut row = vec![name(arg), value(arg), default(arg)];
    if with_env {
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        row.push(code(env.as_deref().unwrap_or_default()));
    }
    let help = arg.get_long_help().or(arg.get_help());
    row.push(help.map(ToString::to_string).unwrap_or_default());
    row
}

fn name(arg: &Arg) -> String {
    match (arg.get_long(), arg.get_short()) {
        (Some(long), Some(short)) => format!("`--{long}`, `-{short}`"),
        (Some(long), None) => format!("`--{long}`"),
        (None, _) => format!("`{}` (argument)", value_names(arg)),
    }
}

fn value_names(arg: &Arg) -> String {
    let names = arg.get_value_names().unwrap_or_default();
    let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
    match names.join(" ") {
        joined if joined.is_empty() => arg.get_id().as_str().to_uppercase(),
        joined => joined,
    }
}

/// The value a flag takes: none for a switch, optional with `=`, one of a list, repeatable.
fn value(arg: &Arg) -> String {
    if !arg.get_action().takes_values() {
        return "(switch)".to_owned();
    }
    let mut value = code(&value_names(arg));
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|v| code(v.get_name()))
        .collect();
    if !possible.is_empty() {
        value = format!("{value}: {}", possible.join(", "));
    }
    let optional = arg.get_num_args().is_some_and(|n| n.min_values() == 0);
    if optional {
        value = format!("{value} (optional, after `=`)");
    }
    if matches!(arg.get_action(), ArgAction::Append) && arg.get_long().is_some() {
        value.push_str(", repeatable");
    }
    value
}

fn default(arg: &Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| code(&v.to_string_lossy()))
        .collect();
    if values.is_empty() && !arg.get_action().takes_values() {
        return "off".to_owned();
    }
    values.join(", ")
}
