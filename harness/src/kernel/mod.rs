//! Kernel pins.
