// SPDX-License-Identifier: GPL-2.0
/*
 * Reproducer: a BPF trampoline is announced as a page, over code that is
 * not its own (ledger: trampoline-ksymbol-page-len-overlap, -extent).
 *
 * bpf_image_ksym_add() (kernel/bpf/trampoline.c) passes PAGE_SIZE to
 * perf_event_ksymbol() whatever the image's size. Since x86 carves a
 * trampoline image out of a bpf_prog_pack with its exact size
 * (arch_alloc_bpf_trampoline(), 6.7), programs JIT-compiled after it land
 * in the same page, and a profiler that maps PERF_RECORD_KSYMBOL
 * ([addr, addr + len)) has two live symbols over their code. Where an
 * image is a page of its own (before 6.7), or with the length fixed, no
 * two live ranges overlap.
 *
 * Steps: stay on one CPU (every record this process causes is then on
 * that CPU's ring, in order), open a listener with ksymbol on every CPU,
 * load `r0 = 0; exit` as an fentry program on hrtimer_nanosleep and attach
 * it (its trampoline's image is allocated), then load up to 64 trivial
 * programs with the link still open (after any holes earlier frees left
 * in the pack, they take the chunks right after the image), and read the
 * ring: a KSYMBOL register whose range meets a range still registered is
 * the bug.
 *
 * Needs root, CONFIG_BPF_SYSCALL, CONFIG_BPF_JIT, CONFIG_DEBUG_INFO_BTF,
 * CONFIG_FUNCTION_TRACER (fentry), CONFIG_PERF_EVENTS. Raises
 * RLIMIT_MEMLOCK itself (repro_setup(), repro.h).
 */
#include "repro.h"

#include <sched.h>

#define TARGET "hrtimer_nanosleep"
#define FILLERS 64
#define MAX_LIVE 512

struct range {
	uint64_t addr;
	uint32_t len;
	char name[128];
};

struct space {
	int cpu;
	int n;
	struct range live[MAX_LIVE];
	int overlaps;
};

static void on_record(struct listener *l, int cpu, const struct perf_event_header *h,
		      const uint8_t *rec, void *arg)
{
	struct space *s = arg;
	const struct ksymbol_body *k = (const void *)(rec + sizeof(*h));
	int i;

	(void)l;
	/* Only this process's CPU: its records are in the order it caused them. */
	if (h->type != PERF_RECORD_KSYMBOL || cpu != s->cpu)
		return;
	if (k->flags & PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER) {
		for (i = 0; i < s->n; i++) {
			if (s->live[i].addr == k->addr) {
				s->live[i] = s->live[--s->n];
				break;
			}
		}
		return;
	}
	for (i = 0; i < s->n && k->len > 0; i++) {
		const struct range *r = &s->live[i];

		if (r->len > 0 && r->addr < k->addr + k->len && k->addr < r->addr + r->len) {
			printf("KSYMBOL register BPF addr=0x%llx len=%u name=\"%s\" overlaps live "
			       "addr=0x%llx len=%u name=\"%s\"\n",
			       (unsigned long long)k->addr, k->len, k->name,
			       (unsigned long long)r->addr, r->len, r->name);
			s->overlaps++;
		}
	}
	if (s->n < MAX_LIVE) {
		s->live[s->n].addr = k->addr;
		s->live[s->n].len = k->len;
		snprintf(s->live[s->n].name, sizeof(s->live[s->n].name), "%s", k->name);
		s->n++;
	}
}

int main(void)
{
	static struct space s;
	struct listener l;
	union bpf_attr attr;
	cpu_set_t one;
	int fillers[FILLERS], n = 0, prog, link, i;
	uint32_t btf_id;

	repro_setup();
	s.cpu = sched_getcpu();
	CPU_ZERO(&one);
	CPU_SET(s.cpu, &one);
	if (s.cpu < 0 || sched_setaffinity(0, sizeof(one), &one) != 0)
		cannot("cannot stay on one CPU: %s", strerror(errno));
	listener_open(&l, "ksymbol", PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_CPU, 1, 0);
	btf_id = btf_func_id(TARGET);
	if (btf_id == 0)
		cannot("%s has no BTF FUNC %s to attach to", BTF_PATH, TARGET);
	prog = load_fentry(btf_id, TARGET);
	memset(&attr, 0, sizeof(attr));
	attr.raw_tracepoint.prog_fd = (uint32_t)prog;
	link = (int)sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &attr, sizeof(attr.raw_tracepoint));
	if (link < 0)
		cannot("attaching the fentry program (BPF_RAW_TRACEPOINT_OPEN): %s: fentry "
		       "needs CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS (x86-64)", strerror(errno));
	/* Fill the pack after the image until a program lands in its page. */
	for (n = 0; n < FILLERS; n++) {
		fillers[n] = load_trivial_prog("kloop_filler");
		listener_read(&l, on_record, &s);
		if (s.overlaps)
			break;
	}
	if (n < FILLERS)
		n++;
	for (i = 0; i < n; i++)
		close(fillers[i]);
	close(link);
	close(prog);
	listener_close(&l);
	if (s.overlaps) {
		printf("BUG: %d KSYMBOL register(s) over a range still registered: a trampoline "
		       "announced with PAGE_SIZE over code carved after it out of the same "
		       "bpf_prog_pack (bpf_image_ksym_add())\n", s.overlaps);
		return REPRO_BUG;
	}
	printf("OK: no KSYMBOL register met a range still registered (%d programs loaded "
	       "beside the trampoline)\n", n);
	return REPRO_OK;
}
