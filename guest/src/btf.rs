//! Just enough of the BTF format (include/uapi/linux/btf.h) to find a
//! FUNC by name and a type's name by id, without building a type graph
//! (the agent runs under TCG, where parsing vmlinux BTF properly takes
//! seconds).

/// Why raw BTF could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BtfError {
    #[error("unknown BTF kind {kind} at type {id}")]
    UnknownKind { kind: u32, id: u32 },
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("not little-endian BTF (magic 0xeb9f)")]
    NotLittleEndian,
    #[error("string section out of bounds")]
    StringsOutOfBounds,
    #[error("no type {0}")]
    NoType(u32),
    #[error("type {type_id}'s name offset {name_off} is past the strings")]
    NamePastStrings { type_id: u32, name_off: u32 },
}

/// The byte length of each type's record after its 12-byte header.
fn extra_len(kind: u32, vlen: usize, id: u32) -> Result<usize, BtfError> {
    Ok(match kind {
        1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
        3 => 12,                      // ARRAY
        4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
        6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
        2 | 7..=12 | 16 | 18 => 0,    // PTR, FWD, TYPEDEF, qualifiers, FUNC, FLOAT, TYPE_TAG
        kind => return Err(BtfError::UnknownKind { kind, id }),
    })
}

/// The header of raw little-endian BTF: where the types and the strings are.
struct Layout<'a> {
    raw: &'a [u8],
    types: usize,
    types_end: usize,
    strings: &'a [u8],
}

fn u32_at(raw: &[u8], off: usize) -> Result<u32, BtfError> {
    raw.get(off..off + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or(BtfError::Truncated(off))
}

fn layout(raw: &[u8]) -> Result<Layout<'_>, BtfError> {
    if raw.get(..2) != Some(&[0x9f, 0xeb][..]) {
        return Err(BtfError::NotLittleEndian);
    }
    let hdr_len = u32_at(raw, 4)? as usize;
    let (type_off, type_len) = (u32_at(raw, 8)? as usize, u32_at(raw, 12)? as usize);
    let (str_off, str_len) = (u32_at(raw, 16)? as usize, u32_at(raw, 20)? as usize);
    let strings = raw
        .get(hdr_len + str_off..hdr_len + str_off + str_len)
        .ok_or(BtfError::StringsOutOfBounds)?;
    Ok(Layout {
        raw,
        types: hdr_len + type_off,
        types_end: hdr_len + type_off + type_len,
        strings,
    })
}

/// Walks the types: `visit(id, name_off, kind)` until it returns `Some`.
fn walk<T>(
    l: &Layout<'_>,
    mut visit: impl FnMut(u32, u32, u32) -> Option<T>,
) -> Result<Option<T>, BtfError> {
    let (mut off, mut id) = (l.types, 1u32);
    while off < l.types_end {
        let (name_at, info) = (u32_at(l.raw, off)?, u32_at(l.raw, off + 4)?);
        let kind = (info >> 24) & 0x1f;
        if let Some(t) = visit(id, name_at, kind) {
            return Ok(Some(t));
        }
        off += 12 + extra_len(kind, (info & 0xffff) as usize, id)?;
        id += 1;
    }
    Ok(None)
}

/// Where `name` is in the string section. Strings are deduplicated: a
/// name has one offset, if any.
fn string_offset(l: &Layout<'_>, name: &str) -> Option<u32> {
    let needle = [&[0u8][..], name.as_bytes(), &[0u8][..]].concat();
    l.strings
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| (p + 1) as u32)
}

/// The BTF type id of the FUNC named `name` in raw BTF.
pub fn func_id(raw: &[u8], name: &str) -> Result<Option<u32>, BtfError> {
    let l = layout(raw)?;
    let Some(name_off) = string_offset(&l, name) else {
        return Ok(None);
    };
    walk(&l, |id, at, kind| {
        (kind == 12 && at == name_off).then_some(id)
    })
}

/// The byte offset of member `member` in the STRUCT named `name` (the
/// first such struct), `None` when there is no such struct or member.
pub fn member_offset(raw: &[u8], name: &str, member: &str) -> Result<Option<u32>, BtfError> {
    Ok(struct_layout(raw, name)?.and_then(|s| s.member(member).map(|(_, off)| off)))
}

/// A STRUCT of raw BTF: its type id, its size and each member's name and
/// byte offset, in declaration order (the order `for_each_member()` walks,
/// whose index a struct_ops program gives as `expected_attach_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StructLayout {
    pub id: u32,
    pub size: u32,
    pub members: Vec<(String, u32)>,
}

impl StructLayout {
    /// The index and byte offset of member `name`.
    pub fn member(&self, name: &str) -> Option<(u32, u32)> {
        self.members
            .iter()
            .position(|(m, _)| m == name)
            .map(|i| (i as u32, self.members[i].1))
    }
}

/// The string at `off` of the string section.
fn string_at<'a>(l: &Layout<'a>, off: u32) -> Option<&'a str> {
    let rest = l.strings.get(off as usize..)?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).ok()
}

/// The layout of the first STRUCT named `name`, `None` when there is none.
pub fn struct_layout(raw: &[u8], name: &str) -> Result<Option<StructLayout>, BtfError> {
    let l = layout(raw)?;
    let Some(name_off) = string_offset(&l, name) else {
        return Ok(None);
    };
    let (mut off, mut id) = (l.types, 1u32);
    while off < l.types_end {
        let (name_at, info) = (u32_at(l.raw, off)?, u32_at(l.raw, off + 4)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        if kind == 4 && name_at == name_off {
            let kind_flag = info >> 31 == 1;
            let mut members = Vec::with_capacity(vlen);
            for m in 0..vlen {
                let rec = off + 12 + 12 * m;
                let bits = u32_at(l.raw, rec + 8)?;
                let bits = if kind_flag { bits & 0x00ff_ffff } else { bits };
                let m_name = u32_at(l.raw, rec)?;
                let m_name = string_at(&l, m_name).ok_or(BtfError::NamePastStrings {
                    type_id: id,
                    name_off: m_name,
                })?;
                members.push((m_name.to_owned(), bits / 8));
            }
            return Ok(Some(StructLayout {
                id,
                size: u32_at(l.raw, off + 8)?,
                members,
            }));
        }
        off += 12 + extra_len(kind, vlen, id)?;
        id += 1;
    }
    Ok(None)
}

/// The name of type `type_id` of standalone raw BTF (a program's own: type
/// ids start at 1 after the void type 0).
pub fn type_name(raw: &[u8], type_id: u32) -> Result<String, BtfError> {
    let l = layout(raw)?;
    let Some(name_off) = walk(&l, |id, at, _| (id == type_id).then_some(at))? else {
        return Err(BtfError::NoType(type_id));
    };
    let rest = l
        .strings
        .get(name_off as usize..)
        .ok_or(BtfError::NamePastStrings { type_id, name_off })?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw little-endian BTF of `types` (32-bit words) and `strings`.
    fn raw_btf(words: &[u32], strings: &[u8]) -> Vec<u8> {
        let types: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut raw = vec![0x9f, 0xeb, 1, 0];
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            raw.extend_from_slice(&w.to_le_bytes());
        }
        raw.extend(types);
        raw.extend_from_slice(strings);
        raw
    }

    /// Raw BTF with: 1 INT "int", 2 FUNC_PROTO (1 param), 3 FUNC "f".
    fn tiny_btf() -> Vec<u8> {
        raw_btf(
            &[
                1,
                1 << 24,
                4,
                0x20, // INT "int", size 4, 32 bits
                0,
                (13 << 24) | 1,
                1,
                0,
                1, // FUNC_PROTO returning int, one int param
                5,
                12 << 24,
                2, // FUNC "f" of proto 2
            ],
            b"\0int\0f\0",
        )
    }

    #[test]
    fn finds_funcs_and_names_types() {
        let raw = tiny_btf();
        assert_eq!(func_id(&raw, "f"), Ok(Some(3)));
        assert_eq!(func_id(&raw, "int"), Ok(None));
        assert_eq!(func_id(&raw, "g"), Ok(None));
        assert_eq!(type_name(&raw, 3).as_deref(), Ok("f"));
        assert_eq!(type_name(&raw, 1).as_deref(), Ok("int"));
        assert_eq!(type_name(&raw, 2).as_deref(), Ok(""));
        assert!(type_name(&raw, 4).is_err());
        assert!(func_id(&raw[..3], "f").is_err());
    }

    /// A STRUCT "s" { int f @ bit 64 }: the member's byte offset is 8.
    #[test]
    fn finds_a_struct_members_offset() {
        let raw = raw_btf(
            &[1, 1 << 24, 4, 0x20, 5, (4 << 24) | 1, 16, 7, 1, 64],
            b"\0int\0s\0f\0",
        );
        assert_eq!(member_offset(&raw, "s", "f"), Ok(Some(8)));
        assert_eq!(member_offset(&raw, "s", "g"), Ok(None));
        assert_eq!(member_offset(&raw, "int", "f"), Ok(None));
        let s = struct_layout(&raw, "s").unwrap().unwrap();
        assert_eq!(
            s,
            StructLayout {
                id: 2,
                size: 16,
                members: vec![("f".into(), 8)],
            }
        );
        assert_eq!(s.member("f"), Some((0, 8)));
        assert_eq!(s.member("g"), None);
        assert_eq!(struct_layout(&raw, "int"), Ok(None));
        assert_eq!(struct_layout(&raw, "t"), Ok(None));
    }
}
