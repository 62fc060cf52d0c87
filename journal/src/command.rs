//! A person's commands: the value of annotation `celld.eric.dev/journal-command`,
//! `abandon <op>` or `retry <op>`.
//!
//! Parsing is strict: one verb in lowercase, one operation id (a hyphenated UUID, any letter case,
//! normalised to lowercase), separated by whitespace; surrounding whitespace (e.g. a trailing
//! newline from a shell) is ignored; anything else — other words, control characters, more than
//! [`MAX_COMMAND_BYTES`] bytes — is an error whose message says what was expected.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::fold::TransitionError;
use crate::journal::Journal;
use crate::model::{truncate_for_message, EntryBody, Leader, NewEntry, OperationId, PersonAction};

/// The annotation carrying a command.
pub const COMMAND_ANNOTATION: &str = "celld.eric.dev/journal-command";

/// Longest command value accepted.
pub const MAX_COMMAND_BYTES: usize = 256;

/// What a person asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandAction {
    /// Stop driving the operation and leave the world as it is (`Abandoned`).
    Abandon,
    /// Run the blocked (or stalled) step again (`Retried`).
    Retry,
}

/// A parsed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// The verb.
    pub action: CommandAction,
    /// The operation.
    pub op: OperationId,
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.action {
            CommandAction::Abandon => "abandon",
            CommandAction::Retry => "retry",
        };
        write!(f, "{verb} {}", self.op)
    }
}

const USAGE: &str = "expected `abandon <operation id>` or `retry <operation id>`";

/// A command value that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// Empty or only whitespace.
    #[error("the journal command is empty; {USAGE}")]
    Empty,
    /// Longer than [`MAX_COMMAND_BYTES`].
    #[error("the journal command is {len} bytes, longer than {MAX_COMMAND_BYTES}; {USAGE}")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Contains a control character other than surrounding whitespace.
    #[error("the journal command contains a control character; {USAGE}")]
    ControlCharacter,
    /// The first word is not a verb.
    #[error("unknown journal command `{verb}`; {USAGE}")]
    UnknownVerb {
        /// The word found.
        verb: String,
    },
    /// The verb has no operation id.
    #[error("`{verb}` needs an operation id; {USAGE}")]
    MissingOperation {
        /// The verb.
        verb: String,
    },
    /// Words after the operation id.
    #[error("unexpected `{extra}` after the operation id; {USAGE}")]
    TrailingWords {
        /// The first extra word.
        extra: String,
    },
    /// `reset` without a reason.
    #[error(
        "`reset` needs a reason (free text), e.g. `reset annotation deleted by a restore tool`"
    )]
    MissingReason,
    /// The second word is not a UUID.
    #[error("`{value}` is not an operation id (a UUID such as 0b5e8a52-6c3e-4c1f-9d7a-2f3b4c5d6e7f); {USAGE}")]
    InvalidOperationId {
        /// The word found.
        value: String,
    },
}

/// Parses a command value.
pub fn parse_command(value: &str) -> Result<Command, CommandError> {
    if value.len() > MAX_COMMAND_BYTES {
        return Err(CommandError::TooLong { len: value.len() });
    }
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(CommandError::Empty);
    }
    if trimmed
        .chars()
        .any(|c| c.is_control() && c != ' ' && c != '\t')
    {
        return Err(CommandError::ControlCharacter);
    }
    let mut words = trimmed.split_whitespace();
    let verb = words.next().expect("non-empty after trim");
    let action = match verb {
        "abandon" => CommandAction::Abandon,
        "retry" => CommandAction::Retry,
        other => {
            return Err(CommandError::UnknownVerb {
                verb: truncate_for_message(other),
            })
        }
    };
    let id = words.next().ok_or_else(|| CommandError::MissingOperation {
        verb: verb.to_owned(),
    })?;
    if let Some(extra) = words.next() {
        return Err(CommandError::TrailingWords {
            extra: truncate_for_message(extra),
        });
    }
    let invalid = || CommandError::InvalidOperationId {
        value: truncate_for_message(id),
    };
    // Only the hyphenated form: the simple, braced and URN forms are not how ids are shown.
    if id.len() != 36 {
        return Err(invalid());
    }
    let uuid = Uuid::parse_str(id).map_err(|_| invalid())?;
    if !uuid.hyphenated().to_string().eq_ignore_ascii_case(id) {
        return Err(invalid());
    }
    Ok(Command {
        action,
        op: OperationId::from_uuid(uuid),
    })
}

/// A repair of a journal that cannot be used as it is (`JournalInvalid`, `JournalMissing`;
/// docs/journal.md "Repairs"): consumed by the operator before the journal is loaded, because the
/// journal it repairs may not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairCommand {
    /// `restore-from-mirror`: write the operator's local mirror of this fleet's chain back to
    /// the annotation (verified, compacted to the budget, compare-and-swap).
    RestoreFromMirror,
    /// `reset <reason>`: start a new, empty journal; the mirror's entries for the fleet are
    /// kept aside (`diverged`, reason `Reset`) with the reason, and an Event records it.
    Reset {
        /// Why (free text, required).
        reason: String,
    },
}

impl fmt::Display for RepairCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RepairCommand::RestoreFromMirror => f.write_str("restore-from-mirror"),
            RepairCommand::Reset { reason } => write!(f, "reset {reason}"),
        }
    }
}

/// Parses a repair command; `None` when the value is not one (then [`parse_command`] applies).
pub fn parse_repair_command(value: &str) -> Option<Result<RepairCommand, CommandError>> {
    let trimmed = value.trim();
    let (verb, rest) = match trimmed.split_once(char::is_whitespace) {
        Some((v, r)) => (v, r.trim()),
        None => (trimmed, ""),
    };
    match verb {
        "restore-from-mirror" | "reset" => {}
        _ => return None,
    }
    if value.len() > MAX_COMMAND_BYTES {
        return Some(Err(CommandError::TooLong { len: value.len() }));
    }
    if trimmed
        .chars()
        .any(|c| c.is_control() && c != ' ' && c != '\t')
    {
        return Some(Err(CommandError::ControlCharacter));
    }
    Some(match verb {
        "restore-from-mirror" if rest.is_empty() => Ok(RepairCommand::RestoreFromMirror),
        "restore-from-mirror" => Err(CommandError::TrailingWords {
            extra: truncate_for_message(rest),
        }),
        _ if rest.is_empty() => Err(CommandError::MissingReason),
        _ => Ok(RepairCommand::Reset {
            reason: rest.to_owned(),
        }),
    })
}

impl Journal {
    /// The entry that carries out `command`: `Abandoned` or `Retried` with `by` and `reason`.
    /// Refused with the transition error when the operation is unknown, already closed, or (for
    /// retry) neither blocked nor stalled; the operator then removes the annotation and reports
    /// the error.
    pub fn command_entry(
        &self,
        command: &Command,
        by: &str,
        reason: Option<&str>,
        at: DateTime<Utc>,
        leader: Leader,
    ) -> Result<NewEntry, TransitionError> {
        let action = PersonAction {
            by: by.to_owned(),
            reason: reason.map(str::to_owned),
        };
        let body = match command.action {
            CommandAction::Abandon => EntryBody::Abandoned(action),
            CommandAction::Retry => EntryBody::Retried(action),
        };
        let entry = NewEntry {
            at,
            op: command.op,
            leader,
            body,
        };
        self.check(&entry)?;
        Ok(entry)
    }
}
