//! `rankwise-fault`: `rankwise` for the failure tests, with `RANKWISE_FAULT` read (see
//! `fault.rs`); never shipped.

mod fault;

fn main() {
    if let Err(line) = fault::arm_from_env() {
        eprintln!("{line}");
        std::process::exit(2);
    }
    std::process::exit(rankwise_launch::cli::main_with_phase_hook(fault::inject));
}
