// SPDX-License-Identifier: GPL-2.0
// kloop fixture "longname": a socket filter and one BPF-to-BPF subprogram
// whose names are 400 bytes long. With BTF the kernel names each JITed
// function bpf_prog_<tag>_<BTF name> (bpf_prog_ksym_set_name() in
// kernel/bpf/core.c), 426 bytes here: more than 256, less than the 512 of
// KSYM_NAME_LEN since 6.1, which btf_name_valid_identifier() (kernel/bpf/
// btf.c) also holds a BTF name to. Before 6.1 (KSYM_NAME_LEN 128) the
// kernel refuses this BTF; the scenario needs `long-symbol-names`.

#define SEC(name) __attribute__((section(name), used))
#define NOINLINE static __attribute__((noinline))

struct __sk_buff {
	unsigned int len;
};

// Depends on runtime input so that clang keeps the call.
NOINLINE unsigned int
kloop_long_sub_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmno(unsigned int x)
{
	return (x * 2654435761u) ^ (x >> 3);
}

SEC("socket")
int
kloop_long_main_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmn(struct __sk_buff *skb)
{
	return (int)kloop_long_sub_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmnopqrstuvwxyz0123456789_abcdefghijklmno(skb->len);
}

char _license[] SEC("license") = "GPL";
