fn main() -> std::process::ExitCode {
    match socklb::cli::main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("socklb: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
