//! `rankwise-fault`: `rankwise` for the failure tests, with `RANKWISE_FAULT` read (feature
//! `fault-injection`; never shipped).

fn main() {
    std::process::exit(rankwise_launch::cli::main_with_faults());
}
