//! Just enough of C's shape to mutate kernel functions safely: which bytes
//! are code (not comments, strings or character literals), where a
//! function's body is, its statements and its `if` and `for` headers.
//!
//! This is no parser: it relies on the kernel's coding style (a function's
//! name at the start of a line, its body's braces balanced), and every
//! mutant it makes is compiled before it is judged, so a mistake here
//! costs a "failed to build" line, never a wrong verdict.

use std::ops::Range;

/// `true` for each byte of `text` that is code.
pub fn code_mask(text: &str) -> Vec<bool> {
    let b = text.as_bytes();
    let mut mask = vec![true; b.len()];
    let mut i = 0;
    while i < b.len() {
        let (end, code) = match b[i] {
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                (end, false)
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                (text[i..].find('\n').map_or(b.len(), |e| i + e), false)
            }
            q @ (b'"' | b'\'') => {
                let mut j = i + 1;
                while j < b.len() && b[j] != q {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                ((j + 1).min(b.len()), false)
            }
            b'#' if i == 0 || b[i - 1] == b'\n' => {
                // A preprocessor line (with its continuations) is not a
                // statement of the function.
                let mut j = i;
                while let Some(e) = text[j..].find('\n') {
                    j += e;
                    if b[j - 1] != b'\\' {
                        break;
                    }
                    j += 1;
                }
                (j.max(i + 1), false)
            }
            _ => (i + 1, true),
        };
        if !code {
            mask[i..end].iter_mut().for_each(|m| *m = false);
        }
        i = end;
    }
    mask
}

/// A byte of a C identifier.
pub(crate) fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The body of function `name` (from its `{` to its `}` inclusive): the
/// definition whose name starts a line (or follows the return type on it),
/// is followed by `(`, and whose line does not end the declaration with `;`.
pub fn function_body(text: &str, mask: &[bool], name: &str) -> Option<Range<usize>> {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(pos) = text[from..].find(name).map(|p| p + from) {
        from = pos + name.len();
        let line_start = text[..pos].rfind('\n').map_or(0, |p| p + 1);
        let before_ok = pos == 0 || !is_ident(b[pos - 1]);
        let after = text[pos + name.len()..].trim_start();
        if !mask[pos]
            || !before_ok
            || !after.starts_with('(')
            || text[line_start..pos].starts_with(char::is_whitespace)
            || text[line_start..pos].contains('=')
        {
            continue;
        }
        // The first `{` or `;` at paren depth 0 after the name decides.
        let mut depth = 0i32;
        let mut i = pos + name.len();
        while i < b.len() {
            if mask[i] {
                match b[i] {
                    b'(' => depth += 1,
                    b')' => depth -= 1,
                    b';' if depth == 0 => break,
                    b'{' if depth == 0 => return matching_brace(b, mask, i).map(|end| i..end + 1),
                    _ => {}
                }
            }
            i += 1;
        }
    }
    None
}

fn matching_brace(b: &[u8], mask: &[bool], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, &c) in b.iter().enumerate().skip(open) {
        if !mask[i] {
            continue;
        }
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The index of the `)` that closes the `(` at `open`.
pub fn matching_paren(b: &[u8], mask: &[bool], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, &c) in b.iter().enumerate().skip(open) {
        if !mask[i] {
            continue;
        }
        match c {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The statements of `body`: each span from the first code byte after a
/// `;`, `{` or `}` (or a label's `:`) to the `;` that ends it, at paren
/// depth 0 (so `if (c) return;` is one span and a multi-line call is one).
pub fn statements(text: &str, mask: &[bool], body: Range<usize>) -> Vec<Range<usize>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut depth = 0i32;
    // Braces of an initialiser (`x = (struct e){ .a = 1, }`) belong to
    // the statement; those of a block end it.
    let mut init_depth = 0i32;
    for i in body.start + 1..body.end.saturating_sub(1) {
        if !mask[i] {
            continue;
        }
        let c = b[i];
        if start.is_none() && !c.is_ascii_whitespace() && !matches!(c, b'{' | b'}' | b';') {
            start = Some(i);
        }
        match c {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b';' if depth == 0 && init_depth == 0 => {
                if let Some(s) = start.take() {
                    out.push(s..i + 1);
                }
            }
            b'{' if depth == 0 => {
                let head = start.map(|s| text[s..i].trim_start()).unwrap_or("");
                let block = ["if", "for", "while", "switch", "else", "do"]
                    .iter()
                    .any(|k| {
                        head.starts_with(k)
                            && !head[k.len()..]
                                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                    });
                if start.is_some() && !block || init_depth > 0 {
                    init_depth += 1;
                } else {
                    start = None;
                }
            }
            b'}' if depth == 0 && init_depth > 0 => init_depth -= 1,
            b'}' if depth == 0 => start = None,
            b':' if depth == 0 => {
                // A label (`err:`) or a case ends nothing but starts anew;
                // `? :` never appears at statement start.
                if let Some(s) = start {
                    let head = text[s..i].trim();
                    if head.bytes().all(is_ident) || head.starts_with("case ") || head == "default"
                    {
                        start = None;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Every `keyword (` … `)` header in `body` (`if`, `for`, `while`): the
/// range of what is between the parentheses.
pub fn headers(text: &str, mask: &[bool], body: Range<usize>, keyword: &str) -> Vec<Range<usize>> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut from = body.start;
    while let Some(pos) = text[from..body.end].find(keyword).map(|p| p + from) {
        from = pos + keyword.len();
        if !mask[pos] || (pos > 0 && is_ident(b[pos - 1])) {
            continue;
        }
        let rest = &text[pos + keyword.len()..body.end];
        let Some(gap) = rest.find(|c: char| !c.is_whitespace()) else {
            continue;
        };
        let open = pos + keyword.len() + gap;
        if b[open] != b'(' {
            continue;
        }
        if let Some(close) = matching_paren(b, mask, open) {
            out.push(open + 1..close);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
static int f_match(struct x *e);

/* f_output(a) in a comment */
static void f_output(struct x *e, void *data)
{
\tu16 size = sizeof(e->id) + e->len; /* ; { */
\tchar *s = \"a;b{\";

\tif (!f_match(e))
\t\treturn;

\tf_begin(&h,
\t\tsize);
err:
\tf_end(&h);
}
";

    #[test]
    fn finds_the_definition_not_the_comment_or_prototype() {
        let mask = code_mask(SAMPLE);
        let body = function_body(SAMPLE, &mask, "f_output").unwrap();
        assert!(SAMPLE[body.clone()].starts_with('{') && SAMPLE[body.clone()].ends_with('}'));
        assert!(SAMPLE[body].contains("f_end"));
        assert!(
            function_body(SAMPLE, &mask, "f_match").is_none(),
            "a prototype has no body"
        );
    }

    #[test]
    fn splits_statements_across_lines_and_skips_comments_and_strings() {
        let mask = code_mask(SAMPLE);
        let body = function_body(SAMPLE, &mask, "f_output").unwrap();
        let st: Vec<String> = statements(SAMPLE, &mask, body.clone())
            .into_iter()
            .map(|r| SAMPLE[r].split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(
            st,
            [
                "u16 size = sizeof(e->id) + e->len;",
                "char *s = \"a;b{\";",
                "if (!f_match(e)) return;",
                "f_begin(&h, size);",
                "f_end(&h);",
            ]
        );
        let ifs = headers(SAMPLE, &mask, body, "if");
        assert_eq!(ifs.len(), 1);
        assert_eq!(&SAMPLE[ifs[0].clone()], "!f_match(e)");
    }
}
