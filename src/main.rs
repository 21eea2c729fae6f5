//! The stock `gaffer` binary: the built-in handlers and the command line. A team with
//! handlers of its own builds the same two lines with its own registry (see `examples/`).

fn main() -> std::process::ExitCode {
    gaffer::cli::run(gaffer::slot::Registry::builtin())
}
