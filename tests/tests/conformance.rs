//! The Kubernetes conformance suite (see `socklb_tests::conformance`): every case through the
//! agent's engine into in-memory maps (one test per case), and every case on real sockets in a
//! sandbox (one test per node identity, naming each failing case).
use libtest_mimic::{Arguments, Failed, Trial};
use socklb_tests::{
    conformance::{CASES, run},
    privileged,
};

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![Trial::test("table", || {
        run::check_table(CASES)?;
        if CASES.len() < 40 {
            return Err(format!("only {} cases; the suite needs at least 40", CASES.len()).into());
        }
        Ok(())
    })];
    for case in CASES {
        trials.push(Trial::test(
            format!("in_memory::{}", case.name),
            move || run::in_memory(case).map_err(|e| Failed::from(format!("{e:#}"))),
        ));
    }
    for (i, (node, cases)) in run::by_node(CASES).into_iter().enumerate() {
        let name = format!("end_to_end::node_{i}_zone_{}", node.zone.unwrap_or("none"));
        let test = name.clone();
        trials.push(Trial::test(name, move || {
            if !privileged(&test) {
                return Ok(());
            }
            let failures =
                run::end_to_end(&node, &cases).map_err(|e| Failed::from(format!("{e:#}")))?;
            if failures.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} of {} cases failed on real sockets:\n{}",
                    failures.len(),
                    cases.len(),
                    failures.join("\n")
                )
                .into())
            }
        }));
    }
    libtest_mimic::run(&args, trials).exit();
}
