//! Debian version ordering (deb-version(7)), used to pick the newest package.

use std::cmp::Ordering;

/// Compares two Debian package versions the way dpkg does:
/// `[epoch:]upstream[-revision]`, `~` sorting before everything, even the end.
pub fn compare_debian_versions(a: &str, b: &str) -> Ordering {
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| compare_part(ua, ub))
        .then_with(|| compare_part(ra, rb))
}

fn split(v: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, rest)) if !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit()) => {
            (e.parse().unwrap_or(u64::MAX), rest)
        }
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((upstream, revision)) => (epoch, upstream, revision),
        None => (epoch, rest, ""),
    }
}

/// Weight of one non-digit character: `~` lowest, then end-of-string, then
/// letters, then everything else.
fn order(c: Option<u8>) -> i32 {
    match c {
        Some(b'~') => -1,
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(c) => i32::from(c) + 256,
    }
}

fn compare_part(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        // Non-digit prefix, character by character.
        while (i < a.len() && !a[i].is_ascii_digit()) || (j < b.len() && !b[j].is_ascii_digit()) {
            let ca = a.get(i).copied().filter(|c| !c.is_ascii_digit());
            let cb = b.get(j).copied().filter(|c| !c.is_ascii_digit());
            let (oa, ob) = (order(ca), order(cb));
            if oa != ob {
                return oa.cmp(&ob);
            }
            if ca.is_some() {
                i += 1;
            }
            if cb.is_some() {
                j += 1;
            }
        }
        // Digit run, numerically (leading zeros ignored, no overflow).
        let start_a = i;
        while i < a.len() && a[i].is_ascii_digit() {
            i += 1;
        }
        let start_b = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        let da = trim_zeros(&a[start_a..i]);
        let db = trim_zeros(&b[start_b..j]);
        let by_number = da.len().cmp(&db.len()).then_with(|| da.cmp(db));
        if by_number != Ordering::Equal {
            return by_number;
        }
    }
    Ordering::Equal
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let first = digits
        .iter()
        .position(|&c| c != b'0')
        .unwrap_or(digits.len());
    &digits[first..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering::*;

    #[test]
    fn orders_like_dpkg() {
        // Pairs checked against `dpkg --compare-versions`.
        let cases = [
            ("6.1.176-1", "6.1.170-3", Greater),
            ("6.12.107-1", "6.12.94-1", Greater),
            ("7.3~rc7-1~exp1", "7.3-1", Less),
            ("7.3~rc7-1~exp1", "7.2.13-1", Greater),
            ("6.1.180-1~deb11u1", "6.1.180-1", Less),
            ("1:1.0", "2.0", Greater),
            ("1.0", "1.0-0", Equal),
            ("1.0a", "1.0", Greater),
            ("1.0+b1", "1.0a", Greater),
            ("1.002", "1.2", Equal),
            ("5.10.262-1", "5.10.218-1", Greater),
            ("1.0~", "1.0", Less),
            ("1.0~~", "1.0~", Less),
        ];
        for (a, b, want) in cases {
            assert_eq!(compare_debian_versions(a, b), want, "{a} vs {b}");
            assert_eq!(compare_debian_versions(b, a), want.reverse(), "{b} vs {a}");
        }
    }
}
