// SPDX-License-Identifier: GPL-2.0
// kloop fixture "subprogs": one socket filter calling two distinct BPF-to-BPF
// subprograms, so the JIT emits three functions (main + 2 subprogs) and the
// kernel registers three KSYMBOLs.

#define SEC(name) __attribute__((section(name), used))
#define NOINLINE static __attribute__((noinline))

struct __sk_buff {
	unsigned int len;
};

// The bodies differ and depend on runtime input, so clang can neither fold
// the two functions into one nor constant-propagate their results away.
NOINLINE unsigned int kloop_sub_mix(unsigned int x)
{
	return (x * 2654435761u) ^ (x >> 7);
}

NOINLINE unsigned int kloop_sub_clamp(unsigned int x)
{
	if (x > 1500)
		return 1500;
	return x + 3;
}

SEC("socket")
int kloop_subprogs(struct __sk_buff *skb)
{
	unsigned int len = skb->len;

	return (int)(kloop_sub_mix(len) + kloop_sub_clamp(len));
}

char _license[] SEC("license") = "GPL";
