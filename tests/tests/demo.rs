//! `cargo xtask demo`, run non-interactively: every claim it makes must hold.
use socklb_tests::privileged;

#[test]
fn the_demo_holds_every_claim() {
    if !privileged("the_demo_holds_every_claim") {
        return;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_socklb-demo"))
        .arg("--non-interactive")
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("claims held."), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}
