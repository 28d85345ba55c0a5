// SPDX-License-Identifier: GPL-2.0
// kloop fixture "tramp": fentry, fexit and LSM programs, each counting its
// runs in an array map. Their attach targets are chosen by the scenario's
// load step (`btf_target`), so the sections carry no function name.

#include "kloop_bpf.h"

KLOOP_COUNTERS(4)

SEC("fentry")
int kloop_fentry(unsigned long long *ctx)
{
	bump(0);
	return 0;
}

SEC("fexit")
int kloop_fexit(unsigned long long *ctx)
{
	bump(1);
	return 0;
}

// An LSM program must return 0 or a negative errno; 0 lets everything pass.
SEC("lsm")
int kloop_lsm(unsigned long long *ctx)
{
	bump(2);
	return 0;
}

char _license[] SEC("license") = "GPL";
