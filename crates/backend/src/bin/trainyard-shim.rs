//! `trainyard-shim <run_dir>`: the replica supervisor as a program of its own (the
//! product binary runs the same code as `trainyard shim <run_dir>`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(trainyard_backend::shim_program_main(args));
}
