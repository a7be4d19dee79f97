//! The one way the CLI writes to stdout.
//!
//! Its JSON is made to be piped (`flashgate deals list | jq`, `… | head`), and a reader may
//! go away before everything is written. `println!` panics then; here a closed pipe ends
//! the output quietly: the command has already done its work, and nobody is left to read
//! the rest. Any other write error (a full disk behind a redirect, say) is reported.

use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

/// Set once stdout's reader has gone: later writes are skipped instead of failing again.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Writes `text` and a newline to stdout, flushed, so a line is never held back in a buffer.
pub fn line(text: &str) -> Result<(), String> {
    write_to(&mut std::io::stdout().lock(), text)
}

/// Writes `value` as pretty-printed JSON, one document followed by a newline.
pub fn json(value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    line(&text)
}

fn write_to(out: &mut impl Write, text: &str) -> Result<(), String> {
    if READER_GONE.load(Ordering::Relaxed) {
        return Ok(());
    }
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == ErrorKind::BrokenPipe => {
            READER_GONE.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(error) => Err(format!("cannot write to stdout: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose reader has gone, or that fails some other way.
    struct Failing(ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(self.0.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn other_write_errors_are_reported() {
        let error = write_to(&mut Failing(ErrorKind::StorageFull), "x").unwrap_err();
        assert!(error.starts_with("cannot write to stdout"), "{error}");
    }
}
