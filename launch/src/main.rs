//! The `rankwise` command.

fn main() {
    std::process::exit(rankwise_launch::cli::main());
}
