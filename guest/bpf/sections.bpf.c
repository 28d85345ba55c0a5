// SPDX-License-Identifier: GPL-2.0
// kloop fixture "sections": one object whose ELF section names say where
// each program attaches, the convention `perf record -e prog.o` (perf's
// bpf-loader) relied on: kprobe/<fn>, kretprobe/<fn>,
// tracepoint/<category>/<name>. The `load-object` step attaches them all.

#include "kloop_bpf.h"

KLOOP_COUNTERS(3)

SEC("kprobe/hrtimer_nanosleep")
int kloop_sec_entry(void *ctx)
{
	bump(0);
	return 0;
}

SEC("kretprobe/hrtimer_nanosleep")
int kloop_sec_return(void *ctx)
{
	bump(1);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_nanosleep")
int kloop_sec_tp(void *ctx)
{
	bump(2);
	return 0;
}

char _license[] SEC("license") = "GPL";
