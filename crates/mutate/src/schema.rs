//! Mutant schemata: many mutants of one kernel in one build, chosen at run
//! time. Each mutated function is rewritten as a switch over copies of its
//! body, the unmutated one and one per mutant, keyed by the kernel
//! parameter `kloop_mutant` (`/sys/module/kernel/parameters/kloop_mutant`,
//! which the agent writes before a plan's first step). With the switch at
//! 0 the kernel runs its own code; at a mutant's number it runs that
//! mutant's body and nothing else differs. One incremental build (and one
//! saved VM per shape) then serves hundreds of mutants that each cost a
//! 46-second build on their own.
//!
//! The rewrite is at the level of whole function bodies, so any mutant
//! whose changes lie inside one body fits, whatever its operator. What
//! does not fit is said, and such a mutant is built on its own:
//! - a change outside the body (none of today's operators makes one),
//! - a body with a `static` local (each copy would keep its own state),
//! - a file with no change to make.
//!
//! Labels are function-wide in C, so each copy declares its labels with
//! GCC's `__label__`, which makes them local to the copy's block.
//!
//! Pure: texts in, text out (the run room applies patches to files and
//! builds).

use std::collections::BTreeMap;
use std::ops::Range;

use super::c_source::{self, is_ident};
use super::Mutant;

/// The kernel parameter the agent writes: a `core_param`, so it sits under
/// the pseudo-module `kernel` in sysfs.
pub const SWITCH: &str = "kloop_mutant";
/// Where the agent writes the switch in the guest.
pub const SWITCH_PATH: &str = "/sys/module/kernel/parameters/kloop_mutant";

/// Why a mutant cannot go in a schema (it is then built alone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Its patch does not parse.
    #[error("its patch does not parse: {0}")]
    Patch(String),
    /// Its patch does not apply.
    #[error("its patch does not apply to the tree's file: {0}")]
    Apply(String),
    /// The mutated file lacks the function.
    #[error("function {0} not found in the mutated file")]
    NoFunction(String),
    /// The patch changes more than the function's body.
    #[error("it changes {0}'s file outside the function's body")]
    OutsideBody(String),
    /// The function has a static local.
    #[error("{0} has a static local, which each copy of its body would keep apart")]
    StaticLocal(String),
}

/// `m`'s file after its patch, from the unmutated `original`.
pub fn mutated_text(original: &str, m: &Mutant) -> Result<String, SchemaError> {
    let patch = diffy::Patch::from_str(&m.patch).map_err(|e| SchemaError::Patch(e.to_string()))?;
    diffy::apply(original, &patch).map_err(|e| SchemaError::Apply(e.to_string()))
}

/// One mutant to put in a schema: its number (the switch's value, never
/// 0), the function it changes and its whole mutated file.
pub struct Variant<'a> {
    /// The switch's value for it.
    pub number: u32,
    /// The function it changes.
    pub function: &'a str,
    /// Its whole mutated file.
    pub mutated: &'a str,
}

/// A file's schema.
#[derive(Debug)]
pub struct FileSchema {
    /// The file with every included mutant's body behind the switch.
    pub text: String,
    /// Mutant numbers it switches to.
    pub included: Vec<u32>,
    /// Mutant numbers left out, with why.
    pub left_out: Vec<(u32, SchemaError)>,
}

/// The schema of one file: `original` with every function that has a
/// variant rewritten as a switch over its bodies. `defines_switch`: this
/// file defines the parameter (exactly one file of a build does); the
/// others declare it.
pub fn file_schema(original: &str, variants: &[Variant], defines_switch: bool) -> FileSchema {
    let mask = c_source::code_mask(original);
    let mut left_out = Vec::new();
    // function → its body in the original, and each variant's body.
    /// A function's body in the original, and each mutant's copy of it.
    type Bodies = (Range<usize>, Vec<(u32, String)>);
    let mut per_function: BTreeMap<&str, Bodies> = BTreeMap::new();
    for v in variants {
        match variant_body(original, &mask, v) {
            Ok((body, mutated_body)) => per_function
                .entry(v.function)
                .or_insert_with(|| (body, Vec::new()))
                .1
                .push((v.number, mutated_body)),
            Err(e) => left_out.push((v.number, e)),
        }
    }
    let mut edits: Vec<(Range<usize>, String)> = Vec::new();
    let mut included = Vec::new();
    for (function, (body, copies)) in per_function {
        let original_body = &original[body.clone()];
        if has_static_local(original_body) {
            left_out.extend(
                copies
                    .iter()
                    .map(|(n, _)| (*n, SchemaError::StaticLocal(function.to_string()))),
            );
            continue;
        }
        included.extend(copies.iter().map(|(n, _)| *n));
        edits.push((body, switch_body(original_body, &copies)));
    }
    // The switch is declared right before the first rewritten function:
    // at file scope, under the same `#if`s as the function (which compiled),
    // after the headers, and before every use.
    let first = edits.iter().map(|(r, _)| r.start).min().unwrap_or(0);
    let at = declaration_start(original, first);
    let mut text = crate::apply(original, &edits);
    let prologue = if defines_switch {
        // A core_param: no module prefix, writable at run time (0644), so
        // a saved VM booted with 0 is switched per trial.
        format!(
            "#include <linux/moduleparam.h>\n\
             /* kloop mutant schema: which mutant's body runs (0: none). */\n\
             int {SWITCH} __read_mostly;\n\
             core_param({SWITCH}, {SWITCH}, int, 0644);\n"
        )
    } else {
        format!("/* kloop mutant schema */\nextern int {SWITCH};\n")
    };
    included.sort_unstable();
    text.insert_str(at, &prologue);
    FileSchema {
        text,
        included,
        left_out,
    }
}

/// The function's body in `original` and its body in the variant, when
/// the variant changes nothing else.
fn variant_body(
    original: &str,
    mask: &[bool],
    v: &Variant,
) -> Result<(Range<usize>, String), SchemaError> {
    let body = c_source::function_body(original, mask, v.function)
        .ok_or_else(|| SchemaError::NoFunction(v.function.to_string()))?;
    let mmask = c_source::code_mask(v.mutated);
    let mbody = c_source::function_body(v.mutated, &mmask, v.function)
        .ok_or_else(|| SchemaError::NoFunction(v.function.to_string()))?;
    if original[..body.start] != v.mutated[..mbody.start]
        || original[body.end..] != v.mutated[mbody.end..]
    {
        return Err(SchemaError::OutsideBody(v.function.to_string()));
    }
    Ok((body, v.mutated[mbody].to_string()))
}

/// Where the definition whose body opens at `body` begins: the lines above
/// its `{` back to a blank line, a comment's end, a preprocessor line or
/// the end of the previous declaration.
fn declaration_start(text: &str, body: usize) -> usize {
    let mut at = text[..body].rfind('\n').map_or(0, |i| i + 1);
    while at > 0 {
        let prev = text[..at - 1].rfind('\n').map_or(0, |i| i + 1);
        let line = text[prev..at - 1].trim();
        if line.is_empty()
            || line.ends_with(';')
            || line.ends_with('}')
            || line.ends_with("*/")
            || line.starts_with('#')
        {
            break;
        }
        at = prev;
    }
    at
}

/// A `static` declaration in code (not in a comment or string) of `body`.
fn has_static_local(body: &str) -> bool {
    let mask = c_source::code_mask(body);
    let b = body.as_bytes();
    body.match_indices("static").any(|(at, _)| {
        let before = at == 0 || !is_ident(b[at - 1]);
        let after = b.get(at + 6).is_none_or(|c| !is_ident(*c));
        // `static_branch_unlikely(...)`, `static_call(...)` are not locals.
        mask[at] && before && after
    })
}

/// The labels a body defines (`out:` at the start of a statement), which
/// each copy must declare local.
fn labels(body: &str) -> Vec<String> {
    let mask = c_source::code_mask(body);
    let mut out = Vec::new();
    let mut line_start = 0;
    for line in body.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let at = line_start + (line.len() - trimmed.len());
        line_start += line.len();
        if at >= mask.len() || !mask[at] {
            continue;
        }
        let name: String = trimmed
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let rest = &trimmed[name.len()..];
        if name.is_empty()
            || name.starts_with(|c: char| c.is_ascii_digit())
            || name == "default"
            || !rest.starts_with(':')
            || rest.starts_with("::")
        {
            continue;
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// `{ if (switch == n) { copy n } else if … else { original } }`: each
/// copy a block with its labels local; a copy that falls off its end
/// falls off the function's, as the original does.
fn switch_body(original_body: &str, copies: &[(u32, String)]) -> String {
    let block = |body: &str| -> String {
        // `body` is `{ … }`: its labels declared first thing inside.
        let labels = labels(body);
        if labels.is_empty() {
            body.to_string()
        } else {
            format!("{{ __label__ {};\n{}", labels.join(", "), &body[1..])
        }
    };
    let mut out = String::from("{\n");
    for (i, (n, body)) in copies.iter().enumerate() {
        out.push_str(if i == 0 { "\tif " } else { " else if " });
        out.push_str(&format!("(READ_ONCE({SWITCH}) == {n}) "));
        out.push_str(&block(body));
    }
    out.push_str(" else ");
    out.push_str(&block(original_body));
    out.push_str("\n}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "#include <x.h>\n\
static int counter;\n\
\n\
int f(int a)\n\
{\n\
\tif (a > 1)\n\
\t\tgoto out;\n\
\treturn a;\n\
out:\n\
\treturn counter + a;\n\
}\n\
\n\
void g(void)\n\
{\n\
\tstatic int calls;\n\
\tcalls++;\n\
}\n";

    fn variant<'a>(number: u32, function: &'a str, mutated: &'a str) -> Variant<'a> {
        Variant {
            number,
            function,
            mutated,
        }
    }

    #[test]
    fn a_function_becomes_a_switch_over_its_bodies_with_local_labels() {
        let m1 = FILE.replace("a > 1", "a >= 1");
        let m2 = FILE.replace("return a;", ";");
        let s = file_schema(FILE, &[variant(1, "f", &m1), variant(2, "f", &m2)], true);
        assert_eq!(s.included, vec![1, 2]);
        assert!(s.left_out.is_empty());
        assert!(s
            .text
            .contains("core_param(kloop_mutant, kloop_mutant, int, 0644);"));
        assert!(s
            .text
            .contains("if (READ_ONCE(kloop_mutant) == 1) { __label__ out;"));
        assert!(s
            .text
            .contains("else if (READ_ONCE(kloop_mutant) == 2) { __label__ out;"));
        // The original body is the last branch, and g is untouched.
        let last = s
            .text
            .rfind("} else { __label__ out;")
            .expect("original branch");
        assert!(s.text[last..].contains("if (a > 1)"));
        assert!(s
            .text
            .ends_with("void g(void)\n{\n\tstatic int calls;\n\tcalls++;\n}\n"));
        assert_eq!(s.text.matches("a >= 1").count(), 1);
        assert_eq!(s.text.matches("if (a > 1)").count(), 2);
    }

    #[test]
    fn what_cannot_be_switched_is_left_out_with_why() {
        let outside = FILE.replace("static int counter;", "static long counter;");
        let in_g = FILE.replace("calls++;", "calls--;");
        let s = file_schema(
            FILE,
            &[variant(3, "f", &outside), variant(4, "g", &in_g)],
            false,
        );
        assert!(s.included.is_empty());
        assert_eq!(
            s.left_out,
            vec![
                (3, SchemaError::OutsideBody("f".into())),
                (4, SchemaError::StaticLocal("g".into()))
            ]
        );
        assert!(s
            .text
            .starts_with("/* kloop mutant schema */\nextern int kloop_mutant;\n"));
    }

    #[test]
    fn a_declaration_starts_after_the_comment_or_declaration_above_it() {
        let text = "int x;\n/* doc */\nstatic int\nf(void)\n{\n}\n";
        let body = text.find('{').unwrap();
        assert_eq!(
            &text[declaration_start(text, body)..body],
            "static int\nf(void)\n"
        );
    }

    #[test]
    fn labels_are_statement_starts_not_cases_or_comments() {
        let body = "{\n\tswitch (x) {\n\tcase 1:\n\tdefault:\n\t\tbreak;\n\t}\n\t/* note: */\nerr_put:\n\tx = y ? 1 : 2;\nout: ;\n}";
        assert_eq!(labels(body), vec!["err_put", "out"]);
    }

    #[test]
    fn static_calls_and_branches_are_not_static_locals() {
        assert!(!has_static_local(
            "{ if (static_branch_unlikely(&k)) static_call(f)(); }"
        ));
        assert!(!has_static_local("{ /* static */ x(); }"));
        assert!(has_static_local("{ static DEFINE_MUTEX(m); }"));
    }
}
