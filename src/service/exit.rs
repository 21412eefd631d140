//! The process's exit codes: one table, used by every subcommand, printed by `--help` and in
//! docs/OPERATIONS.md ("Exit codes"). A script tells a wrong command line from a wrong
//! configuration, an unreachable part, a failed job and a stalled one by the code alone.

use std::process::ExitCode;

/// How `kafka-backfill` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Done: the command did what it was asked.
    Ok,
    /// A job stopped on an error, `verify` found differences, or a data or contract error (the
    /// message names what and where).
    Failed,
    /// The configuration is invalid (the message names the key's path).
    Config,
    /// `run --exit-when-caught-up`: the job made no progress for `--job-wait-secs`; `snapshot`: no
    /// snapshot answered the request within `--within-secs`.
    Stalled,
    /// A part the configuration names does not answer: `doctor` found one, or `status` and the
    /// admin commands could not reach the service.
    Unreachable,
    /// The command line is wrong (an unknown flag, a missing argument): sysexits' EX_USAGE.
    Usage,
}

impl Exit {
    /// Every code, in the order of the table.
    pub const ALL: [Exit; 6] = [
        Exit::Ok,
        Exit::Failed,
        Exit::Config,
        Exit::Stalled,
        Exit::Unreachable,
        Exit::Usage,
    ];

    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Config => 2,
            Exit::Stalled => 3,
            Exit::Unreachable => 4,
            Exit::Usage => 64,
        }
    }

    /// What the code means, as `--help` prints it.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "done",
            Exit::Failed => "a job stopped on an error, verify found differences, or the data broke the contract",
            Exit::Config => "the configuration is invalid (the message names the key)",
            Exit::Stalled => "run --exit-when-caught-up: no progress of the job for --job-wait-secs; snapshot: none published within --within-secs",
            Exit::Unreachable => "a broker, store, snapshot, source or the service does not answer (doctor, status, admin commands)",
            Exit::Usage => "the command line is wrong",
        }
    }

    /// The table `--help` ends with.
    pub fn help() -> String {
        let mut s = String::from("Exit codes:\n");
        for e in Exit::ALL {
            s.push_str(&format!("  {:>2}  {}\n", e.code(), e.meaning()));
        }
        s
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_distinct_and_in_the_help() {
        let mut codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Exit::ALL.len());
        let help = Exit::help();
        for e in Exit::ALL {
            assert!(
                help.contains(&format!("{:>2}  {}", e.code(), e.meaning())),
                "{help}"
            );
        }
    }

    /// docs/OPERATIONS.md's table is this table.
    #[test]
    fn the_operations_guide_lists_every_code() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPERATIONS.md"))
                .unwrap();
        for e in Exit::ALL {
            let row = format!("| {} | {} |", e.code(), e.meaning());
            assert!(doc.contains(&row), "docs/OPERATIONS.md lacks the row {row}");
        }
    }
}
