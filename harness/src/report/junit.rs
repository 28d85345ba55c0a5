//! JUnit XML for CI systems: one testsuite per kernel, one testcase per
//! scenario; skipped and known-bug trials are `<skipped>`, failures and
//! `FIXED?`/`FLAKY` are `<failure>`, the rest `<error>`.

use std::fmt::Write as _;

use crate::run::trial::{TrialResult, Verdict};

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => {
                let _ = write!(out, "&#{};", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// JUnit XML: one testsuite per kernel, one testcase per scenario.
pub fn junit(results: &[TrialResult]) -> String {
    let mut kernels: Vec<&str> = results.iter().map(|r| r.kernel.as_str()).collect();
    kernels.dedup();
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
            xml_escape(k),
            rs.len()
        );
        for r in rs {
            let _ = write!(
                x,
                "    <testcase classname=\"kloop.{}\" name=\"{}\" time=\"{:.3}\">",
                xml_escape(k),
                xml_escape(&r.scenario),
                r.wall_secs
            );
            let props = format!(
                "<properties><property name=\"accel\" value=\"{}\"/><property name=\"guest_release\" value=\"{}\"/><property name=\"qemu\" value=\"{}\"/><property name=\"host_release\" value=\"{}\"/><property name=\"artefacts\" value=\"{}\"/></properties>",
                xml_escape(&r.accel),
                xml_escape(r.guest_release.as_deref().unwrap_or("")),
                xml_escape(&r.qemu_version),
                xml_escape(&r.host_release),
                xml_escape(&r.artefacts.display().to_string())
            );
            x.push_str(&props);
            match &r.verdict {
                Verdict::Ok => {}
                Verdict::Failed(m) => {
                    let _ = write!(
                        x,
                        "<failure message=\"test failure\">{}</failure>",
                        xml_escape(m)
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
                        xml_escape(&message),
                        xml_escape(r.verdict.message().unwrap_or(""))
                    );
                }
                Verdict::Fixed(m) | Verdict::Flaky(m) => {
                    let _ = write!(
                        x,
                        "<failure message=\"{}\">{}</failure>",
                        xml_escape(&r.verdict.headline()),
                        xml_escape(m)
                    );
                }
                other => {
                    let _ = write!(
                        x,
                        "<error type=\"{}\" message=\"{}\">{}</error>",
                        other.label().to_lowercase(),
                        other.label().to_lowercase(),
                        xml_escape(other.message().unwrap_or(""))
                    );
                }
            }
            x.push_str("</testcase>\n");
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}
