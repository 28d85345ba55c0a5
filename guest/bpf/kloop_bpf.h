// SPDX-License-Identifier: GPL-2.0
// What the kloop fixtures share: the libbpf-style map macros, the one
// helper they call, and an array of per-program run counters. Self-contained
// on purpose: no libbpf or kernel headers. Not a fixture itself (build.rs
// compiles only *.bpf.c).
#ifndef KLOOP_BPF_H
#define KLOOP_BPF_H

#define SEC(name) __attribute__((section(name), used))

// A kprobe's context, as the probed function's arguments are read from it,
// per architecture (build.rs defines __TARGET_ARCH_<arch> from the agent's
// target). KLOOP_PT_REGS_WORDS is the size of `bpf_user_pt_regs_t`, the
// head of uapi `struct bpf_perf_event_data`.
#if defined(__TARGET_ARCH_arm64)
// arch/arm64/include/uapi/asm/ptrace.h `struct user_pt_regs`, the first
// member of the kernel's `struct pt_regs`: arguments in x0..x7.
struct pt_regs {
	unsigned long regs[31];
	unsigned long sp, pc, pstate;
};
#define KLOOP_ARG1(ctx) ((ctx)->regs[0])
#define KLOOP_ARG2(ctx) ((ctx)->regs[1])
#define KLOOP_ARG3(ctx) ((ctx)->regs[2])
#define KLOOP_ARG4(ctx) ((ctx)->regs[3])
#define KLOOP_ARG5(ctx) ((ctx)->regs[4])
#define KLOOP_PT_REGS_WORDS 34
#elif defined(__TARGET_ARCH_x86)
// x86-64 `struct pt_regs`: arguments in di, si, dx, cx, r8.
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
#define KLOOP_ARG1(ctx) ((ctx)->di)
#define KLOOP_ARG2(ctx) ((ctx)->si)
#define KLOOP_ARG3(ctx) ((ctx)->dx)
#define KLOOP_ARG4(ctx) ((ctx)->cx)
#define KLOOP_ARG5(ctx) ((ctx)->r8)
#define KLOOP_PT_REGS_WORDS 21
#else
#error "build.rs defines __TARGET_ARCH_x86 or __TARGET_ARCH_arm64"
#endif
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
