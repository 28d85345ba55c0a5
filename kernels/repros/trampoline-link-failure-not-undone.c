// SPDX-License-Identifier: GPL-2.0
/*
 * Reproducer: after an fentry attach whose trampoline update failed, the
 * program can never be attached again (ledger:
 * trampoline-link-failure-not-undone).
 *
 * bpf_trampoline_link_prog() (kernel/bpf/trampoline.c, 5.5 to 5.12) puts
 * the program on the trampoline's list with hlist_add_head(), and when
 * bpf_trampoline_update() fails takes it off again with hlist_del(), which
 * leaves prog->aux->tramp_hlist.pprev poisoned (LIST_POISON2), not NULL.
 * Its "already linked" test is !hlist_unhashed() (pprev != NULL), so every
 * later attach of that program fails with EBUSY although it is linked
 * nowhere. Upstream's f3a95075549e ("bpf: Allow trampoline re-attach for
 * tracing and lsm programs", 5.13) turned both hlist_del() of the program
 * into hlist_del_init(); 5.10.y has neither.
 *
 * Steps: find hrtimer_nanosleep's BTF id in /sys/kernel/btf/vmlinux, load
 * `r0 = 0; exit` as an fentry program on it, and sweep its attach
 * (BPF_RAW_TRACEPOINT_OPEN) with fail-nth
 * (Documentation/fault-injection/fault-injection.rst): for N = 1, 2, …
 * write N to /proc/self/task/<tid>/fail-nth, attach once, read fail-nth
 * back (0: the N-th slab allocation of the syscall was failed; otherwise
 * the syscall passed fewer than N) and close a link that succeeded, until
 * an attempt reaches no injected fault. That attempt starts from what the
 * failed attempts left and must succeed; with the bug it fails with EBUSY.
 * A program an attempt did attach is replaced by a new one (5.10 refuses
 * to re-attach a program whose first link was closed: ENOENT, by design
 * before 5.13), so every attempt meets a program that was never linked.
 *
 * Needs root, CONFIG_BPF_SYSCALL, CONFIG_BPF_JIT, CONFIG_DEBUG_INFO_BTF,
 * CONFIG_FUNCTION_TRACER (fentry), and fault injection:
 * CONFIG_FAULT_INJECTION (fail-nth), CONFIG_FAILSLAB and
 * CONFIG_FAULT_INJECTION_DEBUG_FS (failslab's ignore-gfp-wait knob: by
 * default slab allocations that may sleep are no fault points, and every
 * allocation of the attach may sleep). Debian's kernels have none of the
 * three, so there it exits 77. Raises RLIMIT_MEMLOCK itself
 * (repro_setup(), repro.h).
 *
 * kloop-needs: CONFIG_FAULT_INJECTION CONFIG_FAILSLAB CONFIG_FAULT_INJECTION_DEBUG_FS
 */
#include "repro.h"

#include <sys/mount.h>
#include <sys/stat.h>

#define TARGET "hrtimer_nanosleep"
#define DEBUGFS "/sys/kernel/debug"
#define FAILSLAB DEBUGFS "/failslab"
#define MAX_ATTEMPTS 500

/* Writes `value` to `path`; returns 0 or the errno. */
static int write_text(const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	int err = 0;

	if (fd < 0)
		return errno;
	if (write(fd, value, strlen(value)) != (ssize_t)strlen(value))
		err = errno;
	close(fd);
	return err;
}

/* Reads the first line of `path` into `buf` (newline dropped). */
static int read_text(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return errno;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return 0;
}

/* failslab's knobs as they were, put back at exit. */
static char old_wait[8], old_verbose[8];

static void restore_failslab(void)
{
	if (old_wait[0])
		write_text(FAILSLAB "/ignore-gfp-wait", old_wait);
	if (old_verbose[0])
		write_text(FAILSLAB "/verbose", old_verbose);
}

/*
 * Makes every slab allocation a fault point: failslab skips those that
 * may sleep (ignore-gfp-wait, default Y), and every allocation of the
 * attach may; and each injected failure would print a stack (verbose).
 */
static void arm_failslab(void)
{
	struct stat st;

	if (stat(FAILSLAB, &st) != 0 && stat(DEBUGFS "/tracing", &st) != 0 &&
	    stat(DEBUGFS "/bdi", &st) != 0)
		/* debugfs not mounted here: mount it (the plain init does). */
		mount("debugfs", DEBUGFS, "debugfs", 0, NULL);
	if (stat(FAILSLAB, &st) != 0)
		cannot("%s: %s: the kernel has no failslab knobs (CONFIG_FAILSLAB and "
		       "CONFIG_FAULT_INJECTION_DEBUG_FS): without ignore-gfp-wait = N no "
		       "allocation of the attach can be failed", FAILSLAB, strerror(errno));
	if (read_text(FAILSLAB "/ignore-gfp-wait", old_wait, sizeof(old_wait)) ||
	    read_text(FAILSLAB "/verbose", old_verbose, sizeof(old_verbose)))
		cannot("reading %s's knobs: %s (run as root)", FAILSLAB, strerror(errno));
	atexit(restore_failslab);
	if (write_text(FAILSLAB "/ignore-gfp-wait", "N") ||
	    write_text(FAILSLAB "/verbose", "0"))
		cannot("writing %s's knobs: %s (run as root)", FAILSLAB, strerror(errno));
}

/* Touches the next 64 KiB of stack: no page fault (and its allocations)
 * while an allocation is armed. */
static void __attribute__((noinline)) touch_stack(void)
{
	volatile char pad[64 * 1024];

	memset((char *)pad, 0, sizeof(pad));
}

struct attempt {
	int injected; /* fail-nth read back 0: the N-th point was failed */
	long fd;      /* the link, or -1 */
	int err;      /* its errno when it failed */
};

/* One attach with the `n`-th fault point of this thread armed. */
static struct attempt attach_armed(int nth, int prog_fd, unsigned int n)
{
	struct attempt a = { 0, -1, 0 };
	union bpf_attr attr;
	char text[16], back[16];
	int len = snprintf(text, sizeof(text), "%u", n);
	ssize_t got;

	memset(&attr, 0, sizeof(attr));
	attr.raw_tracepoint.prog_fd = (uint32_t)prog_fd;
	touch_stack();
	if (pwrite(nth, text, (size_t)len, 0) != len)
		cannot("writing %u to fail-nth: %s", n, strerror(errno));
	a.fd = sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &attr, sizeof(attr));
	a.err = a.fd < 0 ? errno : 0;
	got = pread(nth, back, sizeof(back) - 1, 0);
	/* Disarm before anything else can allocate. */
	if (pwrite(nth, "0", 1, 0) != 1 || got <= 0)
		cannot("reading fail-nth back: %s", strerror(errno));
	back[got] = 0;
	a.injected = atoi(back) == 0;
	return a;
}

int main(void)
{
	char nth_path[64];
	uint32_t btf_id;
	int nth, prog;
	unsigned int n, failed = 0;

	repro_setup();
	snprintf(nth_path, sizeof(nth_path), "/proc/self/task/%ld/fail-nth",
		 (long)syscall(SYS_gettid));
	nth = open(nth_path, O_RDWR | O_CLOEXEC);
	if (nth < 0)
		cannot("%s: %s: the kernel has no fail-nth (CONFIG_FAULT_INJECTION)",
		       nth_path, strerror(errno));
	arm_failslab();
	btf_id = btf_func_id(TARGET);
	if (!btf_id)
		cannot("no BTF_KIND_FUNC %s in %s (CONFIG_DEBUG_INFO_BTF; the function "
		       "is in every kernel since 2.6.x)", TARGET, BTF_PATH);
	prog = load_fentry(btf_id, TARGET);
	/* Run the attach path once unarmed with a bad fd, to fault its pages in. */
	{
		union bpf_attr bad;

		memset(&bad, 0, sizeof(bad));
		bad.raw_tracepoint.prog_fd = (uint32_t)-1;
		sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &bad, sizeof(bad));
	}
	for (n = 1; n <= MAX_ATTEMPTS; n++) {
		struct attempt a = attach_armed(nth, prog, n);

		if (a.fd >= 0) {
			close((int)a.fd);
			/* 5.10 cannot re-attach a program whose link was closed. */
			close(prog);
			prog = load_fentry(btf_id, TARGET);
		}
		if (a.injected) {
			if (a.fd < 0) {
				failed++;
				printf("attempt %u: allocation %u failed: attach %s\n", n, n,
				       strerror(a.err));
			}
			continue;
		}
		if (a.fd >= 0) {
			printf("attempt %u: no injected fault: attached; %u injected failures "
			       "before it were undone\n", n, failed);
			return REPRO_OK;
		}
		printf("attempt %u: no injected fault: attach failed with %s (%s) after %u "
		       "injected failures\n", n, a.err == EBUSY ? "EBUSY" : "another errno",
		       strerror(a.err), failed);
		if (a.err == EBUSY) {
			printf("BUG: the program is linked nowhere, yet the kernel says it is: "
			       "a failed bpf_trampoline_update() left prog->aux->tramp_hlist "
			       "hashed (hlist_del() instead of hlist_del_init() in "
			       "bpf_trampoline_link_prog())\n");
			return REPRO_BUG;
		}
		cannot("the attach without an injected fault failed with %s, which is not "
		       "this bug's EBUSY (nothing is known about it)", strerror(a.err));
	}
	cannot("%u attempts and the attach still reached an injected fault every time",
	       MAX_ATTEMPTS);
	return REPRO_CANNOT;
}
