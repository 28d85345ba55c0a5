// SPDX-License-Identifier: GPL-2.0
/*
 * kloop's positive control for UBSAN's bounds check (`--checks ub`,
 * CONFIG_UBSAN_BOUNDS): an array indexed one past its end with an index
 * the compiler cannot see, which the instrumentation sends to
 * __ubsan_handle_out_of_bounds() (lib/ubsan.c): "UBSAN:
 * array-index-out-of-bounds in …kloop_control_ubsan.c". The array is not
 * the last member of its struct (so it is not a flexible-array candidate
 * under -fsanitize=bounds-strict) and the access lands on the member
 * after it, inside the same object: KASAN, when also built in, has
 * nothing to report, and this control tests UBSAN alone.
 */
#include <linux/module.h>

struct kloop_control_ubsan_box {
	int slots[4];
	int after;
};

static struct kloop_control_ubsan_box kloop_control_ubsan_box;

static noinline int kloop_control_ubsan_index(struct kloop_control_ubsan_box *box, int i)
{
	return box->slots[i];
}

static int __init kloop_control_ubsan_init(void)
{
	int i = ARRAY_SIZE(kloop_control_ubsan_box.slots);

	OPTIMIZER_HIDE_VAR(i);
	kloop_control_ubsan_index(&kloop_control_ubsan_box, i);
	return 0;
}
module_init(kloop_control_ubsan_init);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kloop positive control: a UBSAN array-index-out-of-bounds");
