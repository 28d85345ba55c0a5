//! Operand mutation operators: the right code with the wrong operand, the
//! shape many real bugs in the emission paths take (a gate that reads the
//! other listener counter, a record sent with the other kind, the wrong
//! program's field copied, `<` where `<=` was meant).
//!
//! They follow the classic C operator sets (Proteum's, Mull's) but draw
//! every replacement from the code in scope, so the count stays small and
//! each mutant is a plausible slip:
//!
//! | operator | replaces | with |
//! |---|---|---|
//! | `replace-variable` | a local or parameter | another local or parameter of the same declared type |
//! | `replace-global` | a file-scope variable (`nr_ksymbol_events`) | one of the same name family (`nr_*_events`) used in the targets of the file |
//! | `replace-constant` | a member of an enum of the configured headers (`PERF_RECORD_KSYMBOL_TYPE_BPF`) | another member of that enum used in the targets |
//! | `replace-field` | `a->x` / `a.x` | `a->y`: another field read on the same base in the targets of the file |
//! | `relational` | `<`, `<=`, `>`, `>=`, `==`, `!=` in a condition | the boundary shifted (`<` ↔ `<=`, `>` ↔ `>=`) or the equality turned (`==` ↔ `!=`) |
//! | `arithmetic` | binary `+` / `-` | the other |
//! | `swap-arguments` | two adjacent arguments of a call | each other |
//!
//! A replacement by a variable passed as an argument is argument
//! replacement (Proteum's `Varr`), so it needs no operator of its own.
//!
//! "Code in scope" is what the other operators mutate too: the target
//! functions, restricted to the statements and conditions that mention a
//! target's `focus` words when it has any.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use super::c_source::{headers, is_ident, statements};
use super::operators::{shorten, squash, Edit, Operator};

/// What the targets of a run have in scope, computed once over every
/// target function of every file.
#[derive(Debug, Default, Clone)]
pub struct Scope {
    /// Enum families read from the configured headers: member → family.
    family_of: BTreeMap<String, usize>,
    families: Vec<Vec<String>>,
    /// Identifiers used anywhere in the code in scope (all files).
    used: BTreeSet<String>,
}

/// What one file's targets have in scope.
#[derive(Debug, Default, Clone)]
pub struct FileScope {
    /// Identifiers declared at file scope (brace depth 0), with where
    /// they first appear: C needs a declaration before a use.
    file_level: BTreeMap<String, usize>,
    /// Identifiers used in the file's code in scope.
    used: BTreeSet<String>,
    /// Fields read in the file's code in scope, by the last name of their
    /// base (`attr` for `event->attr.ksymbol` and `attr->ksymbol`).
    fields: BTreeMap<String, BTreeMap<String, FieldUse>>,
}

/// Where a field is read.
#[derive(Debug, Default, Clone)]
struct FieldUse {
    /// The target functions (by index) that read it.
    functions: BTreeSet<usize>,
    /// Ever read as a truth value (`if (a.x)`, `return a.x;`).
    truth: bool,
}

impl Scope {
    /// Reads the enum families of `headers` (the header texts).
    pub fn with_headers<'a>(headers: impl IntoIterator<Item = &'a str>) -> Scope {
        let mut scope = Scope::default();
        for text in headers {
            for family in enum_families(text) {
                let n = scope.families.len();
                for m in &family {
                    scope.family_of.entry(m.clone()).or_insert(n);
                }
                scope.families.push(family);
            }
        }
        scope
    }

    /// Adds a file's code in scope to what is used.
    pub fn add_used(&mut self, file: &FileScope) {
        self.used.extend(file.used.iter().cloned());
    }

    /// The other members of `name`'s enum that the code in scope uses.
    fn constant_candidates(&self, name: &str) -> Vec<String> {
        let Some(&f) = self.family_of.get(name) else {
            return Vec::new();
        };
        self.families[f]
            .iter()
            .filter(|m| *m != name && self.used.contains(*m))
            .cloned()
            .collect()
    }
}

impl FileScope {
    /// The scope of one file: `functions[i]` is the code in scope of its
    /// i-th target function.
    pub fn new(text: &str, mask: &[bool], functions: &[Vec<Range<usize>>]) -> FileScope {
        let mut out = FileScope {
            file_level: file_level_names(text, mask),
            ..FileScope::default()
        };
        for (n, spans) in functions.iter().enumerate() {
            for span in spans {
                for tok in idents(text, mask, span.clone()) {
                    out.used.insert(tok.name.to_string());
                    if let Some((base, sep)) = &tok.field_of {
                        let truth = truth_context(text, &tok, base, sep);
                        let u = out
                            .fields
                            .entry(last_name(base).to_string())
                            .or_default()
                            .entry(tok.name.to_string())
                            .or_default();
                        u.functions.insert(n);
                        u.truth |= truth;
                    }
                }
            }
        }
        out
    }
}

/// The code in scope of one function: its body, or the statements and
/// conditions that mention a focus word.
pub fn focused_spans(
    text: &str,
    mask: &[bool],
    body: Range<usize>,
    focus: &[String],
) -> Vec<Range<usize>> {
    if focus.is_empty() {
        return vec![body];
    }
    let hit = |r: &Range<usize>| focus.iter().any(|f| text[r.clone()].contains(f.as_str()));
    let mut spans: Vec<Range<usize>> = statements(text, mask, body.clone())
        .into_iter()
        .filter(hit)
        .collect();
    for kw in ["if", "for", "while"] {
        spans.extend(
            headers(text, mask, body.clone(), kw)
                .into_iter()
                .filter(hit),
        );
    }
    spans.sort_by_key(|r| r.start);
    // A statement `if (c) x;` holds its own condition: keep the outer span.
    let mut out: Vec<Range<usize>> = Vec::new();
    for r in spans {
        match out.last() {
            Some(last) if r.start < last.end => {}
            _ => out.push(r),
        }
    }
    out
}

/// One identifier in the code.
#[derive(Debug, Clone)]
struct Ident<'a> {
    name: &'a str,
    at: usize,
    /// When it is a field: the base expression and `->` or `.`.
    field_of: Option<(String, String)>,
    /// Followed by `(`: a function (or macro) called.
    called: bool,
}

const NOT_OPERANDS: &[&str] = &[
    "if", "for", "while", "switch", "return", "sizeof", "goto", "do", "case", "else", "break",
    "continue", "default", "struct", "union", "enum", "const", "static", "unsigned", "signed",
    "void", "char", "int", "long", "short", "bool", "u8", "u16", "u32", "u64", "s8", "s16", "s32",
    "s64", "__u8", "__u16", "__u32", "__u64", "true", "false", "NULL", "typeof", "volatile",
    "inline", "size_t",
];

/// Identifiers in `span` that are code (not numbers, not in comments or
/// strings).
fn idents<'a>(text: &'a str, mask: &[bool], span: Range<usize>) -> Vec<Ident<'a>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = span.start;
    while i < span.end {
        if !mask[i] || !is_ident(b[i]) || (i > 0 && is_ident(b[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < span.end && is_ident(b[i]) {
            i += 1;
        }
        if b[start].is_ascii_digit() {
            continue;
        }
        let name = &text[start..i];
        let before = text[..start].trim_end();
        let field_of = if before.ends_with("->") || before.ends_with('.') {
            let sep = if before.ends_with("->") { "->" } else { "." };
            let base_end = before.len() - sep.len();
            let base = base_expr(&text[..base_end]);
            (!base.is_empty()).then(|| (base.to_string(), sep.to_string()))
        } else {
            None
        };
        // `.x = v` in a designated initialiser has no base: not a field
        // we can replace from a base's uses, and not a variable.
        if field_of.is_none() && (before.ends_with("->") || before.ends_with('.')) {
            continue;
        }
        let called = text[i..].trim_start().starts_with('(');
        out.push(Ident {
            name,
            at: start,
            field_of,
            called,
        });
    }
    out
}

/// Whether the field `tok` (read as `base sep name`) stands as a truth
/// value: between `(`, `!`, `&&`, `||` or `return` and `)`, `&&`, `||`, `;`.
fn truth_context(text: &str, tok: &Ident, base: &str, sep: &str) -> bool {
    let before = text[..tok.at].trim_end();
    let before = before[..before.len() - sep.len()].trim_end();
    let Some(before) = before.strip_suffix(base) else {
        return false;
    };
    let before = before.trim_end();
    let after = text[tok.at + tok.name.len()..].trim_start();
    let opens = ["(", "!", "&&", "||", "return"]
        .iter()
        .any(|p| before.ends_with(p));
    let closes = [")", "&&", "||", ";"].iter().any(|p| after.starts_with(p));
    opens && closes
}

/// `attr` of `event->attr`.
fn last_name(base: &str) -> &str {
    base.rsplit(['>', '.']).next().unwrap_or(base)
}

/// The member-access chain that ends `s`: `prog->aux` of `prog->aux->`.
fn base_expr(s: &str) -> &str {
    let b = s.as_bytes();
    let mut i = b.len();
    loop {
        let end = i;
        while i > 0 && is_ident(b[i - 1]) {
            i -= 1;
        }
        if i == end {
            return &s[end..];
        }
        if i >= 2 && &s[i - 2..i] == "->" {
            i -= 2;
        } else if i >= 1 && b[i - 1] == b'.' {
            i -= 1;
        } else {
            return &s[i..];
        }
    }
}

/// Names declared at brace depth 0, each with the offset where it first
/// appears: file-scope variables (and functions, which never take a
/// variable's place because called names are skipped).
fn file_level_names(text: &str, mask: &[bool]) -> BTreeMap<String, usize> {
    let b = text.as_bytes();
    let mut depth = 0i32;
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < b.len() {
        if !mask[i] {
            i += 1;
            continue;
        }
        match b[i] {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            c if depth == 0 && is_ident(c) && (i == 0 || !is_ident(b[i - 1])) => {
                let start = i;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                out.entry(text[start..i].to_string()).or_insert(start);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// `nr_ksymbol_events` and `nr_bpf_events`, `jited_len` and `name_len`:
/// the same `_`-separated parts but one, which is not the last (the last
/// part says what kind of thing it is: `bpf_lock` and `bpf_tree`, or
/// `perf_event_ksymbol_output` and `perf_event_ksymbol_match`, are not
/// interchangeable).
fn same_name_family(a: &str, b: &str) -> bool {
    let pa: Vec<&str> = a.split('_').collect();
    let pb: Vec<&str> = b.split('_').collect();
    if a == b || pa.len() != pb.len() || pa.len() < 2 {
        return false;
    }
    let differing: Vec<usize> = (0..pa.len()).filter(|&i| pa[i] != pb[i]).collect();
    let shared_nonempty = pa.iter().zip(&pb).all(|(x, y)| x != y || !x.is_empty());
    differing.len() == 1 && differing[0] != pa.len() - 1 && shared_nonempty
}

/// The members of every `enum [name] { … }` in a header.
pub fn enum_families(text: &str) -> Vec<Vec<String>> {
    let mask = super::c_source::code_mask(text);
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("enum").map(|a| a + from) {
        from = at + 4;
        if !mask[at]
            || (at > 0 && is_ident(b[at - 1]))
            || b.get(at + 4).is_some_and(|&c| is_ident(c))
        {
            continue;
        }
        // `enum name {` or `enum {`, nothing else in between.
        let rest = &text[at + 4..];
        let Some(open_rel) = rest.find(['{', ';', '(', ')', ',', '=']) else {
            break;
        };
        if rest.as_bytes()[open_rel] != b'{' || !rest[..open_rel].trim().bytes().all(is_ident) {
            continue;
        }
        let open = at + 4 + open_rel;
        let Some(close_rel) = text[open..].find('}') else {
            break;
        };
        let inner = open + 1..open + close_rel;
        let mut members = Vec::new();
        let mut depth = 0i32;
        let mut item_start = inner.start;
        for i in inner.clone().chain(std::iter::once(inner.end)) {
            let c = if i < inner.end && mask[i] { b[i] } else { b' ' };
            match c {
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ => {}
            }
            if (c == b',' && depth == 0) || i == inner.end {
                let item: String = text[item_start..i]
                    .char_indices()
                    .filter(|(j, _)| mask[item_start + j])
                    .map(|(_, c)| c)
                    .collect();
                let name = item
                    .trim()
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
                if let Some(n) = name.into_iter().next().filter(|n| !n.is_empty()) {
                    members.push(n.to_string());
                }
                item_start = i + 1;
            }
        }
        if members.len() > 1 {
            out.push(members);
        }
        from = inner.end;
    }
    out
}

/// Locals and parameters of the function whose body is `body`, with their
/// declared types (`struct bpf_prog *`, `u16`, `char[]`).
fn declarations(text: &str, mask: &[bool], body: Range<usize>) -> BTreeMap<String, String> {
    let b = text.as_bytes();
    let mut out = BTreeMap::new();
    // Parameters: the parenthesis right before the body.
    if let Some(close) = text[..body.start].rfind(')') {
        let mut depth = 0i32;
        let mut open = None;
        for i in (0..=close).rev() {
            if !mask[i] {
                continue;
            }
            match b[i] {
                b')' => depth += 1,
                b'(' => {
                    depth -= 1;
                    if depth == 0 {
                        open = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        if let Some(open) = open {
            for p in text[open + 1..close].split(',') {
                if let Some((name, ty)) = declared(p) {
                    out.insert(name, ty);
                }
            }
        }
    }
    for r in statements(text, mask, body) {
        let s = &text[r];
        let head = s.split(['=', ';']).next().unwrap_or("");
        if head.contains('(') || head.contains("->") || head.contains('.') {
            continue;
        }
        if let Some((name, ty)) = declared(head) {
            out.insert(name, ty);
        }
    }
    out
}

/// Where each local of the function whose body is `body` can be named: from
/// its declaration to the end of the block that declares it (a local of a
/// loop's body is not there before the loop). Parameters: the whole body.
fn visibility(text: &str, mask: &[bool], body: Range<usize>) -> BTreeMap<String, Range<usize>> {
    let b = text.as_bytes();
    let mut out = BTreeMap::new();
    for r in statements(text, mask, body.clone()) {
        let s = &text[r.clone()];
        let head = s.split(['=', ';']).next().unwrap_or("");
        if head.contains('(') || head.contains("->") || head.contains('.') {
            continue;
        }
        let Some((name, _)) = declared(head) else {
            continue;
        };
        // The innermost `{` still open at the declaration, and its `}`.
        let mut depth = 0i32;
        let mut open = body.start;
        for i in (body.start..r.start).rev() {
            if !mask[i] {
                continue;
            }
            match b[i] {
                b'}' => depth += 1,
                b'{' if depth == 0 => {
                    open = i;
                    break;
                }
                b'{' => depth -= 1,
                _ => {}
            }
        }
        let mut depth = 0i32;
        let mut close = body.end;
        for i in open..body.end {
            if !mask[i] {
                continue;
            }
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.insert(name, r.end..close);
    }
    out
}

/// `const char *sym` → (`sym`, `const char *`); `char name[LEN]` →
/// (`name`, `char[]`); `None` unless it looks like a declaration (a type of
/// one or more words, then a name).
fn declared(decl: &str) -> Option<(String, String)> {
    let decl = decl.trim();
    let (decl, array) = match decl.find('[') {
        Some(i) => (decl[..i].trim_end(), true),
        None => (decl, false),
    };
    let name_start = decl
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let name = &decl[name_start..];
    let ty = decl[..name_start].trim();
    let words: Vec<&str> = ty
        .split(|c: char| c.is_whitespace() || c == '*')
        .filter(|w| !w.is_empty())
        .collect();
    let first = *words.first()?;
    if name.is_empty()
        || name.as_bytes()[0].is_ascii_digit()
        || !ty
            .bytes()
            .all(|c| is_ident(c) || c == b'*' || c.is_ascii_whitespace())
        || ["return", "goto", "case", "else", "do"].contains(&first)
        || (words.len() == 1 && !ty.contains('*') && first == "struct")
    {
        return None;
    }
    let stars = ty.matches('*').count();
    let mut t = words.join(" ");
    if stars > 0 {
        t.push(' ');
        t.push_str(&"*".repeat(stars));
    }
    if array {
        t.push_str("[]");
    }
    Some((name.to_string(), t))
}

/// Every operand edit in one function, the `function`-th of its file's
/// targets: `spans` are its code in scope.
pub fn edits(
    text: &str,
    mask: &[bool],
    (function, body): (usize, Range<usize>),
    spans: &[Range<usize>],
    scope: &Scope,
    file: &FileScope,
) -> Vec<Edit> {
    let decls = declarations(text, mask, body.clone());
    let visible = visibility(text, mask, body);
    let mut out = Vec::new();
    let swappable = |s: &str| operand_kind(s, &decls);
    let mut seen_at = BTreeSet::new();
    for span in spans {
        for tok in idents(text, mask, span.clone()) {
            if !seen_at.insert(tok.at) || tok.called || NOT_OPERANDS.contains(&tok.name) {
                continue;
            }
            let range = tok.at..tok.at + tok.name.len();
            let site = line_of(text, tok.at);
            let mut push = |op: Operator, new: &str| {
                out.push(Edit {
                    operator: op,
                    changes: vec![(range.clone(), new.to_string())],
                    what: format!("{} → {new} in `{}`", tok.name, shorten(&site)),
                });
            };
            if let Some((base, _)) = &tok.field_of {
                // Without the struct's types, a field may stand for another
                // when their names are of one family (`*_len`), or when both
                // are read as truth values (the attr bits) and both matter
                // beyond this function (another target reads them too:
                // `attr.ksymbol` and `attr.bpf_event`, not the mmap or comm
                // bits that is_sb_event also tests, which no kloop listener
                // sets). A replacement of another type would only fail to
                // build or be a cast.
                let Some(fields) = file.fields.get(last_name(base)) else {
                    continue;
                };
                let elsewhere =
                    |u: &FieldUse| u.functions.iter().filter(|f| **f != function).count() >= 2;
                let Some(mine) = fields.get(tok.name) else {
                    continue;
                };
                for (other, theirs) in fields.iter().filter(|(f, _)| *f != tok.name) {
                    let truths = mine.truth && theirs.truth && elsewhere(mine) && elsewhere(theirs);
                    if same_name_family(tok.name, other) || truths {
                        push(Operator::ReplaceField, other);
                    }
                }
                continue;
            }
            if let Some(ty) = decls.get(tok.name) {
                // Not the declaration itself (`u16 flags = 0;`).
                let decl_here = text[..tok.at]
                    .trim_end()
                    .ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '*');
                if decl_here {
                    continue;
                }
                for (other, other_ty) in &decls {
                    // A parameter is visible everywhere; a local from its
                    // declaration to the end of its block.
                    let in_scope = visible.get(other).is_none_or(|v| v.contains(&tok.at));
                    if other != tok.name && other_ty == ty && !ty.ends_with("[]") && in_scope {
                        push(Operator::ReplaceVariable, other);
                    }
                }
                continue;
            }
            // A case label replaced by another of its switch only fails
            // to build (duplicate case value).
            let case_label = text[..tok.at].trim_end().ends_with("case");
            let constants = scope.constant_candidates(tok.name);
            if !constants.is_empty() && !case_label {
                for other in &constants {
                    push(Operator::ReplaceConstant, other);
                }
                continue;
            }
            // A struct, union or enum tag is a type, not a variable.
            let tag = ["struct", "union", "enum"]
                .iter()
                .any(|k| text[..tok.at].trim_end().ends_with(k));
            if file.file_level.contains_key(tok.name) && !tag {
                // Only a name declared above this use: one declared further
                // down (`perf_event_bpf_output` in `perf_event_ksymbol`)
                // only fails to build.
                let declared_above =
                    |o: &String| file.file_level.get(o).is_some_and(|&at| at < tok.at);
                for other in file
                    .used
                    .iter()
                    .filter(|o| declared_above(o) && same_name_family(tok.name, o))
                {
                    push(Operator::ReplaceGlobal, other);
                }
            }
        }
        relational(text, mask, span.clone(), &mut out);
        arithmetic(text, mask, span.clone(), &mut out);
        swap_arguments(text, mask, span.clone(), &swappable, &mut out);
    }
    out
}

/// Relational operators inside conditions (`if`/`for`/`while` headers and
/// `return` expressions) of `span`.
fn relational(text: &str, mask: &[bool], span: Range<usize>, out: &mut Vec<Edit>) {
    let b = text.as_bytes();
    let mut conds: Vec<Range<usize>> = Vec::new();
    for kw in ["if", "for", "while"] {
        conds.extend(headers(text, mask, span.clone(), kw));
    }
    let s = &text[span.clone()];
    if s.trim_start().starts_with("return") {
        conds.push(span.clone());
    }
    let mut done = BTreeSet::new();
    for c in conds {
        let mut i = c.start;
        while i < c.end {
            if !mask[i] || done.contains(&i) {
                i += 1;
                continue;
            }
            let two = b.get(i..i + 2).unwrap_or(&[]);
            let prev = if i > 0 { b[i - 1] } else { b' ' };
            let (len, new): (usize, &str) = match (b[i], two) {
                (_, b"<=") => (2, "<"),
                (_, b">=") => (2, ">"),
                (_, b"==") => (2, "!="),
                (_, b"!=") => (2, "=="),
                (_, b"<<") | (_, b">>") | (_, b"->") => {
                    i += 2;
                    continue;
                }
                (b'<', _) if prev != b'<' => (1, "<="),
                (b'>', _) if prev != b'>' && prev != b'-' => (1, ">="),
                _ => {
                    i += 1;
                    continue;
                }
            };
            done.insert(i);
            let old = &text[i..i + len];
            out.push(Edit {
                operator: Operator::Relational,
                changes: vec![(i..i + len, new.to_string())],
                what: format!("`{old}` → `{new}` in `{}`", shorten(&line_of(text, i))),
            });
            i += len;
        }
    }
}

/// Binary `+` and `-` in `span` (not `++`, `--`, `+=`, `->`, nor a sign).
fn arithmetic(text: &str, mask: &[bool], span: Range<usize>, out: &mut Vec<Edit>) {
    let b = text.as_bytes();
    for i in span.clone() {
        if !mask[i] || !matches!(b[i], b'+' | b'-') {
            continue;
        }
        let next = b.get(i + 1).copied().unwrap_or(b' ');
        let prev = b[i - 1];
        if matches!(next, b'+' | b'-' | b'=' | b'>') || matches!(prev, b'+' | b'-') {
            continue;
        }
        // Binary only: what comes before must end an operand.
        let before = text[span.start..i].trim_end();
        let Some(last) = before.bytes().last() else {
            continue;
        };
        if !(is_ident(last) || last == b')' || last == b']') {
            continue;
        }
        // `return -1` and `case -1` are signs.
        let word_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        if NOT_OPERANDS.contains(&&before[word_start..]) {
            continue;
        }
        let new = if b[i] == b'+' { "-" } else { "+" };
        out.push(Edit {
            operator: Operator::Arithmetic,
            changes: vec![(i..i + 1, new.to_string())],
            what: format!(
                "`{}` → `{new}` in `{}`",
                b[i] as char,
                shorten(&line_of(text, i))
            ),
        });
    }
}

/// What kind of operand an argument is, for `swap-arguments`: a local of
/// a declared type, a field of a base, or an address; `None` for anything
/// else (constants, literals, casts, calls), which is never swapped.
fn operand_kind(arg: &str, decls: &BTreeMap<String, String>) -> Option<String> {
    let (amp, rest) = match arg.strip_prefix('&') {
        Some(r) => ("&", r.trim_start()),
        None => ("", arg),
    };
    let chain_ok = !rest.is_empty()
        && rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && rest
            .bytes()
            .all(|c| is_ident(c) || c == b'.' || c == b'-' || c == b'>')
        && !rest.contains("..");
    if !chain_ok || ["true", "false"].contains(&rest) {
        return None;
    }
    if amp == "&" {
        return Some("address".into());
    }
    if let Some(ty) = decls.get(rest) {
        return Some(format!("local {ty}"));
    }
    match rest.rfind(['.', '>']) {
        Some(i) => Some(format!("field of {}", &rest[..i])),
        None => Some("global".into()),
    }
}

/// Two adjacent arguments of a call in `span` exchanged, when both are
/// operands of one kind (`kind`: two locals of one type, two fields of one
/// base, two addresses), as Mull's swap of same-typed arguments.
fn swap_arguments(
    text: &str,
    mask: &[bool],
    span: Range<usize>,
    kind: &dyn Fn(&str) -> Option<String>,
    out: &mut Vec<Edit>,
) {
    let b = text.as_bytes();
    for tok in idents(text, mask, span.clone()) {
        if !tok.called || NOT_OPERANDS.contains(&tok.name) || tok.field_of.is_some() {
            continue;
        }
        let name_end = tok.at + tok.name.len();
        let Some(open) = (name_end..span.end).find(|&i| mask[i] && b[i] == b'(') else {
            continue;
        };
        let Some(close) = super::c_source::matching_paren(b, mask, open) else {
            continue;
        };
        if close > span.end {
            continue;
        }
        // The arguments, split at depth-0 commas.
        let mut args: Vec<Range<usize>> = Vec::new();
        let mut depth = 0i32;
        let mut start = open + 1;
        for i in open + 1..close {
            if !mask[i] {
                continue;
            }
            match b[i] {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b',' if depth == 0 => {
                    args.push(start..i);
                    start = i + 1;
                }
                _ => {}
            }
        }
        args.push(start..close);
        let trimmed: Vec<Range<usize>> = args
            .iter()
            .map(|r| {
                let s = &text[r.clone()];
                let lead = s.len() - s.trim_start().len();
                let len = s.trim().len();
                r.start + lead..r.start + lead + len
            })
            .collect();
        for pair in trimmed.windows(2) {
            let (x, y) = (&text[pair[0].clone()], &text[pair[1].clone()]);
            let literal = |s: &str| {
                s.is_empty()
                    || s.starts_with(|c: char| c.is_ascii_digit() || c == '"' || c == '\'')
                    || (pair[0].clone().any(|i| !mask[i]) || pair[1].clone().any(|i| !mask[i]))
            };
            if x == y || literal(x) || literal(y) {
                continue;
            }
            match (kind(x), kind(y)) {
                (Some(a), Some(b)) if a == b => {}
                _ => continue,
            }
            out.push(Edit {
                operator: Operator::SwapArguments,
                changes: vec![
                    (pair[0].clone(), y.to_string()),
                    (pair[1].clone(), x.to_string()),
                ],
                what: format!(
                    "`{}` and `{}` of `{}(…)` swapped in `{}`",
                    squash(x),
                    squash(y),
                    tok.name,
                    shorten(&line_of(text, tok.at))
                ),
            });
        }
    }
}

/// The line holding byte `at`, whitespace squashed: where a mutant is.
fn line_of(text: &str, at: usize) -> String {
    let start = text[..at].rfind('\n').map_or(0, |p| p + 1);
    let end = text[at..].find('\n').map_or(text.len(), |p| at + p);
    squash(&text[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::c_source::{code_mask, function_body};

    /// Shaped like 6.12's `kernel/events/core.c` around the emitters (a
    /// summary written for the test, not the kernel's text).
    const CORE: &str = "\
static atomic_t nr_ksymbol_events __read_mostly;
static atomic_t nr_bpf_events __read_mostly;
static atomic_t nr_text_poke_events __read_mostly;

static void account_event(struct perf_event *event)
{
\tif (event->attr.ksymbol)
\t\tatomic_inc(&nr_ksymbol_events);
\tif (event->attr.bpf_event)
\t\tatomic_inc(&nr_bpf_events);
}

void perf_event_ksymbol(u16 ksym_type, u64 addr, u32 len, bool unregister,
\t\t\tconst char *sym)
{
\tchar name[KSYM_NAME_LEN];
\tu16 flags = 0;
\tint name_len;

\tif (!atomic_read(&nr_ksymbol_events))
\t\treturn;
\tif (ksym_type >= PERF_RECORD_KSYMBOL_TYPE_MAX ||
\t    ksym_type == PERF_RECORD_KSYMBOL_TYPE_UNKNOWN)
\t\tgoto err;
\tname_len = strlen(name) + 1;
\tev = (struct e){
\t\t.addr = addr,
\t\t.len = len,
\t\t.ksym_type = ksym_type,
\t\t.flags = flags,
\t};
\temit(PERF_RECORD_KSYMBOL_TYPE_BPF, ksym_type, flags);
}

static int perf_event_ksymbol_match(struct perf_event *event)
{
\treturn event->attr.ksymbol;
}

static int perf_event_bpf_match(struct perf_event *event)
{
\treturn event->attr.bpf_event;
}

static bool is_sb_event(struct perf_event *event)
{
\tstruct perf_event_attr *attr = &event->attr;

\tif (attr->mmap || attr->ksymbol || attr->bpf_event)
\t\treturn true;
\treturn false;
}

static void perf_event_bpf_emit_ksymbols(struct bpf_prog *prog, int type)
{
\tint i;

\tperf_event_ksymbol(PERF_RECORD_KSYMBOL_TYPE_BPF,
\t\t\t   (u64)(unsigned long)prog->bpf_func,
\t\t\t   prog->jited_len, type, prog->aux->ksym.name);
\tfor (i = 1; i < prog->aux->func_cnt; i++) {
\t\tstruct bpf_prog *subprog = prog->aux->func[i];

\t\tperf_event_ksymbol(PERF_RECORD_KSYMBOL_TYPE_OOL,
\t\t\t\t   (u64)(unsigned long)subprog->bpf_func,
\t\t\t\t   subprog->jited_len, type, subprog->aux->ksym.name);
\t}
}
";

    const HEADER: &str = "\
enum perf_record_ksymbol_type {
\tPERF_RECORD_KSYMBOL_TYPE_UNKNOWN\t= 0,
\tPERF_RECORD_KSYMBOL_TYPE_BPF\t\t= 1,
\t/* out of line code */
\tPERF_RECORD_KSYMBOL_TYPE_OOL\t\t= 2,
\tPERF_RECORD_KSYMBOL_TYPE_MAX\t\t/* non-ABI */
};
enum { A_ONE, A_TWO = (1 << 2), };
";

    fn all(functions: &[(&str, &[&str])]) -> Vec<Edit> {
        let mask = code_mask(CORE);
        let mut scope = Scope::with_headers([HEADER]);
        let bodies: Vec<(Range<usize>, Vec<Range<usize>>)> = functions
            .iter()
            .map(|(f, focus)| {
                let body = function_body(CORE, &mask, f).unwrap();
                let focus: Vec<String> = focus.iter().map(|s| s.to_string()).collect();
                let spans = focused_spans(CORE, &mask, body.clone(), &focus);
                (body, spans)
            })
            .collect();
        let per_function: Vec<Vec<Range<usize>>> = bodies.iter().map(|(_, s)| s.clone()).collect();
        let file = FileScope::new(CORE, &mask, &per_function);
        scope.add_used(&file);
        bodies
            .into_iter()
            .enumerate()
            .flat_map(|(n, (body, spans))| edits(CORE, &mask, (n, body), &spans, &scope, &file))
            .collect()
    }

    fn applied(e: &Edit) -> String {
        crate::apply(CORE, &e.changes)
    }

    #[test]
    fn enum_families_come_from_the_header() {
        let f = enum_families(HEADER);
        assert_eq!(
            f,
            [
                vec![
                    "PERF_RECORD_KSYMBOL_TYPE_UNKNOWN",
                    "PERF_RECORD_KSYMBOL_TYPE_BPF",
                    "PERF_RECORD_KSYMBOL_TYPE_OOL",
                    "PERF_RECORD_KSYMBOL_TYPE_MAX"
                ],
                vec!["A_ONE", "A_TWO"]
            ]
        );
    }

    #[test]
    fn declarations_give_types() {
        let mask = code_mask(CORE);
        let body = function_body(CORE, &mask, "perf_event_ksymbol").unwrap();
        let d = declarations(CORE, &mask, body);
        assert_eq!(d["ksym_type"], "u16");
        assert_eq!(d["flags"], "u16");
        assert_eq!(d["sym"], "const char *");
        assert_eq!(d["name"], "char[]");
        assert_eq!(d["name_len"], "int");
        let body = function_body(CORE, &mask, "perf_event_bpf_emit_ksymbols").unwrap();
        let d = declarations(CORE, &mask, body);
        assert_eq!(d["prog"], "struct bpf_prog *");
        assert_eq!(d["subprog"], "struct bpf_prog *");
    }

    /// A file-scope name is known from where it is first declared, so a
    /// use above it is never replaced by it.
    #[test]
    fn file_level_names_know_where_they_are_declared() {
        let text = "static int nr_a_events;\nvoid f(void)\n{\n\tnr_a_events++;\n}\nstatic int nr_b_events;\n";
        let mask = code_mask(text);
        let names = file_level_names(text, &mask);
        assert_eq!(names["nr_a_events"], text.find("nr_a_events").unwrap());
        assert_eq!(names["nr_b_events"], text.rfind("nr_b_events").unwrap());
        let use_at = text.find("\tnr_a_events++").unwrap();
        assert!(names["nr_b_events"] > use_at, "declared below the use");
        assert!(!names.contains_key("f") || names["f"] < use_at);
    }

    #[test]
    fn the_gate_reads_the_other_counter_and_the_attribute_is_the_other() {
        let edits = all(&[
            ("account_event", &["ksymbol", "bpf_event"]),
            ("perf_event_ksymbol", &[]),
            ("perf_event_ksymbol_match", &[]),
            ("perf_event_bpf_match", &[]),
            ("is_sb_event", &[]),
        ]);
        let globals: Vec<String> = edits
            .iter()
            .filter(|e| e.operator == Operator::ReplaceGlobal)
            .map(applied)
            .collect();
        // Only the counter used in scope: nr_text_poke_events is declared
        // but no target uses it (and its name has another shape).
        assert!(globals
            .iter()
            .any(|t| t.contains("\tif (!atomic_read(&nr_bpf_events))\n")));
        assert!(globals
            .iter()
            .any(|t| t.contains("if (event->attr.ksymbol)\n\t\tatomic_inc(&nr_bpf_events);")));
        assert!(!globals
            .iter()
            .any(|t| t.contains("atomic_inc(&nr_text_poke")));
        let fields: Vec<String> = edits
            .iter()
            .filter(|e| e.operator == Operator::ReplaceField)
            .map(applied)
            .collect();
        assert!(
            fields
                .iter()
                .any(|t| t
                    .contains("if (event->attr.bpf_event)\n\t\tatomic_inc(&nr_ksymbol_events);"))
        );
        assert!(fields.iter().any(
            |t| t.contains("\treturn event->attr.bpf_event;\n}\n\nstatic int perf_event_bpf_match")
        ));
        assert!(fields
            .iter()
            .any(|t| t.contains("if (attr->mmap || attr->bpf_event || attr->bpf_event)")));
        // The mmap bit matters to no other target: it is neither replaced
        // nor a replacement.
        assert!(!fields
            .iter()
            .any(|t| t.contains("attr.mmap") || t.contains("(attr->ksymbol")));
        assert_eq!(fields.len(), 6, "{fields:#?}");
    }

    #[test]
    fn same_type_locals_and_enum_members_replace_each_other() {
        let edits = all(&[
            ("perf_event_ksymbol", &[]),
            ("perf_event_bpf_emit_ksymbols", &[]),
        ]);
        let find = |op: Operator, needle: &str| {
            edits
                .iter()
                .filter(|e| e.operator == op)
                .map(applied)
                .find(|t| t.contains(needle))
                .unwrap_or_else(|| panic!("no {op:?} giving {needle}: {edits:#?}"))
        };
        find(Operator::ReplaceVariable, ".ksym_type = flags,");
        find(Operator::ReplaceVariable, ".flags = ksym_type,");
        // The wrong program's field: subprog's symbol from prog.
        find(
            Operator::ReplaceVariable,
            "(unsigned long)prog->bpf_func,\n\t\t\t\t   subprog->jited_len",
        );
        find(
            Operator::ReplaceConstant,
            "emit(PERF_RECORD_KSYMBOL_TYPE_OOL, ksym_type, flags);",
        );
        find(
            Operator::ReplaceConstant,
            "ksym_type >= PERF_RECORD_KSYMBOL_TYPE_BPF ||",
        );
        find(
            Operator::Relational,
            "ksym_type > PERF_RECORD_KSYMBOL_TYPE_MAX",
        );
        find(
            Operator::Relational,
            "ksym_type != PERF_RECORD_KSYMBOL_TYPE_UNKNOWN",
        );
        find(Operator::Relational, "i <= prog->aux->func_cnt");
        find(Operator::Arithmetic, "name_len = strlen(name) - 1;");
        find(
            Operator::SwapArguments,
            "emit(PERF_RECORD_KSYMBOL_TYPE_BPF, flags, ksym_type);",
        );
        // Arguments of different types or kinds are not swapped.
        assert!(!edits.iter().any(|e| e.operator == Operator::SwapArguments
            && (e.what.starts_with("`addr`") || e.what.starts_with("`PERF_RECORD"))));
        // Fields of other types are not replaced: `jited_len` stays.
        assert!(!edits.iter().any(|e| e.operator == Operator::ReplaceField));
        // Not the declaration, not a called name, not a designated field.
        let all_text: Vec<String> = edits.iter().map(applied).collect();
        assert!(!all_text.iter().any(|t| t.contains("u16 ksym_type = 0;")));
        assert!(!edits.iter().any(|e| e.what.starts_with("strlen →")));
        assert!(!edits
            .iter()
            .any(|e| e.changes.iter().any(
                |(r, _)| CORE[..r.start].ends_with('.') && e.operator != Operator::ReplaceField
            )));
        // `->` and a sign are not operators.
        assert!(!edits
            .iter()
            .any(|e| e.operator == Operator::Relational && e.what.contains("`-`")));
        assert!(!all_text.iter().any(|t| t.contains("prog-+")));
    }

    #[test]
    fn name_families() {
        assert!(same_name_family("nr_ksymbol_events", "nr_bpf_events"));
        assert!(same_name_family("jited_len", "name_len"));
        assert!(same_name_family(
            "perf_event_ksymbol_output",
            "perf_event_bpf_output"
        ));
        assert!(!same_name_family(
            "perf_event_ksymbol_output",
            "perf_event_ksymbol_match"
        ));
        assert!(!same_name_family("bpf_lock", "bpf_tree"));
        assert!(!same_name_family(
            "nr_ksymbol_events",
            "nr_text_poke_events"
        ));
        assert!(!same_name_family("prog", "subprog"));
        assert!(!same_name_family("_a", "_b"));
    }
}
