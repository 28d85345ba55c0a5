//! kloop: kernel-in-the-loop tests of the KSYMBOL / BPF_EVENT record stream.
pub mod evidence;
pub mod kernel;
