// SPDX-License-Identifier: GPL-2.0
// kloop fixture "ksymwatch": a kprobe on perf_event_ksymbol(ksym_type, addr,
// len, unregister, sym) that records, for every call, the arguments and how
// the kernel's own symbolizer resolves `addr` at that instant
// (bpf_snprintf "%ps", which goes through kallsyms_lookup and so
// bpf_address_lookup for BPF text). kallsyms prints an address it cannot
// resolve as "0x<hex>" (__sprint_symbol), so the host can tell whether the
// symbol a KSYMBOL record announces was resolvable when it was emitted.
// Needs bpf_snprintf (5.13). The kprobe context is the architecture's
// pt_regs (kloop_bpf.h).
//
// kallsyms does not resolve kprobe instruction pages through %ps, so for
// an OOL symbol the watch also looks for the page on the page list of the
// kprobe_insn_cache whose `sym` is the call's `sym` (kprobe_insn_slots,
// kprobe_optinsn_slots: their addresses are in `caches`, written by the
// agent from /proc/kallsyms), and for an ftrace trampoline on
// ftrace_ops_trampoline_list (the third address in `caches`). The structs
// below are CO-RE: aya relocates their field offsets against the kernel's
// BTF.

#include "kloop_bpf.h"

#define BPF_MAP_TYPE_RINGBUF 27
#define KSYM_TYPE_OOL 2

// Helpers by number (uapi/linux/bpf.h).
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, unsigned long long size,
				  unsigned long long flags) = (void *)130;
static long (*bpf_probe_read_kernel_str)(void *dst, unsigned int size,
					 const void *unsafe_ptr) = (void *)115;
static long (*bpf_probe_read_kernel)(void *dst, unsigned int size,
				     const void *unsafe_ptr) = (void *)113;
static long (*bpf_snprintf)(char *str, unsigned int str_size, const char *fmt,
			    unsigned long long *data, unsigned int data_len) = (void *)165;


#define NAME_LEN 64

struct list_head {
	struct list_head *next;
} __attribute__((preserve_access_index));

struct kprobe_insn_cache {
	const char *sym;
	struct list_head pages;
} __attribute__((preserve_access_index));

struct kprobe_insn_page {
	struct list_head list;
	void *insns;
} __attribute__((preserve_access_index));

// An ftrace_ops with a trampoline of its own is on ftrace_ops_trampoline_list
// (kernel/trace/ftrace.c) by `list` while kallsyms lists the trampoline.
struct ftrace_ops {
	unsigned long trampoline;
	struct list_head list;
} __attribute__((preserve_access_index));

// BPF_FIELD_BYTE_OFFSET of `field`, relocated.
#define FIELD_OFFSET(type, field) __builtin_preserve_field_info(((type *)0)->field, 0)

// More pages than any scenario makes; a longer list reads as "not listed"
// only if the page is past this many, which the host would then report.
#define MAX_PAGES 32

// Whether an OOL page was on its cache's list: 0 not looked (not a kprobe
// page, or the agent found no cache address), 1 listed, 2 not listed.
#define LISTED 1
#define NOT_LISTED 2

// One call of perf_event_ksymbol. The agent reads these with the same
// layout (guest/src/steps/ksymwatch.rs).
struct observation {
	unsigned long long addr;
	unsigned int len;
	unsigned short ksym_type;
	unsigned char unregister;
	unsigned char listed;
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

// Addresses of kprobe_insn_slots, kprobe_optinsn_slots and
// ftrace_ops_trampoline_list (0: unknown).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, unsigned int);
	__type(value, unsigned long long);
} caches SEC(".maps");

// Walks the list at `head` for an entry whose pointer-sized field at
// `value_off` is `addr`; `link_off` is where the entry's list_head is. Both
// offsets come from FIELD_OFFSET, relocated against the kernel's BTF.
static __attribute__((always_inline)) unsigned char
listed_at(struct list_head *head, long link_off, long value_off, unsigned long long addr)
{
	struct list_head *pos = 0;
	int i;

	bpf_probe_read_kernel(&pos, sizeof(pos), &head->next);
	for (i = 0; i < MAX_PAGES; i++) {
		unsigned long long value = 0;

		if (!pos || pos == head)
			break;
		bpf_probe_read_kernel(&value, sizeof(value), (char *)pos - link_off + value_off);
		if (value == addr)
			return LISTED;
		bpf_probe_read_kernel(&pos, sizeof(pos), &pos->next);
	}
	return NOT_LISTED;
}

// Looks for the page at `addr` on the list of the cache at `cache` if that
// cache's `sym` is `sym`; returns 0 when it is another cache's.
static __attribute__((always_inline)) unsigned char
page_listed(unsigned long long cache, unsigned long long sym, unsigned long long addr)
{
	struct kprobe_insn_cache *c = (void *)cache;
	const char *csym = 0;

	bpf_probe_read_kernel(&csym, sizeof(csym), &c->sym);
	if ((unsigned long long)csym != sym)
		return 0;
	return listed_at(&c->pages, FIELD_OFFSET(struct kprobe_insn_page, list),
			 FIELD_OFFSET(struct kprobe_insn_page, insns), addr);
}

// Looks for an ftrace_ops whose trampoline is `addr` on the list at `head`
// (ftrace_ops_trampoline_list).
static __attribute__((always_inline)) unsigned char
trampoline_listed(unsigned long long head, unsigned long long addr)
{
	return listed_at((struct list_head *)head, FIELD_OFFSET(struct ftrace_ops, list),
			 FIELD_OFFSET(struct ftrace_ops, trampoline), addr);
}

// bpf_snprintf wants its format in a read-only (frozen) map: .rodata.
static const char ps_fmt[] = "%ps";

// page_listed for the cache in slot `key` of `caches` (0 when unknown).
static __attribute__((always_inline)) unsigned char
cache_listed(unsigned int key, unsigned long long sym, unsigned long long addr)
{
	unsigned long long *cache = bpf_map_lookup_elem(&caches, &key);

	if (!cache || !*cache)
		return 0;
	return page_listed(*cache, sym, addr);
}

SEC("kprobe")
int kloop_ksymwatch(struct pt_regs *ctx)
{
	struct observation o = {};
	unsigned long long args[1];

	o.ksym_type = (unsigned short)KLOOP_ARG1(ctx);
	o.addr = KLOOP_ARG2(ctx);
	o.len = (unsigned int)KLOOP_ARG3(ctx);
	o.unregister = (unsigned char)KLOOP_ARG4(ctx);
	args[0] = o.addr;
	o.ps_ret = bpf_snprintf(o.ps, sizeof(o.ps), ps_fmt, args, sizeof(args));
	bpf_probe_read_kernel_str(o.name, sizeof(o.name), (const void *)KLOOP_ARG5(ctx));
	// Unrolled by hand: a loop over the two keys, with its counter on the
	// stack for the map lookup, reads to the verifier as an infinite loop.
	if (o.ksym_type == KSYM_TYPE_OOL) {
		o.listed = cache_listed(0, KLOOP_ARG5(ctx), o.addr);
		if (!o.listed)
			o.listed = cache_listed(1, KLOOP_ARG5(ctx), o.addr);
		if (!o.listed) {
			// FTRACE_TRAMPOLINE_SYM with its NUL, on the stack: a
			// global array would need a .rodata variable of its own.
			char ftrace_sym[] = "ftrace_trampoline";
			unsigned int key = 2;
			unsigned long long *head = bpf_map_lookup_elem(&caches, &key);
			int same = 1;
			int i;

			for (i = 0; i < (int)sizeof(ftrace_sym); i++)
				if (o.name[i] != ftrace_sym[i])
					same = 0;
			if (same && head && *head)
				o.listed = trampoline_listed(*head, o.addr);
		}
	}
	if (bpf_ringbuf_output(&observations, &o, sizeof(o), 0))
		bump(0);
	return 0;
}

char _license[] SEC("license") = "GPL";
