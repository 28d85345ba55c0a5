// SPDX-License-Identifier: GPL-2.0
// kloop fixture "nobtf": a socket filter calling one BPF-to-BPF subprogram,
// compiled without -g (build.rs), so the object has no .BTF and the program
// is loaded without func_info. bpf_prog_ksym_set_name() (kernel/bpf/core.c)
// then names the main function after the program name (aux->name) and the
// subprogram after the "F" jit_subprogs() (kernel/bpf/verifier.c) gives it.

#define SEC(name) __attribute__((section(name), used))
#define NOINLINE static __attribute__((noinline))

struct __sk_buff {
	unsigned int len;
};

// Depends on runtime input so that clang keeps the call.
NOINLINE unsigned int kloop_nobtf_sub(unsigned int x)
{
	return (x * 2654435761u) ^ (x >> 5);
}

SEC("socket")
int kloop_nobtf(struct __sk_buff *skb)
{
	return (int)kloop_nobtf_sub(skb->len);
}

char _license[] SEC("license") = "GPL";
