//! The demo's narration: numbered steps, each claim with its evidence and PASS/FAIL.
use std::io::{BufRead as _, IsTerminal as _, Write as _};

pub struct Story {
    step: usize,
    pub passed: usize,
    pub failed: Vec<String>,
    interactive: bool,
}

impl Story {
    pub fn new(interactive: bool) -> Self {
        Self {
            step: 0,
            passed: 0,
            failed: Vec::new(),
            interactive: interactive && std::io::stdin().is_terminal(),
        }
    }

    /// Starts a step: a title and what it is about to show.
    pub fn step(&mut self, title: &str, what: &str) {
        if self.interactive && self.step > 0 {
            print!("\n  (press Enter to continue) ");
            let _ = std::io::stdout().flush();
            let _ = std::io::stdin().lock().read_line(&mut String::new());
        }
        self.step += 1;
        println!("\n\x1b[1m{}. {title}\x1b[0m", self.step);
        for line in what.lines() {
            println!("   {line}");
        }
    }

    /// Evidence: what was observed.
    pub fn show(&self, text: &str) {
        for line in text.lines() {
            println!("     {line}");
        }
    }

    /// A claim and whether the evidence supports it.
    pub fn claim(&mut self, claim: &str, holds: bool) -> bool {
        if holds {
            self.passed += 1;
            println!("   \x1b[32mPASS\x1b[0m {claim}");
        } else {
            self.failed.push(claim.to_string());
            println!("   \x1b[31mFAIL\x1b[0m {claim}");
        }
        holds
    }

    pub fn summary(&self) -> bool {
        println!();
        if self.failed.is_empty() {
            println!("\x1b[1mAll {} claims held.\x1b[0m", self.passed);
            true
        } else {
            println!(
                "\x1b[1m{} of {} claims failed:\x1b[0m",
                self.failed.len(),
                self.failed.len() + self.passed
            );
            for f in &self.failed {
                println!("  - {f}");
            }
            false
        }
    }
}

/// `a: 51, b: 49` as a bar chart.
pub fn spread(counts: &std::collections::BTreeMap<String, usize>) -> String {
    let total: usize = counts.values().sum();
    counts
        .iter()
        .map(|(k, v)| {
            let pct = if total == 0 {
                0.0
            } else {
                *v as f64 * 100.0 / total as f64
            };
            let bar = "#".repeat(usize::try_from((pct / 2.5).round() as i64).unwrap_or(0));
            format!("{k:<22} {v:>5}  {pct:5.1}%  {bar}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}
