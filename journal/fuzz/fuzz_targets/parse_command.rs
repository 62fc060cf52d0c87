//! Fuzzes the `celld.eric.dev/journal-command` parser: it must never panic, and an accepted
//! command must print to text that parses to the same command.
#![no_main]

use journal::parse_command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cmd) = parse_command(text) {
        assert_eq!(parse_command(&cmd.to_string()), Ok(cmd));
    }
});
