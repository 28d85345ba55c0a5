/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every kloop reproducer shares: the two system calls, CPU-wide
 * side-band listeners and a reader of their rings. Only the kernel's uapi
 * headers; no libbpf, no libperf. `cargo xtask repro --standalone` pastes
 * this file into the reproducer it writes, so the result is one C file.
 *
 * Exit status of a reproducer: 0 the bug does not show, 1 it shows (the
 * offending records are printed), 77 the reproducer could not run here
 * (the reason is printed, naming the missing permission or CONFIG_
 * option; nothing is known about the bug).
 *
 * A reproducer needs nothing from whoever starts it but root: it is meant
 * to run as the only program of a plain initramfs, with the kernel's
 * default limits. repro_setup() raises what it needs itself (see
 * raise_memlock() for why RLIMIT_MEMLOCK matters before 5.11).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/btf.h>
#include <linux/perf_event.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define REPRO_OK 0
#define REPRO_BUG 1
#define REPRO_CANNOT 77

#define RING_PAGES 16
#define MAX_CPUS 256
#define MAX_RECORD 4096

static void cannot(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("CANNOT RUN: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	exit(REPRO_CANNOT);
}

/*
 * Why RLIMIT_MEMLOCK must be raised, from the kernel's sources:
 *
 * - Up to 5.10, a BPF program is charged to RLIMIT_MEMLOCK:
 *   bpf_prog_load() -> bpf_prog_charge_memlock() -> __bpf_prog_charge()
 *   (kernel/bpf/syscall.c) adds the program's pages to the user's
 *   user->locked_vm and fails the load with EPERM when the sum passes
 *   rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT. There is no capability
 *   exemption: root is refused too. 5.11 removed that charge ("bpf:
 *   Eliminate rlimit-based memory accounting for bpf progs"); programs
 *   and maps are charged to the memory cgroup since.
 * - perf_mmap() (kernel/events/core.c) adds each ring's pages (data pages
 *   + 1) to the same user->locked_vm, up to kernel.perf_event_mlock_kb
 *   (516 KiB with 4 KiB pages) times the online CPUs; pages past that
 *   count against RLIMIT_MEMLOCK through mm->pinned_vm, and fail the
 *   mmap with EPERM unless the caller has CAP_IPC_LOCK (root has) or
 *   kernel.perf_event_paranoid is -1.
 * - The default RLIMIT_MEMLOCK (MLOCK_LIMIT, include/uapi/linux/resource.h)
 *   is 64 KiB, 16 pages, before 5.16, and 8 MiB from 5.16; init starts
 *   with it as both soft and hard limit (INIT_RLIMITS,
 *   include/asm-generic/resource.h), and every process inherits it.
 *
 * So on 5.10 the rings of a listener on two CPUs (2 x 17 pages) alone put
 * user->locked_vm past 16 pages, and the next BPF_PROG_LOAD fails with
 * EPERM although the caller is root. Raising RLIMIT_MEMLOCK (soft and
 * hard) to infinity needs CAP_SYS_RESOURCE when the hard limit is lower
 * (kernel/sys.c do_prlimit(): raising rlim_max needs it), which root has.
 */
static int kernel_before(int major, int minor)
{
	struct utsname u;
	int ma = 0, mi = 0;

	if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &ma, &mi) != 2)
		return 1; /* unknown: assume the old accounting */
	return ma < major || (ma == major && mi < minor);
}

static void raise_memlock(void)
{
	struct rlimit want = { RLIM_INFINITY, RLIM_INFINITY };
	struct rlimit had;
	int err;

	if (getrlimit(RLIMIT_MEMLOCK, &had) == 0 &&
	    had.rlim_cur == RLIM_INFINITY && had.rlim_max == RLIM_INFINITY)
		return;
	if (setrlimit(RLIMIT_MEMLOCK, &want) == 0)
		return;
	err = errno;
	/*
	 * From 5.11 a program is not charged to RLIMIT_MEMLOCK, and root's
	 * CAP_IPC_LOCK lets the rings past it: the soft limit raised to the
	 * hard one (no permission needed) is enough. Before 5.11 it is not.
	 */
	if (!kernel_before(5, 11)) {
		had.rlim_cur = had.rlim_max;
		setrlimit(RLIMIT_MEMLOCK, &had);
		return;
	}
	cannot("setrlimit(RLIMIT_MEMLOCK, unlimited): %s: raising the hard limit needs "
	       "CAP_SYS_RESOURCE (run as root, with CAP_SYS_RESOURCE in the bounding set); "
	       "before 5.11 every BPF program is charged to RLIMIT_MEMLOCK (64 KiB by "
	       "default before 5.16) and perf rings fill the same account",
	       strerror(err));
}

/* Whether /proc is mounted (the reproducers read and write sysctls). */
static void need_proc(void)
{
	if (access("/proc/self/stat", R_OK) != 0)
		cannot("/proc is not mounted (%s): mount -t proc proc /proc first; the "
		       "reproducer reads kernel.perf_event_paranoid and net.core sysctls there",
		       strerror(errno));
}

/* What every reproducer does first: see raise_memlock() and need_proc(). */
static void repro_setup(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	need_proc();
	raise_memlock();
}

static long sys_perf_event_open(struct perf_event_attr *attr, pid_t pid,
				int cpu, int group_fd, unsigned long flags)
{
	return syscall(__NR_perf_event_open, attr, pid, cpu, group_fd, flags);
}

static long sys_bpf(int cmd, union bpf_attr *attr, unsigned int size)
{
	return syscall(__NR_bpf, cmd, attr, size);
}

static inline int read_sysctl(const char *path);

/* Says why perf_event_open() of a CPU-wide dummy event failed, and exits. */
static inline void perf_open_failed(int ksymbol, int bpf_event, int cpu)
{
	int err = errno;
	const char *why;

	switch (err) {
	case ENOSYS:
		why = "the kernel has no perf_event_open(): CONFIG_PERF_EVENTS is needed";
		break;
	case EACCES:
	case EPERM:
		/* perf_event_open() -> perf_allow_cpu(): CPU-wide events. */
		why = "a CPU-wide event needs CAP_PERFMON (5.8+) or CAP_SYS_ADMIN (run as "
		      "root), or kernel.perf_event_paranoid <= 0";
		break;
	case EINVAL:
	case E2BIG:
		/* perf_copy_attr(): attr.ksymbol and attr.bpf_event are 5.1's. */
		why = "this kernel does not know attr.ksymbol / attr.bpf_event (they came "
		      "in 5.1, with PERF_RECORD_KSYMBOL and PERF_RECORD_BPF_EVENT)";
		break;
	case ENOENT:
	case EOPNOTSUPP:
		why = "the dummy software event is missing: CONFIG_PERF_EVENTS is needed";
		break;
	default:
		why = "unexpected";
		break;
	}
	errno = err;
	cannot("perf_event_open(dummy, ksymbol=%d, bpf_event=%d, cpu %d): %s: %s "
	       "(kernel.perf_event_paranoid = %d)", ksymbol, bpf_event, cpu,
	       strerror(err), why, read_sysctl("/proc/sys/kernel/perf_event_paranoid"));
}

/* One listener: a dummy software event per CPU with a ring each. */
struct listener {
	const char *name;
	uint64_t sample_type;
	int ncpu;
	int fd[MAX_CPUS];
	int cpu[MAX_CPUS];
	void *ring[MAX_CPUS];
	uint64_t tail[MAX_CPUS];
};

static size_t page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

/*
 * Opens `l` on every CPU that takes an event (offline and absent CPUs
 * refuse with ENODEV / EINVAL and are skipped).
 */
static inline void listener_open(struct listener *l, const char *name,
			  uint64_t sample_type, int ksymbol, int bpf_event)
{
	long ncpus = sysconf(_SC_NPROCESSORS_CONF);
	int cpu;

	memset(l, 0, sizeof(*l));
	l->name = name;
	l->sample_type = sample_type;
	for (cpu = 0; cpu < ncpus && cpu < MAX_CPUS; cpu++) {
		struct perf_event_attr attr;
		size_t len = (1 + RING_PAGES) * page_size();
		void *ring;
		long fd;

		memset(&attr, 0, sizeof(attr));
		attr.size = sizeof(attr);
		attr.type = PERF_TYPE_SOFTWARE;
		attr.config = PERF_COUNT_SW_DUMMY;
		attr.sample_type = sample_type;
		attr.sample_id_all = 1;
		attr.ksymbol = ksymbol;
		attr.bpf_event = bpf_event;
		attr.watermark = 1;
		attr.wakeup_watermark = 1;
		fd = sys_perf_event_open(&attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC);
		if (fd < 0 && (errno == ENODEV || errno == EINVAL) && cpu > 0)
			continue;
		if (fd < 0)
			perf_open_failed(ksymbol, bpf_event, cpu);
		ring = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
		if (ring == MAP_FAILED && errno == EPERM)
			cannot("mmap of the %zu KiB ring of cpu %d: %s: the ring's pages past "
			       "kernel.perf_event_mlock_kb (%d KiB per CPU) count against "
			       "RLIMIT_MEMLOCK, and past that only CAP_IPC_LOCK (or "
			       "kernel.perf_event_paranoid = -1) lets it be mapped (perf_mmap(), "
			       "kernel/events/core.c)", len / 1024, cpu, strerror(errno),
			       read_sysctl("/proc/sys/kernel/perf_event_mlock_kb"));
		if (ring == MAP_FAILED)
			cannot("mmap of the %zu KiB ring of cpu %d: %s (out of memory for "
			       "the ring: give the machine more memory)", len / 1024, cpu,
			       strerror(errno));
		l->fd[l->ncpu] = (int)fd;
		l->cpu[l->ncpu] = cpu;
		l->ring[l->ncpu] = ring;
		l->ncpu++;
	}
	if (l->ncpu == 0)
		cannot("no CPU took a perf event (CONFIG_PERF_EVENTS with no online CPU?)");
}

/*
 * Calls `fn` for every record written to `l` since the last call, in ring
 * order, with the record copied out (it may wrap around the ring's end).
 */
static inline void listener_read(struct listener *l,
			  void (*fn)(struct listener *l, int cpu,
				     const struct perf_event_header *h,
				     const uint8_t *rec, void *arg),
			  void *arg)
{
	size_t data_size = RING_PAGES * page_size();
	int i;

	for (i = 0; i < l->ncpu; i++) {
		struct perf_event_mmap_page *meta = l->ring[i];
		uint8_t *data = (uint8_t *)l->ring[i] + page_size();
		uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
		uint64_t tail = l->tail[i];
		uint8_t rec[MAX_RECORD];

		while (tail < head) {
			struct perf_event_header h;
			size_t k;

			for (k = 0; k < sizeof(h); k++)
				((uint8_t *)&h)[k] = data[(tail + k) % data_size];
			if (h.size < sizeof(h) || h.size > MAX_RECORD || tail + h.size > head) {
				printf("listener %s cpu %d: unreadable record header at ring offset %llu (size %u)\n",
				       l->name, l->cpu[i], (unsigned long long)tail, h.size);
				exit(REPRO_BUG);
			}
			for (k = 0; k < h.size; k++)
				rec[k] = data[(tail + k) % data_size];
			fn(l, l->cpu[i], &h, rec, arg);
			tail += h.size;
		}
		l->tail[i] = tail;
		__atomic_store_n(&meta->data_tail, tail, __ATOMIC_RELEASE);
	}
}

static inline void listener_close(struct listener *l)
{
	size_t len = (1 + RING_PAGES) * page_size();
	int i;

	for (i = 0; i < l->ncpu; i++) {
		munmap(l->ring[i], len);
		close(l->fd[i]);
	}
	l->ncpu = 0;
}

/* The smallest program: `r0 = 0; exit` as a socket filter named `name`. */
static inline int load_trivial_prog(const char *name)
{
	struct bpf_insn insns[2];
	union bpf_attr attr;
	char log[4096];
	long fd;

	memset(insns, 0, sizeof(insns));
	insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K; /* r0 = 0 */
	insns[0].dst_reg = BPF_REG_0;
	insns[1].code = BPF_JMP | BPF_EXIT;
	memset(&attr, 0, sizeof(attr));
	attr.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;
	attr.insns = (uint64_t)(unsigned long)insns;
	attr.insn_cnt = 2;
	attr.license = (uint64_t)(unsigned long)"GPL";
	attr.log_buf = (uint64_t)(unsigned long)log;
	attr.log_size = sizeof(log);
	attr.log_level = 1;
	strncpy(attr.prog_name, name, sizeof(attr.prog_name) - 1);
	log[0] = 0;
	fd = sys_bpf(BPF_PROG_LOAD, &attr, sizeof(attr));
	if (fd < 0 && errno == EPERM) {
		struct rlimit rl;
		int err = errno;

		getrlimit(RLIMIT_MEMLOCK, &rl);
		/* __bpf_prog_charge(), kernel/bpf/syscall.c, before 5.11: see raise_memlock(). */
		if (kernel_before(5, 11) && rl.rlim_cur != RLIM_INFINITY)
			cannot("BPF_PROG_LOAD of a two-instruction socket filter: %s: before 5.11 "
			       "a program is charged to RLIMIT_MEMLOCK, %llu KiB here and already "
			       "filled by the perf rings; raising it needs CAP_SYS_RESOURCE",
			       strerror(err), (unsigned long long)rl.rlim_cur / 1024);
		cannot("BPF_PROG_LOAD of a two-instruction socket filter: %s: the caller "
		       "lacks CAP_BPF (5.8+) or CAP_SYS_ADMIN while "
		       "kernel.unprivileged_bpf_disabled = %d (run as root)",
		       strerror(err), read_sysctl("/proc/sys/kernel/unprivileged_bpf_disabled"));
	}
	if (fd < 0 && errno == ENOSYS)
		cannot("BPF_PROG_LOAD: %s: the kernel has no bpf(): CONFIG_BPF_SYSCALL is needed",
		       strerror(errno));
	if (fd < 0)
		cannot("BPF_PROG_LOAD of a two-instruction socket filter: %s (a kernel "
		       "before 4.15 has no prog_name)%s%s",
		       strerror(errno), log[0] ? "; verifier: " : "", log);
	return (int)fd;
}

/* bpf_prog_info of `fd`: its id and the length of its JITed code. */
static inline void prog_info(int fd, uint32_t *id, uint32_t *jited_len)
{
	struct bpf_prog_info info;
	union bpf_attr attr;

	memset(&info, 0, sizeof(info));
	memset(&attr, 0, sizeof(attr));
	attr.info.bpf_fd = fd;
	attr.info.info_len = sizeof(info);
	attr.info.info = (uint64_t)(unsigned long)&info;
	if (sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &attr, sizeof(attr)) < 0)
		cannot("BPF_OBJ_GET_INFO_BY_FD: %s (a kernel before 4.13 has no "
		       "BPF_OBJ_GET_INFO_BY_FD; CONFIG_BPF_SYSCALL is needed)", strerror(errno));
	*id = info.id;
	*jited_len = info.jited_prog_len;
}

/* Whether program `id` can still be found (unloads may finish later). */
static inline int prog_alive(uint32_t id)
{
	union bpf_attr attr;
	long fd;

	memset(&attr, 0, sizeof(attr));
	attr.prog_id = id;
	fd = sys_bpf(BPF_PROG_GET_FD_BY_ID, &attr, sizeof(attr));
	if (fd >= 0) {
		close((int)fd);
		return 1;
	}
	/* bpf_prog_get_fd_by_id() (kernel/bpf/syscall.c) wants CAP_SYS_ADMIN. */
	if (errno == EPERM)
		cannot("BPF_PROG_GET_FD_BY_ID: %s: it needs CAP_SYS_ADMIN (run as root)",
		       strerror(errno));
	return 0;
}

/* Waits up to 5 s for program `id` to be gone. */
static inline void wait_unloaded(uint32_t id)
{
	int i;

	for (i = 0; i < 500 && prog_alive(id); i++)
		usleep(10000);
	if (prog_alive(id))
		cannot("program %u is still loaded 5 s after its last fd was closed (no "
		       "permission or CONFIG_ option is missing: the kernel frees a program "
		       "after an RCU grace period, and this one was slower; run it again)", id);
}

/* Reads a one-line sysctl; returns -1 when it is absent. */
static inline int read_sysctl(const char *path)
{
	char buf[32];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	return atoi(buf);
}

/* Writes a one-line sysctl; returns 0 or the errno. */
static inline int write_sysctl(const char *path, int value)
{
	char buf[32];
	int len = snprintf(buf, sizeof(buf), "%d\n", value);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	int err = 0;

	if (fd < 0)
		return errno;
	if (write(fd, buf, (size_t)len) != len)
		err = errno;
	close(fd);
	return err;
}

/* The sample_id trailer's length for `sample_type` (perf_event_open(2)). */
static inline unsigned int id_trailer_len(uint64_t sample_type)
{
	unsigned int n = 0;

	n += (sample_type & PERF_SAMPLE_TID) ? 8 : 0;
	n += (sample_type & PERF_SAMPLE_TIME) ? 8 : 0;
	n += (sample_type & PERF_SAMPLE_ID) ? 8 : 0;
	n += (sample_type & PERF_SAMPLE_STREAM_ID) ? 8 : 0;
	n += (sample_type & PERF_SAMPLE_CPU) ? 8 : 0;
	n += (sample_type & PERF_SAMPLE_IDENTIFIER) ? 8 : 0;
	return n;
}

/* PERF_RECORD_KSYMBOL's body after the header (uapi perf_event.h). */
struct ksymbol_body {
	uint64_t addr;
	uint32_t len;
	uint16_t ksym_type;
	uint16_t flags;
	char name[];
};

/* PERF_RECORD_BPF_EVENT's body after the header. */
struct bpf_event_body {
	uint16_t type;
	uint16_t flags;
	uint32_t id;
	uint8_t tag[8];
};

#define BTF_PATH "/sys/kernel/btf/vmlinux"

/* Reads all of `path` (sysfs files report no size). */
static inline uint8_t *read_all(const char *path, size_t *len)
{
	size_t cap = 1 << 20, n = 0;
	uint8_t *buf = malloc(cap);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t r;

	if (fd < 0 || !buf)
		return NULL;
	while ((r = read(fd, buf + n, cap - n)) > 0) {
		n += (size_t)r;
		if (n == cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			if (!buf)
				cannot("out of memory reading %s", path);
		}
	}
	close(fd);
	*len = n;
	return buf;
}

/* The id of BTF_KIND_FUNC `name` in vmlinux's BTF, or 0. */
static inline uint32_t btf_func_id(const char *name)
{
	size_t len, off;
	uint8_t *btf = read_all(BTF_PATH, &len);
	const struct btf_header *h = (const void *)btf;
	const uint8_t *types, *strs;
	uint32_t id = 1;

	if (!btf)
		cannot("%s: %s: the kernel's BTF is needed to attach an fentry program "
		       "(CONFIG_DEBUG_INFO_BTF)", BTF_PATH, strerror(errno));
	if (len < sizeof(*h) || h->magic != BTF_MAGIC ||
	    (size_t)h->hdr_len + h->str_off + h->str_len > len)
		cannot("%s is not BTF this reproducer reads", BTF_PATH);
	types = btf + h->hdr_len + h->type_off;
	strs = btf + h->hdr_len + h->str_off;
	for (off = 0; off + sizeof(struct btf_type) <= h->type_len; id++) {
		const struct btf_type *t = (const void *)(types + off);
		uint32_t kind = BTF_INFO_KIND(t->info), vlen = BTF_INFO_VLEN(t->info);
		size_t extra;

		switch (kind) {
		case 1:  /* INT */
		case 14: /* VAR */
		case 17: /* DECL_TAG */
			extra = 4;
			break;
		case 3: /* ARRAY */
			extra = 12;
			break;
		case 4:  /* STRUCT */
		case 5:  /* UNION */
		case 15: /* DATASEC */
		case 19: /* ENUM64 */
			extra = 12 * (size_t)vlen;
			break;
		case 6:  /* ENUM */
		case 13: /* FUNC_PROTO */
			extra = 8 * (size_t)vlen;
			break;
		case 2: case 7: case 8: case 9: case 10: case 11: case 12: case 16: case 18:
			extra = 0;
			break;
		default:
			cannot("%s: BTF kind %u at type %u is unknown to this reproducer",
			       BTF_PATH, kind, id);
		}
		if (kind == 12 && t->name_off < h->str_len &&
		    strcmp((const char *)strs + t->name_off, name) == 0) {
			free(btf);
			return id;
		}
		off += sizeof(*t) + extra;
	}
	free(btf);
	return 0;
}

/* `r0 = 0; exit` as an fentry program on BTF function `btf_id` (`target`). */
static inline int load_fentry(uint32_t btf_id, const char *target)
{
	struct bpf_insn insns[2];
	union bpf_attr attr;
	char log[4096];
	long fd;

	memset(insns, 0, sizeof(insns));
	insns[0].code = BPF_ALU64 | BPF_MOV | BPF_K;
	insns[0].dst_reg = BPF_REG_0;
	insns[1].code = BPF_JMP | BPF_EXIT;
	memset(&attr, 0, sizeof(attr));
	attr.prog_type = BPF_PROG_TYPE_TRACING;
	attr.expected_attach_type = BPF_TRACE_FENTRY;
	attr.attach_btf_id = btf_id;
	attr.insns = (uint64_t)(unsigned long)insns;
	attr.insn_cnt = 2;
	attr.license = (uint64_t)(unsigned long)"GPL";
	attr.log_buf = (uint64_t)(unsigned long)log;
	attr.log_size = sizeof(log);
	attr.log_level = 1;
	strncpy(attr.prog_name, "kloop_fentry", sizeof(attr.prog_name) - 1);
	log[0] = 0;
	fd = sys_bpf(BPF_PROG_LOAD, &attr, sizeof(attr));
	if (fd < 0 && errno == EPERM)
		cannot("BPF_PROG_LOAD of an fentry program: %s: it needs CAP_BPF and "
		       "CAP_PERFMON (5.8+) or CAP_SYS_ADMIN (run as root)", strerror(errno));
	if (fd < 0)
		cannot("BPF_PROG_LOAD of an fentry program on %s: %s: fentry needs "
		       "CONFIG_BPF_JIT, CONFIG_DEBUG_INFO_BTF and CONFIG_FUNCTION_TRACER "
		       "(x86-64, 5.5+)%s%s", target, strerror(errno),
		       log[0] ? "; verifier: " : "", log);
	return (int)fd;
}

