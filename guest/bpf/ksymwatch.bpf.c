// SPDX-License-Identifier: GPL-2.0
// kloop fixture "ksymwatch": a kprobe on perf_event_ksymbol(ksym_type, addr,
// len, unregister, sym) that records, for every call, the arguments and how
// the kernel's own symbolizer resolves `addr` at that instant
// (bpf_snprintf "%ps", which goes through kallsyms_lookup and so
// bpf_address_lookup for BPF text). kallsyms prints an address it cannot
// resolve as "0x<hex>" (__sprint_symbol), so the host can tell whether the
// symbol a KSYMBOL record announces was resolvable when it was emitted.
// Needs bpf_snprintf (5.13). The kprobe context is x86-64 pt_regs: the
// agent runs on x86-64 guests only.

#include "kloop_bpf.h"

#define BPF_MAP_TYPE_RINGBUF 27

// Helpers by number (uapi/linux/bpf.h).
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, unsigned long long size,
				  unsigned long long flags) = (void *)130;
static long (*bpf_probe_read_kernel_str)(void *dst, unsigned int size,
					 const void *unsafe_ptr) = (void *)115;
static long (*bpf_snprintf)(char *str, unsigned int str_size, const char *fmt,
			    unsigned long long *data, unsigned int data_len) = (void *)165;

// x86-64 struct pt_regs, as the kprobe sees it.
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

#define NAME_LEN 64

// One call of perf_event_ksymbol. The agent reads these with the same
// layout (guest/src/steps/ksymwatch.rs).
struct observation {
	unsigned long long addr;
	unsigned int len;
	unsigned short ksym_type;
	unsigned char unregister;
	unsigned char pad;
	// bpf_snprintf's return: the length "%ps" needed, or a negative errno.
	long long ps_ret;
	char ps[NAME_LEN];
	char name[NAME_LEN];
};

// 64 KiB: a few hundred observations, far more than a scenario causes; a
// call that finds it full is counted in counts[0], never lost silently.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} observations SEC(".maps");

// counts[0]: calls whose observation did not fit in the ring.
KLOOP_COUNTERS(1)

// bpf_snprintf wants its format in a read-only (frozen) map: .rodata.
static const char ps_fmt[] = "%ps";

SEC("kprobe")
int kloop_ksymwatch(struct pt_regs *ctx)
{
	struct observation o = {};
	unsigned long long args[1];

	o.ksym_type = (unsigned short)ctx->di;
	o.addr = ctx->si;
	o.len = (unsigned int)ctx->dx;
	o.unregister = (unsigned char)ctx->cx;
	args[0] = o.addr;
	o.ps_ret = bpf_snprintf(o.ps, sizeof(o.ps), ps_fmt, args, sizeof(args));
	bpf_probe_read_kernel_str(o.name, sizeof(o.name), (const void *)ctx->r8);
	if (bpf_ringbuf_output(&observations, &o, sizeof(o), 0))
		bump(0);
	return 0;
}

char _license[] SEC("license") = "GPL";
