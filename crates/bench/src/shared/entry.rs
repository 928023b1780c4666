//! The entry of a bench binary: its options parsed (or its usage printed), then its run,
//! with exit codes 0, 64 (bad arguments) and 1 (the run failed).

use std::process::ExitCode;

/// `parse` gives `None` for `--help`.
pub fn main_of<O>(
    name: &str,
    usage: &str,
    parse: impl FnOnce(&[String]) -> anyhow::Result<Option<O>>,
    run: impl FnOnce(&O) -> anyhow::Result<()>,
) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{usage}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{name}: {e}\n\n{usage}");
            return ExitCode::from(64);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The value after option `name`, as a number.
#[allow(dead_code)] // not every bench has numeric options
pub fn number<T: std::str::FromStr>(it: &mut std::slice::Iter<'_, String>, name: &str) -> anyhow::Result<T> {
    let v = it.next().ok_or_else(|| anyhow::anyhow!("{name} needs a number"))?;
    v.parse().map_err(|_| anyhow::anyhow!("{name}: {v:?} is not a number"))
}
