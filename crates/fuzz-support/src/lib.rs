//! Fuzz entry points (test support: a dev-only crate, never linked into the
//! kloop library).
//!
//! One function per `cargo fuzz` target in `fuzz/fuzz_targets/`; the targets
//! call nothing else, and `tests/fuzz_corpus.rs` replays the committed seeds
//! (`fuzz/seeds/<target>/`) and every input a fuzzer ever found
//! (`fuzz/regressions/<target>/`) through the same functions on stable Rust.
//! Each function panics when an invariant breaks, and returns normally for
//! every input the code under test handles correctly (errors included).
//!
//! | target | function | input |
//! |---|---|---|
//! | `records` | [`fuzz_check_records`] | listener selector byte ([`records_listener`]), then raw ring bytes |
//! | `frames` | [`fuzz_check_frames`] | chunking mode byte, chunking seed byte, then channel bytes |
//! | `analyse` | [`fuzz_check_analyse`] | a small [`RunEvidence`] in the layout of [`analyse_evidence`] |
//!
//! Memory: when [`CountingAlloc`] is the global allocator (the fuzz targets
//! and the replay test install it), the peak of bytes live during the code
//! under test must stay within a linear bound of the input length, so a
//! length field can never make the parser allocate more than the input
//! justifies.
//!
//! [`seeds`] builds the seed corpora from the recorded real-kernel runs in
//! `src/testdata/real/`; `cargo test -p kloop-fuzz-support --test fuzz_corpus -- --ignored
//! write_seeds` rewrites `fuzz/seeds/`.

// The ratchet on long functions (issue 49; threshold in clippy.toml).
#![warn(clippy::too_many_lines)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use kloop_protocol::frame::HEADER_LEN as FRAME_HEADER_LEN;
use kloop_protocol::{
    encode_frame, records_frames, FrameDecoder, FrameError, FrameKind, KallsymsEntry,
    KsymbolObservation, ListenerInfo, Message, ProgFacts, RawFrame, RecordsHeader, MAX_PAYLOAD,
};

use kloop_judge::evidence::{KsymbolWatchEvidence, RunEvidence};
use kloop_judge::normalise;
use kloop_records::testutil::XorShift;
use kloop_records::{
    self, parse_prefix, parse_stream, Record, RecordBody, SampleId, HEADER_LEN,
    PERF_RECORD_BPF_EVENT, PERF_RECORD_KSYMBOL, PERF_RECORD_LOST, PERF_SAMPLE_CPU, PERF_SAMPLE_ID,
    PERF_SAMPLE_IDENTIFIER, PERF_SAMPLE_STREAM_ID, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
};

// ---------------------------------------------------------------------------
// Allocation accounting

/// A global allocator that forwards to [`System`] and keeps, per thread, the
/// bytes live and their peak, for [`peak_alloc`].
pub struct CountingAlloc;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn note(delta: isize) {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let _ = LIVE.try_with(|live| {
        let v = live.get().wrapping_add(delta);
        live.set(v);
        let _ = PEAK.try_with(|p| {
            if v > p.get() {
                p.set(v)
            }
        });
    });
}

fn isize_of(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(isize_of(layout.size()));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(isize_of(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note(-isize_of(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(isize_of(new_size) - isize_of(layout.size()));
        }
        p
    }
}

/// Runs `f`; returns its result and the peak number of bytes allocated on
/// this thread while it ran (above what was live before), or `None` when
/// [`CountingAlloc`] is not the global allocator.
pub fn peak_alloc<R>(f: impl FnOnce() -> R) -> (R, Option<usize>) {
    let base = LIVE.with(Cell::get);
    let outer = PEAK.with(|p| p.replace(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    PEAK.with(|p| p.set(outer.max(peak)));
    let used = usize::try_from(peak.saturating_sub(base)).unwrap_or(0);
    (r, INSTALLED.load(Ordering::Relaxed).then_some(used))
}

fn assert_alloc_bound(what: &str, peak: Option<usize>, input_len: usize, per_byte: usize) {
    // A fixed allowance for formatting, error messages and empty collections,
    // then a linear one: nothing may grow faster than the input.
    let bound = 16 * 1024 + per_byte * input_len;
    if let Some(p) = peak {
        assert!(
            p <= bound,
            "{what}: {p} bytes allocated for {input_len} input bytes (bound {bound})"
        );
    }
}

// ---------------------------------------------------------------------------
// records

/// The `sample_type` bits that select `sample_id` trailer fields, in the order
/// of selector bits 0–5.
const TRAILER_BITS: [u64; 6] = [
    PERF_SAMPLE_TID,
    PERF_SAMPLE_TIME,
    PERF_SAMPLE_ID,
    PERF_SAMPLE_STREAM_ID,
    PERF_SAMPLE_CPU,
    PERF_SAMPLE_IDENTIFIER,
];
/// `PERF_SAMPLE_IP | PERF_SAMPLE_PERIOD`: bits that select no trailer field.
const NON_TRAILER_BITS: u64 = (1 << 0) | (1 << 8);
const SEL_NO_SAMPLE_ID_ALL: u8 = 1 << 6;
const SEL_NON_TRAILER: u8 = 1 << 7;

/// The listener a selector byte describes: bits 0–5 select TID, TIME, ID,
/// STREAM_ID, CPU, IDENTIFIER; bit 6 clears `sample_id_all`; bit 7 adds
/// sample_type bits that select no trailer field (IP, PERIOD).
pub fn records_listener(selector: u8) -> ListenerInfo {
    let mut sample_type = 0;
    for (i, bit) in TRAILER_BITS.iter().enumerate() {
        if selector & (1 << i) != 0 {
            sample_type |= bit;
        }
    }
    if selector & SEL_NON_TRAILER != 0 {
        sample_type |= NON_TRAILER_BITS;
    }
    ListenerInfo {
        index: 0,
        cpu: 0,
        sample_type,
        sample_id_all: selector & SEL_NO_SAMPLE_ID_ALL == 0,
        ksymbol: true,
        bpf_event: true,
        ring_bytes: 64 * 1024,
        inherit: false,
        pid: None,
        cpus: None,
        side_band: Vec::new(),
        disabled: false,
        backward: false,
        poll_watermark: 0,
    }
}

/// The selector byte whose [`records_listener`] parses like `l` (its
/// trailer-selecting bits and `sample_id_all`).
pub fn records_selector(l: &ListenerInfo) -> u8 {
    let mut sel = 0u8;
    for (i, bit) in TRAILER_BITS.iter().enumerate() {
        if l.sample_type & bit != 0 {
            sel |= 1 << i;
        }
    }
    if !l.sample_id_all {
        sel |= SEL_NO_SAMPLE_ID_ALL;
    }
    if l.sample_type & NON_TRAILER_BITS != 0 {
        sel |= SEL_NON_TRAILER;
    }
    sel
}

/// The `sample_id` trailer of `s` as listener `l` lays it out (unselected
/// fields are not written; selected ones that are `None` are written as 0).
pub fn encode_trailer(l: &ListenerInfo, s: &SampleId) -> Vec<u8> {
    let mut v = Vec::new();
    if !l.sample_id_all {
        return v;
    }
    let st = l.sample_type;
    if st & PERF_SAMPLE_TID != 0 {
        v.extend_from_slice(&s.pid.unwrap_or(0).to_le_bytes());
        v.extend_from_slice(&s.tid.unwrap_or(0).to_le_bytes());
    }
    if st & PERF_SAMPLE_TIME != 0 {
        v.extend_from_slice(&s.time.unwrap_or(0).to_le_bytes());
    }
    if st & PERF_SAMPLE_ID != 0 {
        v.extend_from_slice(&s.id.unwrap_or(0).to_le_bytes());
    }
    if st & PERF_SAMPLE_STREAM_ID != 0 {
        v.extend_from_slice(&s.stream_id.unwrap_or(0).to_le_bytes());
    }
    if st & PERF_SAMPLE_CPU != 0 {
        v.extend_from_slice(&s.cpu.unwrap_or(0).to_le_bytes());
        v.extend_from_slice(&s.cpu_res.unwrap_or(0).to_le_bytes());
    }
    if st & PERF_SAMPLE_IDENTIFIER != 0 {
        v.extend_from_slice(&s.identifier.unwrap_or(0).to_le_bytes());
    }
    v
}

/// Encodes a KSYMBOL, BPF_EVENT or LOST record the way the kernel writes it
/// into listener `l`'s ring (`header.size` computed, `misc` kept); `None` for
/// a record type kloop does not interpret or a record too long for a header.
pub fn encode_record(
    l: &ListenerInfo,
    misc: u16,
    body: &RecordBody,
    s: &SampleId,
) -> Option<Vec<u8>> {
    let (type_, mut b) = match body {
        RecordBody::Ksymbol {
            addr,
            len,
            ksym_type,
            flags,
            name,
        } => {
            let mut b = Vec::new();
            b.extend_from_slice(&addr.to_le_bytes());
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&ksym_type.to_le_bytes());
            b.extend_from_slice(&flags.to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.push(0);
            while b.len() % 8 != 0 {
                b.push(0);
            }
            (PERF_RECORD_KSYMBOL, b)
        }
        RecordBody::BpfEvent {
            event_type,
            flags,
            id,
            tag,
        } => {
            let mut b = Vec::new();
            b.extend_from_slice(&event_type.to_le_bytes());
            b.extend_from_slice(&flags.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(tag);
            (PERF_RECORD_BPF_EVENT, b)
        }
        RecordBody::Lost { id, lost } => {
            let mut b = Vec::new();
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&lost.to_le_bytes());
            (PERF_RECORD_LOST, b)
        }
        // The poked bytes are not kept, so a TEXT_POKE cannot be rebuilt.
        RecordBody::Task {
            exit,
            pid,
            ppid,
            tid,
            ptid,
            time,
        } => {
            let mut b = Vec::new();
            for v in [pid, ppid, tid, ptid] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&time.to_le_bytes());
            let t = if *exit {
                kloop_records::PERF_RECORD_EXIT
            } else {
                kloop_records::PERF_RECORD_FORK
            };
            (t, b)
        }
        RecordBody::TextPoke { .. } | RecordBody::Unknown { .. } => return None,
    };
    b.extend(encode_trailer(l, s));
    let size = u16::try_from(b.len() + HEADER_LEN).ok()?;
    let mut v = Vec::with_capacity(usize::from(size));
    v.extend_from_slice(&type_.to_le_bytes());
    v.extend_from_slice(&misc.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v.extend(b);
    Some(v)
}

/// Which `SampleId` fields listener `l` selects, as a `SampleId` of `Some(0)`s.
fn selected_fields(l: &ListenerInfo) -> SampleId {
    let on = |bit: u64| (l.sample_id_all && l.sample_type & bit != 0).then_some(());
    SampleId {
        pid: on(PERF_SAMPLE_TID).map(|_| 0),
        tid: on(PERF_SAMPLE_TID).map(|_| 0),
        time: on(PERF_SAMPLE_TIME).map(|_| 0),
        id: on(PERF_SAMPLE_ID).map(|_| 0),
        stream_id: on(PERF_SAMPLE_STREAM_ID).map(|_| 0),
        cpu: on(PERF_SAMPLE_CPU).map(|_| 0),
        cpu_res: on(PERF_SAMPLE_CPU).map(|_| 0),
        identifier: on(PERF_SAMPLE_IDENTIFIER).map(|_| 0),
    }
}

fn shape(s: &SampleId) -> [bool; 8] {
    [
        s.pid.is_some(),
        s.tid.is_some(),
        s.time.is_some(),
        s.id.is_some(),
        s.stream_id.is_some(),
        s.cpu.is_some(),
        s.cpu_res.is_some(),
        s.identifier.is_some(),
    ]
}

/// The `records` target: `data[0]` selects the listener
/// ([`records_listener`]), the rest is one listener's raw ring bytes.
///
/// Checks: no panic; allocation linear in the input; `parse_stream` agrees
/// with `parse_prefix`; an error names the offset where the well-formed
/// prefix ends; on success the records tile the input exactly (sum of
/// `header.size` == input length, offsets contiguous), carry exactly the
/// trailer fields the listener selects, and re-encode to the input bytes.
pub fn fuzz_check_records(data: &[u8]) {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let l = records_listener(sel);
    let ((recs, err), peak) = peak_alloc(|| parse_prefix(&l, bytes));
    assert_alloc_bound("parse_prefix", peak, bytes.len(), 128);
    check_records_result(&l, bytes, &recs, err.as_ref());
    match parse_stream(&l, bytes) {
        Ok(all) => {
            assert!(err.is_none(), "parse_stream Ok but parse_prefix erred");
            assert_eq!(all, recs, "parse_stream and parse_prefix disagree");
        }
        Err(e) => assert_eq!(
            Some(&e),
            err.as_ref(),
            "parse_stream and parse_prefix disagree"
        ),
    }
    // Reading past zero-filled excess: linear too, the same records where
    // the strict reading found none, and only whole records read past.
    let (on, peak) = peak_alloc(|| kloop_records::parse_reading_on(&l, bytes));
    assert_alloc_bound("parse_reading_on", peak, bytes.len(), 128);
    if on.oversized.is_empty() {
        assert_eq!(
            on.records, recs,
            "nothing read past, yet the readings differ"
        );
        assert_eq!(on.error.as_ref(), err.as_ref());
    } else {
        assert!(on.records.len() > recs.len() || on.error.is_none());
        assert_eq!(
            on.records.get(..recs.len()),
            Some(&recs[..]),
            "the strict prefix is kept"
        );
        for o in &on.oversized {
            let r = on
                .records
                .iter()
                .find(|r| r.offset == o.offset)
                .expect("a record read past is among the records");
            assert_eq!(
                u32::from(r.header.size),
                o.body_end + o.trailer_len + o.excess
            );
            let pad = &bytes[(o.offset as usize + (o.body_end + o.trailer_len) as usize)
                ..(o.offset as usize + usize::from(o.size))];
            assert!(
                o.excess > 0 && pad.iter().all(|b| *b == 0),
                "only zero excess is read past"
            );
        }
    }
}

fn check_records_result(
    l: &ListenerInfo,
    bytes: &[u8],
    recs: &[Record],
    err: Option<&kloop_records::ParseError>,
) {
    let want = shape(&selected_fields(l));
    let mut pos = 0usize;
    for r in recs {
        let size = usize::from(r.header.size);
        assert_eq!(r.listener, l.index);
        assert_eq!(r.offset, pos as u64, "records must tile the stream");
        assert!(size >= HEADER_LEN && size % 8 == 0, "bad size in {r}");
        let orig = bytes
            .get(pos..pos + size)
            .expect("a parsed record lies inside the input");
        assert_eq!(
            orig.get(..4),
            Some(&r.header.type_.to_le_bytes()[..]),
            "header.type re-encodes"
        );
        assert_eq!(orig.get(4..6), Some(&r.header.misc.to_le_bytes()[..]));
        assert_eq!(orig.get(6..8), Some(&r.header.size.to_le_bytes()[..]));
        match &r.body {
            RecordBody::Unknown { type_ } => {
                assert_eq!(*type_, r.header.type_);
                assert_eq!(r.sample, SampleId::default());
            }
            RecordBody::TextPoke { .. } => {
                assert_eq!(shape(&r.sample), want, "trailer fields of {r}");
            }
            body => {
                assert_eq!(shape(&r.sample), want, "trailer fields of {r}");
                let enc = encode_record(l, r.header.misc, body, &r.sample)
                    .expect("known record types re-encode");
                let lossy_name =
                    matches!(body, RecordBody::Ksymbol { name, .. } if name.contains('\u{fffd}'));
                if !lossy_name {
                    assert_eq!(enc, orig, "{r} does not re-encode to its bytes");
                }
            }
        }
        let _ = r.to_string();
        pos += size;
    }
    match err {
        None => assert_eq!(pos, bytes.len(), "sum of header.size == input length"),
        Some(e) => {
            assert_eq!(e.offset, pos as u64, "error at the end of the good prefix");
            assert!(pos < bytes.len(), "error past the end of the input");
            assert_eq!(e.listener, l.index);
            assert!(e.bytes_hex.len() <= 64 * 2 + 7);
            let _ = e.to_string();
        }
    }
}

// ---------------------------------------------------------------------------
// frames

/// Chunk sizes for the `frames` target: `mode % 5` picks 1 byte at a time,
/// 1–7, 1–64, 1–4096 bytes (sizes drawn from `seed`), or everything at once.
pub fn frame_chunks(mode: u8, seed: u8, len: usize) -> Vec<usize> {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ u64::from(seed));
    let max = match mode % 5 {
        0 => 1,
        1 => 7,
        2 => 64,
        3 => 4096,
        _ => len.max(1),
    };
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let n = if max == 1 {
            1
        } else {
            1 + usize::try_from(rng.next() % max as u64).unwrap_or(0)
        };
        let n = n.min(left);
        out.push(n);
        left -= n;
    }
    out
}

fn frame_error_offset(e: &FrameError) -> u64 {
    match e {
        FrameError::BadMagic { offset, .. }
        | FrameError::UnknownKind { offset, .. }
        | FrameError::BadPadding { offset, .. }
        | FrameError::TooLong { offset, .. }
        | FrameError::Checksum { offset, .. } => *offset,
    }
}

/// Takes every frame the decoder can give, checking progress and round
/// trips; `stream` is everything pushed so far.
///
/// `deep`: also check payloads and render the first few errors (one of the
/// two decoding passes is enough; rendering every error of a garbage stream
/// would dominate the run time).
fn drain_frames(
    d: &mut FrameDecoder,
    stream: &[u8],
    out: &mut Vec<Result<RawFrame, FrameError>>,
    deep: bool,
) {
    loop {
        let before = d.consumed();
        let pending = d.pending();
        assert_eq!(
            before + pending as u64,
            stream.len() as u64,
            "consumed + pending == bytes pushed"
        );
        match d.next_frame() {
            Ok(None) => {
                assert_eq!(d.consumed(), before, "Ok(None) consumes nothing");
                assert_eq!(d.pending(), pending);
                // Waiting for more: a header, or at most a whole frame.
                assert!(
                    pending < FRAME_HEADER_LEN + MAX_PAYLOAD,
                    "{pending} bytes pending"
                );
                return;
            }
            Ok(Some(f)) => {
                assert_eq!(f.offset, before, "frame offset is where it started");
                assert!(f.payload.len() <= MAX_PAYLOAD);
                let enc = encode_frame(f.kind, &f.payload);
                assert_eq!(
                    d.consumed(),
                    before + enc.len() as u64,
                    "a frame consumes exactly its bytes"
                );
                let start = usize::try_from(before).unwrap_or(usize::MAX);
                assert_eq!(
                    stream.get(start..start + enc.len()),
                    Some(&enc[..]),
                    "frame at {before} does not round-trip through encode_frame"
                );
                if deep {
                    check_frame_payload(&f, &enc);
                }
                out.push(Ok(f));
            }
            Err(e) => {
                assert_eq!(frame_error_offset(&e), before, "error names its offset");
                assert!(
                    d.consumed() > before,
                    "an error must skip at least one byte"
                );
                if deep && out.len() < 16 {
                    let _ = e.to_string();
                }
                out.push(Err(e));
            }
        }
    }
}

/// What the host does with a frame's payload, checked for round trips.
fn check_frame_payload(f: &RawFrame, encoded: &[u8]) {
    match f.kind {
        FrameKind::Message => {
            if let Ok(m) = serde_json::from_slice::<Message>(&f.payload) {
                let json = serde_json::to_vec(&m).expect("messages serialise");
                if json.len() <= MAX_PAYLOAD {
                    let again: Message =
                        serde_json::from_slice(&json).expect("a serialised message parses");
                    assert_eq!(again, m, "message does not survive a JSON round trip");
                    assert_eq!(m.to_frame(), encode_frame(FrameKind::Message, &json));
                }
            }
        }
        FrameKind::Records => match RecordsHeader::split(&f.payload) {
            None => assert!(f.payload.len() < RecordsHeader::LEN),
            Some((h, raw)) => {
                let mut again = h.encode().to_vec();
                again.extend_from_slice(raw);
                assert_eq!(again, f.payload, "records header round trip");
                if !raw.is_empty() && raw.len() <= 64 * 1024 {
                    assert_eq!(
                        records_frames(h.listener, h.stream_offset, raw),
                        vec![encoded.to_vec()],
                        "records_frames re-encodes the frame"
                    );
                }
            }
        },
    }
}

/// Decodes `stream` pushed in `chunks`, appending every result to `out`.
///
/// Each result consumes at least one byte, so an `out` with room for
/// `stream.len() + 1` results never grows: the allocations measured around
/// this are the decoder's own (its buffer, the payloads it returns) and the
/// payload checks'.
fn decode(
    stream: &[u8],
    chunks: &[usize],
    deep: bool,
    out: &mut Vec<Result<RawFrame, FrameError>>,
) {
    let mut d = FrameDecoder::new();
    let mut pushed = 0usize;
    for &n in chunks {
        let chunk = stream.get(pushed..pushed + n).unwrap_or(&[]);
        let before = d.pending();
        d.push(chunk);
        pushed += chunk.len();
        assert_eq!(d.pending(), before + chunk.len());
        assert!(
            d.pending() <= MAX_PAYLOAD + FRAME_HEADER_LEN + chunk.len(),
            "{} bytes pending after a {}-byte chunk",
            d.pending(),
            chunk.len()
        );
        drain_frames(&mut d, stream.get(..pushed).unwrap_or(&[]), out, deep);
    }
}

/// The `frames` target: `data[0]` and `data[1]` choose chunk sizes
/// ([`frame_chunks`]), the rest is fed to a [`FrameDecoder`] in those chunks.
///
/// Checks: no panic; allocation linear in the input; every call makes
/// progress (an error skips at least one byte, `Ok(None)` waits for at most
/// one frame); `pending()` never exceeds `MAX_PAYLOAD` + header + the last
/// chunk; each decoded frame is exactly `encode_frame(kind, payload)` at its
/// offset, its message survives a JSON round trip, its records header
/// re-encodes; the frames (and every error but `BadMagic`, whose count
/// depends on how much garbage had arrived) do not depend on the chunking.
pub fn fuzz_check_frames(data: &[u8]) {
    let [mode, seed, stream @ ..] = data else {
        return;
    };
    let chunks = frame_chunks(*mode, *seed, stream.len());
    let mut chunked = Vec::with_capacity(stream.len() + 1);
    let ((), peak) = peak_alloc(|| decode(stream, &chunks, true, &mut chunked));
    assert_alloc_bound("frame decoding", peak, stream.len(), 64);
    let mut whole = Vec::with_capacity(stream.len() + 1);
    decode(stream, &[stream.len()], false, &mut whole);
    let essential = |v: &[Result<RawFrame, FrameError>]| -> Vec<Result<RawFrame, FrameError>> {
        v.iter()
            .filter(|r| !matches!(r, Err(FrameError::BadMagic { .. })))
            .cloned()
            .collect()
    };
    assert_eq!(
        essential(&chunked),
        essential(&whole),
        "decoding depends on chunking ({chunks:?})"
    );
}

// ---------------------------------------------------------------------------
// analyse

/// Bounds-checked reads of fuzz input; past the end everything is 0.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.bytes(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn str(&mut self) -> String {
        let n = usize::from(self.u8() % 64);
        String::from_utf8_lossy(self.bytes(n)).into_owned()
    }

    fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

const RING_SIZES: [u64; 4] = [64 * 1024, 4096, 8192, 0];
const PROG_HAS_FUNC_TAGS: u8 = 1;
const PROG_SHORT_LENS: u8 = 2;
const EV_STRAY_STREAM: u8 = 4;
const EV_KSYMBOL_WATCH: u8 = 8;

fn entry(addr: u64, name: String) -> KallsymsEntry {
    KallsymsEntry {
        addr,
        kind: 't',
        name,
        module: Some("bpf".into()),
    }
}

/// The small [`RunEvidence`] the `analyse` target builds from its input:
///
/// ```text
/// u8  bits 0-1: listener count (0-3); bit 2: a stream for an unreported listener
/// per listener: u8 index % 4, u8 cpu (% 5 - 1), u8 records selector,
///               u8 flags (bit 0: no ksymbol, bit 1: no bpf_event, bits 2-3: ring size)
/// u8  online CPU mask (bits 0-3)
/// u8  program count % 3
/// per program: str label, str name, u32 id, [8] tag, u8 prog_type,
///              u8 functions % 4, u8 flags (bit 0: func_tags, bit 1: one len short),
///              per function: u64 addr, u32 len, [8] func tag
///              u8 kallsyms % 5, per entry: u64 addr, str name
/// u8  initial kallsyms % 4, per entry: u64 addr, str name
/// if head bit 3 (a ksymbol watch): u8 observations % 8, per observation:
///              u8 ksym_type, u8 flags (bit 0: unregister, bits 1-2: listed
///              none / yes / no, bit 3: bpf_snprintf failed), u64 addr,
///              u32 len, str name, str symbolized; then u8 dropped
/// per listener but the last: u16 stream length, bytes; the last: the rest
/// ```
///
/// `str` is a length byte (% 64) and that many bytes (lossy UTF-8); reads
/// past the end give zeros.
pub fn analyse_evidence(data: &[u8]) -> RunEvidence {
    let mut inp = Input { data };
    let head = inp.u8();
    let nl = usize::from(head & 3);
    let mut ev = RunEvidence::default();
    for _ in 0..nl {
        let index = u32::from(inp.u8() % 4);
        let cpu = i32::from(inp.u8() % 5) - 1;
        let mut l = records_listener(inp.u8());
        let flags = inp.u8();
        l.index = index;
        l.cpu = cpu;
        l.ksymbol = flags & 1 == 0;
        l.bpf_event = flags & 2 == 0;
        l.ring_bytes = RING_SIZES[usize::from((flags >> 2) & 3)];
        ev.listeners.push(l);
    }
    let online = inp.u8();
    ev.online_cpus = (0..4).filter(|c| online & (1 << c) != 0).collect();
    let np = inp.u8() % 3;
    for _ in 0..np {
        ev.progs.push(read_prog(&mut inp));
    }
    let ni = inp.u8() % 4;
    for _ in 0..ni {
        let addr = inp.u64();
        ev.initial_kallsyms.push(entry(addr, inp.str()));
    }
    if head & EV_KSYMBOL_WATCH != 0 {
        ev.ksymbol_watch = Some(read_ksymbol_watch(&mut inp));
    }
    let indexes: Vec<u32> = ev.listeners.iter().map(|l| l.index).collect();
    for (k, idx) in indexes.iter().enumerate() {
        let bytes = if k + 1 == indexes.len() {
            inp.rest()
        } else {
            let n = usize::from(inp.u16());
            inp.bytes(n)
        };
        ev.streams.entry(*idx).or_default().extend_from_slice(bytes);
    }
    if head & EV_STRAY_STREAM != 0 {
        ev.streams.entry(7).or_default();
    }
    ev
}

/// One program of an `analyse` input (see [`analyse_evidence`]).
fn read_prog(inp: &mut Input<'_>) -> ProgFacts {
    let label = inp.str();
    let name = inp.str();
    let id = inp.u32();
    let tag = inp.array::<8>();
    let prog_type = u32::from(inp.u8());
    let nf = inp.u8() % 4;
    let flags = inp.u8();
    let mut p = ProgFacts {
        label,
        id,
        tag,
        name,
        prog_type,
        jited_ksyms: Vec::new(),
        jited_func_lens: Vec::new(),
        func_tags: Vec::new(),
        func_names: Vec::new(),
        kallsyms: Vec::new(),
    };
    for _ in 0..nf {
        p.jited_ksyms.push(inp.u64());
        p.jited_func_lens.push(inp.u32());
        let t = inp.array::<8>();
        if flags & PROG_HAS_FUNC_TAGS != 0 {
            p.func_tags.push(t);
        }
    }
    if flags & PROG_SHORT_LENS != 0 {
        p.jited_func_lens.pop();
    }
    let nk = inp.u8() % 5;
    for _ in 0..nk {
        let addr = inp.u64();
        p.kallsyms.push(entry(addr, inp.str()));
    }
    p
}

/// The ksymbol watch of an `analyse` input (see [`analyse_evidence`]).
fn read_ksymbol_watch(inp: &mut Input<'_>) -> KsymbolWatchEvidence {
    let n = inp.u8() % 8;
    let mut observations = Vec::new();
    for _ in 0..n {
        let ksym_type = u16::from(inp.u8());
        let flags = inp.u8();
        let addr = inp.u64();
        let len = inp.u32();
        let name = inp.str();
        let symbolized = inp.str();
        observations.push(KsymbolObservation {
            ksym_type,
            unregister: flags & 1 != 0,
            addr,
            len,
            snprintf_ret: if flags & 8 != 0 {
                -22
            } else {
                symbolized.len() as i64
            },
            name,
            symbolized,
            listed: match (flags >> 1) & 3 {
                1 => Some(true),
                2 => Some(false),
                _ => None,
            },
        });
    }
    KsymbolWatchEvidence {
        observations,
        dropped: u64::from(inp.u8()),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = s.as_bytes();
    let b = b.get(..63).unwrap_or(b);
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

/// The `analyse` input closest to `ev` (inverse of [`analyse_evidence`] for
/// evidence within its limits; more listeners, programs, functions or
/// kallsyms entries than it holds are dropped), for seeding.
pub fn encode_analyse_input(ev: &RunEvidence) -> Vec<u8> {
    let mut out = Vec::new();
    let ls: Vec<&ListenerInfo> = ev.listeners.iter().take(3).collect();
    let stray = ev
        .streams
        .keys()
        .any(|k| !ev.listeners.iter().any(|l| l.index == *k));
    out.push(
        ls.len() as u8
            | if stray { EV_STRAY_STREAM } else { 0 }
            | if ev.ksymbol_watch.is_some() {
                EV_KSYMBOL_WATCH
            } else {
                0
            },
    );
    for l in &ls {
        out.push((l.index % 4) as u8);
        out.push((l.cpu.clamp(-1, 3) + 1) as u8);
        out.push(records_selector(l));
        let ring = RING_SIZES
            .iter()
            .position(|r| *r == l.ring_bytes)
            .unwrap_or(0) as u8;
        out.push(u8::from(!l.ksymbol) | u8::from(!l.bpf_event) << 1 | ring << 2);
    }
    let mask = ev
        .online_cpus
        .iter()
        .filter(|c| **c < 4)
        .fold(0u8, |m, c| m | 1 << c);
    out.push(mask);
    let ps: Vec<&ProgFacts> = ev.progs.iter().take(2).collect();
    out.push(ps.len() as u8);
    for p in ps {
        put_prog(&mut out, p);
    }
    let init: Vec<&KallsymsEntry> = ev.initial_kallsyms.iter().take(3).collect();
    out.push(init.len() as u8);
    for k in init {
        out.extend_from_slice(&k.addr.to_le_bytes());
        put_str(&mut out, &k.name);
    }
    if let Some(w) = &ev.ksymbol_watch {
        put_ksymbol_watch(&mut out, w);
    }
    for (k, l) in ls.iter().enumerate() {
        let bytes = ev.streams.get(&l.index).map(Vec::as_slice).unwrap_or(&[]);
        if k + 1 == ls.len() {
            out.extend_from_slice(bytes);
        } else {
            let bytes = bytes.get(..usize::from(u16::MAX)).unwrap_or(bytes);
            out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out
}

/// One program, as [`read_prog`] reads it.
fn put_prog(out: &mut Vec<u8>, p: &ProgFacts) {
    put_str(out, &p.label);
    put_str(out, &p.name);
    out.extend_from_slice(&p.id.to_le_bytes());
    out.extend_from_slice(&p.tag);
    out.push(p.prog_type as u8);
    let nf = p.jited_ksyms.len().min(3);
    out.push(nf as u8);
    let mut flags = 0;
    if !p.func_tags.is_empty() {
        flags |= PROG_HAS_FUNC_TAGS;
    }
    if p.jited_func_lens.len() < p.jited_ksyms.len() {
        flags |= PROG_SHORT_LENS;
    }
    out.push(flags);
    for fi in 0..nf {
        out.extend_from_slice(&p.jited_ksyms[fi].to_le_bytes());
        out.extend_from_slice(
            &p.jited_func_lens
                .get(fi)
                .copied()
                .unwrap_or(0)
                .to_le_bytes(),
        );
        out.extend_from_slice(&p.func_tags.get(fi).copied().unwrap_or_default());
    }
    let ks: Vec<&KallsymsEntry> = p.kallsyms.iter().take(4).collect();
    out.push(ks.len() as u8);
    for k in ks {
        out.extend_from_slice(&k.addr.to_le_bytes());
        put_str(out, &k.name);
    }
}

/// The ksymbol watch, as [`read_ksymbol_watch`] reads it.
fn put_ksymbol_watch(out: &mut Vec<u8>, w: &KsymbolWatchEvidence) {
    let os: Vec<&KsymbolObservation> = w.observations.iter().take(7).collect();
    out.push(os.len() as u8);
    for o in os {
        out.push(o.ksym_type as u8);
        let listed = match o.listed {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        };
        out.push(u8::from(o.unregister) | listed << 1 | u8::from(o.snprintf_ret < 0) << 3);
        out.extend_from_slice(&o.addr.to_le_bytes());
        out.extend_from_slice(&o.len.to_le_bytes());
        put_str(out, &o.name);
        put_str(out, &o.symbolized);
    }
    out.push(w.dropped.min(255) as u8);
}

/// The `analyse` target: the judge's one door ([`kloop_judge::judge`],
/// every rule family, with every check a kernel can be built with
/// expected) and [`normalise::normalise`] over the evidence
/// [`analyse_evidence`] builds from `data`.
///
/// Checks: no panic; allocation linear in the input; every violation names a
/// rule the ledger knows ([`kloop_judge::known_issues::rule_names`]); each listener's records are what
/// `parse_prefix` gives for its stream; the merged stream holds every record
/// of the first CPU-wide set; `lost` is the sum of LOST records;
/// normalisation is deterministic.
pub fn fuzz_check_analyse(data: &[u8]) {
    let ev = analyse_evidence(data);
    let ((a, text), peak) = peak_alloc(|| {
        let a = kloop_judge::judge(&kloop_judge::Inputs {
            evidence: &ev,
            scenario: None,
            kernel_checks: kloop_judge::kernel_log::KernelChecks::from_config(|_| true),
            perf_file: None,
        })
        .analysis;
        let text = normalise::normalise(&ev, &a);
        (a, text)
    });
    assert_alloc_bound("analyse + normalise", peak, data.len(), 1024);
    let rules = kloop_judge::known_issues::rule_names();
    for v in &a.violations {
        assert!(rules.contains(&v.rule), "unknown rule {}", v.rule);
        let _ = v.to_string();
    }
    let indexes: BTreeSet<u32> = ev.listeners.iter().map(|l| l.index).collect();
    let keys: BTreeSet<u32> = a.records_per_listener.keys().copied().collect();
    assert_eq!(keys, indexes, "records for exactly the reported listeners");
    let mut first: BTreeMap<u32, &ListenerInfo> = BTreeMap::new();
    for l in &ev.listeners {
        first.entry(l.index).or_insert(l);
    }
    let mut lost = 0u64;
    for (idx, l) in &first {
        let bytes = ev.streams.get(idx).map(Vec::as_slice).unwrap_or(&[]);
        let (recs, _) = parse_prefix(l, bytes);
        for r in &recs {
            if let RecordBody::Lost { lost: n, .. } = r.body {
                lost = lost.saturating_add(n);
            }
        }
        assert_eq!(a.records_per_listener.get(idx), Some(&recs));
    }
    assert_eq!(a.lost, lost, "lost total");
    let in_set0: usize = a
        .sets
        .first()
        .map(|s| {
            s.iter()
                .map(|i| a.records_per_listener.get(i).map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0);
    assert_eq!(
        a.merged.len(),
        in_set0,
        "merged holds the first set's records"
    );
    for s in &a.sets {
        let cpus: BTreeSet<i32> = s
            .iter()
            .filter_map(|i| first.get(i))
            .map(|l| l.cpu)
            .collect();
        assert_eq!(cpus.len(), s.len(), "a set has one listener per CPU");
    }
    assert!(text.starts_with("# kloop normalised record stream\n"));
    assert_eq!(
        text,
        normalise::normalise(&ev, &a),
        "normalise is deterministic"
    );
}

// ---------------------------------------------------------------------------
// seeds

/// One seed input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// `records`, `frames` or `analyse`.
    pub target: &'static str,
    /// File name under `fuzz/seeds/<target>/`.
    pub name: String,
    pub bytes: Vec<u8>,
}

/// A fuzz target's check function.
pub type CheckFn = fn(&[u8]);

/// The fuzz targets, with their check functions.
pub const TARGETS: [(&str, CheckFn); 3] = [
    ("records", fuzz_check_records),
    ("frames", fuzz_check_frames),
    ("analyse", fuzz_check_analyse),
];

/// One recorded run: its messages and each listener's raw ring bytes.
/// Raw ring bytes per listener index.
type Streams = BTreeMap<u32, Vec<u8>>;

fn read_run(dir: &Path) -> std::io::Result<(Vec<Message>, Streams)> {
    let text = std::fs::read_to_string(dir.join("messages.jsonl"))?;
    let mut messages = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let m: Message = serde_json::from_str(line)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", dir.display())))?;
        messages.push(m);
    }
    let mut streams = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(idx) = name
            .strip_prefix("records-")
            .and_then(|n| n.strip_suffix(".bin"))
            .and_then(|n| n.parse::<u32>().ok())
        {
            streams.insert(idx, std::fs::read(&p)?);
        }
    }
    Ok((messages, streams))
}

/// Listener selectors the `records` seeds are re-encoded for, besides each
/// real listener's own: no trailer, every trailer field, ids only, and
/// TID|TIME|CPU plus bits that select nothing.
const SEED_SELECTORS: [u8; 4] = [
    SEL_NO_SAMPLE_ID_ALL,
    0b11_1111,
    0b10_0100,
    SEL_NON_TRAILER | 0b1_0011,
];

/// The seed corpora, built from the recorded runs under `real_dir`
/// (`harness/src/testdata/real/`): each stream as recorded and re-encoded for
/// other listener layouts (`records`); each run's frame stream as the guest
/// would send it, and a short one (`frames`); each run's evidence
/// (`analyse`). Sorted and without duplicate contents.
pub fn seeds(real_dir: &Path) -> std::io::Result<Vec<Seed>> {
    let mut dirs: Vec<_> = std::fs::read_dir(real_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("messages.jsonl").is_file())
        .collect();
    dirs.sort();
    let mut out: Vec<Seed> = Vec::new();
    let mut push = |target: &'static str, name: String, bytes: Vec<u8>| {
        if !out.iter().any(|s| s.target == target && s.bytes == bytes) {
            out.push(Seed {
                target,
                name,
                bytes,
            });
        }
    };
    for dir in dirs {
        let run = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (messages, streams) = read_run(&dir)?;
        let ev = RunEvidence::from_messages(&messages, streams.clone());

        for l in &ev.listeners {
            let Some(bytes) = ev.streams.get(&l.index).filter(|b| !b.is_empty()) else {
                continue;
            };
            let mut seed = vec![records_selector(l)];
            seed.extend_from_slice(bytes);
            push("records", format!("{run}-L{}", l.index), seed);
            let Ok(recs) = parse_stream(l, bytes) else {
                continue;
            };
            for sel in SEED_SELECTORS {
                let mut seed = vec![sel];
                seed.extend(reencode(&recs, sel));
                push("records", format!("{run}-L{}-sel{sel:02x}", l.index), seed);
            }
        }

        let stream = frame_stream(&messages, &streams);
        let mut seed = vec![3, 0];
        seed.extend_from_slice(&stream);
        push("frames", format!("{run}-run"), seed);
        // Short: hello, one records frame (with a byte-by-byte chunking), done.
        let mut seed = vec![0, 0];
        if let Some(hello) = messages.first() {
            seed.extend(hello.to_frame());
        }
        if let Some((idx, bytes)) = streams.iter().find(|(_, b)| !b.is_empty()) {
            for f in records_frames(*idx, 0, bytes) {
                seed.extend(f);
            }
        }
        seed.extend(Message::Done { records_bytes: 0 }.to_frame());
        push("frames", format!("{run}-short"), seed);

        push(
            "analyse",
            format!("{run}-evidence"),
            encode_analyse_input(&ev),
        );
    }
    out.sort_by(|a, b| (a.target, &a.name).cmp(&(b.target, &b.name)));
    Ok(out)
}

/// `recs` encoded again for the listener `selector` describes, with fixed
/// ids in the trailer fields the recording's listener may not have had.
fn reencode(recs: &[Record], selector: u8) -> Vec<u8> {
    let to = records_listener(selector);
    let mut bytes = Vec::new();
    for r in recs {
        let s = SampleId {
            id: Some(0x77),
            stream_id: Some(0x78),
            identifier: Some(0x77),
            cpu_res: Some(0),
            ..r.sample
        };
        if let Some(b) = encode_record(&to, r.header.misc, &r.body, &s) {
            bytes.extend(b);
        }
    }
    bytes
}

/// A run's frame stream as the guest sends it: messages in order, the
/// rings drained before `done`.
fn frame_stream(messages: &[Message], streams: &Streams) -> Vec<u8> {
    let mut records: Vec<u8> = Vec::new();
    for (idx, bytes) in streams {
        for f in records_frames(*idx, 0, bytes) {
            records.extend(f);
        }
    }
    let mut stream = Vec::new();
    let mut placed = false;
    for m in messages {
        if matches!(m, Message::Done { .. }) && !placed {
            stream.extend_from_slice(&records);
            placed = true;
        }
        stream.extend(m.to_frame());
    }
    if !placed {
        stream.extend_from_slice(&records);
    }
    stream
}
