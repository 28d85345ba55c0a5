// SPDX-License-Identifier: GPL-2.0
// kloop fixture "probes": a kprobe and a kretprobe, each counting its runs
// in an array map. Where they attach is the scenario's attach step.
// Self-contained on purpose: no libbpf or kernel headers.

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_ARRAY 2

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, unsigned int);
	__type(value, unsigned long long);
} counts SEC(".maps");

// Helper 1 in uapi/linux/bpf.h.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

static __attribute__((always_inline)) void bump(unsigned int slot)
{
	unsigned long long *v = bpf_map_lookup_elem(&counts, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("kprobe")
int kloop_kprobe(void *ctx)
{
	bump(0);
	return 0;
}

SEC("kretprobe")
int kloop_kretprobe(void *ctx)
{
	bump(1);
	return 0;
}

char _license[] SEC("license") = "GPL";
