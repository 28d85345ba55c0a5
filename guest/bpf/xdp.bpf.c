// SPDX-License-Identifier: GPL-2.0
// kloop fixture "xdp": one XDP program that passes every packet.
// Attached in native mode to a veth device it makes the kernel route XDP
// calls through the XDP dispatcher (kernel/bpf/dispatcher.c), whose
// generated code is announced as the `bpf_dispatcher_xdp` KSYMBOL.

#define SEC(name) __attribute__((section(name), used))

// Only the first fields of the real `struct xdp_md` (uapi/linux/bpf.h);
// the verifier checks ctx accesses by offset, and the name matches the
// kernel's ctx type for BTF.
struct xdp_md {
	unsigned int data;
	unsigned int data_end;
};

#define XDP_PASS 2
#define XDP_DROP 1

SEC("xdp")
int kloop_xdp(struct xdp_md *ctx)
{
	// Drops empty frames, passes the rest: a real decision on the ctx.
	return ctx->data_end > ctx->data ? XDP_PASS : XDP_DROP;
}

char _license[] SEC("license") = "GPL";
