//! The mutation operators: each turns one function body into edits, one
//! edit per mutant.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::c_source::{headers, statements};

/// What a mutant does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operator {
    /// A call statement removed.
    DropCall,
    /// Two adjacent call statements in the other order.
    SwapCalls,
    /// `if (c)` → `if (!(c))`.
    NegateCondition,
    /// `if (c)` → `if (1 || (c))`: the guarded code always runs.
    ConditionAlways,
    /// `if (c)` → `if (0 && (c))`: the guarded code never runs.
    ConditionNever,
    /// An early `return` or `goto` removed (the function goes on).
    DropReturn,
    /// A flag, record type, event type or constant changed.
    Constant,
    /// A local's type narrowed (`u16` → `u8`, …).
    NarrowType,
    /// A length, size or address passed on is 1 too large.
    OffByOne,
    /// … or 8 too large (a whole `u64` field).
    OffBySome,
    /// A `for` loop skips its first iteration.
    SkipFirst,
    /// A `for` loop skips its last iteration.
    SkipLast,
    /// A local or parameter read in place of another of its type
    /// ([`super::operands`]).
    ReplaceVariable,
    /// A file-scope variable in place of one of its name family
    /// (`nr_bpf_events` for `nr_ksymbol_events`).
    ReplaceGlobal,
    /// Another member of the same enum.
    ReplaceConstant,
    /// Another field of the same base (`attr.bpf_event` for `attr.ksymbol`).
    ReplaceField,
    /// A relational operator's boundary shifted or its equality turned.
    Relational,
    /// `+` for `-` and back.
    Arithmetic,
    /// Two adjacent arguments of a call exchanged.
    SwapArguments,
}

impl Operator {
    /// Its name in ids and reports (`drop-call`).
    pub fn name(self) -> &'static str {
        match self {
            Operator::DropCall => "drop-call",
            Operator::SwapCalls => "swap-calls",
            Operator::NegateCondition => "negate-condition",
            Operator::ConditionAlways => "condition-always",
            Operator::ConditionNever => "condition-never",
            Operator::DropReturn => "drop-return",
            Operator::Constant => "constant",
            Operator::NarrowType => "narrow-type",
            Operator::OffByOne => "off-by-one",
            Operator::OffBySome => "off-by-some",
            Operator::SkipFirst => "skip-first",
            Operator::SkipLast => "skip-last",
            Operator::ReplaceVariable => "replace-variable",
            Operator::ReplaceGlobal => "replace-global",
            Operator::ReplaceConstant => "replace-constant",
            Operator::ReplaceField => "replace-field",
            Operator::Relational => "relational",
            Operator::Arithmetic => "arithmetic",
            Operator::SwapArguments => "swap-arguments",
        }
    }

    /// Operators that put the right code's operand in the wrong place
    /// ([`super::operands`]), as opposed to those that change statements
    /// and conditions.
    pub fn is_operand(self) -> bool {
        matches!(
            self,
            Operator::ReplaceVariable
                | Operator::ReplaceGlobal
                | Operator::ReplaceConstant
                | Operator::ReplaceField
                | Operator::Relational
                | Operator::Arithmetic
                | Operator::SwapArguments
        )
    }
}

/// One change to the file's text.
#[derive(Debug, Clone)]
pub struct Edit {
    /// The operator that made it.
    pub operator: Operator,
    /// Replacements (byte range of the original, new text), disjoint.
    pub changes: Vec<(Range<usize>, String)>,
    /// What it does, in a few words.
    pub what: String,
}

/// Named constants and what each becomes.
const CONSTANTS: &[(&str, &str)] = &[
    ("PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER", "0"),
    ("PERF_BPF_EVENT_PROG_LOAD", "PERF_BPF_EVENT_PROG_UNLOAD"),
    ("PERF_BPF_EVENT_PROG_UNLOAD", "PERF_BPF_EVENT_PROG_LOAD"),
    (
        "PERF_RECORD_KSYMBOL_TYPE_BPF",
        "PERF_RECORD_KSYMBOL_TYPE_OOL",
    ),
    (
        "PERF_RECORD_KSYMBOL_TYPE_OOL",
        "PERF_RECORD_KSYMBOL_TYPE_BPF",
    ),
    ("PERF_RECORD_KSYMBOL", "PERF_RECORD_BPF_EVENT"),
    ("PERF_RECORD_BPF_EVENT", "PERF_RECORD_KSYMBOL"),
    ("PERF_RECORD_LOST", "PERF_RECORD_KSYMBOL"),
    ("BPF_TAG_SIZE", "(BPF_TAG_SIZE - 1)"),
    ("KSYM_NAME_LEN", "(KSYM_NAME_LEN / 2)"),
    ("true", "false"),
    ("false", "true"),
];

/// Types and their narrower replacement in a local declaration.
const NARROWER: &[(&str, &str)] = &[("u64", "u32"), ("u32", "u16"), ("u16", "u8")];

/// Words that end a value worth shifting: lengths, sizes, addresses.
const SHIFTABLE: &[&str] = &[
    "len", "size", "addr", "start", "bpf_func", "insns", "name_len",
];

const KEYWORDS: &[&str] = &[
    "if", "for", "while", "switch", "return", "sizeof", "goto", "do", "case", "else",
];

pub(super) fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn leading_ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// A statement that is one call and nothing else: `name(...);`.
fn is_call_statement(stmt: &str) -> bool {
    let name = leading_ident(stmt);
    // Compile-time checks and warnings change nothing a run can see, and
    // a dropped lock hangs or races rather than changes records: such
    // mutants would only spend machine time.
    let unobservable = [
        "BUILD_BUG",
        "WARN",
        "pr_",
        "printk",
        "might_sleep",
        "lockdep_",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || ["lock", "preempt_", "local_irq_"]
            .iter()
            .any(|p| name.contains(p));
    if name.is_empty() || KEYWORDS.contains(&name) || unobservable {
        return false;
    }
    let rest = stmt[name.len()..].trim_start();
    rest.starts_with('(') && rest.ends_with(");") && !stmt.contains('=')
}

/// Every edit the operators make in `body`; `focus`, when not empty,
/// keeps those whose statement or condition mentions one of its words.
#[expect(clippy::too_many_lines)]
pub fn edits(text: &str, mask: &[bool], body: Range<usize>, focus: &[String]) -> Vec<Edit> {
    let focused = |s: &str| focus.is_empty() || focus.iter().any(|f| s.contains(f.as_str()));
    let b = text.as_bytes();
    let mut out = Vec::new();
    let stmts = statements(text, mask, body.clone());
    let last_stmt_start = stmts.last().map(|r| r.start);

    // Statement-level operators.
    for (n, r) in stmts.iter().enumerate() {
        let stmt = &text[r.clone()];
        let flat = squash(stmt);
        if !focused(stmt) {
            continue;
        }
        if is_call_statement(&flat) {
            out.push(Edit {
                operator: Operator::DropCall,
                changes: vec![(r.clone(), "/* kloop mutant: call dropped */;".into())],
                what: format!("drop `{}`", shorten(&flat)),
            });
            // The next statement, when it is a call too and nothing but
            // whitespace separates them.
            if let Some(next) = stmts.get(n + 1) {
                let between = &text[r.end..next.start];
                let next_flat = squash(&text[next.clone()]);
                if between.trim().is_empty() && is_call_statement(&next_flat) {
                    out.push(Edit {
                        operator: Operator::SwapCalls,
                        changes: vec![
                            (r.clone(), text[next.clone()].to_string()),
                            (next.clone(), stmt.to_string()),
                        ],
                        what: format!("swap `{}` and `{}`", shorten(&flat), shorten(&next_flat)),
                    });
                }
            }
        }
        // An early exit: `return …;` / `goto …;` that is not the body's
        // last statement, alone or as a braceless if's body.
        for word in ["return", "goto"] {
            let Some(at) = find_word(stmt, word) else {
                continue;
            };
            let begins_or_guarded = at == 0 || flat.starts_with("if ");
            if begins_or_guarded && Some(r.start) != last_stmt_start {
                out.push(Edit {
                    operator: Operator::DropReturn,
                    changes: vec![(
                        r.start + at..r.end,
                        "/* kloop mutant: exit dropped */;".into(),
                    )],
                    what: format!("drop the early exit of `{}`", shorten(&flat)),
                });
            }
        }
        // A narrower local: `u16 size = …;`.
        for (wide, narrow) in NARROWER {
            if flat.starts_with(&format!("{wide} ")) && flat.contains('=') {
                out.push(Edit {
                    operator: Operator::NarrowType,
                    changes: vec![(r.start..r.start + wide.len(), (*narrow).into())],
                    what: format!("`{}` declared {narrow}", shorten(&flat)),
                });
            }
        }
        // Constants and shifted values inside the statement.
        for (name, becomes) in CONSTANTS {
            let mut from = 0;
            while let Some(at) = find_word(&stmt[from..], name).map(|a| a + from) {
                from = at + name.len();
                if !mask[r.start + at] {
                    continue;
                }
                out.push(Edit {
                    operator: Operator::Constant,
                    changes: vec![(r.start + at..r.start + at + name.len(), (*becomes).into())],
                    what: format!("{name} → {becomes} in `{}`", shorten(&flat)),
                });
            }
        }
        for (value, at) in shiftable_values(stmt) {
            for (op, delta) in [(Operator::OffByOne, 1), (Operator::OffBySome, 8)] {
                let range = r.start + at..r.start + at + value.len();
                if !mask[range.start] {
                    continue;
                }
                out.push(Edit {
                    operator: op,
                    changes: vec![(range, format!("({value} + {delta})"))],
                    what: format!("`{value}` + {delta} in `{}`", shorten(&flat)),
                });
            }
        }
    }

    // Conditions.
    for cond in headers(text, mask, body.clone(), "if") {
        let c = &text[cond.clone()];
        if !focused(c) {
            continue;
        }
        let flat = squash(c);
        for (op, new) in [
            (Operator::NegateCondition, format!("!({c})")),
            (Operator::ConditionAlways, format!("1 || ({c})")),
            (Operator::ConditionNever, format!("0 && ({c})")),
        ] {
            out.push(Edit {
                operator: op,
                changes: vec![(cond.clone(), new)],
                what: format!("{} `if ({})`", op.name(), shorten(&flat)),
            });
        }
    }
    // Loops: `for (i = A; i < B; …)`.
    for header in headers(text, mask, body, "for") {
        let h = &text[header.clone()];
        let parts: Vec<&str> = h.splitn(3, ';').collect();
        if parts.len() != 3 || !focused(h) {
            continue;
        }
        if let Some(eq) = parts[0].find('=') {
            let init = parts[0][eq + 1..].trim();
            if !init.is_empty() {
                let start = header.start + eq + 1 + parts[0][eq + 1..].find(init).unwrap_or(0);
                out.push(Edit {
                    operator: Operator::SkipFirst,
                    changes: vec![(start..start + init.len(), format!("({init}) + 1"))],
                    what: format!("`for ({})` starts one later", squash(h)),
                });
            }
        }
        if let Some(lt) = parts[1]
            .find('<')
            .filter(|&i| parts[1].as_bytes().get(i + 1) != Some(&b'='))
        {
            let bound = parts[1][lt + 1..].trim();
            if !bound.is_empty() {
                let start = header.start
                    + parts[0].len()
                    + 1
                    + lt
                    + 1
                    + parts[1][lt + 1..].find(bound).unwrap_or(0);
                out.push(Edit {
                    operator: Operator::SkipLast,
                    changes: vec![(start..start + bound.len(), format!("({bound}) - 1"))],
                    what: format!("`for ({})` stops one earlier", squash(h)),
                });
            }
        }
    }
    let _ = b;
    out
}

/// Where `word` occurs in `s` as a whole identifier.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(at) = s[from..].find(word).map(|a| a + from) {
        let before = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let end = at + word.len();
        let after = end >= b.len() || !(b[end].is_ascii_alphanumeric() || b[end] == b'_');
        if before && after {
            return Some(at);
        }
        from = end;
    }
    None
}

/// Values passed on in `stmt` (a call's argument, or the right side of a
/// designated initialiser `.x = v,`) whose last name part says length,
/// size or address: `(text, offset)`.
fn shiftable_values(stmt: &str) -> Vec<(String, usize)> {
    let b = stmt.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        // A value starts after `(`, `,` or `=` (not `==`, `<=`, …).
        let starts = match b[i] {
            b'(' | b',' => true,
            b'=' => i > 0 && !b"=!<>+-*/|&".contains(&b[i - 1]) && b.get(i + 1) != Some(&b'='),
            _ => false,
        };
        i += 1;
        if !starts {
            continue;
        }
        let rest = &stmt[i..];
        let lead = rest.len() - rest.trim_start().len();
        let value_start = i + lead;
        let end = stmt[value_start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_.->[]".contains(c)))
            .map_or(stmt.len(), |e| value_start + e);
        let value = &stmt[value_start..end];
        let next = stmt[end..].trim_start().chars().next();
        let last = value.rsplit(['.', '>', '-']).next().unwrap_or("");
        if matches!(next, Some(',' | ')' | ';'))
            && !value.is_empty()
            && !value.chars().next().is_some_and(|c| c.is_ascii_digit())
            && SHIFTABLE
                .iter()
                .any(|s| last == *s || last.ends_with(&format!("_{s}")))
        {
            out.push((value.to_string(), value_start));
        }
    }
    out
}

pub(super) fn shorten(s: &str) -> String {
    if s.chars().count() > 70 {
        format!("{}…", s.chars().take(69).collect::<String>())
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::c_source::{code_mask, function_body};

    const KSYMBOL: &str = "\
void emit(u16 ksym_type, u64 addr, u32 len, bool unregister)
{
\tu16 size = sizeof(ev) + name_len;
\tu16 flags = 0;

\tif (!atomic_read(&nr))
\t\treturn;
\tif (unregister)
\t\tflags |= PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER;
\tev = (struct e){
\t\t.addr = addr,
\t\t.len = len,
\t};
\tprepare(&ev);
\tperf_iterate_sb(out, &ev, NULL);
\tfor (i = 1; i < prog->aux->func_cnt; i++)
\t\tsub(i);
}
";

    fn all() -> Vec<Edit> {
        let mask = code_mask(KSYMBOL);
        let body = function_body(KSYMBOL, &mask, "emit").unwrap();
        edits(KSYMBOL, &mask, body, &[])
    }

    fn apply(e: &Edit) -> String {
        crate::apply(KSYMBOL, &e.changes)
    }

    #[test]
    fn every_operator_fires_on_a_ksymbol_emitter() {
        let edits = all();
        let ops: std::collections::BTreeSet<Operator> = edits.iter().map(|e| e.operator).collect();
        for op in [
            Operator::DropCall,
            Operator::SwapCalls,
            Operator::NegateCondition,
            Operator::ConditionAlways,
            Operator::ConditionNever,
            Operator::DropReturn,
            Operator::Constant,
            Operator::NarrowType,
            Operator::OffByOne,
            Operator::OffBySome,
            Operator::SkipFirst,
            Operator::SkipLast,
        ] {
            assert!(ops.contains(&op), "{op:?} never fired: {edits:#?}");
        }
    }

    #[test]
    fn edits_change_exactly_what_they_say() {
        let edits = all();
        let find = |op: Operator, needle: &str| {
            edits
                .iter()
                .find(|e| e.operator == op && e.what.contains(needle))
                .map(apply)
                .unwrap_or_else(|| panic!("no {op:?} on {needle}"))
        };
        assert!(find(Operator::DropCall, "perf_iterate_sb")
            .contains("\t/* kloop mutant: call dropped */;\n\tfor"));
        assert!(find(Operator::SwapCalls, "prepare")
            .contains("\tperf_iterate_sb(out, &ev, NULL);\n\tprepare(&ev);"));
        assert!(find(Operator::NegateCondition, "unregister").contains("if (!(unregister))"));
        assert!(find(Operator::DropReturn, "atomic_read")
            .contains("if (!atomic_read(&nr))\n\t\t/* kloop mutant: exit dropped */;"));
        assert!(find(Operator::Constant, "FLAGS_UNREGISTER").contains("flags |= 0;"));
        assert!(find(Operator::NarrowType, "size").contains("\tu8 size ="));
        assert!(find(Operator::OffByOne, "`len`").contains(".len = (len + 1),"));
        assert!(find(Operator::OffBySome, "`addr`").contains(".addr = (addr + 8),"));
        assert!(find(Operator::SkipFirst, "for").contains("for (i = (1) + 1; i <"));
        assert!(find(Operator::SkipLast, "for").contains("i < (prog->aux->func_cnt) - 1;"));
        // The function's last statement is not an early exit, `size`'s
        // declaration is not a value passed on, `sizeof` is not a call.
        assert!(!edits.iter().any(|e| e.what.contains("drop `sub")));
        assert!(!edits.iter().any(|e| e.what.contains("drop `u16")));
    }
}
