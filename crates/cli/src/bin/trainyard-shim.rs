//! `trainyard-shim <run_dir>`: one replica's supervisor (the same code as `trainyard shim`),
//! as a program of its own so that it starts quicker than the whole CLI. `serve` uses it
//! when it stands beside the `trainyard` executable.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(trainyard_backend::shim_program_main(args));
}
