//! `check-perf-data`: the KSYMBOL, BPF_EVENT and LOST records of a
//! perf.data written anywhere (a production host, a CI runner), judged with
//! kloop's strict record parser and the rules that need no guest evidence.
//!
//! `linux-perf-data` reads the file (header, attributes, feature sections,
//! records in time order); each side-band record's bytes are put back
//! together (header and body) and parsed by `kloop-records` against the
//! attribute it belongs to, so a `header.size` that does not match the body
//! and that attribute's `sample_id` trailer is a finding, as in kloop's own
//! rings. A record whose `header.size` is larger than its body and trailer
//! by zero bytes is a `header-size` finding (and is judged further at its
//! true size); BPF symbol shape and register/unregister pairing are judged
//! over the time-ordered stream. [`recognise`] marks the findings the
//! ledger explains for the file's kernel release (`[issue.perf_data]`).

mod check;
mod finding;
pub mod generate;
pub mod prog_info;

pub use check::*;
pub use finding::Finding;
