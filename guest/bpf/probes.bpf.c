// SPDX-License-Identifier: GPL-2.0
// kloop fixture "probes": a kprobe and a kretprobe, each counting its runs
// in an array map. Where they attach is the scenario's attach step.

#include "kloop_bpf.h"

KLOOP_COUNTERS(2)

SEC("kprobe")
int kloop_kprobe(void *ctx)
{
	bump(0);
	return 0;
}

SEC("kretprobe")
int kloop_kretprobe(void *ctx)
{
	bump(1);
	return 0;
}

char _license[] SEC("license") = "GPL";
