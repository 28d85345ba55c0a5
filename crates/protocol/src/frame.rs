//! Length-prefixed, checksummed frames.

use std::fmt;

pub const MAGIC: [u8; 4] = *b"KLF1";
pub const HEADER_LEN: usize = 16;
/// Largest payload a frame may announce; anything bigger is corruption, and
/// refusing it keeps the decoder's memory bounded.
pub const MAX_PAYLOAD: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Message = 1,
    Records = 2,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(FrameKind::Message),
            2 => Some(FrameKind::Records),
            _ => None,
        }
    }
}

fn checksum(kind: u8, len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind]);
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Encodes one frame.
pub fn encode_frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= MAX_PAYLOAD, "frame payload too large");
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(kind as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum(kind as u8, len, payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A decoded frame and where it started in the byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    pub kind: FrameKind,
    pub payload: Vec<u8>,
    /// Offset of the frame's first byte in the whole stream.
    pub offset: u64,
}

/// A violation of the framing, with the stream offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    BadMagic {
        offset: u64,
        found: [u8; 4],
    },
    UnknownKind {
        offset: u64,
        kind: u8,
    },
    /// The three pad bytes after the kind are not zero (the CRC does not
    /// cover them, so this is the only check that catches their corruption).
    BadPadding {
        offset: u64,
        pad: [u8; 3],
    },
    TooLong {
        offset: u64,
        len: u32,
    },
    Checksum {
        offset: u64,
        expected: u32,
        found: u32,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadMagic { offset, found } => write!(
                f,
                "no frame magic at stream offset {offset}: found bytes {found:02x?}"
            ),
            FrameError::UnknownKind { offset, kind } => {
                write!(f, "unknown frame kind {kind} at stream offset {offset}")
            }
            FrameError::BadPadding { offset, pad } => write!(
                f,
                "frame at stream offset {offset} has non-zero pad bytes {pad:02x?}"
            ),
            FrameError::TooLong { offset, len } => write!(
                f,
                "frame at stream offset {offset} announces {len} payload bytes (limit {MAX_PAYLOAD})"
            ),
            FrameError::Checksum {
                offset,
                expected,
                found,
            } => write!(
                f,
                "checksum mismatch in frame at stream offset {offset}: header says {expected:#010x}, payload hashes to {found:#010x}"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// Incremental decoder: feed it bytes as they arrive, take frames out.
///
/// After an error it skips ahead to the next magic so that one corrupt frame
/// is reported once instead of poisoning the rest of the stream.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Stream offset of `buf[0]`.
    base: u64,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet consumed as a frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Total bytes consumed so far.
    pub fn consumed(&self) -> u64 {
        self.base
    }

    fn skip(&mut self, n: usize) {
        self.buf.drain(..n);
        self.base += n as u64;
    }

    /// Drops bytes up to the next possible magic (at least one byte).
    fn resync(&mut self) {
        let next = self.buf[1..]
            .windows(MAGIC.len())
            .position(|w| w == MAGIC)
            .map(|p| p + 1)
            .unwrap_or(self.buf.len().saturating_sub(MAGIC.len() - 1).max(1));
        self.skip(next);
    }

    /// Gives up on the frame at the head of the buffer (one that can never
    /// complete because the stream has ended) and skips to the next magic
    /// after its first byte, so frames written over it can still be read.
    pub fn abandon_head(&mut self) {
        if !self.buf.is_empty() {
            self.resync();
        }
    }

    /// Returns the next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<RawFrame>, FrameError> {
        if self.buf.len() < MAGIC.len() {
            return Ok(None);
        }
        let offset = self.base;
        if self.buf[..4] != MAGIC {
            let found = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
            self.resync();
            return Err(FrameError::BadMagic { offset, found });
        }
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let kind_byte = self.buf[4];
        let len = u32::from_le_bytes(self.buf[8..12].try_into().unwrap());
        let expected = u32::from_le_bytes(self.buf[12..16].try_into().unwrap());
        let Some(kind) = FrameKind::from_u8(kind_byte) else {
            self.resync();
            return Err(FrameError::UnknownKind {
                offset,
                kind: kind_byte,
            });
        };
        let pad = [self.buf[5], self.buf[6], self.buf[7]];
        if pad != [0; 3] {
            self.resync();
            return Err(FrameError::BadPadding { offset, pad });
        }
        if len as usize > MAX_PAYLOAD {
            self.resync();
            return Err(FrameError::TooLong { offset, len });
        }
        let total = HEADER_LEN + len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let payload = &self.buf[HEADER_LEN..total];
        let found = checksum(kind_byte, len, payload);
        if found != expected {
            self.resync();
            return Err(FrameError::Checksum {
                offset,
                expected,
                found,
            });
        }
        let payload = payload.to_vec();
        self.skip(total);
        Ok(Some(RawFrame {
            kind,
            payload,
            offset,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<Result<RawFrame, FrameError>> {
        let mut d = FrameDecoder::new();
        d.push(bytes);
        let mut out = Vec::new();
        loop {
            match d.next_frame() {
                Ok(Some(f)) => out.push(Ok(f)),
                Ok(None) => break,
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    #[test]
    fn round_trip_byte_by_byte() {
        let mut stream = encode_frame(FrameKind::Message, b"{\"msg\":\"x\"}");
        stream.extend(encode_frame(FrameKind::Records, &[7u8; 300]));
        let mut d = FrameDecoder::new();
        let mut frames = Vec::new();
        for b in &stream {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].kind, FrameKind::Message);
        assert_eq!(frames[0].offset, 0);
        assert_eq!(frames[1].kind, FrameKind::Records);
        assert_eq!(frames[1].payload, vec![7u8; 300]);
        assert_eq!(frames[1].offset, 16 + 11);
        assert_eq!(d.pending(), 0);
    }

    #[test]
    fn corrupt_payload_is_reported_and_stream_recovers() {
        let mut stream = encode_frame(FrameKind::Message, b"hello");
        stream[HEADER_LEN + 1] ^= 0xff;
        let second_at = stream.len() as u64;
        stream.extend(encode_frame(FrameKind::Message, b"world"));
        let out = decode_all(&stream);
        assert!(matches!(
            out[0],
            Err(FrameError::Checksum { offset: 0, .. })
        ));
        let last = out.last().unwrap().as_ref().unwrap();
        assert_eq!(last.payload, b"world");
        assert_eq!(last.offset, second_at);
    }

    #[test]
    fn absurd_length_is_refused_without_buffering() {
        let mut stream = encode_frame(FrameKind::Message, b"x");
        stream[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let out = decode_all(&stream);
        assert!(matches!(
            out[0],
            Err(FrameError::TooLong {
                offset: 0,
                len: u32::MAX
            })
        ));
    }

    #[test]
    fn garbage_before_first_frame_names_offset() {
        let mut stream = b"\r\nnoise".to_vec();
        stream.extend(encode_frame(FrameKind::Records, b"abc"));
        let out = decode_all(&stream);
        assert!(matches!(
            out[0],
            Err(FrameError::BadMagic { offset: 0, .. })
        ));
        assert_eq!(out.last().unwrap().as_ref().unwrap().payload, b"abc");
    }

    #[test]
    fn truncated_frames_wait_for_more_bytes() {
        let frame = encode_frame(FrameKind::Records, &[5u8; 100]);
        for cut in [1, MAGIC.len(), HEADER_LEN - 1, HEADER_LEN, frame.len() - 1] {
            let mut d = FrameDecoder::new();
            d.push(&frame[..cut]);
            assert_eq!(d.next_frame(), Ok(None), "cut at {cut}");
            assert_eq!((d.pending(), d.consumed()), (cut, 0));
            d.push(&frame[cut..]);
            let f = d.next_frame().unwrap().expect("complete now");
            assert_eq!(f.payload, vec![5u8; 100]);
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn wrong_checksum_field_names_the_offset() {
        let first = encode_frame(FrameKind::Message, b"{}");
        let mut stream = first.clone();
        let mut bad = encode_frame(FrameKind::Message, b"{}");
        bad[12] ^= 1;
        stream.extend(&bad);
        let out = decode_all(&stream);
        assert!(out[0].is_ok());
        match &out[1] {
            Err(e @ FrameError::Checksum { offset, .. }) => {
                assert_eq!(*offset, first.len() as u64);
                assert!(e
                    .to_string()
                    .contains(&format!("stream offset {}", first.len())));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn largest_payload_passes_one_more_byte_is_refused() {
        let max = vec![0xa5u8; MAX_PAYLOAD];
        let out = decode_all(&encode_frame(FrameKind::Records, &max));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ref().unwrap().payload.len(), MAX_PAYLOAD);
        let mut header = encode_frame(FrameKind::Records, b"");
        header[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        let mut d = FrameDecoder::new();
        d.push(&header);
        // Refused from the header alone: no payload is ever awaited.
        assert!(matches!(
            d.next_frame(),
            Err(FrameError::TooLong { offset: 0, .. })
        ));
    }

    /// xorshift: deterministic noise without a dependency.
    fn noise(len: usize, mut x: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Feeds `stream` in `chunk`-byte reads the way the host does (decode
    /// everything after each read) and returns the most the decoder held.
    fn peak_pending(stream: &[u8], chunk: usize) -> (usize, usize, usize) {
        let mut d = FrameDecoder::new();
        let (mut peak, mut frames, mut errors) = (0, 0, 0);
        for c in stream.chunks(chunk) {
            d.push(c);
            loop {
                match d.next_frame() {
                    Ok(Some(_)) => frames += 1,
                    Ok(None) => break,
                    Err(_) => errors += 1,
                }
            }
            peak = peak.max(d.pending());
            assert_eq!(d.consumed() + d.pending() as u64, {
                let end = c.as_ptr() as usize + c.len() - stream.as_ptr() as usize;
                end as u64
            });
        }
        (peak, frames, errors)
    }

    #[test]
    fn memory_stays_bounded_by_one_frame() {
        // Largest frames back to back, read in 64 KiB pieces.
        let mut stream = Vec::new();
        for i in 0..3u8 {
            stream.extend(encode_frame(FrameKind::Records, &vec![i; MAX_PAYLOAD]));
        }
        let (peak, frames, errors) = peak_pending(&stream, 64 * 1024);
        assert_eq!((frames, errors), (3, 0));
        assert!(peak < HEADER_LEN + MAX_PAYLOAD, "peak {peak}");
        // Megabytes of noise never accumulate: each read resyncs past it.
        let junk = noise(8 << 20, 0x9e37_79b9_7f4a_7c15);
        let (peak, _, errors) = peak_pending(&junk, 64 * 1024);
        assert!(errors > 0);
        assert!(peak < HEADER_LEN + MAX_PAYLOAD, "peak {peak}");
        // A header promising the largest payload, then noise: held while it
        // could still be a frame, never more.
        let mut stream = encode_frame(FrameKind::Records, b"");
        stream[8..12].copy_from_slice(&(MAX_PAYLOAD as u32).to_le_bytes());
        stream.extend(noise(3 << 20, 7));
        let (peak, _, errors) = peak_pending(&stream, 64 * 1024);
        assert!(errors > 0, "the checksum must fail");
        assert!(peak < HEADER_LEN + MAX_PAYLOAD + 64 * 1024, "peak {peak}");
    }

    #[test]
    fn noise_between_frames_never_panics_and_frames_survive() {
        let mut stream = Vec::new();
        let mut expect = Vec::new();
        for i in 0..50u64 {
            stream.extend(noise((i as usize * 37) % 300, i + 1));
            let payload = noise(i as usize * 11, i + 1000);
            expect.push(payload.clone());
            stream.extend(encode_frame(FrameKind::Records, &payload));
        }
        for chunk in [1, 7, 4096] {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                d.push(c);
                loop {
                    match d.next_frame() {
                        Ok(Some(f)) => got.push(f.payload),
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
            }
            assert_eq!(got, expect, "chunk {chunk}");
        }
    }

    #[test]
    fn nonzero_padding_is_an_error() {
        let mut stream = encode_frame(FrameKind::Message, b"x");
        stream[6] = 8;
        let out = decode_all(&stream);
        assert!(matches!(
            out[0],
            Err(FrameError::BadPadding {
                offset: 0,
                pad: [0, 8, 0]
            })
        ));
    }

    #[test]
    fn unknown_kind_is_an_error() {
        let mut stream = encode_frame(FrameKind::Message, b"x");
        stream[4] = 9;
        let out = decode_all(&stream);
        assert!(matches!(
            out[0],
            Err(FrameError::UnknownKind { offset: 0, kind: 9 })
        ));
    }
}
