//! The command line's parsing: argv and the environment into [`Cli`], an empty variable
//! counting as unset, an unknown `SLUICE_*` variable refused, and a bad value's message naming
//! the variable the Go service reads.

use std::ffi::OsString;

use clap::builder::Resettable;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches};

use super::{Cli, env_names};

/// Parse `args` (including the program name) and the process environment. A `SLUICE_*`
/// variable that is no setting is an error naming the closest one ([`env_names`]).
///
/// On a bad value for a flag that has an environment variable, the message names both, e.g.
/// `invalid value 'abc' for PORT (--port): invalid digit found in string`, because clap cannot
/// tell which of the two the value came from and operators of the Go service think in variables.
/// `--help` and `--version` also come back as errors; `err.exit()` prints them correctly.
pub fn parse_cli_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cmd = ignore_empty_env(Cli::command(), &|name| {
        std::env::var_os(name).is_some_and(|v| v.is_empty())
    });
    let settings = setting_variables(&Cli::command());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let unknown = env_names::unknown_sluice_variables(
        // Empty counts as unset, for these as for the settings.
        std::env::vars_os()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, _)| name),
        &settings,
    );
    if !unknown.is_empty() {
        let message = unknown.join("\n");
        return Err(clap::Error::raw(ErrorKind::UnknownArgument, message).format(&mut cmd));
    }
    parse_with(cmd, args)
}

/// Every environment variable a flag of `cmd` or of its subcommands reads.
fn setting_variables(cmd: &clap::Command) -> Vec<String> {
    let own = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|name| name.to_string_lossy().into_owned());
    let nested: Vec<String> = cmd.get_subcommands().flat_map(setting_variables).collect();
    own.chain(nested).collect()
}

/// [`parse_cli_from`] on this process's own arguments.
pub fn parse_cli() -> Result<Cli, clap::Error> {
    parse_cli_from(std::env::args_os())
}

pub(super) fn parse_with<I, T>(mut cmd: clap::Command, args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = cmd
        .try_get_matches_from_mut(args)
        .map_err(|err| name_env_var(err, &mut cmd))?;
    Cli::from_arg_matches(&matches).map_err(|err| err.format(&mut cmd))
}

/// clap has already read each variable when the command was built; an empty one would then be
/// parsed as an empty value (an error for numbers). Dropping the variable from such arguments
/// makes empty mean unset, at the cost of its `[env: ...]` note in `--help`.
pub(super) fn ignore_empty_env(
    cmd: clap::Command,
    is_empty: &dyn Fn(&str) -> bool,
) -> clap::Command {
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let mut cmd = cmd.mut_args(|arg| {
        let empty = arg
            .get_env()
            .and_then(|name| name.to_str())
            .is_some_and(is_empty);
        if empty {
            arg.env(Resettable::Reset)
        } else {
            arg
        }
    });
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |sub| ignore_empty_env(sub, is_empty));
    }
    cmd
}

/// Rewrite a value error to name the environment variable of the argument, if it has one.
/// The variable is looked up in a freshly built command, so it is found even when
/// [`ignore_empty_env`] removed it from `cmd`.
fn name_env_var(err: clap::Error, cmd: &mut clap::Command) -> clap::Error {
    if err.kind() != ErrorKind::ValueValidation {
        return err;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) = (
        err.get(ContextKind::InvalidArg),
        err.get(ContextKind::InvalidValue),
    ) else {
        return err;
    };
    // clap renders the argument as `--port <PORT>` or `--shadow-mode[=<BOOL>]`.
    let flag = arg
        .split([' ', '=', '['])
        .next()
        .unwrap_or_default()
        .to_owned();
    let Some(long) = flag.strip_prefix("--") else {
        return err;
    };
    let Some(var) = env_var_of(&Cli::command(), long) else {
        return err;
    };
    let reason = std::error::Error::source(&err)
        .map(|source| source.to_string())
        .unwrap_or_else(|| "invalid value".to_owned());
    let message = format!("invalid value '{value}' for {var} ({flag}): {reason}");
    clap::Error::raw(ErrorKind::ValueValidation, message).format(cmd)
}

fn env_var_of(cmd: &clap::Command, long: &str) -> Option<String> {
    let own = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|name| name.to_string_lossy().into_owned());
    own.or_else(|| cmd.get_subcommands().find_map(|s| env_var_of(s, long)))
}
