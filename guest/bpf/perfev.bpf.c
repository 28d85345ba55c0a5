// SPDX-License-Identifier: GPL-2.0
// kloop fixture "perfev": a BPF_PROG_TYPE_PERF_EVENT program, run as the
// overflow handler of a sampling event. It stores the event's sample_period
// (read through the context, as the kernel rewrites the access) in slot 0
// and counts its runs in slot 1.
// Self-contained on purpose: no libbpf or kernel headers.

#include "kloop_bpf.h"

// `struct bpf_perf_event_data` (uapi/linux/bpf_perf_event.h): the
// architecture's `bpf_user_pt_regs_t` (21 unsigned longs on x86-64, 34 on
// arm64), then sample_period and addr.
struct bpf_perf_event_data {
	unsigned long regs[KLOOP_PT_REGS_WORDS];
	unsigned long long sample_period;
	unsigned long long addr;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, unsigned int);
	__type(value, unsigned long long);
} samples SEC(".maps");

SEC("perf_event")
int kloop_perf_event(struct bpf_perf_event_data *ctx)
{
	unsigned int period_slot = 0, count_slot = 1;
	unsigned long long *period = bpf_map_lookup_elem(&samples, &period_slot);
	unsigned long long *count = bpf_map_lookup_elem(&samples, &count_slot);

	if (period)
		*period = ctx->sample_period;
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char _license[] SEC("license") = "GPL";
