//! The demo's narration: numbered steps, each claim with its evidence and PASS/FAIL, or NOT
//! SHOWN (with why) where this machine cannot show it: never a PASS that was not observed.
use std::io::{BufRead as _, IsTerminal as _, Write as _};

pub struct Story {
    step: usize,
    pub passed: usize,
    pub failed: Vec<String>,
    /// Claims this machine cannot show, each with why.
    pub not_shown: Vec<String>,
    interactive: bool,
    /// Colour and bold only on a terminal (not in a file or a CI log).
    styled: bool,
}

impl Story {
    pub fn new(interactive: bool) -> Self {
        Self {
            step: 0,
            passed: 0,
            failed: Vec::new(),
            not_shown: Vec::new(),
            interactive: interactive && std::io::stdin().is_terminal(),
            styled: std::io::stdout().is_terminal(),
        }
    }

    /// `text` in the SGR style `code` (1 bold, 31 red, 32 green) when on a terminal.
    fn style(&self, code: u8, text: &str) -> String {
        if self.styled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
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
        // The tests' way to make the demo fail mid-way and check it cleans up after a panic.
        assert!(
            std::env::var("SOCKLB_DEMO_PANIC_AT_STEP").ok() != Some(self.step.to_string()),
            "SOCKLB_DEMO_PANIC_AT_STEP={}: panicking on purpose",
            self.step
        );
        println!("\n{}", self.style(1, &format!("{}. {title}", self.step)));
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
            println!("   {} {claim}", self.style(32, "PASS"));
        } else {
            self.failed.push(claim.to_string());
            println!("   {} {claim}", self.style(31, "FAIL"));
        }
        holds
    }

    /// A claim this machine cannot show (an optional kernel part is off), and why: neither
    /// PASS nor FAIL, counted apart and said in the summary.
    pub fn not_shown(&mut self, claim: &str, why: &str) {
        self.not_shown.push(format!("{claim} ({why})"));
        println!("   {} {claim}: {why}", self.style(33, "NOT SHOWN"));
    }

    pub fn summary(&self) -> bool {
        println!();
        if self.failed.is_empty() {
            let mut line = format!("All {} claims shown held.", self.passed);
            if !self.not_shown.is_empty() {
                use std::fmt::Write as _;
                let _ = write!(
                    line,
                    " {} not shown on this machine: {}",
                    self.not_shown.len(),
                    self.not_shown.join("; ")
                );
            }
            println!("{}", self.style(1, &line));
            true
        } else {
            let line = format!(
                "{} of {} claims failed:",
                self.failed.len(),
                self.failed.len() + self.passed
            );
            println!("{}", self.style(1, &line));
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
