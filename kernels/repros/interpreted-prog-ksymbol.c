// SPDX-License-Identifier: GPL-2.0
/*
 * Reproducer: interpreted BPF programs get PERF_RECORD_KSYMBOL records
 * (ledger: interpreted-prog-ksymbol-register, -unregister).
 *
 * perf_event_bpf_event() (kernel/events/core.c) calls
 * perf_event_bpf_emit_ksymbols() on every PROG_LOAD and PROG_UNLOAD without
 * testing prog->jited. For a program the interpreter runs, the record says
 * addr = prog->bpf_func (the shared __bpf_prog_run<N> in vmlinux),
 * len = jited_len = 0 and an empty name (bpf_prog_kallsyms_add() names only
 * JITed programs). A kernel without the bug sends the program's
 * PERF_RECORD_BPF_EVENT load and unload and no KSYMBOL for it.
 *
 * Steps: turn the JIT off (net.core.bpf_jit_enable = 0), open a CPU-wide
 * listener with ksymbol and bpf_event on every CPU, load `r0 = 0; exit` as
 * a socket filter, check it is interpreted (jited_prog_len 0), close it,
 * wait until it is gone, restore the JIT setting, read the rings.
 *
 * Needs root, CONFIG_BPF_SYSCALL, CONFIG_PERF_EVENTS, and a JIT that can
 * be turned off (not CONFIG_BPF_JIT_ALWAYS_ON). Raises RLIMIT_MEMLOCK
 * itself (repro_setup(), repro.h): runs as the only program of a plain
 * initramfs with the kernel's default limits.
 */
#include "repro.h"

#define JIT_SYSCTL "/proc/sys/net/core/bpf_jit_enable"

struct seen {
	uint32_t id;
	int loads, unloads, bogus;
};

static void check(struct listener *l, int cpu, const struct perf_event_header *h,
		  const uint8_t *rec, void *arg)
{
	struct seen *s = arg;

	(void)l;
	if (h->type == PERF_RECORD_BPF_EVENT) {
		const struct bpf_event_body *b = (const void *)(rec + sizeof(*h));

		if (b->id == s->id && b->type == PERF_BPF_EVENT_PROG_LOAD)
			s->loads++;
		if (b->id == s->id && b->type == PERF_BPF_EVENT_PROG_UNLOAD)
			s->unloads++;
		return;
	}
	if (h->type == PERF_RECORD_KSYMBOL) {
		const struct ksymbol_body *k = (const void *)(rec + sizeof(*h));

		/* A JITed symbol always has a length and a bpf_prog_<tag> name. */
		if (k->ksym_type == PERF_RECORD_KSYMBOL_TYPE_BPF &&
		    (k->len == 0 || k->name[0] == 0)) {
			printf("KSYMBOL %s BPF addr=0x%llx len=%u name=\"%s\" (cpu %d)\n",
			       (k->flags & PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER) ? "unregister" : "register",
			       (unsigned long long)k->addr, k->len, k->name, cpu);
			s->bogus++;
		}
	}
}

int main(void)
{
	int jit;
	struct listener l;
	struct seen s = { 0 };
	uint32_t jited_len;
	int fd, err;

	repro_setup();
	jit = read_sysctl(JIT_SYSCTL);
	/* Without CONFIG_BPF_JIT there is no knob: every program is interpreted. */
	if (jit > 0) {
		err = write_sysctl(JIT_SYSCTL, 0);
		/*
		 * net/core/sysctl_net_core.c: proc_dointvec_minmax_bpf_enable()
		 * refuses a writer without CAP_SYS_ADMIN (EPERM); with
		 * CONFIG_BPF_JIT_ALWAYS_ON the knob's minimum is 1 (EINVAL);
		 * the file is root's, mode 0644 (EACCES).
		 */
		if (err == EPERM || err == EACCES)
			cannot("cannot set %s to 0: %s: it needs root with CAP_SYS_ADMIN",
			       JIT_SYSCTL, strerror(err));
		if (err == EINVAL)
			cannot("cannot set %s to 0: %s: the kernel is built with "
			       "CONFIG_BPF_JIT_ALWAYS_ON, interprets nothing, so the bug "
			       "cannot show there", JIT_SYSCTL, strerror(err));
		if (err)
			cannot("cannot set %s to 0: %s", JIT_SYSCTL, strerror(err));
	}
	listener_open(&l, "ksymbol+bpf_event", PERF_SAMPLE_TID | PERF_SAMPLE_TIME |
		      PERF_SAMPLE_CPU, 1, 1);
	fd = load_trivial_prog("kloop_interp");
	prog_info(fd, &s.id, &jited_len);
	close(fd);
	wait_unloaded(s.id);
	if (jit > 0)
		write_sysctl(JIT_SYSCTL, jit);
	if (jited_len != 0)
		cannot("program %u was JIT-compiled (%u bytes) although %s was 0: "
		       "the kernel forces the JIT (CONFIG_BPF_JIT_ALWAYS_ON), so the bug "
		       "cannot show there", s.id, jited_len, JIT_SYSCTL);
	listener_read(&l, check, &s);
	listener_close(&l);
	if (s.loads == 0 || s.unloads == 0)
		cannot("the listener got %d PROG_LOAD and %d PROG_UNLOAD records for "
		       "program %u, expected one each: nothing can be concluded (a kernel "
		       "before 5.1 has no PERF_RECORD_BPF_EVENT; no permission is missing "
		       "once the listener opened)", s.loads, s.unloads, s.id);
	if (s.bogus) {
		printf("BUG: %d PERF_RECORD_KSYMBOL record(s) for interpreted program %u "
		       "(jited_prog_len 0): a nameless zero-length BPF symbol at the "
		       "interpreter\n", s.bogus, s.id);
		return REPRO_BUG;
	}
	printf("OK: interpreted program %u got its BPF_EVENT load and unload and no KSYMBOL\n",
	       s.id);
	return REPRO_OK;
}
