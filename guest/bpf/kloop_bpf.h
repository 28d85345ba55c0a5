// SPDX-License-Identifier: GPL-2.0
// What the kloop fixtures share: the libbpf-style map macros, the one
// helper they call, and an array of per-program run counters. Self-contained
// on purpose: no libbpf or kernel headers. Not a fixture itself (build.rs
// compiles only *.bpf.c).
#ifndef KLOOP_BPF_H
#define KLOOP_BPF_H

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_ARRAY 2

// Helper 1 in uapi/linux/bpf.h.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

// An array map `counts` of `slots` u64 counters (read by the scenarios'
// `read-counter` steps) and `bump(slot)`, which adds one to a counter.
#define KLOOP_COUNTERS(slots)                                                  \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_ARRAY);                              \
		__uint(max_entries, slots);                                    \
		__type(key, unsigned int);                                     \
		__type(value, unsigned long long);                             \
	} counts SEC(".maps");                                                 \
                                                                               \
	static __attribute__((always_inline)) void bump(unsigned int slot)     \
	{                                                                      \
		unsigned long long *v = bpf_map_lookup_elem(&counts, &slot);   \
                                                                               \
		if (v)                                                         \
			__sync_fetch_and_add(v, 1);                            \
	}

#endif
