// SPDX-License-Identifier: GPL-2.0
/*
 * Reproducer: with several listeners, KSYMBOL and BPF_EVENT records get a
 * header.size that grows from listener to listener
 * (ledger: ksymbol-bpf-event-header-size-accumulates).
 *
 * perf_event_ksymbol() and perf_event_bpf_event() (kernel/events/core.c)
 * build one record and perf_iterate_sb() hands it to the output function
 * once per matching side-band event. Each call adds that event's
 * id_header_size to the shared header.size (perf_event_header__init_id())
 * and nothing restores it, so every listener after the first one written
 * gets a record too long by the trailers of the listeners before it. A
 * kernel without the bug writes every copy with
 * header.size = body + this listener's own sample_id trailer.
 *
 * Steps: open two CPU-wide listeners on every CPU with different
 * sample_id trailers (TID|TIME|CPU: 24 bytes, TID|TIME|ID|CPU|IDENTIFIER:
 * 40 bytes), load `r0 = 0; exit` as a socket filter, close it, wait until
 * it is gone, and check the size of every KSYMBOL and BPF_EVENT record
 * each listener got against its body and its own trailer.
 *
 * Needs root, CONFIG_BPF_SYSCALL and CONFIG_PERF_EVENTS. Raises
 * RLIMIT_MEMLOCK itself (repro_setup(), repro.h): runs as the only program
 * of a plain initramfs with the kernel's default limits.
 */
#include "repro.h"

struct seen {
	uint32_t id;
	int records, bad;
};

/* header + body, without the sample_id trailer. */
static unsigned int body_len(const struct perf_event_header *h, const uint8_t *rec)
{
	if (h->type == PERF_RECORD_BPF_EVENT)
		return sizeof(*h) + sizeof(struct bpf_event_body);
	/* KSYMBOL: the name is NUL-terminated and padded to 8 bytes. */
	{
		const struct ksymbol_body *k = (const void *)(rec + sizeof(*h));
		size_t max = h->size - sizeof(*h) - sizeof(*k);
		size_t n = strnlen(k->name, max) + 1;

		return sizeof(*h) + sizeof(*k) + ((n + 7) & ~(size_t)7);
	}
}

static void check(struct listener *l, int cpu, const struct perf_event_header *h,
		  const uint8_t *rec, void *arg)
{
	struct seen *s = arg;
	unsigned int want;

	if (h->type != PERF_RECORD_KSYMBOL && h->type != PERF_RECORD_BPF_EVENT)
		return;
	s->records++;
	want = body_len(h, rec) + id_trailer_len(l->sample_type);
	if (h->size == want)
		return;
	s->bad++;
	if (h->type == PERF_RECORD_KSYMBOL) {
		const struct ksymbol_body *k = (const void *)(rec + sizeof(*h));

		printf("listener %s, cpu %d: KSYMBOL %s addr=0x%llx len=%u name=\"%s\": "
		       "header.size %u, body and trailer make %u (%d bytes too many)\n",
		       l->name, cpu,
		       (k->flags & PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER) ? "unregister" : "register",
		       (unsigned long long)k->addr, k->len, k->name, h->size, want,
		       (int)h->size - (int)want);
	} else {
		const struct bpf_event_body *b = (const void *)(rec + sizeof(*h));

		printf("listener %s, cpu %d: BPF_EVENT %s id=%u: header.size %u, body and "
		       "trailer make %u (%d bytes too many)\n",
		       l->name, cpu, b->type == PERF_BPF_EVENT_PROG_LOAD ? "PROG_LOAD" : "PROG_UNLOAD",
		       b->id, h->size, want, (int)h->size - (int)want);
	}
}

int main(void)
{
	struct listener a, b;
	struct seen s = { 0 };
	uint32_t jited_len;
	int fd;

	repro_setup();
	listener_open(&a, "TID|TIME|CPU", PERF_SAMPLE_TID | PERF_SAMPLE_TIME |
		      PERF_SAMPLE_CPU, 1, 1);
	listener_open(&b, "TID|TIME|ID|CPU|IDENTIFIER", PERF_SAMPLE_TID |
		      PERF_SAMPLE_TIME | PERF_SAMPLE_ID | PERF_SAMPLE_CPU |
		      PERF_SAMPLE_IDENTIFIER, 1, 1);
	fd = load_trivial_prog("kloop_sizes");
	prog_info(fd, &s.id, &jited_len);
	close(fd);
	wait_unloaded(s.id);
	listener_read(&a, check, &s);
	listener_read(&b, check, &s);
	listener_close(&a);
	listener_close(&b);
	/* Both listeners must have their BPF_EVENT load and unload at least. */
	if (s.records < 4)
		cannot("the two listeners got %d KSYMBOL/BPF_EVENT records in all, "
		       "expected at least 4: nothing can be concluded (a kernel before 5.1 "
		       "has no PERF_RECORD_KSYMBOL or PERF_RECORD_BPF_EVENT; no permission "
		       "is missing once the listeners opened)", s.records);
	if (s.bad) {
		printf("BUG: %d of %d KSYMBOL/BPF_EVENT records have a header.size that "
		       "is not their body plus their listener's sample_id trailer\n",
		       s.bad, s.records);
		return REPRO_BUG;
	}
	printf("OK: all %d KSYMBOL/BPF_EVENT records of program %u have exact sizes "
	       "on both listeners\n", s.records, s.id);
	return REPRO_OK;
}
