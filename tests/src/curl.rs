//! curl, the HTTP client a load balancer's probe stands for, run in a network namespace.
use std::process::Command;

use anyhow::{Context as _, bail};

/// One HTTP answer as curl got it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What came of a request: an answer, or curl's exit code (7: connection refused).
#[derive(Debug)]
pub enum Outcome {
    Answer(Answer),
    Failed { code: i32, stderr: String },
}

/// `curl URL` from inside `netns` (`method`: GET unless given), at most 5 s.
pub fn curl(netns: &str, method: &str, url: &str) -> anyhow::Result<Outcome> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "curl",
            "-sS",
            "-i",
            "--max-time",
            "5",
        ])
        .args(["-X", method, url])
        .output()
        .context("running curl")?;
    if !out.status.success() {
        return Ok(Outcome::Failed {
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8(out.stdout).context("curl's output is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of headers in curl's output")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("status line {status_line:?}"))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Outcome::Answer(Answer {
        status,
        headers,
        body: body.to_string(),
    }))
}

/// `curl` that must get an answer.
pub fn get(netns: &str, url: &str) -> anyhow::Result<Answer> {
    match curl(netns, "GET", url)? {
        Outcome::Answer(a) => Ok(a),
        Outcome::Failed { code, stderr } => bail!("curl {url} in {netns}: exit {code}: {stderr}"),
    }
}
