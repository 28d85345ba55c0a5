// SPDX-License-Identifier: GPL-2.0
// kloop fixture "basic": one socket filter, no subprograms.
// Self-contained on purpose: no libbpf or kernel headers.

#define SEC(name) __attribute__((section(name), used))

// Only the first field of the real `struct __sk_buff` (uapi/linux/bpf.h);
// the verifier checks ctx accesses by offset, and the name matches the
// kernel's ctx type for BTF.
struct __sk_buff {
	unsigned int len;
};

SEC("socket")
int kloop_basic(struct __sk_buff *skb)
{
	return skb->len > 64 ? 0 : -1;
}

char _license[] SEC("license") = "GPL";
