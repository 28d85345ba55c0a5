//! `cargo fuzz run analyse`: see `kloop_fuzz_support::fuzz_check_analyse`.
#![no_main]

use kloop_fuzz_support::{fuzz_check_analyse, CountingAlloc};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fuzz_target!(|data: &[u8]| fuzz_check_analyse(data));
