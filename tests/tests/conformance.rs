//! The Kubernetes conformance suite (see `socklb_tests::conformance`): every case through the
//! agent's engine into in-memory maps (one test per case), and every case on real sockets in a
//! sandbox (one test per node identity, naming each failing case).
use libtest_mimic::{Arguments, Failed, Trial};
use socklb_tests::{
    conformance::{cases, run},
    privileged,
};

fn main() {
    let args = Arguments::from_args();
    let all = match cases() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("the conformance cases do not read: {e:#}");
            std::process::exit(1);
        }
    };
    let table = all.clone();
    let mut trials = vec![Trial::test("table", move || {
        run::check_table(&table)?;
        if table.len() < 40 {
            return Err(format!("only {} cases; the suite needs at least 40", table.len()).into());
        }
        Ok(())
    })];
    for case in all.iter().cloned() {
        trials.push(Trial::test(
            format!("in_memory::{}", case.name),
            move || run::in_memory(&case).map_err(|e| Failed::from(format!("{e:#}"))),
        ));
    }
    for (i, (node, cases)) in run::by_node(&all).into_iter().enumerate() {
        let cases: Vec<_> = cases.into_iter().cloned().collect();
        let name = format!(
            "end_to_end::node_{i}_zone_{}{}",
            node.zone.as_deref().unwrap_or("none"),
            node.kubernetes_version
                .as_deref()
                .map(|v| format!("_kubernetes_{}", v.replace('.', "_")))
                .unwrap_or_default()
        );
        let test = name.clone();
        trials.push(Trial::test(name, move || {
            if !privileged(&test) {
                return Ok(());
            }
            let cases: Vec<_> = cases.iter().collect();
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
