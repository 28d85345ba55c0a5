//! JUnit XML for CI systems: one testsuite per kernel, one testcase per
//! scenario; skipped and known-bug trials are `<skipped>`, failures and
//! `FIXED?`/`FLAKY` are `<failure>`, the rest `<error>`.
//!
//! Messages come from the guest (agent errors, probe reasons, console
//! lines), so they may hold any character, and the file must still be XML
//! 1.0 a CI's parser accepts. Written by hand rather than with a JUnit
//! crate: `quick-junit` (0.8) deletes control characters and whole ANSI
//! escape sequences from what it writes, which hides that the guest sent
//! them, and it brings a dozen crates along; the escaping below is small
//! enough to keep and test here.

use std::fmt::Write as _;

use crate::run::trial::{TrialResult, Verdict};

/// Whether XML 1.0 can carry `c` at all (its `Char` production: tab, LF,
/// CR, U+0020–U+D7FF, U+E000–U+FFFD, U+10000–U+10FFFF). A character
/// reference (`&#27;`) must name a `Char` too, so for the rest there is no
/// escape in XML itself. Rust strings hold no surrogates, which leaves the
/// other C0 controls and U+FFFE / U+FFFF.
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

/// `s` escaped for XML 1.0 text (`attribute`: for an attribute value in
/// double quotes). A character XML cannot carry is written visibly as
/// Rust writes it, `\u{1b}`, rather than dropped, so a reader sees that
/// the guest sent it. CR, and in attributes tab and LF, become character
/// references: a parser would otherwise turn them into LF and spaces.
fn escape(s: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#13;"),
            '\n' if attribute => out.push_str("&#10;"),
            '\t' if attribute => out.push_str("&#9;"),
            c if !xml_char(c) => {
                let _ = write!(out, "{}", c.escape_unicode());
            }
            c => out.push(c),
        }
    }
    out
}

/// Text content.
fn text(s: &str) -> String {
    escape(s, false)
}

/// An attribute value (in double quotes).
fn attr(s: &str) -> String {
    escape(s, true)
}

/// JUnit XML: one testsuite per kernel, one testcase per scenario.
pub fn junit(results: &[TrialResult]) -> String {
    // In first-seen order, each once: A/B runs interleave their kernels'
    // trials, and a kernel's suite holds all of its trials.
    let mut kernels: Vec<&str> = Vec::new();
    for r in results {
        if !kernels.contains(&r.kernel.as_str()) {
            kernels.push(&r.kernel);
        }
    }
    let mut x =
        String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"kloop\">\n");
    for k in kernels {
        let rs: Vec<&TrialResult> = results.iter().filter(|r| r.kernel == k).collect();
        let failures = rs
            .iter()
            .filter(|r| {
                matches!(
                    r.verdict,
                    Verdict::Failed(_) | Verdict::Fixed(_) | Verdict::Flaky(_)
                )
            })
            .count();
        let skipped = rs
            .iter()
            .filter(|r| matches!(r.verdict, Verdict::Skipped(_) | Verdict::Known(_)))
            .count();
        let errors =
            rs.len() - failures - skipped - rs.iter().filter(|r| r.verdict == Verdict::Ok).count();
        let time: f64 = rs.iter().map(|r| r.wall_secs).sum();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{time:.3}\">",
            attr(k),
            rs.len()
        );
        for r in rs {
            x.push_str(&testcase(k, r));
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

/// One trial as a testcase of kernel `k`'s suite: its properties, and its
/// verdict as JUnit's failure, skipped or error.
fn testcase(k: &str, r: &TrialResult) -> String {
    let mut x = String::new();
    let _ = write!(
        x,
        "    <testcase classname=\"kloop.{}\" name=\"{}\" time=\"{:.3}\">",
        attr(k),
        attr(&r.scenario),
        r.wall_secs
    );
    let props = format!(
        "<properties><property name=\"accel\" value=\"{}\"/><property name=\"guest_release\" value=\"{}\"/><property name=\"qemu\" value=\"{}\"/><property name=\"host_release\" value=\"{}\"/><property name=\"artefacts\" value=\"{}\"/></properties>",
        attr(&r.accel),
        attr(r.guest_release.as_deref().unwrap_or("")),
        attr(&r.qemu_version),
        attr(&r.host_release),
        attr(&r.artefacts.display().to_string())
    );
    x.push_str(&props);
    match &r.verdict {
        Verdict::Ok => {}
        Verdict::Failed(f) => {
            let _ = write!(
                x,
                "<failure message=\"{}\">{}</failure>",
                attr(&f.cause.summary()),
                text(&f.message)
            );
        }
        // JUnit has no "expected failure": a known bug is
        // skipped with the reason, so CI shows it without failing.
        Verdict::Skipped(_) | Verdict::Known(_) => {
            let headline = r.verdict.headline();
            let message = match &r.verdict {
                Verdict::Known(_) => format!("known bug: {headline}"),
                _ => headline,
            };
            let _ = write!(
                x,
                "<skipped message=\"{}\">{}</skipped>",
                attr(&message),
                text(r.verdict.message().unwrap_or(""))
            );
        }
        Verdict::Fixed(m) | Verdict::Flaky(m) => {
            let _ = write!(
                x,
                "<failure message=\"{}\">{}</failure>",
                attr(&r.verdict.headline()),
                text(m)
            );
        }
        other => {
            let _ = write!(
                x,
                "<error type=\"{}\" message=\"{}\">{}</error>",
                other.label().to_lowercase(),
                other.label().to_lowercase(),
                text(other.message().unwrap_or(""))
            );
        }
    }
    x.push_str("</testcase>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(kernel: &str, scenario: &str, verdict: Verdict) -> TrialResult {
        TrialResult {
            wall_secs: 1.5,
            boot_to_hello_secs: Some(1.0),
            guest_release: Some("6.1.0-\u{1b}[1mcloud".into()),
            ..TrialResult::for_test(kernel, scenario, verdict, "/tmp/a")
        }
    }

    /// Whatever the guest sent, the report parses as XML 1.0, and what
    /// XML cannot carry shows as `\u{…}` instead of vanishing.
    #[test]
    fn control_characters_from_the_guest_stay_valid_and_visible() {
        let rs = vec![
            result(
                "6.1",
                "basic",
                Verdict::failed(crate::run::trial::FailureCause::AgentError, "agent said \u{0}nul \u{1b}[31mred\u{1b}[0m bell\u{7}\r\nend \u{fffe}\u{ffff} <&>"),
            ),
            result("6.12", "basic", Verdict::Ok),
            result(
                "6.1",
                "probes",
                Verdict::Skipped("lsm-bpf: \"bpf\u{1}\" missing\ttab".into()),
            ),
            result("6.1", "many", Verdict::Panic("Kernel panic\u{8}\u{1f}".into())),
        ];
        let xml = junit(&rs);
        let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
        let suites: Vec<_> = doc
            .descendants()
            .filter(|n| n.has_tag_name("testsuite"))
            .collect();
        let names: Vec<_> = suites.iter().filter_map(|s| s.attribute("name")).collect();
        assert_eq!(names, ["6.1", "6.12"], "one suite per kernel, in order");
        assert_eq!(suites[0].attribute("tests"), Some("3"));
        let cases: Vec<_> = suites[0]
            .children()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        let case_names: Vec<_> = cases.iter().filter_map(|c| c.attribute("name")).collect();
        assert_eq!(case_names, ["basic", "probes", "many"]);
        let failure = cases[0]
            .children()
            .find(|n| n.has_tag_name("failure"))
            .unwrap();
        assert_eq!(failure.attribute("message"), Some("guest agent error"));
        assert_eq!(
            failure.text(),
            Some("agent said \\u{0}nul \\u{1b}[31mred\\u{1b}[0m bell\\u{7}\r\nend \\u{fffe}\\u{ffff} <&>")
        );
        let skipped = cases[1]
            .children()
            .find(|n| n.has_tag_name("skipped"))
            .unwrap();
        // Tab and quotes survive an attribute value, the control shows.
        assert_eq!(
            skipped.attribute("message"),
            Some("SKIPPED (lsm-bpf: \"bpf\\u{1}\" missing\ttab)")
        );
        let error = cases[2]
            .children()
            .find(|n| n.has_tag_name("error"))
            .unwrap();
        assert_eq!(error.attribute("type"), Some("panic"));
        assert_eq!(error.text(), Some("Kernel panic\\u{8}\\u{1f}"));
        let release = cases[0]
            .descendants()
            .find(|n| n.attribute("name") == Some("guest_release"))
            .and_then(|n| n.attribute("value"));
        assert_eq!(release, Some("6.1.0-\\u{1b}[1mcloud"));
    }

    /// What the escaping replaces is what a strict parser refuses.
    #[test]
    fn character_references_to_controls_are_not_xml() {
        assert!(roxmltree::Document::parse("<a>&#27;</a>").is_err());
        assert!(roxmltree::Document::parse("<a>\u{ffff}</a>").is_err());
        assert!(roxmltree::Document::parse(&format!("<a>{}</a>", text("\u{1b}\u{ffff}"))).is_ok());
    }
}
