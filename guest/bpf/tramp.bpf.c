// SPDX-License-Identifier: GPL-2.0
// kloop fixture "tramp": fentry, fexit and LSM programs, each counting its
// runs in an array map. Their attach targets are chosen by the scenario's
// load step (`btf_target`), so the sections carry no function name.
// Self-contained on purpose: no libbpf or kernel headers.

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

#define BPF_MAP_TYPE_ARRAY 2

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
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

SEC("fentry")
int kloop_fentry(unsigned long long *ctx)
{
	bump(0);
	return 0;
}

SEC("fexit")
int kloop_fexit(unsigned long long *ctx)
{
	bump(1);
	return 0;
}

// An LSM program must return 0 or a negative errno; 0 lets everything pass.
SEC("lsm")
int kloop_lsm(unsigned long long *ctx)
{
	bump(2);
	return 0;
}

char _license[] SEC("license") = "GPL";
