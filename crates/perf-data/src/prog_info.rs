//! `HEADER_BPF_PROG_INFO`: the `bpf_prog_info` perf stored for every
//! program it saw (synthesised at start, or on a PROG_LOAD during the
//! session), held to the file's KSYMBOL and BPF_EVENT records.
//!
//! The section (tools/perf/util/header.c `write_bpf_prog_info` /
//! `process_bpf_prog_info`): a `u32` count, then per program a
//! `struct perf_bpil` (tools/perf/util/bpf-utils.h): `u32 info_len`,
//! `u32 data_len`, `u64 arrays`, `info_len` bytes of `struct bpf_prog_info`
//! (include/uapi/linux/bpf.h), `data_len` bytes of data, where each array
//! field of the info holds an offset into that data (`bpil_addr_to_offs`).

use std::collections::BTreeMap;

use crate::finding::Finding;

/// One program's facts as perf stored them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    pub id: u32,
    pub tag: [u8; 8],
    pub name: String,
    pub jited_ksyms: Vec<u64>,
    pub jited_func_lens: Vec<u32>,
    pub prog_tags: Vec<[u8; 8]>,
}

/// Offsets in `struct bpf_prog_info` (include/uapi/linux/bpf.h, the same
/// from 5.10 to 7.3 for these fields).
const ID: usize = 4;
const TAG: usize = 8;
const NAME: usize = 64;
const NR_JITED_KSYMS: usize = 104;
const NR_JITED_FUNC_LENS: usize = 108;
const JITED_KSYMS: usize = 112;
const JITED_FUNC_LENS: usize = 120;
const NR_PROG_TAGS: usize = 180;
const PROG_TAGS: usize = 184;

/// Where `HEADER_BPF_PROG_INFO` stops making sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgInfoError {
    #[error("{n} bytes at {at} past the section's {len}")]
    PastSection { n: usize, at: usize, len: usize },
    #[error("program {program} of {count}: bpf_prog_info of {info_len} bytes, too short")]
    TooShort {
        program: u32,
        count: u32,
        info_len: usize,
    },
    #[error(
        "program {program} of {count}: an array of {n} at {off} past its {data_len} data bytes"
    )]
    ArrayPastData {
        program: u32,
        count: u32,
        n: usize,
        off: usize,
        data_len: usize,
    },
}

/// Reads the section; `Err`: where it stops making sense.
pub fn parse(section: &[u8]) -> Result<Vec<ProgInfo>, ProgInfoError> {
    let mut r = Reader { b: section, at: 0 };
    let count = r.u32()?;
    let mut out = Vec::new();
    for n in 0..count {
        let info_len = r.u32()? as usize;
        let data_len = r.u32()? as usize;
        let _arrays = r.u64()?;
        let info = r.take(info_len)?;
        let data = r.take(data_len)?;
        let program = n;
        if info_len < PROG_TAGS + 8 {
            return Err(ProgInfoError::TooShort {
                program,
                count,
                info_len,
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(info[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(info[o..o + 8].try_into().expect("8 bytes"));
        let array = |off: u64, n: usize, width: usize| -> Result<&[u8], ProgInfoError> {
            let off = off as usize;
            data.get(off..off + n * width)
                .ok_or(ProgInfoError::ArrayPastData {
                    program,
                    count,
                    n,
                    off,
                    data_len,
                })
        };
        let ksyms = array(u64_at(JITED_KSYMS), u32_at(NR_JITED_KSYMS) as usize, 8)?;
        let lens = array(
            u64_at(JITED_FUNC_LENS),
            u32_at(NR_JITED_FUNC_LENS) as usize,
            4,
        )?;
        let tags = array(u64_at(PROG_TAGS), u32_at(NR_PROG_TAGS) as usize, 8)?;
        let name = &info[NAME..NAME + 16];
        out.push(ProgInfo {
            id: u32_at(ID),
            tag: info[TAG..TAG + 8].try_into().expect("8 bytes"),
            name: String::from_utf8_lossy(name.split(|b| *b == 0).next().unwrap_or(name))
                .into_owned(),
            jited_ksyms: ksyms
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            jited_func_lens: lens
                .chunks(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
            prog_tags: tags
                .chunks(8)
                .map(|c| c.try_into().expect("8 bytes"))
                .collect(),
        });
    }
    Ok(out)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProgInfoError> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or(ProgInfoError::PastSection {
                n,
                at: self.at,
                len: self.b.len(),
            })?;
        self.at += n;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, ProgInfoError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, ProgInfoError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// A BPF symbol's register as the file has it.
#[derive(Debug, Clone)]
pub struct Registered {
    pub name: String,
    pub len: u32,
    /// perf wrote it at start-up (its trailer's time is 0: perf zeroes the
    /// id header of what it synthesises, tools/perf/util/bpf-event.c).
    pub synthesised: bool,
}

/// A PROG_LOAD as the file has it.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    pub tag: [u8; 8],
    pub synthesised: bool,
}

/// The tag in a BPF symbol's name, `bpf_prog_<16 hex>_…`.
fn name_tag(name: &str) -> Option<&str> {
    let t = name.strip_prefix("bpf_prog_")?.get(..16)?;
    t.bytes().all(|b| b.is_ascii_hexdigit()).then_some(t)
}

/// Which tag a multi-function program's main symbol is named after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MainName {
    /// The whole program's `tag` (the kernel from 6.1 on).
    ProgTag,
    /// `prog_tags[0]`, the main function's own (5.10's kernel; perf's
    /// synthesis, `synthesize_bpf_prog_name`, always).
    FirstFuncTag,
}

/// Findings of rules `bpf-prog-info` (perf's stored facts against the
/// records: every function's register at its `jited_ksyms` address with its
/// `jited_func_lens` length and a name carrying its `prog_tags` entry or the
/// program's tag; the PROG_LOAD's tag) and `synthesised-name` (perf named a
/// program it synthesised otherwise than the kernel names the same kind
/// of symbol in the same file: a name that never existed in the kernel).
pub fn judge(
    progs: &[ProgInfo],
    registered: &BTreeMap<u64, Vec<Registered>>,
    loaded: &BTreeMap<u32, Loaded>,
    bpf_events: bool,
) -> Vec<Finding> {
    let mut out = Vec::new();
    // How this file's kernel names a multi-function program's main symbol,
    // seen in its own records; and how perf named the ones it synthesised.
    let mut kernel_style: Option<MainName> = None;
    let mut synthesised: Vec<(&ProgInfo, &Registered, MainName)> = Vec::new();
    for p in progs {
        for (i, addr) in p.jited_ksyms.iter().enumerate() {
            let at = registered.get(addr).map(Vec::as_slice).unwrap_or_default();
            // Of the registers at this address, the one of this program's
            // length and a name with one of its tags; else the first.
            let own_hex = p.prog_tags.get(i).map(hex);
            let fits = |r: &&Registered| {
                p.jited_func_lens.get(i) == Some(&r.len)
                    && name_tag(&r.name)
                        .is_some_and(|t| Some(t) == own_hex.as_deref() || t == hex(&p.tag))
            };
            let Some(r) = at.iter().find(fits).or(at.first()) else {
                out.push(Finding::new(
                    "bpf-prog-info",
                    format!("program {} ({}): function {i} at {addr:#x} (jited_ksyms) has no KSYMBOL register in the file", p.id, p.name),
                ));
                continue;
            };
            if let Some(len) = p.jited_func_lens.get(i).filter(|l| **l != r.len) {
                out.push(Finding::new(
                    "bpf-prog-info",
                    format!("program {} ({}): function {i} at {addr:#x} is {len} bytes (jited_func_lens), its KSYMBOL says {}", p.id, p.name, r.len),
                ));
            }
            let own = p.prog_tags.get(i).map(hex);
            let tag = name_tag(&r.name);
            if tag.is_none() || (tag != own.as_deref() && tag != Some(hex(&p.tag).as_str())) {
                out.push(Finding::new(
                    "bpf-prog-info",
                    format!("program {} ({}): function {i}'s symbol {:?} names neither its prog_tags entry {} nor the program's tag {}", p.id, p.name, r.name, own.unwrap_or_default(), hex(&p.tag)),
                ));
                continue;
            }
            // The main symbol of a program with more than one function,
            // when its two candidate tags differ, says the convention.
            if i == 0 && p.jited_ksyms.len() > 1 && p.prog_tags.first() != Some(&p.tag) {
                let style = if tag == own.as_deref() {
                    MainName::FirstFuncTag
                } else {
                    MainName::ProgTag
                };
                if r.synthesised {
                    synthesised.push((p, r, style));
                } else {
                    kernel_style = Some(style);
                }
            }
        }
        out.extend(load_finding(p, loaded, bpf_events));
    }
    if let Some(kernel) = kernel_style {
        for (p, r, style) in synthesised.into_iter().filter(|s| s.2 != kernel) {
            out.push(Finding::new(
                "synthesised-name",
                format!(
                    "perf synthesised program {} ({})'s main symbol as {:?}, after its {}; this file's kernel names that symbol after the {} (seen in its own records): the synthesised name never existed in the kernel",
                    p.id,
                    p.name,
                    r.name,
                    style.after(),
                    kernel.after(),
                ),
            ));
        }
    }
    out
}

impl MainName {
    /// What the main symbol's name is after, in a finding's words.
    fn after(self) -> &'static str {
        match self {
            MainName::FirstFuncTag => "first function's tag (prog_tags[0])",
            MainName::ProgTag => "program's tag",
        }
    }
}

/// A tag as the kernel prints it in a symbol name.
fn hex(t: &[u8; 8]) -> String {
    t.iter().map(|b| format!("{b:02x}")).collect::<String>()
}

/// The `bpf-prog-info` finding on program `p`'s PROG_LOAD: one with another
/// tag, or none when the file has BPF_EVENT records.
fn load_finding(p: &ProgInfo, loaded: &BTreeMap<u32, Loaded>, bpf_events: bool) -> Option<Finding> {
    match loaded.get(&p.id) {
        Some(l) if l.tag != p.tag => Some(Finding::new(
            "bpf-prog-info",
            format!(
                "program {} ({}): its PROG_LOAD carries tag {}, bpf_prog_info says {}",
                p.id,
                p.name,
                hex(&l.tag),
                hex(&p.tag)
            ),
        )),
        None if bpf_events => Some(Finding::new(
            "bpf-prog-info",
            format!("program {} ({}): no PROG_LOAD in the file", p.id, p.name),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(progs: &[ProgInfo]) -> Vec<u8> {
        let mut s = (progs.len() as u32).to_le_bytes().to_vec();
        for p in progs {
            let mut info = vec![0u8; 232];
            let mut data = Vec::new();
            info[ID..ID + 4].copy_from_slice(&p.id.to_le_bytes());
            info[TAG..TAG + 8].copy_from_slice(&p.tag);
            info[NAME..NAME + p.name.len()].copy_from_slice(p.name.as_bytes());
            let mut array = |info: &mut Vec<u8>, nr: usize, at: usize, n: usize, bytes: Vec<u8>| {
                info[nr..nr + 4].copy_from_slice(&(n as u32).to_le_bytes());
                info[at..at + 8].copy_from_slice(&(data.len() as u64).to_le_bytes());
                data.extend(bytes);
            };
            array(
                &mut info,
                NR_JITED_KSYMS,
                JITED_KSYMS,
                p.jited_ksyms.len(),
                p.jited_ksyms.iter().flat_map(|a| a.to_le_bytes()).collect(),
            );
            array(
                &mut info,
                NR_JITED_FUNC_LENS,
                JITED_FUNC_LENS,
                p.jited_func_lens.len(),
                p.jited_func_lens
                    .iter()
                    .flat_map(|a| a.to_le_bytes())
                    .collect(),
            );
            array(
                &mut info,
                NR_PROG_TAGS,
                PROG_TAGS,
                p.prog_tags.len(),
                p.prog_tags.iter().flatten().copied().collect(),
            );
            s.extend((info.len() as u32).to_le_bytes());
            s.extend((data.len() as u32).to_le_bytes());
            s.extend(0u64.to_le_bytes());
            s.extend(info);
            s.extend(data);
        }
        s
    }

    fn prog(id: u32, tag: u8, addrs: &[u64]) -> ProgInfo {
        ProgInfo {
            id,
            tag: [tag; 8],
            name: "kloop_subprogs".into(),
            jited_ksyms: addrs.to_vec(),
            jited_func_lens: vec![40; addrs.len()],
            prog_tags: (0..addrs.len()).map(|i| [0x10 + i as u8; 8]).collect(),
        }
    }

    fn reg(name: &str, len: u32, synthesised: bool) -> Vec<Registered> {
        vec![Registered {
            name: name.into(),
            len,
            synthesised,
        }]
    }

    #[test]
    fn the_section_reads_back_and_a_short_one_says_where() {
        let progs = vec![prog(19, 0xaa, &[0x1000, 0x2000]), prog(20, 0xbb, &[0x3000])];
        let s = section(&progs);
        assert_eq!(parse(&s).unwrap(), progs);
        let e = parse(&s[..s.len() - 3]).unwrap_err();
        assert!(e.to_string().contains("past the section's"), "{e}");
    }

    #[test]
    fn lengths_tags_loads_and_the_synthesised_main_name_are_judged() {
        let p19 = prog(19, 0xaa, &[0x1000, 0x2000]);
        let p20 = prog(20, 0xaa, &[0x3000, 0x4000]);
        let mut registered = BTreeMap::new();
        // 19 alive at perf's start: perf named main after prog_tags[0].
        registered.insert(
            0x1000,
            reg("bpf_prog_1010101010101010_kloop_subprogs", 40, true),
        );
        registered.insert(0x2000, reg("bpf_prog_1111111111111111_F", 40, true));
        // 20 loaded during the session: the kernel named main after the tag.
        registered.insert(
            0x3000,
            reg("bpf_prog_aaaaaaaaaaaaaaaa_kloop_subprogs", 40, false),
        );
        registered.insert(0x4000, reg("bpf_prog_1111111111111111_F", 41, false));
        let mut loaded = BTreeMap::new();
        loaded.insert(
            19,
            Loaded {
                tag: [0xaa; 8],
                synthesised: true,
            },
        );
        loaded.insert(
            20,
            Loaded {
                tag: [0xbc; 8],
                synthesised: false,
            },
        );
        let f = judge(&[p19, p20], &registered, &loaded, true);
        let got: Vec<(&str, bool)> = f
            .iter()
            .map(|f| (f.rule, f.message.contains("program 19")))
            .collect();
        assert_eq!(
            got,
            [
                ("bpf-prog-info", false),
                ("bpf-prog-info", false),
                ("synthesised-name", true)
            ],
            "{f:#?}"
        );
        assert!(f[0]
            .message
            .contains("is 40 bytes (jited_func_lens), its KSYMBOL says 41"));
        assert!(f[1]
            .message
            .contains("PROG_LOAD carries tag bcbcbcbcbcbcbcbc"));
        // 5.10's kernel names main after prog_tags[0] too: no finding.
        registered.insert(
            0x3000,
            reg("bpf_prog_1010101010101010_kloop_subprogs", 40, false),
        );
        registered.insert(0x4000, reg("bpf_prog_1111111111111111_F", 40, false));
        loaded.insert(
            20,
            Loaded {
                tag: [0xaa; 8],
                synthesised: false,
            },
        );
        let p19 = prog(19, 0xaa, &[0x1000, 0x2000]);
        let p20 = prog(20, 0xaa, &[0x3000, 0x4000]);
        assert!(judge(&[p19, p20], &registered, &loaded, true).is_empty());
        // A function with no register at all.
        assert!(
            judge(&[prog(21, 1, &[0x9000])], &registered, &loaded, false)[0]
                .message
                .contains("has no KSYMBOL register")
        );
    }
}
