// SPDX-License-Identifier: GPL-2.0
/*
 * kloop's positive control for KASAN (`--checks memory`): one read one
 * byte past the end of a kmalloc'd object, which generic KASAN must
 * report as "BUG: KASAN: slab-out-of-bounds in kloop_control_kasan_read"
 * (mm/kasan/report.c, print_error_description()). The object is 123
 * bytes: generic KASAN poisons the rest of its kmalloc-128 slot from
 * byte 123 on, with byte precision in the last granule (mm/kasan/common.c,
 * poison_kmalloc_redzone(), and mm/kasan/shadow.c,
 * kasan_poison_last_granule()), so the read lands in the object's own
 * slot, never in another object.
 */
#include <linux/module.h>
#include <linux/slab.h>

static noinline char kloop_control_kasan_read(void)
{
	size_t size = 123;
	char *p;
	char c;

	p = kmalloc(size, GFP_KERNEL);
	if (!p)
		return 0;
	/* Hide the bound from the compiler, which would warn at build time. */
	OPTIMIZER_HIDE_VAR(size);
	c = ((volatile char *)p)[size];
	kfree(p);
	return c;
}

static int __init kloop_control_kasan_init(void)
{
	kloop_control_kasan_read();
	return 0;
}
module_init(kloop_control_kasan_init);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kloop positive control: a KASAN slab-out-of-bounds read");
